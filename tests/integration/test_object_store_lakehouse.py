"""The production shapes of the lakehouse: Iceberg on an S3 server through each transactional catalog.

A real S3 server (moto's, on loopback) holds the warehouse, and a real catalog holds the tables:
Iceberg's JDBC catalog in a database of the test PostgreSQL cluster (warehouse through S3A),
Iceberg's REST catalog fixture behind OAuth2 client credentials (warehouse through S3FileIO), and
moto's Glue API (warehouse through S3FileIO), each with credentials from Airflow connections
(``tests/support/catalogs.py``). Staging is on the same bucket under another prefix
(``s3://<conn>@<bucket>/staging``): the initial sync and the pull write it through
``ObjectStoragePath``, the apply job reads it and removes the applied batches (retention) through
S3A. Keyed and keyless tables with out-of-line TOAST values are snapshotted, changed, pulled and
applied twice through the operators, then compared with the source by verify (PostgreSQL digests
the source, a verify job digests Iceberg through the same catalog, bucket and staging root). The
second apply runs beside another apply of the pipeline and a housekeeping run (compaction, expiry,
orphan listing): the lease and the commits the catalog validates let none lose or double a change
(on moto's Glue only the lease and Iceberg's check of the metadata location: moto ignores the
``VersionId`` of Glue's optimistic lock, so Glue's own lock is not what this proves; docs/lakehouse.md).
An idle tick starts no Spark. While all of them run, every process's command line is watched:
neither the S3 secret nor the catalog's password, client secret or keys may show there, nor in the
log, nor in a catalog server's log. Last, on the JDBC catalog, a table dropped from the catalog is
not taken for idle. One server of each kind per module; one bucket per kind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.exceptions import AirflowException
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_pglogical.exceptions import ConcurrentApplyError
from airflow_provider_pglogical.lakehouse.catalog_kinds import CatalogKind
from airflow_provider_pglogical.verification.witness import verify_pipeline
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators.iceberg_apply import RESULT_PREFIX, IcebergApplyOperator
from airflow_provider_pglogical.operators.iceberg_maintenance import IcebergMaintenanceOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from tests.support.catalogs import CatalogUnderTest, lakehouse_on, start_test_rest_catalog
from tests.support.databases import drop_database, new_database
from tests.support.object_store import start_s3_server

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE orders(id int PRIMARY KEY, status text NOT NULL, note text);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE events(kind text, payload text);
ALTER TABLE events REPLICA IDENTITY FULL;
ALTER TABLE events ALTER COLUMN payload SET STORAGE EXTERNAL;
INSERT INTO orders SELECT g, 'new', repeat(md5(g::text), 100) FROM generate_series(1, 30) g;
INSERT INTO events SELECT 'k' || (g % 3), repeat(md5(g::text), 100) FROM generate_series(1, 9) g;
INSERT INTO events VALUES ('dup', 'same'), ('dup', 'same'), ('dup', 'same');
"""
#: the UPDATEs leave the out-of-line notes unchanged: pgoutput sends them as 'u', the apply keeps them
CHANGES = """
UPDATE orders SET status = 'paid' WHERE id <= 10;
UPDATE orders SET id = id + 1000 WHERE id = 11;
DELETE FROM orders WHERE id > 25;
INSERT INTO orders VALUES (100, 'new', repeat('x', 5000));
DELETE FROM events WHERE ctid = (SELECT min(ctid) FROM events WHERE kind = 'dup');
UPDATE events SET kind = 'k9' WHERE kind = 'k1';
INSERT INTO events VALUES ('dup', 'same');
"""
NAMESPACE = "shop"


@pytest.fixture(scope="module")
def s3_server():
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rest_catalog(s3_server):
    """Iceberg's REST catalog fixture on loopback, its warehouse in the bucket ``lake-rest``."""
    rest = start_test_rest_catalog(s3_server, "lake-rest")
    yield rest
    rest.server.stop()
    rest.server.log_path.unlink(missing_ok=True)


@pytest.fixture(params=[CatalogKind.JDBC, CatalogKind.REST, CatalogKind.GLUE], ids=lambda kind: kind.value)
def lakehouse(request, s3_server, publisher_cluster, monkeypatch):
    """The lakehouse on one catalog kind, in a bucket of its own (``lake-<kind>``)."""
    kind, catalog_db = request.param, None
    if kind is CatalogKind.JDBC:  # a database of its own for Iceberg's JDBC catalog
        catalog_db = new_database(publisher_cluster, "catalog", monkeypatch.setenv)
    rest = request.getfixturevalue("rest_catalog") if kind is CatalogKind.REST else None
    yield lakehouse_on(kind, s3_server, monkeypatch.setenv, namespace=NAMESPACE, bucket=f"lake-{kind.value}",
                       rest=rest, catalog_db=catalog_db)
    if catalog_db is not None:
        drop_database(catalog_db)


class CommandLines:
    """Every command line of this test's own processes seen while they run (``/proc/*/cmdline``)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "CommandLines":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)  # one pass over /proc: never a wait without a deadline

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            parents = {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:  # /proc/<pid>/stat: "pid (name) state ppid ...", the name may hold spaces
                    parents[int(pid)] = int(Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
            for pid in parents:
                if self._descends(pid, parents):
                    try:
                        line = Path("/proc", str(pid), "cmdline").read_bytes().replace(b"\0", b" ")
                    except OSError:
                        continue
                    self.seen.add(line.decode(errors="replace"))

    @staticmethod
    def _descends(pid: int, parents: dict[int, int]) -> bool:
        mine = os.getpid()
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == mine:
                return True
        return False


def source_rows(publisher, table: str, columns: str) -> list[tuple]:
    return sorted(publisher.query(f"SELECT {columns} FROM {table}"))


def test_keyed_and_keyless_tables_staged_and_landed_on_s3_through_each_catalog_and_no_secret_shows(
        publisher, publisher_hook, lakehouse: CatalogUnderTest, s3_server, monkeypatch, caplog, capfd):
    iceberg, bucket = lakehouse.iceberg, lakehouse.bucket
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))

    staging = f"s3://{iceberg.storage_conn_id}@{bucket}/staging"  # the same bucket and connection as the warehouse
    capture = {"publications": ["p"], "staging_root": staging, "pipeline": "p", "postgres_conn_id": publisher.conn_id}

    spark = {"conf": {"spark.ui.enabled": "false"}, "env_vars": {"SPARK_LOCAL_IP": "127.0.0.1"}}

    def apply() -> dict:
        operator = IcebergApplyOperator(task_id="apply", staging_root=staging, pipeline="p", iceberg=iceberg,
                                        table_map={"public.orders": "orders", "public.events": "events"},
                                        staging_retention=timedelta(0), **spark)
        return operator.execute({})

    def housekeeping() -> None:  # expires every snapshot but the newest: its files go from the bucket
        IcebergMaintenanceOperator(task_id="housekeeping", iceberg=iceberg, older_than_hours=0, retain_last=1,
                                   driver_memory="1g", **spark).execute({})

    def outcome(task) -> dict | BaseException:
        try:
            return task()
        except Exception as error:  # judged below, then by the comparison with the source
            return error

    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable("orders"), PublishedTable("events")])
    caplog.clear()
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG), CommandLines() as command_lines:
        snapshot = PgInitialSyncOperator(task_id="sync", slot="s1", **capture).execute({})["batch"].rsplit("/", 1)[1]
        first = apply()
        publisher.execute(CHANGES)
        changes = PgSlotPullOperator(task_id="pull", slot="s1", **capture).execute({})["batch"].rsplit("/", 1)[1]
        manifest_lists = manifest_lists_of(s3_server, lakehouse)
        # one snapshot per table so far: a housekeeping run that expires before either apply below
        # commits has nothing to expire (retain_last=1) and rightly reports nothing expired
        per_table = Counter(key[len(lakehouse.table_prefix):].split("/")[0] for key in manifest_lists)
        # (on REST the state table also has the empty snapshots that fenced the lease's take and release)
        fences = per_table["_pglogical_state"] - 1 if lakehouse.kind is CatalogKind.REST else 0
        assert per_table == {"_pglogical_state": 1 + fences, "events": 1, "orders": 1}, manifest_lists
        # two applies of the pipeline at once (a zombie beside its retry) and housekeeping beside them
        with ThreadPoolExecutor(max_workers=3) as pool:
            *applies, kept = pool.map(outcome, [apply, apply, housekeeping])
        # each apply applied, was held off by the other's lease, or found nothing left; on REST too,
        # whose lease commits carry a fence the server checks (docs/lakehouse.md, "Concurrency")
        assert all(isinstance(a, (dict, ConcurrentApplyError, AirflowException))
                   for a in [*applies, kept or {}]), (applies, kept)
        if not any(isinstance(a, dict) for a in applies):  # the next apply finishes what a refused one left
            applies.append(apply())
        # a compaction meeting an apply's commit fails one of the two: it runs again. It also runs again
        # when it succeeded: a run that expired before the applies committed expired nothing (above),
        # so the expiry below is asserted of the pipeline after the race, not of that run
        housekeeping()
        second = {"tables": sorted({t for a in applies if isinstance(a, dict) for t in a["tables"]})}
        raced = f"two applies and housekeeping at once: {[type(a).__name__ for a in applies]}, housekeeping {kept!r}"
        # verify, the pipeline's own witness (PostgreSQL digests the source, Spark the Iceberg tables),
        # through the same catalog, bucket and staging root
        verified = verify_pipeline(postgres_conn_id=publisher.conn_id, publications=["p"], staging_path=staging,
                                   pipeline="p", iceberg=iceberg, report=lambda message: None,
                                   table_map={"public.orders": "orders", "public.events": "events"})
    out, err = capfd.readouterr()
    task_log = "\n".join((caplog.text, out, err))  # Airflow's structlog loggers write to the process's output
    print(raced)
    assert first["tables"] == second["tables"] == ["public.events", "public.orders"], (first, second)
    # the keyed snapshot's staged files were adopted into the S3 warehouse (retention removed them after)
    assert re.search(r"public\.orders: applied snapshot \S+ \(\d+ rows, 1 staged files adopted\)", task_log)
    with pytest.raises(AirflowSkipException, match="Spark was not started"):  # an idle tick lists S3 staging only
        apply()

    # housekeeping expired the older snapshots: their manifest lists are gone from the bucket (through S3A)
    expired = manifest_lists - manifest_lists_of(s3_server, lakehouse)
    assert expired, manifest_lists
    # the warehouse is on the S3 server: metadata and data files of both tables, none on the local disk
    keys = s3_server.keys(bucket, "warehouse/")
    for table in ("orders", "events"):
        assert any(k.startswith(f"{lakehouse.table_prefix}{table}/metadata/") for k in keys), keys
        assert any(k.startswith(f"{lakehouse.table_prefix}{table}/data/") for k in keys), keys
    # staging is on the S3 server too, and retention removed the applied snapshot (a change batch stays:
    # the newest one is kept for a pull that died before advancing its slot)
    staged = s3_server.keys(bucket, "staging/p/")
    assert f"staging/p/{changes}/_manifest.json" in staged, staged
    assert not [key for key in staged if key.startswith(f"staging/p/{snapshot}/")], staged
    assert "staging/p/_retention.json" in staged, staged
    # and the tables are in the catalog (asked by its own API), not in a Hadoop catalog's version-hint
    assert lakehouse.listed() == ["_pglogical_state", "events", "orders"]

    assert verified["equal"], verified["summary"]
    counts = {t["table"]: (t["source_rows"], t["target_rows"]) for t in verified["tables"]}
    assert counts == {"public.orders": (len(source_rows(publisher, "orders", "id")),) * 2,
                      "public.events": (len(source_rows(publisher, "events", "kind")),) * 2}, counts

    # the credentials reached Spark (it wrote to the bucket and the catalog) through no command line and no log
    # (the JVM of an in-process session an earlier test of this worker left, "pyspark-shell", is no apply)
    submits = [line for line in command_lines.seen if "SparkSubmit" in line and "pyspark-shell" not in line]
    assert submits and all("--properties-file" in line for line in submits), command_lines.seen
    for line in command_lines.seen:
        assert not [secret for secret in lakehouse.secrets if secret in line], line
    assert not [secret for secret in lakehouse.secrets if secret in task_log]
    for log in lakehouse.logs:  # a catalog server's own log: no secret, and readable by its user only
        assert log.read_text() and not [secret for secret in lakehouse.secrets if secret in log.read_text()], log
        assert log.stat().st_mode & 0o077 == 0, oct(log.stat().st_mode)
    # the log was captured, spark-submit's own output included: the secrets' absence proves something
    assert "Spark-Submit cmd" in task_log and RESULT_PREFIX.strip() in task_log, task_log[-3000:]
    properties_files = {line.split("--properties-file ", 1)[1].split(" ", 1)[0] for line in submits}
    assert not any(os.path.exists(path) for path in properties_files), "the private properties file outlived its job"

    if lakehouse.kind is not CatalogKind.JDBC:  # the only kind a worker can list without a JVM
        return
    # a table dropped from the catalog (JdbcCatalog.dropTable without purge: its entry goes, its files
    # stay) is no idle tick: the operator asks the catalog, without a JVM, and starts Spark to rebuild it
    catalog_db = lakehouse.catalog_db
    catalog_db.execute("DELETE FROM iceberg_tables WHERE table_namespace = 'shop' AND table_name = 'orders'")
    started = []
    monkeypatch.setattr(IcebergApplyOperator, "run_spark_submit", lambda self, *a, **k: started.append(1) or {})
    apply()  # the job itself is not run: its rebuild of a missing table is tested on the local disk
    out, err = capfd.readouterr()
    assert started and "table(s) orders are gone from the catalog" in out + err, (out + err)[-2000:]


def manifest_lists_of(s3_server, lakehouse: CatalogUnderTest) -> set[str]:
    """The manifest list of every snapshot of every table in the warehouse (``snap-*.avro``)."""
    return {key for key in s3_server.keys(lakehouse.bucket, lakehouse.table_prefix)
            if key.rsplit("/", 1)[1].startswith("snap-")}
