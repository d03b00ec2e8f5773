"""Remove the delete files that apply to no data file any more (a maintenance step).

**Equality deletes.** No apply writes them (invariant 17: deletes are by position, which every
engine reads). Tables written by earlier versions of this provider hold them: each row delta
committed one equality delete file per table per tick. Housekeeping converts such a table: its
``rewrite_data_files`` (``delete-file-threshold`` 1) rewrites every data file a delete applies to
with the deletes applied, and this step then removes the equality delete files left applying to
nothing. Iceberg applies an equality delete to the data files of lower data sequence number only,
so an equality delete whose data sequence number is at most the lowest of every live data file
applies to none. The lowest is taken from the data manifests' ``min_sequence_number``, which also
counts the deleted entries a manifest still lists: never higher than the truth, so a delete that
may still apply stays.

**Position deletes and deletion vectors.** A position delete names its data files by path, so once
a compaction has replaced every file it names it deletes nothing. Iceberg drops such a file only
by sequence number (a compaction that started at the delete's own sequence number keeps it), or
through ``rewrite_position_delete_files``, which Iceberg 1.10 cannot run on a table with a list or
map column (``position_delete_rewrite.py``). So this step also removes a position delete file when
no live data file lies within the bounds of the paths it names (its ``file_path`` column's lower
and upper bounds, which Iceberg keeps in full for position deletes), and a deletion vector whose
referenced data file is gone. A file without bounds stays. Removing either changes no row: no data
file a delete could name is ever added again (new data files get new paths).

Iceberg (1.9, 1.10) removes such entries only while it filters a delete manifest for another reason,
and ``RemoveDanglingDeleteFiles`` skips unpartitioned tables, hence this step. One commit, validated
from the snapshot it read.
"""

from __future__ import annotations

from bisect import bisect_left

from airflow_provider_pglogical.spark.common.java_classes import java_class

#: Iceberg's field id of a position delete file's ``file_path`` column (``MetadataColumns.DELETE_FILE_PATH``)
DELETE_FILE_PATH_ID = 2147483546


def remove_dead_deletes(spark, table_name: str) -> dict:
    """Remove ``table_name``'s delete files that apply to no data file; returns their counts by kind."""
    removed = {"removed_equality_delete_files_count": 0, "removed_position_delete_files_count": 0}
    table = java_class(spark, "org.apache.iceberg.spark.Spark3Util").loadIcebergTable(spark._jsparkSession, table_name)
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return removed
    io = table.io()
    data_manifests = list(snapshot.dataManifests(io))
    delete_manifests = list(snapshot.deleteManifests(io))
    if not data_manifests or not delete_manifests:
        return removed
    oldest_data = min(manifest.minSequenceNumber() for manifest in data_manifests)
    content = java_class(spark, "org.apache.iceberg.FileContent")
    live: list[str] | None = None  # the live data files' paths, sorted; read once, when needed
    rewrite = table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
    for manifest in delete_manifests:
        reader = java_class(spark, "org.apache.iceberg.ManifestFiles").readDeleteManifest(manifest, io, table.specs())
        try:
            entries = reader.liveEntries().iterator()
            while entries.hasNext():
                entry = entries.next()
                delete = entry.file()
                if delete.content() == content.EQUALITY_DELETES:
                    if entry.dataSequenceNumber() > oldest_data:
                        continue
                    kind = "removed_equality_delete_files_count"
                else:
                    named = _named_paths(spark, delete)
                    if named is None:
                        continue
                    if live is None:
                        live = _live_data_paths(spark, data_manifests, io, table)
                    if _any_within(live, *named):
                        continue
                    kind = "removed_position_delete_files_count"
                rewrite.deleteFile(delete.copy())
                removed[kind] += 1
        finally:
            reader.close()
    if any(removed.values()):
        rewrite.commit()
    return removed


def _named_paths(spark, delete) -> tuple[str, str] | None:
    """The lowest and highest data file path a position delete file (or deletion vector) names,
    or None when its metadata does not say."""
    referenced = delete.referencedDataFile()
    if referenced is not None:
        return str(referenced), str(referenced)
    lower, upper = delete.lowerBounds(), delete.upperBounds()
    if lower is None or upper is None:
        return None
    low, high = lower.get(DELETE_FILE_PATH_ID), upper.get(DELETE_FILE_PATH_ID)
    if low is None or high is None:
        return None
    utf8 = java_class(spark, "java.nio.charset.StandardCharsets").UTF_8
    return str(utf8.decode(low.duplicate()).toString()), str(utf8.decode(high.duplicate()).toString())


def _live_data_paths(spark, data_manifests, io, table) -> list[str]:
    """Every live data file's path, sorted."""
    paths: list[str] = []
    for manifest in data_manifests:
        reader = java_class(spark, "org.apache.iceberg.ManifestFiles").read(manifest, io, table.specs())
        try:
            files = reader.iterator()
            while files.hasNext():
                paths.append(str(files.next().location()))
        finally:
            reader.close()
    return sorted(paths)


def _any_within(paths: list[str], low: str, high: str) -> bool:
    """Whether a path of the sorted ``paths`` lies in [``low``, ``high``]."""
    at = bisect_left(paths, low)
    return at < len(paths) and paths[at] <= high
