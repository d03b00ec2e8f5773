"""Which batch directories of a pipeline's staging hold a manifest, on a Hadoop file system.

A batch is committed once its ``_manifest.json`` is written, and stays so until the apply's
retention removes it (manifest first, ``hadoop_files.Staging.remove_batch``). So a listing of the
pipeline's directory, and a question for the manifest only of a batch directory not known committed
yet, says what a glob of ``*/_manifest.json`` says. The glob asked for every batch's manifest at
each call (a HEAD each on an object store), a streaming window's poll too: with a week of retained
batches, hundreds of requests a poll where this makes one listing.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_provider_pglogical.spark.common.batch import Batch
from airflow_provider_pglogical.staging.contract import MANIFEST


def committed_directories(fs, path: Callable[[str], object], directory: str,
                          known: dict[str, int]) -> list[tuple[str, Callable[[], int]]]:
    """(batch directory name, how to ask its manifest's modification time in ms) of every batch
    directory under ``directory`` holding a manifest; ``known``: the committed ones seen before,
    name -> that time, whose manifests are not asked for again.

    :param fs: the directory's Hadoop ``FileSystem`` (Java); ``path`` makes its ``Path`` of a URI.
    """
    try:
        children = fs.listStatus(path(directory))
    except Exception as error:  # py4j's: no such directory (nothing staged yet), as the glob found nothing
        if "FileNotFoundException" not in str(error):
            raise
        return []
    listed: list[tuple[str, Callable[[], int]]] = []
    for status in children:
        name = status.getPath().getName()
        if not status.isDirectory() or Batch.parse(name) is None:
            continue
        if name in known:
            listed.append((name, lambda ms=known[name]: ms))
            continue
        manifest = fs.globStatus(path(f"{directory}/{name}/{MANIFEST}"))  # None when there is none
        if manifest:
            listed.append((name, manifest[0].getModificationTime))
    return listed
