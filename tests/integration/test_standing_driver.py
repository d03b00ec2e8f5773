"""The apply operator with a standing driver: one Spark session serves tick after tick.

Real PostgreSQL, real spark-submit (local), real Iceberg. The driver is a spark-submit the
operator starts and leaves running; the test ends every driver it caused.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.standing_driver import DriverError, StandingDriver
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.operators.publication import PgCreatePublicationOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.spark.apply_server import PROTOCOL
from tests.support.processes import kill_naming, pids_naming
from tests.support.spark_jobs import reading_session

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE orders(id int PRIMARY KEY, status text NOT NULL, note text);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
INSERT INTO orders SELECT g, 'new', repeat(md5(g::text), 300) FROM generate_series(1, 50) g;
"""


@pytest.fixture
def driver_dir(monkeypatch):
    """A short private directory for the drivers' sockets; every driver left is killed after."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    directory = Path(tempfile.mkdtemp(prefix="drv"))
    yield directory
    kill_naming(directory)


def _wait_exit(pid: int, timeout: float) -> bool:
    """True once ``pid`` (not our child) has exited, within ``timeout`` (a pidfd: no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _must_not_start():
    raise AssertionError("a driver was listening: nothing should have been started")


def _apply(staging, iceberg, directory, idle=timedelta(minutes=5), **kwargs) -> IcebergApplyOperator:
    operator = IcebergApplyOperator(task_id="apply", staging_root=staging, pipeline="shop", iceberg=iceberg,
                                    conf={"spark.ui.enabled": "false"}, standing_driver=idle,
                                    standing_driver_dir=str(directory), asset_alias=None,
                                    env_vars={"SPARK_LOCAL_IP": "127.0.0.1", **kwargs.pop("env", {})}, **kwargs)
    operator.execute({})
    return operator


def test_one_driver_serves_tick_after_tick_and_a_killed_one_is_replaced(publisher, driver_dir, tmp_path):
    publisher.execute(SOURCE)
    staging = f"file://{tmp_path}/staging"
    iceberg = IcebergConfig(warehouse=f"file://{tmp_path}/warehouse", namespace="shop")
    common = {"postgres_conn_id": publisher.conn_id, "staging_path": staging, "pipeline": "shop"}
    PgCreatePublicationOperator(task_id="pub", publication="shop", tables=["public.orders"],
                                postgres_conn_id=publisher.conn_id).execute({})
    PgInitialSyncOperator(task_id="sync", slot="shop", publications=["shop"], **common).execute({})
    pull = PgSlotPullOperator(task_id="pull", slot="shop", publications=["shop"], **common)

    first = _apply(staging, iceberg, driver_dir)
    assert first._applied_steps[0]["rows"] == 50
    publisher.execute("UPDATE orders SET status = 'paid' WHERE id <= 10; UPDATE orders SET id = id + 100 WHERE id = 20;"
                      "DELETE FROM orders WHERE id = 30")
    pull.execute({})
    second = _apply(staging, iceberg, driver_dir)
    assert second._applied_steps[0]["rows"] == 12
    pid = second._driver["pid"]
    assert pid == first._driver["pid"], "the second tick must be served by the driver the first one started"
    assert second._driver["run"] == first._driver["run"] + 1

    # a request it does not know gets an error and the driver keeps serving
    sockets = list(driver_dir.glob("*.sock"))
    assert len(sockets) == 1
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(sockets[0]))
        client.sendall(json.dumps({"protocol": PROTOCOL + 1, "op": "apply"}).encode() + b"\n")
        answer = json.loads(client.makefile().readline())
    assert "this driver speaks protocol" in answer["error"]

    # the job's log lines reach the task that asked (here a run with nothing new to apply)
    lines: list[str] = []
    answer = StandingDriver(driver_dir, sockets[0].stem).apply(second.job_args(), _must_not_start, lines.append)
    assert answer["driver"]["pid"] == pid and answer["result"]["steps"] == []
    assert any(line.startswith("pglogical.apply: apply of shop took") for line in lines), lines

    # an apply that fails in the job fails the task with the job's error; the driver stays
    publisher.execute("UPDATE orders SET status = 'shipped' WHERE id BETWEEN 5 AND 15")
    batch = pull.execute({})["batch"]
    manifest = tmp_path / "staging" / "shop" / batch.rsplit("/", 1)[-1] / "_manifest.json"
    kept = manifest.read_bytes()
    manifest.write_bytes(b"{not json")
    with pytest.raises(DriverError, match="the apply failed in standing driver [0-9a-f]{16}: JSONDecodeError"):
        _apply(staging, iceberg, driver_dir)
    manifest.write_bytes(kept)
    assert sockets[0].exists(), "the driver stays after a failed apply (it removes its socket when it ends)"
    assert "apply of shop failed: JSONDecodeError" in sockets[0].with_suffix(".log").read_text(), \
        "the driver's own lines reach its log"

    # killed between ticks: the next tick starts a new one
    os.kill(pid, signal.SIGKILL)
    assert _wait_exit(pid, 60)
    third = _apply(staging, iceberg, driver_dir)
    assert third._driver["pid"] != pid and third._driver["run"] == 1
    assert third._applied_steps[0]["rows"] == 11

    # the task that asked leaves during its apply (killed, timed out): the driver ends, so the
    # apply stops as a killed spark-submit's would
    publisher.execute("UPDATE orders SET status = 'lost' WHERE id BETWEEN 40 AND 45")
    pull.execute({})
    key = sockets[0].stem
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(sockets[0]))
        client.sendall(json.dumps({"protocol": PROTOCOL, "op": "apply", "args": third.job_args()}).encode() + b"\n")
        assert json.loads(client.makefile().readline())["pid"] == third._driver["pid"]
    assert _wait_exit(third._driver["pid"], 60), "the driver must end when its client leaves mid-apply"
    assert "the task that asked for this apply left during it" in (driver_dir / f"{key}.log").read_text()
    assert not sockets[0].exists()

    # killed during an apply, after the data commit and before the state commit: the task fails,
    # and the next tick's apply leaves the lakehouse equal to the source
    publisher.execute("UPDATE orders SET status = 'returned' WHERE id <= 3; INSERT INTO orders VALUES (500, 'new', 'x')")
    pull.execute({})
    with pytest.raises(DriverError, match="ended during the apply"):
        _apply(staging, iceberg, driver_dir, env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "1"})
    # a short idle time: this driver ends by itself once the tick is done
    last = _apply(staging, iceberg, driver_dir, idle=timedelta(seconds=2))
    assert last._driver["run"] == 1 and last._driver["pid"] != third._driver["pid"]
    assert (driver_dir / f"{key}.log.1").exists() and len(list(driver_dir.glob("*.log"))) == 2, \
        "the same key as before (its log rotated) and the crashing one's: an idle time is not part of the key"
    os.kill(last._driver["pid"], signal.SIGTERM)

    session = reading_session(tmp_path / "warehouse", "test-standing-driver")
    try:
        got = sorted(tuple(r) for r in session.sql("SELECT id, status, md5(note) FROM lake.shop.public__orders").collect())
    finally:
        session.stop()
    assert got == sorted(publisher.query("SELECT id, status, md5(note) FROM orders"))


def test_a_driver_ends_after_its_idle_time(publisher, driver_dir, tmp_path):
    publisher.execute(SOURCE)
    staging = f"file://{tmp_path}/staging"
    iceberg = IcebergConfig(warehouse=f"file://{tmp_path}/warehouse", namespace="shop")
    PgCreatePublicationOperator(task_id="pub", publication="shop", tables=["public.orders"],
                                postgres_conn_id=publisher.conn_id).execute({})
    PgInitialSyncOperator(task_id="sync", slot="shop", publications=["shop"], postgres_conn_id=publisher.conn_id,
                          staging_path=staging, pipeline="shop").execute({})
    operator = _apply(staging, iceberg, driver_dir, idle=timedelta(seconds=3))
    assert operator._applied_steps[0]["rows"] == 50
    assert _wait_exit(operator._driver["pid"], 120), "the driver must end after 3 s without a request"
    assert not list(driver_dir.glob("*.sock")), "an idle driver removes its socket"


def test_bad_settings_are_refused_before_anything_starts(driver_dir, tmp_path):
    with pytest.raises(ValueError, match="standing_driver must be a positive idle time"):
        IcebergApplyOperator(task_id="a", staging_root=f"file://{tmp_path}/s", pipeline="p",
                             standing_driver=timedelta(0))
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    operator = IcebergApplyOperator(task_id="a", staging_root=f"file://{tmp_path}/s", pipeline="p",
                                    standing_driver=timedelta(minutes=1), standing_driver_dir=str(open_dir),
                                    skip_when_idle=False)
    with pytest.raises(DriverError, match="must belong to uid .* with mode 0700") as raised:
        operator.execute({})
    assert isinstance(raised.value, AirflowFailException), "a directory others can open fails without retries"
    assert list(open_dir.iterdir()) == [] and not pids_naming(open_dir)


def test_a_driver_that_cannot_start_fails_the_task_with_its_log(driver_dir, tmp_path):
    operator = IcebergApplyOperator(task_id="a", staging_root=f"file://{tmp_path}/s", pipeline="p",
                                    standing_driver=timedelta(minutes=1), standing_driver_dir=str(driver_dir),
                                    skip_when_idle=False, asset_alias=None,
                                    env_vars={"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(tmp_path / "no-python")})
    with pytest.raises(DriverError, match=r"exited before it listened \(exit code \d+\); its log: .*\.log") as raised:
        operator.execute({})
    assert not isinstance(raised.value, AirflowFailException), "a driver that failed to start is retried"
    log = Path(str(raised.value).rsplit("its log: ", 1)[1])
    assert "no-python" in log.read_text(), "its log says why"
    assert not pids_naming(driver_dir) and not list(driver_dir.glob("*.sock"))
