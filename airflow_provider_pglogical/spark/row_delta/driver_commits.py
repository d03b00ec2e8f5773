"""Iceberg commits the job's driver writes itself, without a Spark job: Parquet files written
with pyarrow through the table's own FileIO (so any warehouse URI works), their metrics read by
Iceberg's ``ParquetUtil``, and one commit.

A Spark write costs every commit its planning and jobs, 0.3-0.5 s of a 2-core machine for a
few rows. Deletes are by position, never by equality (every engine reads them: Spark, DuckDB,
pyiceberg, Trino, Snowflake, Databricks): a row delta names the data file and position of every
row it replaces, which the step read through Iceberg's reader. The row deltas (``row_deltas.py``, ``multiset_row_deltas.py``) and the state commit
that ends each round (``state_table.py``) are small enough to write here instead.

No commit here is blind: each names the snapshot its step read and refuses (Iceberg's
``ValidationException``, raised as :class:`ConcurrentCommit`) when another commit added data or
deletes since, so Iceberg's retry of a commit that lost a race can never apply a change twice.
The apply's lease (:class:`ApplyLease`) keeps a second apply of the pipeline from starting at all.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import uuid

from airflow_provider_pglogical.spark.common.commit_stamp import stamp
from airflow_provider_pglogical.spark.common.hadoop_files import local_path
from airflow_provider_pglogical.spark.row_delta.deletion_vectors import deletion_vectors
from airflow_provider_pglogical.spark.common.java_classes import java_class
from airflow_provider_pglogical.spark.common.errors import ApplyError

log = logging.getLogger("pglogical.apply")

#: the oldest pyarrow the driver's files are written with (``concat_tables(promote_options=…)``)
MIN_PYARROW = 14


def pyarrow_missing() -> str | None:
    """Why the driver cannot write Parquet files itself (no pyarrow, or too old); None when it can."""
    if importlib.util.find_spec("pyarrow") is None:
        return "pyarrow is not installed where the driver runs"
    if int(importlib.metadata.version("pyarrow").split(".")[0]) < MIN_PYARROW:
        return f"pyarrow where the driver runs is older than {MIN_PYARROW}"
    return None


def same_thread_executor(spark):
    """An executor that runs each task in the calling thread. Iceberg's worker pool would run a
    commit's (or a small scan's) few manifest reads and writes on other threads and poll them
    every 10 ms (``Tasks.waitFor``): most of a small commit's time. Guava's public direct executor
    (Guava is on every Spark's class path: 14 in Spark 3.5, where it is ``sameThreadExecutor``)."""
    from py4j.protocol import Py4JError

    executors = java_class(spark, "com.google.common.util.concurrent.MoreExecutors")
    try:
        return executors.newDirectExecutorService()  # Guava 18 and later
    except Py4JError:
        return executors.sameThreadExecutor()


class ConcurrentCommit(ApplyError):
    """Another commit changed a table after this step read it: nothing of the step was committed;
    a retry reads the table again.

    :param read_at: the snapshot the step read (None: the table had none)."""

    permanent = False

    def __init__(self, message: str, read_at: int | None = None) -> None:
        super().__init__(message)
        self.read_at = read_at


def only_compacted_since(table, read_at: int | None) -> bool:
    """Whether every commit to ``table`` (Java, refreshed here) after snapshot ``read_at`` rewrote
    files without changing a row (a compaction: Iceberg's ``replace`` operation). A row delta that
    lost to one may read its rows again and commit: what it computed from staging is unchanged."""
    if read_at is None:
        return False
    table.refresh()
    snapshot = table.currentSnapshot()
    while snapshot is not None and snapshot.snapshotId() != read_at:
        if snapshot.operation() != "replace":
            return False
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None
    return snapshot is not None


def java_exception_class(error: BaseException) -> str | None:
    """The Java class name of the exception behind a py4j error (None for a Python error)."""
    java = getattr(error, "java_exception", None)
    return java.getClass().getName() if java is not None else None


def committed_snapshot(spark, update) -> int:
    """The snapshot a committed Iceberg update (``RowDelta``, ``OverwriteFiles``) made, without a
    request: ``updateEvent()``, the public way, loads the table again first (``ops.refresh()``),
    which on a REST catalog is a GET of the whole table's metadata per commit, on JDBC a query. The
    id is the update's own (``SnapshotProducer.snapshotId()``, what ``updateEvent`` reports),
    read by reflection; an Iceberg without that method falls back to ``updateEvent()``."""
    from py4j.protocol import Py4JError

    try:
        method = java_class(spark, "org.apache.iceberg.SnapshotProducer")._java_lang_class.getDeclaredMethod(
            "snapshotId", spark.sparkContext._gateway.new_array(java_class(spark, "java.lang.Class"), 0))
        method.setAccessible(True)
        return int(method.invoke(update, spark.sparkContext._gateway.new_array(java_class(spark, "java.lang.Object"), 0)))
    except (Py4JError, LookupError) as error:  # another Iceberg's internals: the public way
        log.debug("the update's snapshot id by updateEvent(): %s", error)
        return int(update.updateEvent().snapshotId())


def validated_commit(update, table, read_at: int | None) -> None:
    """Commit an Iceberg update that validates against concurrent commits; a conflict is raised as
    :class:`ConcurrentCommit`, naming the table and the fix."""
    stamp(update)  # the running step's position and batch, in the snapshot's summary
    try:
        update.commit()
    except Exception as error:
        if java_exception_class(error) == "org.apache.iceberg.exceptions.ValidationException":
            raise _conflict(table.name(), read_at, error.java_exception) from None
        if expired_base(error):
            raise _conflict(table.name(), read_at, error) from None
        raise


def expired_base(error: BaseException) -> bool:
    """Whether a commit was refused because the snapshot its step read was expired meanwhile
    (housekeeping's ``expire_snapshots`` beside the apply): Iceberg's validation cannot walk back to
    it and raises before committing anything, so the step is run again like any other conflict."""
    from pyspark.errors.exceptions.captured import IllegalArgumentException  # PySpark's own for the JVM's

    java = getattr(error, "java_exception", None)
    if java is not None:
        return (java.getClass().getName() == "java.lang.IllegalArgumentException"
                and "is not an ancestor of" in (java.getMessage() or ""))
    return isinstance(error, IllegalArgumentException) and "is not an ancestor of" in str(error)


def _conflict(name: str, read_at: int | None, cause) -> ConcurrentCommit:
    return ConcurrentCommit(
        f"table {name}: another commit added rows or deletes after this step read it (at snapshot {read_at}): "
        f"{cause.getMessage() if hasattr(cause, 'getMessage') else cause}. Nothing of this step was committed. Run one apply per pipeline at a time "
        "(max_active_tis_per_dag=1 on the apply task) and do not write to the pipeline's tables otherwise; "
        "the next apply applies the step again from what the table holds then.", read_at)


#: the snapshot summary property naming a Spark overwrite of this job (:func:`validated_overwrite`)
SPARK_WRITE_PROPERTY = "pglogical.spark-write"


def validated_overwrite(lakehouse, target: str, frame, condition, read_at: int | None) -> int | None:
    """Overwrite ``target``'s rows matching ``condition`` with ``frame`` by a Spark write that refuses
    (:class:`ConcurrentCommit`) when another commit added data or deletes matching it after ``read_at``
    (None: since the first snapshot), as the driver's own commits do. Returns this write's snapshot,
    found by a marker in its summary (the newest may be another writer's), or None if none was made."""
    marker, name = uuid.uuid4().hex, lakehouse.name(target)
    writer = frame.writeTo(name).option("isolation-level", "serializable").option(
        f"snapshot-property.{SPARK_WRITE_PROPERTY}", marker)
    try:
        (writer.option("validate-from-snapshot-id", str(read_at)) if read_at is not None else writer).overwrite(condition)
    except Exception as error:
        cause = getattr(error, "java_exception", None)
        while cause is not None and cause.getClass().getName() != "org.apache.iceberg.exceptions.ValidationException":
            cause = cause.getCause()
        if cause is None:
            raise
        raise _conflict(name, read_at, cause) from None
    table = lakehouse.iceberg_table(target)
    snapshot = table.currentSnapshot()
    while snapshot is not None and snapshot.summary().get(SPARK_WRITE_PROPERTY) != marker:
        snapshot = table.snapshot(snapshot.parentId()) if snapshot.parentId() is not None else None
    return snapshot.snapshotId() if snapshot is not None else None


class DriverCommits:
    """Writes Parquet files into a lakehouse table and commits them from the driver."""

    def __init__(self, spark, lakehouse) -> None:
        self.spark = spark
        self.lakehouse = lakehouse
        self._gateway = spark.sparkContext._gateway

    def load(self, target: str):
        """The Iceberg table (Java) as Spark's catalog holds it: a commit here is what Spark reads next."""
        return self.lakehouse.iceberg_table(target)

    def row_delta(self, table, data, deletes: list[tuple[str, int]], *, read_at: int | None) -> int | None:
        """Commit ``data`` (an Arrow table with field ids) as a data file and ``deletes`` (the data
        file and position of every row it replaces, read at ``read_at`` through Iceberg's reader) as
        a position delete file, in one ``RowDelta``; an empty file is left out. Returns the snapshot
        committed, or None when both are empty (nothing is committed).

        :param read_at: the snapshot the step read the table at (None: it had none). The commit
            refuses (:class:`ConcurrentCommit`) when any data or delete file was added to the
            table since, or a data file a delete points into was removed (a compaction that
            rewrote it): the step computed its rows and positions from what it read, and a retry
            on top of another writer's commit would apply the change twice or delete nothing."""
        metrics = java_class(self.spark, "org.apache.iceberg.MetricsConfig").forTable(table)
        parquet = java_class(self.spark, "org.apache.iceberg.FileFormat").PARQUET
        delta = table.newRowDelta().scanManifestsWith(self._same_thread())
        if read_at is not None:
            delta.validateFromSnapshot(read_at)
        everything = java_class(self.spark, "org.apache.iceberg.expressions.Expressions").alwaysTrue()
        delta.conflictDetectionFilter(everything).validateNoConflictingDataFiles().validateNoConflictingDeleteFiles()
        if data.num_rows:
            path, written = self._write(table, data, "data")
            delta.addRows(java_class(self.spark, "org.apache.iceberg.DataFiles").builder(table.spec())
                          .withPath(path).withFileSizeInBytes(len(written)).withFormat(parquet)
                          .withMetrics(self._metrics(path, written, metrics)).build())
        if deletes and table.operations().current().formatVersion() >= 3:  # one deletion vector per data file
            added, replaced = deletion_vectors(self.spark, table, deletes, read_at)
            for vector in added:
                delta.addDeletes(vector)
            for vector in replaced:
                delta.removeDeletes(vector)
            delta.validateDataFilesExist(sorted({file for file, _ in deletes})).validateDeletedFiles()
        elif deletes:
            delta.addDeletes(self._position_deletes(table, deletes))
            delta.validateDataFilesExist(sorted({file for file, _ in deletes})).validateDeletedFiles()
        if not (data.num_rows or deletes):
            return None
        validated_commit(delta, table, read_at)
        return committed_snapshot(self.spark, delta)  # this commit's, whatever committed after it

    def with_row_ids(self, data, table, rows: list[tuple | None]):
        """``data`` with format v3's ``_row_id`` column: each row the id of the row it replaces (the
        lookup's tuples end with ``_row_id``, ``_file``, ``_pos``), a new row none (Iceberg assigns
        one at commit). ``_last_updated_sequence_number`` is left out: the commit's is inherited."""
        import pyarrow as pa

        row_id = java_class(self.spark, "org.apache.iceberg.MetadataColumns").ROW_ID
        field = pa.field(row_id.name(), pa.int64(), nullable=True,
                         metadata={b"PARQUET:field_id": str(row_id.fieldId()).encode()})
        ids = pa.array([row[-3] if row is not None else None for row in rows], type=pa.int64())
        return data.append_column(field, ids)

    def _position_deletes(self, table, deletes: list[tuple[str, int]]):
        """A position delete file of ``deletes`` ((data file, position) pairs) in the spec's schema
        (``file_path``, ``pos``, with their reserved field ids; sorted by file and position),
        written with pyarrow and stored as the data files are; returns its ``DeleteFile``, with
        metrics by ``MetricsConfig.forPositionDelete``. Iceberg's own ``PositionDeleteWriter`` took
        two py4j round trips per position (most of a 100-row step's commit under load)."""
        import pyarrow as pa

        metadata = java_class(self.spark, "org.apache.iceberg.MetadataColumns")
        columns = [(metadata.DELETE_FILE_PATH, pa.string()), (metadata.DELETE_FILE_POS, pa.int64())]
        schema = pa.schema([pa.field(column.name(), kind, nullable=False,
                                     metadata={b"PARQUET:field_id": str(column.fieldId()).encode()})
                            for column, kind in columns])
        ordered = sorted(set(deletes))
        frame = pa.Table.from_arrays([pa.array([file for file, _ in ordered], pa.string()),
                                      pa.array([position for _, position in ordered], pa.int64())], schema=schema)
        path, written = self._write(table, frame, "deletes")
        config = java_class(self.spark, "org.apache.iceberg.MetricsConfig").forPositionDelete(table)
        builder = (java_class(self.spark, "org.apache.iceberg.FileMetadata").deleteFileBuilder(table.spec())
                   .ofPositionDeletes().withPath(path).withFileSizeInBytes(len(written))
                   .withFormat(java_class(self.spark, "org.apache.iceberg.FileFormat").PARQUET)
                   .withMetrics(self._metrics(path, written, config)))
        files = {file for file, _ in ordered}
        if len(files) == 1:  # as Iceberg's writer does: planning applies the file to that data file only
            builder = builder.withReferencedDataFile(next(iter(files)))
        return builder.build()

    def replace_partition(self, table, data, column: str, value: str, *, read_at: int | None) -> int:
        """Replace the rows of identity partition ``column`` = ``value`` with ``data`` (an Arrow
        table with field ids), in one ``OverwriteFiles`` commit; returns its snapshot.

        :param read_at: the snapshot the partition was read at (None: the table had none); the
            commit refuses (:class:`ConcurrentCommit`) when another commit changed the partition
            since."""
        metrics = java_class(self.spark, "org.apache.iceberg.MetricsConfig").forTable(table)
        path, contents = self._write(table, data, "data")
        written = (java_class(self.spark, "org.apache.iceberg.DataFiles").builder(table.spec())
                   .withPath(path).withFileSizeInBytes(len(contents))
                   .withFormat(java_class(self.spark, "org.apache.iceberg.FileFormat").PARQUET)
                   .withPartitionValues([value]).withMetrics(self._metrics(path, contents, metrics)).build())
        matching = java_class(self.spark, "org.apache.iceberg.expressions.Expressions").equal(column, value)
        overwrite = table.newOverwrite().scanManifestsWith(self._same_thread()).overwriteByRowFilter(matching)
        if read_at is not None:
            overwrite.validateFromSnapshot(read_at)
        overwrite.conflictDetectionFilter(matching).validateNoConflictingData().validateNoConflictingDeletes()
        validated_commit(overwrite.addFile(written), table, read_at)
        return committed_snapshot(self.spark, overwrite)

    def _same_thread(self):
        return same_thread_executor(self.spark)

    # files -------------------------------------------------------------------------------------
    def _write(self, table, frame, kind: str) -> tuple[str, bytes]:
        """Write ``frame`` as a Parquet file where the table keeps its data; returns its location
        and the bytes written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(frame, sink, compression="zstd")
        written = sink.getvalue().to_pybytes()
        path = table.locationProvider().newDataLocation(f"pglogical-{uuid.uuid4().hex}-{kind}.parquet")
        self._store(table, path, written)
        return path, written

    def _store(self, table, path: str, written: bytes) -> None:
        """Store ``written`` as the new file ``path`` of the table (never replacing a file)."""
        local = local_path(self.spark, path)
        if local is not None:  # see hadoop_files: py4j's byte[] and Hadoop's chmod forks cost more
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "xb") as file:  # a new name: never replaces a file
                file.write(written)
        else:
            out = table.io().newOutputFile(path).create()
            try:
                out.write(bytearray(written))
            finally:
                out.close()

    def _metrics(self, path: str, written: bytes, config):
        """Column bounds and counts of the file just written, by Iceberg's own public reader of a
        Parquet footer (``ParquetUtil.fileMetrics``), over the very bytes written rather than the
        file read back: on S3 that read was three requests per file (a HEAD, the footer's length,
        the footer), two files per row delta."""
        contents = java_class(self.spark, "org.apache.iceberg.inmemory.InMemoryInputFile")(path, bytearray(written))
        return java_class(self.spark, "org.apache.iceberg.parquet.ParquetUtil").fileMetrics(contents, config)

    def arrow_field(self, schema, name: str, kind):
        """The Arrow field of Iceberg column ``name``: its field id (and its list element's), required or not."""
        import pyarrow as pa

        field = schema.findField(name)
        if pa.types.is_list(kind):
            element_id = field.type().asListType().elementId()
            kind = pa.list_(pa.field("element", kind.value_type, metadata={b"PARQUET:field_id": str(element_id).encode()}))
        return pa.field(name, kind, nullable=field.isOptional(),
                        metadata={b"PARQUET:field_id": str(field.fieldId()).encode()})
