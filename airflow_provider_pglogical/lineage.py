"""OpenLineage for the provider's operators: PostgreSQL tables → staging → Iceberg tables.

An optional integration: the OpenLineage provider calls ``get_openlineage_facets_on_complete``
of an operator after it ran; the imports happen there, and fail with the pip extra to install.

Naming follows OpenLineage's conventions: PostgreSQL tables are ``postgres://<host>:<port>`` /
``<database>.<schema>.<table>``; staged tables are the object store's namespace (``file``,
``s3://<bucket>``) / ``<path>/<pipeline>/<schema.table>``; Iceberg tables are the warehouse URI /
``<namespace>.<table>``. Every dataset carries a schema facet with its columns and PostgreSQL types.
"""

from __future__ import annotations

from typing import Any, Iterable

from airflow_provider_pglogical.staging.layout import BatchManifest, Column, StagingPath, read_manifest

EXTRA = "pip install 'airflow-provider-pglogical[openlineage]'"


def _openlineage():
    try:
        from airflow.providers.common.compat.openlineage.facet import (
            Dataset,
            SchemaDatasetFacet,
            SchemaDatasetFacetFields,
        )
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError as err:  # pragma: no cover - only without the provider
        raise ImportError(f"OpenLineage needs apache-airflow-providers-openlineage: {EXTRA}") from err
    return Dataset, SchemaDatasetFacet, SchemaDatasetFacetFields, OperatorLineage


def _schema_facets(columns: Iterable[Column]) -> dict:
    _, SchemaDatasetFacet, SchemaDatasetFacetFields, _ = _openlineage()
    fields = [SchemaDatasetFacetFields(name=c.name, type=c.formatted or c.type) for c in columns]
    return {"schema": SchemaDatasetFacet(fields=fields)}


def postgres_namespace(connect_kwargs: dict) -> tuple[str, str]:
    """``(namespace, database)`` of a PostgreSQL connection, by OpenLineage's naming."""
    return f"postgres://{connect_kwargs.get('host', 'localhost')}:{connect_kwargs.get('port', 5432)}", \
        str(connect_kwargs.get("dbname", ""))


def _store_namespace_and_path(root: StagingPath) -> tuple[str, str]:
    protocol = getattr(root, "protocol", "") or "file"
    if protocol in ("file", "local"):
        return "file", str(root.path)
    bucket, _, key = str(root.path).partition("/")
    return f"{protocol}://{bucket}", "/" + key if key else "/"


def staged_dataset(root: StagingPath, pipeline: str, table: str, columns: Iterable[Column]):
    Dataset = _openlineage()[0]
    namespace, path = _store_namespace_and_path(root)
    return Dataset(namespace=namespace, name=f"{path.rstrip('/')}/{pipeline}/{table}", facets=_schema_facets(columns))


def manifests_of(root: StagingPath, pipeline: str, batches: Iterable[str | None]) -> list[BatchManifest]:
    """The manifests of the named batches (paths or names; ``None`` skipped)."""
    out = []
    for batch in batches:
        if batch:
            out.append(read_manifest(root, pipeline, str(batch).rstrip("/").rsplit("/", 1)[-1]))
    return out


def capture_lineage(connect_kwargs: dict, root: StagingPath, pipeline: str, batches: Iterable[str | None]):
    """PostgreSQL tables → staged tables, for an initial sync, backfill or pull that staged ``batches``."""
    Dataset, _, _, OperatorLineage = _openlineage()
    namespace, database = postgres_namespace(connect_kwargs)
    inputs, outputs = {}, {}
    for manifest in manifests_of(root, pipeline, batches):
        for name, table in manifest.tables.items():
            inputs[name] = Dataset(namespace=namespace, name=f"{database}.{name}", facets=_schema_facets(table.columns))
            outputs[name] = staged_dataset(root, pipeline, name, table.columns)
    return OperatorLineage(inputs=list(inputs.values()), outputs=list(outputs.values()))


def apply_lineage(root: StagingPath, pipeline: str, warehouse: str, namespace: str, steps: list[dict[str, Any]]):
    """Staged tables → Iceberg tables, for the steps an apply run reported."""
    Dataset, _, _, OperatorLineage = _openlineage()
    last_batch: dict[str, dict] = {}
    for step in steps:
        last_batch[step["table"]] = step
    inputs, outputs = [], []
    for source, step in sorted(last_batch.items()):
        columns = manifests_of(root, pipeline, [step["batch"]])[0].tables[source].columns
        inputs.append(staged_dataset(root, pipeline, source, columns))
        outputs.append(Dataset(namespace=warehouse.rstrip("/"), name=f"{namespace}.{step['target']}",
                               facets=_schema_facets(columns)))
    return OperatorLineage(inputs=inputs, outputs=outputs)


class CaptureLineageMixin:
    """For the operators that stage batches: remember where they came from and went, and report
    PostgreSQL tables → staged tables when the OpenLineage provider asks."""

    _lineage_state: tuple | None = None

    def remember_lineage(self, hook, root: StagingPath, result: dict) -> dict:
        conn = hook.connection
        source = {"host": conn.host, "port": conn.port or 5432, "dbname": hook.database or conn.schema}
        self._lineage_state = (source, root, str(self.pipeline), [result.get("batch")])
        return result

    def get_openlineage_facets_on_complete(self, task_instance):
        """PostgreSQL tables (with their published columns) → the staged tables of this run."""
        if self._lineage_state is None:
            return _openlineage()[3]()
        return capture_lineage(*self._lineage_state)
