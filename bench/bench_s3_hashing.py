"""Benchmark of the apply's check of small staged files on S3: read one at a time or several at once.

    python bench/bench_s3_hashing.py [--files 50] [--repeat 5] [--tiny]

Before it writes anything the apply hashes every staged file a step will read against its
manifest (invariant 12); on an object store, while they are small in all, the driver reads them
itself. This puts ``--files`` small files (3-5 kB, a change batch's per-table Parquet files at 100
changes) on moto's S3 server on loopback and times ``Staging._sha256`` over them in one
in-process Spark session, one read at a time (the baseline, as before) against
``DRIVER_READS`` at once, interleaved, and checks both give the files' SHA-256 and that the row
deltas get the hashed bytes without another read.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.environment import prepare  # noqa: E402

prepare()

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.lakehouse.lakehouse_access import LakehouseAccess  # noqa: E402
from airflow_provider_pglogical.spark.common import hadoop_files  # noqa: E402
from tests.support.object_store import start_s3_server  # noqa: E402
from tests.support.spark_jobs import applying_session  # noqa: E402

BUCKET = "bench-hashing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="5 files, 1 repeat (CI)")
    args = parser.parse_args()
    files, repeat = (5, 1) if args.tiny else (args.files, args.repeat)
    server = start_s3_server()
    spark = None
    try:
        server.create_bucket(BUCKET)
        client = server.client()
        data = {f"s3a://{BUCKET}/staging/p/batch/t{i:03d}.parquet": os.urandom(3000 + 37 * i) for i in range(files)}
        for uri, body in data.items():
            client.put_object(Bucket=BUCKET, Key=uri.split(f"s3a://{BUCKET}/", 1)[1], Body=body)
        public = {**IcebergConfig(warehouse=f"s3a://{BUCKET}/warehouse", catalog_type="jdbc",
                                  catalog_uri="jdbc:postgresql://127.0.0.1/unused").spark_conf(),
                  "spark.hadoop.fs.s3a.endpoint": server.endpoint, "spark.hadoop.fs.s3a.path.style.access": "true",
                  "spark.hadoop.fs.s3a.connection.ssl.enabled": "false"}
        spark = applying_session(None, "bench-s3-hashing", LakehouseAccess(
            public, {"spark.hadoop.fs.s3a.access.key": "bench", "spark.hadoop.fs.s3a.secret.key": "bench"}))
        lengths = {uri: len(body) for uri, body in data.items()}
        wanted = {"/".join(uri.rsplit("/", 2)[-2:]): hashlib.sha256(body).hexdigest() for uri, body in data.items()}
        at_once = hadoop_files.DRIVER_READS
        hadoop_files.Staging(spark, f"s3a://{BUCKET}/staging", "p")._sha256(list(data), lengths)  # S3A's first use
        runs: dict[int, list[float]] = {1: [], at_once: []}
        for _ in range(repeat):
            for reads in runs:  # interleaved: each setting meets the same machine state
                hadoop_files.DRIVER_READS = reads
                staging = hadoop_files.Staging(spark, f"s3a://{BUCKET}/staging", "p")
                started = time.perf_counter()
                digests = staging._sha256(list(data), lengths)
                runs[reads].append(time.perf_counter() - started)
                assert digests == wanted, "a file's SHA-256 differs from the bytes put on S3"
                assert all(staging.read_bytes(uri) == body for uri, body in data.items())
                assert not staging._checked, "a hashed file was read again instead of its hashed bytes"
        hadoop_files.DRIVER_READS = at_once
        medians = {reads: statistics.median(times) for reads, times in runs.items()}
        for reads, times in runs.items():
            print(f"{files} small staged files on S3, {reads} read(s) at once: median {medians[reads]:.2f} s of "
                  f"{len(times)} ({', '.join(f'{t:.2f}' for t in times)})")
        print(f"{at_once} at once / one at a time: {medians[at_once] / medians[1]:.2f}x; hashes equal, the row deltas "
              "get the hashed bytes")
    finally:
        if spark is not None:
            spark.stop()
        server.stop()


if __name__ == "__main__":
    main()
