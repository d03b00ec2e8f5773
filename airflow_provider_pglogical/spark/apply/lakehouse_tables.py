"""The lakehouse side of the apply job: target tables (created, evolved); the state table is ``state_table.py``."""

from __future__ import annotations

import json
import logging
from typing import NamedTuple

from airflow_provider_pglogical.spark.common.hadoop_files import unreadable_table_error
from airflow_provider_pglogical.spark.common.identifiers import col, qualified, quote, sql_string
from airflow_provider_pglogical.spark.common.java_classes import java_class
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.format_versions import DEFAULT_FORMAT_VERSION, FORMAT_VERSIONS
from airflow_provider_pglogical.spark.apply.state_table import METADATA_PROPERTIES, StateTable, metadata_properties
from airflow_provider_pglogical.staging.contract import (
    KEY_PROPERTY,
    MULTISET_COLUMNS,
    NUMBERED_PROPERTY,
    OCCURRENCE,
    OWNER_PROPERTY,
    WRITTEN_BY,
)
from airflow_provider_pglogical.staging.column_types import column_type
from airflow_provider_pglogical.staging.seam.manifests import ColumnEvolution, TableManifest
from airflow_provider_pglogical.staging.seam.pg_types import SparkType

log = logging.getLogger("pglogical.apply")

#: name prefix of the temporary tables a bucketed target's batch is staged in
BATCH_TABLE_PREFIX = "_pglogical_batch__"
class TableSize(NamedTuple):
    """A lakehouse table's size by its current snapshot: the rows of its data files (with
    merge-on-read, rows that delete files hide too: a scan reads them) and the bytes of its files."""

    rows: int
    bytes: int



class Lakehouse:
    """One Iceberg namespace: its target tables, and this job's state table (:attr:`state`)."""

    def __init__(self, spark, catalog: str, namespace: str, write_mode: str, bucket_count: int | None,
                 format_version: int = DEFAULT_FORMAT_VERSION, upgrade_format_version: bool = False):
        self.spark = spark
        self.catalog = catalog
        self.namespace = namespace
        self.write_mode = write_mode
        self.bucket_count = bucket_count
        #: the format version of the tables it creates, and whether older ones are upgraded (``format_versions.py``)
        if format_version not in FORMAT_VERSIONS:
            raise ApplyError(f"Iceberg format version must be one of {FORMAT_VERSIONS}, not {format_version!r}")
        self.format_version = format_version
        self.upgrade_format_version = upgrade_format_version
        #: target -> the :data:`OWNER_PROPERTY` value a table created by this run records (``table_identity.py``)
        self.owners: dict[str, str] = {}
        if not self._namespace_exists() and not self._created_namespace():
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {qualified(catalog, namespace)}")
        #: ``_pglogical_state``: its own object, read at a run's start and committed once per round
        self.state = StateTable(self)

    def _namespace_exists(self) -> bool:
        """Asks the catalog itself: in a fresh JVM, the first SQL statement costs about a second
        of parsing, which a run whose namespace exists need not pay."""
        try:
            return bool(self._catalog().namespaceExists(self._namespace_names()))
        except Exception:  # only a shortcut: an unknown catalog, or one without namespaces, is
            return False  # for CREATE NAMESPACE to report in Spark's words

    def _created_namespace(self) -> bool:
        """Create the namespace through the catalog itself (see :meth:`_namespace_exists`); False
        when that failed (one created meanwhile, a catalog that wants properties): SQL decides."""
        try:
            self._catalog().createNamespace(self._namespace_names(), java_class(self.spark, "java.util.HashMap")())
        except Exception:
            return False
        return True

    def create_by_catalog(self, table: str, columns: dict[str, tuple[str, bool]], properties: dict[str, str],
                          partitioning: list[tuple[str, str, int | None]] = ()) -> bool:
        """``CREATE TABLE IF NOT EXISTS ... USING iceberg`` through Spark's catalog plugin itself,
        which is what that statement calls, without the SQL parser and analyzer: in a fresh JVM
        (every snapshot's apply) their first use costs one to two seconds.

        :param columns: name -> (Spark type, nullable).
        :param partitioning: ``("identity", column, None)`` or ``("bucket", column, buckets)``.
        Returns False (nothing done) for a type it does not parse: the caller runs the SQL.
        """
        from pyspark.sql.types import StructField, StructType

        fields = []
        for name, (kind, nullable) in columns.items():
            parsed = spark_data_type(kind)
            if parsed is None:
                return False
            fields.append(StructField(name, parsed, nullable))
        schema = java_class(self.spark, "org.apache.spark.sql.types.DataType").fromJson(StructType(fields).json())
        expressions = java_class(self.spark, "org.apache.spark.sql.connector.expressions.Expressions")
        gateway = self.spark.sparkContext._gateway
        transforms = gateway.new_array(java_class(self.spark, "org.apache.spark.sql.connector.expressions.Transform"),
                                       len(partitioning))
        for index, (kind, column, buckets) in enumerate(partitioning):
            if kind == "identity":
                transforms[index] = expressions.identity(column)
            else:
                names = gateway.new_array(java_class(self.spark, "java.lang.String"), 1)
                names[0] = column
                transforms[index] = expressions.bucket(int(buckets), names)
        table_properties = java_class(self.spark, "java.util.HashMap")()
        for key, value in {"provider": "iceberg", **properties}.items():  # what USING iceberg passes
            table_properties.put(key, value)
        try:
            self._catalog().createTable(self._identifier(table), schema, transforms, table_properties)
        except Exception as error:
            from airflow_provider_pglogical.spark.row_delta.driver_commits import java_exception_class

            if java_exception_class(error) != "org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException":
                raise
        return True

    def _catalog(self):
        """Spark's catalog plugin (Java) of this lakehouse."""
        return self.spark._jsparkSession.sessionState().catalogManager().catalog(self.catalog)

    def _namespace_names(self):
        names = self.spark.sparkContext._gateway.new_array(java_class(self.spark, "java.lang.String"), 1)
        names[0] = self.namespace
        return names

    def _identifier(self, table: str):
        """The table's identifier in the catalog, built without Spark's SQL parser (whose first use
        in a fresh JVM, with the analysis of a statement, costs a second or more per step)."""
        return java_class(self.spark, "org.apache.spark.sql.connector.catalog.Identifier").of(
            self._namespace_names(), table)

    def name(self, table: str) -> str:
        return qualified(self.catalog, self.namespace, table)

    def exists(self, table: str) -> bool:
        """Asks the catalog itself (see :meth:`_identifier`)."""
        return self.loaded_table(table) is not None

    def loaded_table(self, table: str):
        """:meth:`iceberg_table`, or None when the catalog has no such table."""
        from pyspark.errors import AnalysisException

        try:
            return self.iceberg_table(table)
        except AnalysisException as error:  # Spark's NoSuchTableException
            if error.getErrorClass() != "TABLE_OR_VIEW_NOT_FOUND":
                raise
        except Exception as error:  # py4j's: the catalog knows the table, but its metadata file is gone
            raise unreadable_table_error(error, self.name(table)) or error
        return None

    def metadata_locations(self, states) -> dict[str, str | None]:
        """Each target's current metadata file (what a dropped table loses: the operator's idle tick
        checks they still exist, without a JVM); None for a table that is not there."""
        found = {state.target: self.loaded_table(state.target) for state in states}
        return {target: table.operations().current().metadataFileLocation() if table is not None else None
                for target, table in found.items()}

    def size(self, table: str) -> TableSize:
        """The table's rows and bytes of files by its current snapshot's summary (Iceberg
        metadata: no Spark job); zeros for a table without a snapshot."""
        snapshot = self.iceberg_table(table).currentSnapshot()
        summary = snapshot.summary() if snapshot is not None else None

        def total(key: str) -> int:
            value = summary.get(key) if summary is not None else None
            return int(value) if value is not None else 0

        return TableSize(total("total-records"), total("total-files-size"))

    def drop_batch_tables(self) -> None:
        """Drop the bucketed batch tables a killed run left (see ``paths/merge._merge_source``)."""
        for row in self.spark.sql(f"SHOW TABLES IN {qualified(self.catalog, self.namespace)}").collect():
            if row.tableName.startswith(BATCH_TABLE_PREFIX):
                self.spark.sql(f"DROP TABLE IF EXISTS {self.name(row.tableName)} PURGE")

    def bucketed(self, table: str, column: str) -> bool:
        """True when ``table`` is partitioned by ``bucket(bucket_count, column)`` and nothing else."""
        spec = self.spark.sql(f"DESCRIBE TABLE {self.name(table)}").collect()
        start = next((i for i, r in enumerate(spec) if r.col_name.strip() == "# Partitioning"), None)
        if start is None:
            return False
        parts = [r.data_type.strip() for r in spec[start + 1:] if r.col_name.startswith("Part ")]
        return parts == [f"bucket({int(self.bucket_count)}, {column})"]

    def iceberg_table(self, table: str):
        """The Iceberg table (Java) as Spark's catalog holds it: a commit to it is what Spark reads next.
        Loaded as ``Spark3Util.loadIcebergTable`` loads it, without parsing the name."""
        return java_class(self.spark, "org.apache.iceberg.spark.Spark3Util").toIcebergTable(
            self._catalog().loadTable(self._identifier(table)))

    def spark_types(self, iceberg_table) -> dict[str, str]:
        """Column name -> Spark type of an Iceberg table, as ``spark.table(name).schema`` gives them
        (Iceberg's own conversion), without a Spark analysis."""
        from pyspark.sql.types import StructType

        converted = java_class(self.spark, "org.apache.iceberg.spark.SparkSchemaUtil").convert(iceberg_table.schema())
        return {f.name: f.dataType.simpleString() for f in StructType.fromJson(json.loads(converted.json())).fields}

    # tables --------------------------------------------------------------------------------
    def ensure_table(self, table: str, manifest: TableManifest) -> dict[str, str]:
        """Create or evolve the table for a table manifest; returns column name -> Spark type."""
        try:
            wanted = {column.name: column_type(column) for column in manifest.columns}
        except ValueError as error:
            raise ApplyError(f"table {self.name(table)}: {error}") from None
        iceberg_table = self.loaded_table(table)
        if iceberg_table is None:
            return self._create(table, manifest, wanted)
        current = self.spark_types(iceberg_table)
        if self._follow_columns(table, manifest.column_evolution, current, wanted):
            current = self.spark_types(self.iceberg_table(table))
        if manifest.is_multiset and self._unnumbered(table, current, iceberg_table):
            current = self._number_copies(table, current)
        for name, kind in wanted.items():
            if name not in current:
                self.spark.sql(f"ALTER TABLE {self.name(table)} ADD COLUMN {quote(name)} {kind}")
                log.info("added column %s %s to %s", name, kind, table)
            elif current[name] != kind:
                if not widens(current[name], kind):
                    raise ApplyError(
                        f"table {self.name(table)}: column {name} is {current[name]} in Iceberg but {kind} at "
                        "the source; Iceberg cannot change it in place. Drop the Iceberg table (or the "
                        "column) and re-run the apply: it is rebuilt from the staged batches, or backfill it."
                    )
                self.spark.sql(f"ALTER TABLE {self.name(table)} ALTER COLUMN {quote(name)} TYPE {kind}")
        return {**current, **wanted}

    def _follow_columns(self, table: str, evolution: ColumnEvolution | None, current: dict[str, str],
                        wanted: dict[str, str]) -> bool:
        """Rename (same field id, same values) and drop the columns the source renamed and dropped
        (``capture/ddl.py`` proved it by attnum); a re-run finds them done. Returns whether it changed any."""
        changed = False
        for old, new in (evolution.renamed if evolution else {}).items():
            if old in current and new not in current:
                self.spark.sql(f"ALTER TABLE {self.name(table)} RENAME COLUMN {quote(old)} TO {quote(new)}")
                log.info("renamed column %s of %s to %s", old, table, new)
                changed = True
        for name in evolution.dropped if evolution else ():
            if name in current and name not in wanted:
                self.spark.sql(f"ALTER TABLE {self.name(table)} DROP COLUMN {quote(name)}")
                log.info("dropped column %s of %s", name, table)
                changed = True
        return changed

    def replace(self, table: str, why: str) -> None:
        """Drop the table before a snapshot that replaces it: DDL at the source it cannot follow."""
        log.warning("replacing %s (%s)", self.name(table), why)
        existing = self.loaded_table(table)
        owner = existing.properties().get(OWNER_PROPERTY) if existing is not None else None
        if owner is not None:  # the table created again records the owner the run checked
            self.owners.setdefault(table, owner)
        self.spark.sql(f"DROP TABLE IF EXISTS {self.name(table)} PURGE")

    def _create(self, table: str, manifest: TableManifest, wanted: dict[str, str]) -> dict[str, str]:
        key = manifest.key
        not_null = not manifest.is_multiset and key
        columns = ", ".join(
            f"{quote(name)} {kind}{' NOT NULL' if not_null and name in key else ''}" for name, kind in wanted.items()
        )
        if manifest.is_multiset:
            wanted = {**wanted, **MULTISET_COLUMNS}
            columns += "".join(f", {quote(name)} {kind}" for name, kind in MULTISET_COLUMNS.items())
        mode = sql_string(self.write_mode)
        properties = {KEY_PROPERTY: json.dumps(key), **({NUMBERED_PROPERTY: "true"} if manifest.is_multiset else {}),
                      **({OWNER_PROPERTY: self.owners[table]} if table in self.owners else {})}
        partitioning = ""
        if self.bucket_count and key:
            partitioning = f" PARTITIONED BY (bucket({int(self.bucket_count)}, {quote(key[0])}))"
        by_catalog = {name: (kind, not (not_null and name in key)) for name, kind in wanted.items()}
        if not self.create_by_catalog(
                table, by_catalog, {"format-version": str(self.format_version), "write.merge.mode": self.write_mode,
                                    "write.update.mode": self.write_mode, "write.delete.mode": self.write_mode,
                                    **properties, **METADATA_PROPERTIES},
                [("bucket", key[0], int(self.bucket_count))] if partitioning else []):
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self.name(table)} ({columns}) USING iceberg{partitioning} "
                f"TBLPROPERTIES ('format-version'='{int(self.format_version)}', 'write.merge.mode'={mode}, "
                f"'write.update.mode'={mode}, 'write.delete.mode'={mode}"
                + "".join(f", {sql_string(name)}={sql_string(value)}" for name, value in properties.items())
                + metadata_properties() + ")"
            )
        # Iceberg 1.6-1.9 Spark fails every merge-on-read MERGE/UPDATE/DELETE of a table with
        # identifier fields (apache/iceberg#11709); 1.10 no longer does (checked: MERGE, UPDATE and
        # DELETE of such a table on the 1.10.1 runtime), but a cluster may name an older runtime
        # (IcebergConfig(packages=...)), so on merge-on-read tables the key lives in KEY_PROPERTY only.
        if not_null and self.write_mode == "copy-on-write":
            fields = ", ".join(quote(name) for name in key)
            self.spark.sql(f"ALTER TABLE {self.name(table)} SET IDENTIFIER FIELDS {fields}")
        log.info("created %s", self.name(table))
        return wanted

    def _unnumbered(self, table: str, current: dict[str, str], iceberg_table) -> bool:
        """A keyless table without (complete) copy numbers: written before this job numbered them."""
        if OCCURRENCE not in current:
            return True
        if iceberg_table.properties().get(NUMBERED_PROPERTY) == "true":  # created numbered, or numbered since: no scan
            return False
        # file statistics answer this for every file a finished numbering wrote
        return bool(self.spark.table(self.name(table)).where(col(OCCURRENCE).isNull()).limit(1).count())

    def _number_copies(self, table: str, current: dict[str, str]) -> dict[str, str]:
        """Add the multiset columns to a keyless table and number its identical rows (one overwrite).

        A crash between the two commits leaves NULL occurrences, which the next run numbers.
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        log.warning("table %s is keyless but its identical rows are not numbered (written by an earlier "
                    "version, which could lose copies): numbering them now; backfill it to be sure it is exact",
                    self.name(table))
        # unset first: a crash before the overwrite below must leave the table to be numbered again
        self.spark.sql(f"ALTER TABLE {self.name(table)} UNSET TBLPROPERTIES IF EXISTS ({sql_string(NUMBERED_PROPERTY)})")
        for name, kind in MULTISET_COLUMNS.items():
            if name not in current:
                self.spark.sql(f"ALTER TABLE {self.name(table)} ADD COLUMN {quote(name)} {kind}")
        from airflow_provider_pglogical.spark.row_delta.driver_commits import validated_overwrite

        values = [col(c) for c in current if c not in MULTISET_COLUMNS]
        read = self.iceberg_table(table).currentSnapshot()  # read at it; a commit after it refuses the overwrite
        rows = (self.spark.read.option("snapshot-id", read.snapshotId()).table(self.name(table))
                if read is not None else self.spark.table(self.name(table)))
        numbered = rows.select(
            *values, F.row_number().over(Window.partitionBy(*values).orderBy(F.lit(1))).cast("int").alias(OCCURRENCE),
            F.lit(None).cast("string").alias(WRITTEN_BY)).localCheckpoint()
        validated_overwrite(self, table, numbered, F.lit(True), read.snapshotId() if read is not None else None)
        # only after the overwrite committed: a crash before it leaves the table to be numbered again
        self.spark.sql(f"ALTER TABLE {self.name(table)} SET TBLPROPERTIES "
                       f"({sql_string(NUMBERED_PROPERTY)}={sql_string('true')})")
        return {**current, **MULTISET_COLUMNS}


def spark_data_type(kind: str):
    """The PySpark ``DataType`` of a Spark SQL type name the staging contract produces (primitives,
    ``decimal(p,s)``, ``array<...>``); None for any other (its SQL then decides)."""
    from pyspark.sql import types as T

    primitives = {"boolean": T.BooleanType, "smallint": T.ShortType, "int": T.IntegerType, "bigint": T.LongType,
                  "float": T.FloatType, "double": T.DoubleType, "string": T.StringType, "binary": T.BinaryType,
                  "date": T.DateType, "timestamp": T.TimestampType, "timestamp_ntz": T.TimestampNTZType}
    spark_type = SparkType.parse(kind)
    if spark_type.kind in primitives:
        return primitives[spark_type.kind]()
    if spark_type.kind == "decimal" and spark_type.precision is not None:
        return T.DecimalType(spark_type.precision, spark_type.scale)
    element = spark_data_type(spark_type.element.sql) if spark_type.is_array else None
    return T.ArrayType(element, True) if element is not None else None


def widens(old: str, new: str) -> bool:
    """Iceberg's in-place type promotions: int -> bigint, float -> double, wider decimal precision."""
    return SparkType.parse(old).widens_to(SparkType.parse(new))
