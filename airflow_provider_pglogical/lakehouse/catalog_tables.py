"""Which target tables the catalog still lists: the idle tick's dropped-table check, without a JVM.

An idle tick (``IcebergApplyOperator.skip_if_idle``) skips Spark only while every target table
the last apply left is still there. In a transactional catalog ``DROP TABLE`` (without ``PURGE``)
removes the catalog's entry and leaves every file, so a metadata file on the store proves
nothing: the catalog must be asked. Iceberg's JDBC catalog keeps its entries in one PostgreSQL
table, ``iceberg_tables``; one query on the catalog's own Airflow connection answers for every
target. Other catalogs (REST, Glue, Hive, Nessie) would need their client on the worker: they are
not asked here, and the tick trusts the apply marker (docs/lakehouse.md says what catches a drop).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import closing

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig

log = logging.getLogger(__name__)

#: Iceberg's ``JdbcCatalog`` table of tables (1.9: ``catalog_name``, ``table_namespace``,
#: ``table_name``, ``metadata_location``, ...); a fixed name, not configurable in Iceberg
CATALOG_TABLES_QUERY = ("SELECT table_name, metadata_location FROM iceberg_tables "
                        "WHERE catalog_name = %s AND table_namespace = %s")


def lists_tables_without_spark(config: IcebergConfig) -> bool:
    """The catalog is Iceberg's JDBC catalog in the database of ``catalog_conn_id`` (the uri built
    from it), so this worker can read its entries itself."""
    spec = config.spec
    return (spec is not None and spec.lists_tables_without_spark and not config.catalog_impl
            and bool(config.catalog_conn_id) and not config.catalog_uri)


def catalog_metadata_locations(config: IcebergConfig, targets: Iterable[str]) -> dict[str, str | None] | None:
    """Target table -> its current metadata file as the JDBC catalog lists it (None: not listed,
    dropped); None when this catalog cannot be asked without Spark, or did not answer.

    :param config: the lakehouse of the apply (its catalog, namespace and ``catalog_conn_id``).
    :param targets: table names in ``config.namespace``.
    """
    if not lists_tables_without_spark(config):
        return None
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    targets = list(targets)
    try:
        with closing(PostgresHook(postgres_conn_id=config.catalog_conn_id).get_conn()) as conn:
            with conn.cursor() as cursor:
                cursor.execute(CATALOG_TABLES_QUERY, (config.catalog, config.namespace))
                listed = dict(cursor.fetchall())
    except Exception as error:  # no answer: Spark decides (a wasted JVM start at worst, never a skipped batch)
        log.warning("could not read the JDBC catalog %r through connection %r (%s): starting Spark to check the "
                    "target tables", config.catalog, config.catalog_conn_id, type(error).__name__)
        return None
    return {name: listed.get(name) for name in targets}
