"""Remove the equality delete files that apply to no data file any more (a maintenance step).

No apply writes equality deletes (invariant 17: deletes are by position, which every engine
reads). Tables written by earlier versions of this provider hold them: each row delta committed one
equality delete file per table per tick. Housekeeping converts such a table: its
``rewrite_data_files`` (``delete-file-threshold`` 1) rewrites every data file a delete applies
to with the deletes applied, and this step then removes the equality delete files left applying
to nothing. Iceberg applies an equality delete to the data files of lower data sequence number
only, so once those files are rewritten (with a sequence number at least the delete's) it
applies to nothing, yet stays in the table's delete manifests: Iceberg (1.9, 1.10) drops such entries
only while it filters a delete manifest for another reason, and ``RemoveDanglingDeleteFiles``
skips unpartitioned tables.

It removes them in one commit: an equality delete whose data sequence number is at most the
lowest of every live data file applies to none, so removing it changes no row. The lowest is
taken from the data manifests' ``min_sequence_number``, which also counts the deleted entries a
manifest still lists: never higher than the truth, so a delete that may still apply stays.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.common.java_classes import java_class


def remove_dead_equality_deletes(spark, table_name: str) -> dict:
    """Remove ``table_name``'s equality delete files that apply to no data file; returns their count."""
    table = java_class(spark, "org.apache.iceberg.spark.Spark3Util").loadIcebergTable(spark._jsparkSession, table_name)
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return {"removed_equality_delete_files_count": 0}
    io = table.io()
    data_manifests = list(snapshot.dataManifests(io))
    if not data_manifests:
        return {"removed_equality_delete_files_count": 0}
    oldest_data = min(manifest.minSequenceNumber() for manifest in data_manifests)
    equality = java_class(spark, "org.apache.iceberg.FileContent").EQUALITY_DELETES
    rewrite = table.newRewrite()
    removed = 0
    for manifest in snapshot.deleteManifests(io):
        if manifest.minSequenceNumber() > oldest_data:
            continue  # every delete it lists may still apply
        reader = java_class(spark, "org.apache.iceberg.ManifestFiles").readDeleteManifest(manifest, io, table.specs())
        try:
            entries = reader.liveEntries().iterator()
            while entries.hasNext():
                entry = entries.next()
                delete = entry.file()
                if delete.content() == equality and entry.dataSequenceNumber() <= oldest_data:
                    rewrite.deleteFile(delete.copy())
                    removed += 1
        finally:
            reader.close()
    if removed:
        rewrite.commit()
    return {"removed_equality_delete_files_count": removed}
