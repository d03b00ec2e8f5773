"""Files the jobs read and write through Spark's Hadoop FileSystem (file://, s3a://, gs://, hdfs://).

The job reads staging where the executors can: a driver in a cluster has no local copy, so
listing and manifests go through the same FileSystem the Parquet reader uses.
"""

from __future__ import annotations

import json

from airflow_provider_pglogical.spark.plan import Batch
from airflow_provider_pglogical.staging.contract import MANIFEST, RESULT_CONF


class Staging:
    """One pipeline's staged batches: ``<root>/<pipeline>/<batch>/``."""

    def __init__(self, spark, root: str, pipeline: str) -> None:
        self.spark = spark
        self.directory = root.rstrip("/") + "/" + pipeline
        self._jvm = spark.sparkContext._jvm
        self._fs = self._path(self.directory).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def _path(self, uri: str):
        return self._jvm.org.apache.hadoop.fs.Path(uri)

    def committed(self) -> list[Batch]:
        """Every batch with a manifest, in name order (manifests not read yet)."""
        statuses = self._fs.globStatus(self._path(f"{self.directory}/*/{MANIFEST}")) or []
        found = [Batch.parse(status.getPath().getParent().getName()) for status in statuses]
        return sorted((batch for batch in found if batch), key=lambda batch: batch.name)

    def read_manifest(self, batch: Batch) -> dict:
        stream = self._fs.open(self._path(f"{self.directory}/{batch.name}/{MANIFEST}"))
        try:
            text = self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return json.loads(text)

    def files(self, batch: Batch, source: str) -> list[str]:
        return [f"{self.directory}/{batch.name}/{f['path']}" for f in batch.manifest["tables"][source]["files"]]


def write_result(spark, summary: dict) -> None:
    """Leave a job's summary where the task reads it (the Spark property ``RESULT_CONF``): stdout
    is lost in cluster deploy modes. Written to a temporary name, then renamed."""
    uri = spark.conf.get(RESULT_CONF, None)
    if not uri:
        return
    hadoop_path = spark._jvm.org.apache.hadoop.fs.Path
    fs = hadoop_path(uri).getFileSystem(spark._jsc.hadoopConfiguration())
    fs.setWriteChecksum(False)
    out = fs.create(hadoop_path(uri + ".tmp"), True)
    try:
        out.write(bytearray(json.dumps(summary, sort_keys=True).encode()))
    finally:
        out.close()
    if not fs.rename(hadoop_path(uri + ".tmp"), hadoop_path(uri)):
        raise OSError(f"could not rename the result file to {uri}")
