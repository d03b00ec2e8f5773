"""A real Airflow API server on loopback for the UI tests: a temporary AIRFLOW_HOME, SQLite, the
simple auth manager with known users, and the DAGs of a folder serialized into the database; and a
real scheduler and triggerer on such a home, for the asset watcher's test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from airflow_provider_pglogical.embedded.postgres import wait_until
from tests.support.environment import REPO, subprocess_env

AIRFLOW = str(Path(sys.executable).parent / "airflow")

#: migrate the database and serialize the DAG folder in one interpreter (two CLI calls cost twice the start-up)
_PREPARE = """
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
from airflow.utils import db
from airflow.utils.session import create_session

db.initdb()
with create_session() as session:
    manager = DagBundlesManager()
    manager.sync_bundles_to_db(session=session)
    session.commit()
    for bundle in manager.get_all_dag_bundles():
        bundle.initialize()
        bag = BundleDagBag(bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
        assert not bag.import_errors, bag.import_errors
        sync_bag_to_db(bag, bundle.name, bundle_version=None, session=session)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now (a server's health check while it starts)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def plugin_entry_point_installed() -> bool:
    """Whether the installed distribution declares the ``airflow.plugins`` entry point (an editable
    install made before it was added to setup.cfg does not, until ``scripts/setup.sh`` reinstalls)."""
    return any(ep.value.startswith("airflow_provider_pglogical.") for ep in metadata.entry_points(group="airflow.plugins"))


@dataclass
class ApiServer:
    url: str
    process: subprocess.Popen
    log: Path

    def token(self, username: str, password: str) -> str:
        """A JWT of the simple auth manager (``POST /auth/token``)."""
        request = urllib.request.Request(f"{self.url}/auth/token", method="POST",
                                         data=json.dumps({"username": username, "password": password}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["access_token"]

    def get(self, path: str, token: str | None = None) -> tuple[int, dict | str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, headers=headers), timeout=60) as r:
                body = r.read().decode()
                return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def wait_ready(self, timeout: float = 180) -> "ApiServer":
        """Wait until the server answers its health check; stop it and raise if it cannot."""
        def healthy() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"airflow api-server exited ({self.process.returncode}): "
                                     f"{self.log.read_text()[-3000:]}")
            try:
                return self.get("/api/v2/monitor/health")[0] == 200
            except OSError:
                return False

        try:
            wait_until(healthy, timeout=timeout, interval=0.3, message="airflow api-server to answer")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL the server's process group (it started it as its own session): a test has nothing to flush."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def start_api_server(home: Path, dags: Path, users: dict[str, tuple[str, str]], **env: str) -> ApiServer:
    """Prepare ``home`` (SQLite, the DAGs of ``dags`` serialized) and start ``airflow api-server`` in the
    background: call :meth:`ApiServer.wait_ready` before using it, and :meth:`ApiServer.stop` after.

    :param users: ``{username: (role, password)}``; an empty role has no permission at all.
    """
    passwords = home / "passwords.json"
    home.mkdir(parents=True, exist_ok=True)
    passwords.write_text(json.dumps({name: password for name, (_role, password) in users.items()}))
    port = free_port()
    environ = subprocess_env(
        AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=",".join(f"{name}:{role}" for name, (role, _pw) in users.items()),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
        AIRFLOW__API_AUTH__JWT_SECRET=os.urandom(32).hex(), AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env,
    )
    environ.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    if not plugin_entry_point_installed():  # then the provider info's "plugins" entry registers it
        environ["AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS"] = "False"
    log = home / "api-server.log"
    # one process: prepare the database, then become the API server (so the caller can work meanwhile)
    serve = [AIRFLOW, "api-server", "--apps", "core", "--host", "127.0.0.1", "--port", str(port)]
    launcher = _PREPARE + f"\nimport os\nos.execv({AIRFLOW!r}, {serve!r})\n"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-c", launcher], env=environ, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return ApiServer(f"http://127.0.0.1:{port}", process, log)


@dataclass
class AirflowProcesses:
    """Airflow's scheduler and triggerer (each its own process group), sharing a SQLite database."""

    processes: list[subprocess.Popen]
    logs: list[Path]

    def check_running(self) -> None:
        """Raise with the log's tail of a process that exited."""
        for process, log in zip(self.processes, self.logs):
            if process.poll() is not None:
                raise AssertionError(f"{log.stem} exited ({process.returncode}): {log.read_text()[-3000:]}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def start_scheduler(home: Path, dags: Path, **env: str) -> AirflowProcesses:
    """Prepare ``home`` (SQLite, the DAGs of ``dags`` serialized, their asset watchers registered) and
    start ``airflow scheduler`` and ``airflow triggerer`` (which runs the watchers' triggers)."""
    home.mkdir(parents=True, exist_ok=True)
    environ = subprocess_env(
        AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db", AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="1", AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
        AIRFLOW__API_AUTH__JWT_SECRET=os.urandom(32).hex(),
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env,
    )
    environ.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
    subprocess.run([sys.executable, "-c", _PREPARE], env=environ, check=True, capture_output=True)
    processes, logs = [], []
    for command in ("scheduler", "triggerer"):
        log = home / f"{command}.log"
        with log.open("wb") as out:
            processes.append(subprocess.Popen([AIRFLOW, command], env=environ, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        logs.append(log)
    return AirflowProcesses(processes, logs)
