"""A snapshot batch's staged Parquet files adopted into its Iceberg table as data files: no rewrite.

Reading the staged rows and writing them again costs a snapshot about four times its copy from
PostgreSQL (issue 37). When the staged values already are the table's values, in the table's
physical types, the driver instead copies each staged file next to the table's data, page by
page (Parquet's ``ParquetFileWriter.appendFile``: the column chunks' bytes, undecoded, under a
new footer that carries the table's field ids), and commits the copies in one ``OverwriteFiles``
that replaces every row, validated against concurrent commits like the rewrite's overwrite.

Why a copy and not the staged files themselves: staging retention (``retention.py``) deletes
applied batches, and a table must own its files. The copy is in the table's data location, so
only Iceberg's expiry or orphan removal ever deletes it; a copy a killed run left uncommitted is
an orphan that ``remove_orphan_files`` removes. The field ids make the files exact under any
later rename, drop or re-added column, which a name mapping would not.

When a staged file already carries the table's field ids (the snapshot numbers its columns as a
new table's are numbered: ``staging/batches.with_field_ids``) and the staging root and the table
are on one local file system (the embedded default), the file is adopted by a hard link instead
of a copy: a second name of the same bytes in the table's data location, which the table owns as
it would own a copy (retention removes only the staged name; nothing here or in Iceberg ever
writes into an existing file). A 20M-row snapshot's file is half a gigabyte that is then neither
read nor written again. Anything else (an object store, other ids, a link the file system
refuses) copies as above.

What is adopted (:func:`adoption_refused`, pure): a full snapshot of a keyed, unpartitioned table
whose every column is staged as exactly the Spark type the table holds, of a kind whose staged
Parquet form is Iceberg's. Anything else keeps the rewrite, and the job logs why at INFO.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid

from airflow_provider_pglogical.staging.seam.pg_types import SparkType

log = logging.getLogger("pglogical.apply")

#: the snapshot summary property naming the staged batch a commit adopted
ADOPTED_PROPERTY = "pglogical.adopted-batch"
#: tests only: ``copied`` SIGKILLs the driver after the copies are written and before the commit,
#: ``committed`` after the commit, before anything else (the reliability harness's kill points)
CRASH_VARIABLE = "PGLOGICAL_ADOPT_CRASH"
_PARQUET = "org.apache.iceberg.shaded.org.apache.parquet"


def adoptable_type(kind: str) -> bool:
    """Whether a column of Spark type ``kind`` can be adopted from its staged Parquet form (pyarrow's:
    Iceberg reads it as the same values; the registry says which, ``staging/seam/pg_types.py``)."""
    return SparkType.parse(kind).adoptable


def adoption_refused(staged: dict[str, str], types: dict[str, str], *, keyless: bool, ranged: bool,
                     partitioned: bool) -> str | None:
    """Why a snapshot's staged files cannot become the table's data files as they are; None when they can.

    :param staged: staged column -> Spark type (``column_types.staged_columns``, overrides applied).
    :param types: the target table's column -> Spark type, after its evolution for this batch.
    """
    if keyless:
        return "a keyless table numbers its identical rows (_pglogical_occurrence): the rows are rewritten"
    if ranged:
        return "a ranged backfill replaces only its key range: a MERGE"
    if partitioned:
        return "the table is partitioned: a staged file may span partitions"
    missing = sorted(set(types) - set(staged))
    if missing:
        return f"the table has columns the batch does not stage ({', '.join(missing)})"
    for name, kind in staged.items():
        if types.get(name) != kind:
            return f"column {name} is staged as {kind} but the table holds {types.get(name)}"
        if not adoptable_type(kind):
            return f"column {name}: type {kind} is not adopted as staged"
    return None


class Adoption:
    """Adopts a snapshot's staged files into an Iceberg table from the driver (py4j)."""

    def __init__(self, spark, kill_points: bool = True) -> None:
        """:param kill_points: honour :data:`CRASH_VARIABLE` (off for the window's warm-up, ``warm_up.py``)."""
        self.spark = spark
        self.kill_points = kill_points

    def _class(self, name: str):
        from airflow_provider_pglogical.spark.common.java_classes import java_class

        return java_class(self.spark, name)

    def adopt(self, table, files: list[str], batch: str) -> tuple[int, str | None]:
        """Replace every row of ``table`` (Java) with the staged ``files``, in one commit.

        Returns the number of files adopted, or ``(0, reason)`` when a file's own schema is not
        the table's (nothing was committed then; the caller rewrites)."""
        from airflow_provider_pglogical.spark.row_delta.driver_commits import same_thread_executor, validated_commit

        snapshot = table.currentSnapshot()
        read_at = snapshot.snapshotId() if snapshot is not None else None
        conf = self.spark.sparkContext._jsc.hadoopConfiguration()
        mapping = self._class("org.apache.iceberg.mapping.MappingUtil").create(table.schema())
        sources = []
        for path in files:  # every footer checked before anything is written
            source = self._class(f"{_PARQUET}.hadoop.util.HadoopInputFile").fromPath(
                self._class("org.apache.hadoop.fs.Path")(path), conf)
            reader = self._class(f"{_PARQUET}.hadoop.ParquetFileReader").open(source)
            try:
                staged = reader.getFooter().getFileMetaData().getSchema()
                schema = self._class("org.apache.iceberg.parquet.ParquetSchemaUtil").applyNameMapping(staged, mapping)
            finally:
                reader.close()
            reason = self._schema_differs(table.schema(), schema, path)
            if reason is not None:
                return 0, reason
            sources.append((path, source, schema, bool(staged.equals(schema))))  # its own ids are the table's
        metrics = self._class("org.apache.iceberg.MetricsConfig").forTable(table)
        overwrite = table.newOverwrite().scanManifestsWith(same_thread_executor(self.spark))
        everything = self._class("org.apache.iceberg.expressions.Expressions").alwaysTrue()
        overwrite.overwriteByRowFilter(everything)
        if read_at is not None:
            overwrite.validateFromSnapshot(read_at)
        overwrite.conflictDetectionFilter(everything).validateNoConflictingData().validateNoConflictingDeletes()
        for path, source, schema, numbered in sources:
            overwrite.addFile(self._adopted_file(table, path, source, schema, numbered, conf, metrics))
        overwrite.set(ADOPTED_PROPERTY, batch)
        self._crash_point("copied")
        validated_commit(overwrite, table, read_at)
        self._crash_point("committed")
        return len(sources), None

    def _crash_point(self, name: str) -> None:
        if self.kill_points:
            _crash_point(name)

    def _schema_differs(self, expected, schema, path: str) -> str | None:
        """Why a staged file's schema (with the table's ids) does not read as the table's types."""
        unmapped = [field.getName() for field in schema.getFields() if field.getId() is None]
        if unmapped:
            return f"staged file {path}: the table has no column {', '.join(unmapped)}"
        found = self._class("org.apache.iceberg.parquet.ParquetSchemaUtil").convert(schema)
        for field in found.columns():
            wanted = expected.findField(field.fieldId())
            if wanted is None or not wanted.type().equals(field.type()):
                return (f"staged file {path}: column {field.name()} is Parquet {field.type()} but the table "
                        f"holds {wanted.type() if wanted is not None else 'no such column'}")
        return None

    def _adopted_file(self, table, staged: str, source, schema, numbered: bool, conf, metrics):
        """The staged file where the table keeps its data, linked (``numbered``: it carries the
        table's ids) or copied; returns its ``DataFile`` (metrics from its footer)."""
        path = table.locationProvider().newDataLocation(f"pglogical-{uuid.uuid4().hex}-adopted.parquet")
        if not (numbered and _linked(self.spark, staged, path)):
            self._copy(source, path, schema, conf)
        written = table.io().newInputFile(path)
        return (self._class("org.apache.iceberg.DataFiles").builder(table.spec())
                .withPath(path).withFileSizeInBytes(written.getLength())
                .withFormat(self._class("org.apache.iceberg.FileFormat").PARQUET)
                .withMetrics(self._class("org.apache.iceberg.parquet.ParquetUtil").fileMetrics(written, metrics))
                .build())

    def _copy(self, source, path: str, schema, conf) -> None:
        """A page-by-page copy of a staged file to ``path``, under a footer with the table's field ids."""
        target = self._class(f"{_PARQUET}.hadoop.util.HadoopOutputFile").fromPath(
            self._class("org.apache.hadoop.fs.Path")(path), conf)
        writer_class = self._class(f"{_PARQUET}.hadoop.ParquetFileWriter")
        writer = writer_class(target, schema, self._class(f"{_PARQUET}.hadoop.ParquetFileWriter$Mode").CREATE,
                              128 * 1024 * 1024, 0)
        writer.start()
        writer.appendFile(source)
        writer.end(self._class("java.util.HashMap")())


def _linked(spark, staged: str, path: str) -> bool:
    """Hard-link the staged file as ``path`` when both are on this machine's file system; False
    (nothing made, the reason logged) when they are not or the file system refuses the link.

    The link's time is set to now: to orphan removal a file is only as old as its last change,
    and an adopted file is new to its table (a staged file's own time decides nothing: staging
    retention goes by its batch's manifest)."""
    from airflow_provider_pglogical.spark.common.hadoop_files import local_path

    source, target = local_path(spark, staged), local_path(spark, path)
    if source is None or target is None:
        return False
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(source, target)
    except OSError as error:  # another file system (EXDEV), or one without links: copied instead
        log.info("staged file %s is copied, not linked, into its table: %s", staged, error)
        return False
    os.utime(target)
    return True


def _crash_point(name: str) -> None:
    """Tests only: die like a killed driver at an adoption's kill point (:data:`CRASH_VARIABLE`)."""
    if os.environ.get(CRASH_VARIABLE) == name:
        log.error("crash point reached: adoption %s", name)
        os.kill(os.getpid(), signal.SIGKILL)
