"""The lakehouse's tables read from Python, without Spark: pyiceberg tables from an :class:`IcebergConfig`.

pyiceberg has no Hadoop catalog: a Hadoop warehouse's table is found as Iceberg's
``HadoopTableOperations`` finds it (``<warehouse>/<namespace>/<table>/metadata/version-hint.text``
names the current ``v<N>.metadata.json``) and opened as a read-only ``StaticTable``. A REST
catalog is built from the config's ``catalog_uri``; any other catalog is passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.catalog_kinds import CatalogKind, UnknownCatalogKind, catalog_kind
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig, default_warehouse

#: what to install when pyiceberg is missing
READERS_EXTRA = "airflow-provider-pglogical[readers]"


@dataclass(frozen=True)
class StateRow:
    """A table's row of ``_pglogical_state``: where the apply has brought it."""

    target: str
    position: int
    last_batch: str | None


def _pyiceberg():
    try:
        import pyiceberg  # noqa: F401
    except ModuleNotFoundError:
        raise InvalidInputError(
            f"reading the lakehouse from Python needs pyiceberg: pip install {READERS_EXTRA}") from None


def load_tables(config: IcebergConfig, catalog=None) -> Callable[[str], object]:
    """A function loading a table of ``config.namespace`` by name as a pyiceberg table."""
    _pyiceberg()
    namespace = tuple(config.namespace.split("."))
    if catalog is not None:
        return lambda name: catalog.load_table((*namespace, name))
    try:
        kind = catalog_kind(config.catalog_type, config.catalog_impl)
    except UnknownCatalogKind:
        kind = None  # named in the error below
    if kind is CatalogKind.HADOOP:
        warehouse = (config.warehouse or default_warehouse()).rstrip("/")
        return lambda name: _hadoop_table("/".join([warehouse, *namespace, name]))
    if kind is CatalogKind.REST and config.catalog_uri:
        from pyiceberg.catalog import load_catalog

        properties = {"type": "rest", "uri": config.catalog_uri}
        if config.warehouse:
            properties["warehouse"] = config.warehouse
        rest = load_catalog(config.catalog, **properties)
        return lambda name: rest.load_table((*namespace, name))
    raise InvalidInputError(
        f"Iceberg catalog {config.catalog!r} ({config.catalog_impl or config.catalog_type}): pyiceberg cannot be "
        "built from this config alone (its credentials live in Airflow connections). Pass catalog=<a pyiceberg "
        "catalog>, e.g. pyiceberg.catalog.load_catalog('lake', type='sql'|'glue'|'rest', ...)")


def _hadoop_table(location: str):
    """The current version of a Hadoop catalog's table at ``location``."""
    from pyiceberg.io import load_file_io
    from pyiceberg.table import StaticTable

    io = load_file_io({}, location)
    hint = f"{location}/metadata/version-hint.text"
    try:
        with io.new_input(hint).open() as file:
            version = int(file.read().decode().strip())
    except FileNotFoundError:
        raise InvalidInputError(f"no Iceberg table at {location} (no {hint}): check the warehouse and the "
                                "namespace the apply writes") from None
    for name in (f"v{version}.metadata.json", f"v{version}.gz.metadata.json"):
        path = f"{location}/metadata/{name}"
        if io.new_input(path).exists():
            return StaticTable.from_metadata(path)
    raise InvalidInputError(f"Iceberg table at {location}: {hint} names version {version}, whose metadata file "
                            "is missing")


def state_rows(state_table, pipeline: str) -> dict[str, StateRow]:
    """The pipeline's rows of the state table (a pyiceberg table) at its current snapshot."""
    from pyiceberg.expressions import EqualTo

    rows = state_table.scan(row_filter=EqualTo("pipeline", pipeline),
                            selected_fields=("source_table", "target_table", "position", "last_batch")).to_arrow()
    return {row["source_table"]: StateRow(row["target_table"], int(row["position"], 16), row["last_batch"])
            for row in rows.to_pylist()}
