"""Deletes of a driver's row delta on a format v3 table: deletion vectors, not position delete files.

A v3 table holds at most one deletion vector per data file (a Roaring bitmap of deleted positions
in a Puffin file). Iceberg's own ``BaseDVFileWriter`` writes them: it merges each data file's
previous vector into the new one, and names the previous ones, which the row delta removes in the
same commit. The previous vectors are read at the snapshot the step read (``read_at``), so the
row delta's validation (``validateFromSnapshot``, no conflicting delete files) refuses a commit
racing another writer's vector of the same file.

The writer asks for each data file's previous deletes through a ``java.util.function.Function``.
A Python function cannot be one without a py4j callback server, so the map of previous vectors
becomes one through the JDK's ``MethodHandleProxies`` (``Map.get`` bound to the map).
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.common.java_classes import java_class

#: what :func:`deletion_vectors` returns: the new vectors to add, the previous ones to remove
DeletionVectors = tuple[list, list]


def previous_vectors(spark, table, read_at: int, data_files: set[str]) -> dict:
    """Data file -> its deletion vector (a ``DeleteFile``) at snapshot ``read_at``, for ``data_files``."""
    is_dv = java_class(spark, "org.apache.iceberg.util.ContentFileUtil").isDV
    tasks = table.newScan().useSnapshot(read_at).planFiles()
    found = {}
    try:
        iterator = tasks.iterator()
        while iterator.hasNext():
            task = iterator.next()
            location = task.file().location()
            if location in data_files:
                for delete in task.deletes():
                    if is_dv(delete):
                        found[location] = delete
    finally:
        tasks.close()
    return found


def _read_vector(spark, table, vector):
    """A deletion vector's positions (a ``PositionDeleteIndex``), read from its Puffin blob."""
    stream = table.io().newInputFile(vector.location()).newStream()
    try:
        stream.seek(vector.contentOffset())
        blob = stream.readNBytes(vector.contentSizeInBytes())
    finally:
        stream.close()
    return java_class(spark, "org.apache.iceberg.deletes.PositionDeleteIndex").deserialize(blob, vector)


def _map_function(spark, mapping):
    """``mapping`` (a Java ``Map``) as a ``java.util.function.Function`` (``Map.get``; null when absent)."""
    jvm = spark.sparkContext._gateway.jvm
    classes = jvm.java.lang.Class
    anything = classes.forName("java.lang.Object")
    get = jvm.java.lang.invoke.MethodHandles.publicLookup().findVirtual(
        classes.forName("java.util.Map"), "get", jvm.java.lang.invoke.MethodType.methodType(anything, anything))
    return jvm.java.lang.invoke.MethodHandleProxies.asInterfaceInstance(
        classes.forName("java.util.function.Function"), get.bindTo(mapping))


def deletion_vectors(spark, table, deletes: list[tuple[str, int]], read_at: int | None) -> DeletionVectors:
    """The deletion vectors deleting ``deletes`` ((data file, position) pairs read at ``read_at``),
    each merged with its data file's previous vector; and those previous vectors."""
    if not deletes:
        return [], []
    previous = java_class(spark, "java.util.HashMap")()
    if read_at is not None:
        for location, vector in previous_vectors(spark, table, read_at, {file for file, _ in deletes}).items():
            previous.put(location, _read_vector(spark, table, vector))
    files = (java_class(spark, "org.apache.iceberg.io.OutputFileFactory").builderFor(table, 1, 1)
             .format(java_class(spark, "org.apache.iceberg.FileFormat").PUFFIN).build())
    writer = java_class(spark, "org.apache.iceberg.deletes.BaseDVFileWriter")(files, _map_function(spark, previous))
    spec = table.spec()
    try:
        for file, position in sorted(set(deletes)):
            writer.delete(file, position, spec, None)
    finally:
        writer.close()
    result = writer.result()
    return list(result.deleteFiles()), list(result.rewrittenDeleteFiles())
