"""Files the jobs read and write through Spark's Hadoop FileSystem (file://, s3a://, gs://, hdfs://).

The job reads staging where the executors can: a driver in a cluster has no local copy, so
listing and manifests go through the same FileSystem the Parquet reader uses. A whole file the
driver reads or writes itself on a ``file:`` location is read or written by Python: py4j carries
a ``byte[]`` at about 1.7 MB/s (51 ms for an 87 kB file here), and Hadoop's local file system
forks ``chmod`` for each file it creates where it has no native library. A staged file or a
table's metadata file damaged by hand is named, with its fix (``damaged_file_error``,
``unreadable_table_error``), instead of the reader's raw error. What Python writes on a
``file:`` location is created with the staging mode (private unless the operator widened it:
``contract.STAGING_FILE_MODE_CONF``), as the Python side's files are.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_pglogical.spark.common.java_classes import java_class
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.common.rereads import reread
from airflow_provider_pglogical.spark.common.batch import Batch
from airflow_provider_pglogical.spark.common.batch_listing import committed_directories
from airflow_provider_pglogical.staging.contract import (
    FOLDED_FROM,
    MANIFEST,
    RESULT_CONF,
    STAGING_FILE_MODE_CONF,
    format_lsn,
    staging_directory_mode,
    staging_file_mode,
)
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest

log = logging.getLogger(__name__)


def local_path(spark, uri: str) -> str | None:
    """The path on this machine of ``uri`` when Hadoop reads it from the local file system (the
    ``file`` scheme, no authority), else None. Hadoop's own ``Path`` parses the URI, so Python
    opens exactly the file Hadoop would; the plain forms Iceberg writes (``file:/a/b``,
    ``file:///a/b``) are parsed here, as Hadoop does, without its four calls to the JVM."""
    plain = _plain_file_path(uri)
    if plain is not None:
        return plain
    parsed = java_class(spark, "org.apache.hadoop.fs.Path")(uri).toUri()
    if parsed.getScheme() != "file" or parsed.getAuthority():
        return None
    return parsed.getPath()


def _plain_file_path(uri: str) -> str | None:
    """The path of a ``file:/a/b`` or ``file:///a/b`` URI whose path Hadoop's ``Path`` keeps as it
    is (no ``%``, ``\\``, ``:``, empty, ``.`` or ``..`` segment, nor trailing slash); None for
    anything else, which Hadoop parses."""
    if uri.startswith("file:///"):
        path = uri[len("file://"):]
    elif uri.startswith("file:/") and not uri.startswith("file://"):
        path = uri[len("file:"):]
    else:
        return None
    if any(c in path for c in "%\\:?#") or path.endswith("/") \
            or any(part in ("", ".", "..") for part in path[1:].split("/")):
        return None
    return path


#: staged bytes on an object store the driver hashes itself rather than in a Spark job over the
#: executors: the first Spark job of an apply's fresh JVM costs seconds (50 tables' 260 kB on S3:
#: planning 6.1 s, against 0.5 s on local disk), py4j carries 4 MB in about 0.25 s (4-20 MB/s by
#: size, 2026-11-28), and the row deltas apply the bytes read here without reading them again
DRIVER_HASH_BYTES = 4 * 1024 * 1024
#: object-store reads the driver runs at once to hash small staged files: each waits on a round trip
DRIVER_READS = 8


def _file_mode(spark) -> int:
    return staging_file_mode(spark.conf.get(STAGING_FILE_MODE_CONF, None))


def _make_local_dirs(directory: str, file_mode: int) -> None:
    """``mkdir -p``; the directories it creates get the staging directory mode."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        os.chmod(path, staging_directory_mode(file_mode))


def _write_local(path: str, data: bytes, file_mode: int) -> None:
    """Write a whole local file through a temporary name and an atomic rename, with the staging mode."""
    _make_local_dirs(os.path.dirname(path), file_mode)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode)
    os.fchmod(fd, file_mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(tmp, path)


#: what Spark's Parquet reader and pyarrow say of a file that is not whole Parquet
_DAMAGED_PARQUET = ("is not a Parquet file", "magic bytes not found", "CANNOT_READ_FILE_FOOTER", "Could not read footer",
                    "Couldn't deserialize thrift", "Unexpected end of stream", "FAILED_READ_FILE")


def damaged_file_error(error: Exception, files: list[str], batch: str, source: str) -> ApplyError | None:
    """An :class:`ApplyError` naming the staged file a step could not read as Parquet (from Spark's or
    pyarrow's raw error), the batch and the fix; None for any other error."""
    text = str(error)
    marker = next((m for m in _DAMAGED_PARQUET if m in text), None)
    if marker is None:
        return None
    named = [path for path in files if path.rsplit("/", 1)[-1] in text]
    line = next(line.strip() for line in text.splitlines() if marker in line)
    if not named and len(files) == 1:  # the driver's own read names no file: its step has one
        named = files
    return ApplyError(
        f"batch {batch}, table {source}: staged file {named[0] if named else 'one of ' + ', '.join(files)} cannot "
        f"be read as Parquet ({line[:300]}); it changed after the batch was committed (truncated or overwritten). "
        f"This step was not applied. Fix: run a backfill of {source} (PgBackfillOperator): its snapshot replaces "
        "this batch for the table; or restore the file from a copy"
    )


def unreadable_table_error(error: Exception, table: str) -> ApplyError | None:
    """An :class:`ApplyError` naming an Iceberg table whose current metadata file is gone or damaged
    (from py4j's raw error when the catalog loads it) and the fixes; None for any other error."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if "Exception" in line and "metadata" in line.lower()]
    if not lines or not any(word in text for word in ("is missing", "NotFound", "not found", "does not exist",
                                                        "Failed to open", "Cannot parse", "JsonParse")):
        return None
    return ApplyError(
        f"Iceberg table {table} cannot be loaded: its current metadata file is missing or damaged "
        f"({lines[0][:300]}). Nothing was applied. Fix: restore that file from a backup; or drop the table (DROP "
        f"TABLE {table} PURGE; with a Hadoop catalog, remove the table's directory) and the next apply rebuilds "
        "it from staging (a backfill, if staging retention removed its history)"
    )


class Staging:
    """One pipeline's staged batches: ``<root>/<pipeline>/<batch>/``."""

    def __init__(self, spark, root: str, pipeline: str) -> None:
        self.spark = spark
        self.directory = root.rstrip("/") + "/" + pipeline
        self._fs = self._path(self.directory).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        #: small object-store files the driver read to hash them: the row deltas apply these bytes,
        #: the ones proven equal to the manifest, without reading them again
        self._checked: dict[str, bytes] = {}
        #: per committed batch still listed: its manifest's modification time and (once read) the
        #: manifest. A committed manifest does not change, and a window lists and plans every
        #: round: without these a round read every manifest since the position of the table that
        #: changed least (a table no change touches keeps its position), one py4j read each
        self._committed_ms: dict[str, int] = {}
        self._manifests: dict[str, BatchManifest] = {}

    def _path(self, uri: str):
        return java_class(self.spark, "org.apache.hadoop.fs.Path")(uri)

    def committed(self) -> list[Batch]:
        """Every batch with a manifest, in name order (manifests not read yet); elsewhere than on the
        local disk by one listing, a manifest asked for only where not known (``batch_listing.py``)."""
        # (the batch directory's name, how to ask its manifest's modification time)
        local = local_path(self.spark, self.directory)
        if local is not None:  # Python's listing: no py4j call per batch (0.1-0.3 s a round for 500 batches)
            listed = [(os.path.basename(os.path.dirname(path)),
                       lambda path=path: os.stat(path).st_mtime_ns // 1_000_000)
                      for path in glob.glob(os.path.join(glob.escape(local), "*", MANIFEST))]
        else:
            listed = committed_directories(self._fs, self._path, self.directory, self._committed_ms)
        found, times = [], {}
        for directory, modified in listed:
            batch = Batch.parse(directory)
            if batch:
                known = self._committed_ms.get(batch.name)
                batch.committed_ms = times[batch.name] = known if known is not None else modified()
                found.append(batch)
        self._committed_ms = times  # a batch no longer listed is forgotten with its manifest
        self._manifests = {name: manifest for name, manifest in self._manifests.items() if name in times}
        return sorted(found, key=lambda batch: batch.name)

    def uncommitted(self, committed: list[Batch]) -> list[Batch]:
        """Batch directories without a manifest: a pull writing one now, a dead attempt's
        leftovers, or a batch whose manifest was deleted (one listing of the pipeline's directory)."""
        names = {batch.name for batch in committed}
        found = [Batch.parse(status.getPath().getName()) for status in self._fs.listStatus(self._path(self.directory))
                 if status.isDirectory()]
        return sorted((batch for batch in found if batch and batch.name not in names), key=lambda batch: batch.name)

    def damaged_files(self, reads: dict[str, tuple[Batch, set[str]]]) -> list[str]:
        """Files the steps will read that differ from their manifest: missing, of another size, or
        of another SHA-256. Sizes come from one listing per batch; every file is read once more
        to hash it (by Python on ``file:`` and for a few small files on an object store, else by one
        Spark job on the executors): on the order of a second per GB. Files staged before sizes and
        hashes were recorded are not checked."""
        problems, expected, lengths = [], {}, {}
        for batch, sources in reads.values():
            directory = self._path(f"{self.directory}/{batch.name}")
            sizes = {status.getPath().getName(): status.getLen() for status in self._fs.listStatus(directory)}
            for source in sorted(sources):
                for entry in batch.manifest.tables[source].files:
                    name, size = entry.path, entry.size
                    if name not in sizes:
                        problems.append(_damaged(batch, source, name, "is missing"))
                    elif size is not None and sizes[name] != size:
                        problems.append(_damaged(batch, source, name, f"is {sizes[name]:,} bytes, its manifest says "
                                                                      f"{size:,} (truncated or replaced)"))
                    elif entry.sha256:
                        expected[f"{self.directory}/{batch.name}/{name}"] = (batch, source, name, entry.sha256)
                        lengths[f"{self.directory}/{batch.name}/{name}"] = sizes[name]
        actual = self._sha256(list(expected), lengths)
        for uri, (batch, source, name, sha256) in expected.items():
            if actual.get(_batch_file(uri)) != sha256:
                problems.append(_damaged(batch, source, name, "has other bytes than were staged (its SHA-256 differs "
                                                              "from the manifest's)"))
        return problems

    def _sha256(self, uris: list[str], lengths: dict[str, int] | None = None) -> dict[str, str]:
        """``{"<batch>/<file>": SHA-256 hex}`` of staged files: read by the driver on ``file:``, and on
        an object store while they are small in all (``lengths``): a Spark job costs seconds there."""
        out, remote = {}, []
        for uri in uris:
            local = local_path(self.spark, uri)
            if local is None:
                remote.append(uri)
                continue
            digest = hashlib.sha256()
            with open(local, "rb") as file:
                for chunk in iter(lambda: file.read(1 << 20), b""):
                    digest.update(chunk)
            out[_batch_file(uri)] = digest.hexdigest()
        if remote and sum((lengths or {}).get(uri, DRIVER_HASH_BYTES) for uri in remote) < DRIVER_HASH_BYTES:
            # one round trip each: side by side (50 tables' files on S3 took 6.6 s one after another)
            with ThreadPoolExecutor(max_workers=min(DRIVER_READS, len(remote)), thread_name_prefix="pglogical-hash") as pool:
                read = dict(zip(remote, pool.map(lambda uri: self._bytes(self._path(uri)), remote)))
            self._checked.update(read)
            out.update((_batch_file(uri), hashlib.sha256(data).hexdigest()) for uri, data in read.items())
            remote = []
        if remote:
            hashed = self.spark.sparkContext.binaryFiles(",".join(remote)).map(_sha256_of).collect()
            out.update((_batch_file(uri), digest) for uri, digest in hashed)
        return out

    def read_file(self, name: str) -> dict | None:
        """A small JSON file of the pipeline's (``<root>/<pipeline>/<name>``); None when absent. Read
        again when another process replaced it meanwhile (``rereads.py``)."""
        return reread(lambda: self._read_file(name), name)

    def _read_file(self, name: str) -> dict | None:
        path = self._path(f"{self.directory}/{name}")
        if not self._fs.exists(path):
            # killed between removing the old file and renaming the new one into place (below):
            # the temporary file was complete before the old one went
            path = self._path(f"{self.directory}/{name}.tmp")
            if not self._fs.exists(path):
                return None
        return json.loads(self._read(path))

    def write_file(self, name: str, data: dict) -> None:
        """Write a small JSON file of the pipeline's through a temporary name and a rename."""
        self.write_text(name, json.dumps(data, indent=1, sort_keys=True))

    def read_text(self, name: str) -> str | None:
        """A small text file of the pipeline's (``<root>/<pipeline>/<name>``); None when absent."""
        path = self._path(f"{self.directory}/{name}")
        return reread(lambda: self._read(path) if self._fs.exists(path) else None, name)

    def write_text(self, name: str, text: str) -> None:
        """Write a small text file of the pipeline's through a temporary name and a rename."""
        local = local_path(self.spark, f"{self.directory}/{name}")
        if local is not None:
            _write_local(local, text.encode(), _file_mode(self.spark))
            return
        path, tmp = self._path(f"{self.directory}/{name}"), self._path(f"{self.directory}/{name}.tmp")
        out = self._fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        self._fs.delete(path, False)  # Hadoop's rename does not replace an existing file
        if not self._fs.rename(tmp, path):
            raise OSError(f"could not rename {tmp} to {path}")

    def remove_batch(self, name: str, archive: str | None = None) -> None:
        """Remove a batch: its manifest first (the batch is no longer committed), then the rest;
        or, with ``archive``, move the whole directory there."""
        directory = self._path(f"{self.directory}/{name}")
        self._committed_ms.pop(name, None)
        if archive is not None:
            local = local_path(self.spark, f"{self.directory}/{archive}")
            if local is not None:
                _make_local_dirs(local, _file_mode(self.spark))
            else:
                self._fs.mkdirs(self._path(f"{self.directory}/{archive}"))
            target = self._path(f"{self.directory}/{archive}/{name}")
            if self._fs.exists(directory):
                self._fs.delete(target, True)  # what a killed earlier move left
                if not self._fs.rename(directory, target):
                    raise OSError(f"could not move batch {name} under {archive}")
            return
        self._fs.delete(self._path(f"{self.directory}/{name}/{MANIFEST}"), False)
        self._fs.delete(directory, True)

    def _read(self, path) -> str:
        return self._bytes(path).decode("utf-8")

    def _bytes(self, path) -> bytes:
        local = local_path(self.spark, path.toString())
        if local is not None:
            with open(local, "rb") as file:
                return file.read()
        stream = self._fs.open(path)
        try:
            return bytes(java_class(self.spark, "org.apache.commons.io.IOUtils").toByteArray(stream))
        finally:
            stream.close()

    def read_bytes(self, uri: str) -> bytes:
        """A whole (small) staged file, for the driver to read itself (``row_deltas.py``): the bytes
        :meth:`damaged_files` hashed, when it read them."""
        checked = self._checked.pop(uri, None)
        return checked if checked is not None else self._bytes(self._path(uri))

    def read_manifest(self, batch: Batch) -> BatchManifest:
        """The batch's manifest, typed (a copy: read once while the batch stays listed, see ``__init__``)."""
        if batch.name not in self._manifests:
            text = self._read(self._path(f"{self.directory}/{batch.name}/{MANIFEST}"))
            self._manifests[batch.name] = BatchManifest.from_json(text)
        return copy.deepcopy(self._manifests[batch.name])

    def files(self, batch: Batch, source: str) -> list[str]:
        # a folded step's files lie in the directories of the batches it folds (``plan.fold_changes``)
        return [f"{self.directory}/{f.extra.get(FOLDED_FROM, batch.name)}/{f.path}"
                for f in batch.manifest.tables[source].files]


def _batch_file(uri: str) -> str:
    """``<batch>/<file>`` of a staged file's URI: unique in a pipeline whatever form the URI has."""
    return "/".join(uri.rstrip("/").rsplit("/", 2)[-2:])


def _sha256_of(item: tuple[str, bytes]) -> tuple[str, str]:
    """On an executor: a whole file's SHA-256."""
    return item[0], hashlib.sha256(item[1]).hexdigest()


def _damaged(batch: Batch, source: str, name: str, problem: str) -> str:
    return (f"batch {batch.name} ({batch.kind}, LSN {format_lsn(batch.start)} to {format_lsn(batch.end)}): file "
            f"{name} of table {source} {problem}, so applying it would leave {source} silently wrong. Restore the "
            f"batch if you have a copy, or run a backfill of the table (PgBackfillOperator(tables=[{source!r}])): its "
            "snapshot supersedes the batch")


def write_result(spark, summary: dict, committed: bool = False) -> None:
    """Leave a job's summary where the task reads it (the Spark property ``RESULT_CONF``): stdout
    is lost in cluster deploy modes. Written to a temporary name, then renamed.

    :param committed: the job's commits have all landed: a result that cannot be written (a full
        staging) is logged, not raised, so the job still ends well and its task reports it applied
        (without its figures) instead of failing an apply that happened.
    """
    uri = spark.conf.get(RESULT_CONF, None)
    if not uri:
        return
    try:
        _write_result(spark, uri, summary)
    except Exception as err:  # noqa: BLE001 - OSError here, a Py4JJavaError from Hadoop's FileSystem
        if not committed:
            raise
        log.error(
            "every commit of the job landed, but its result could not be written to %s (%s): the task reports "
            "the run as applied without its figures; free space there", uri, err)


def _write_result(spark, uri: str, summary: dict) -> None:
    local = local_path(spark, uri)
    if local is not None:
        _write_local(local, json.dumps(summary, sort_keys=True).encode(), _file_mode(spark))
        return
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    fs = hadoop_path(uri).getFileSystem(spark._jsc.hadoopConfiguration())
    fs.setWriteChecksum(False)
    out = fs.create(hadoop_path(uri + ".tmp"), True)
    try:
        out.write(bytearray(json.dumps(summary, sort_keys=True).encode()))
    finally:
        out.close()
    if not fs.rename(hadoop_path(uri + ".tmp"), hadoop_path(uri)):
        raise OSError(f"could not rename the result file to {uri}")
