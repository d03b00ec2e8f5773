"""Connections are built the way PostgresHook builds them: IAM tokens, libpq extras, options, the
``cursor`` extra; always psycopg2, for SQL and replication connections alike.

Only the cloud token call is faked (an ``AwsBaseHook`` whose RDS client returns a token); the
token is a real password of a real role on a real PostgreSQL, and PostgresHook's own
``get_aws_iam_token`` runs unchanged.
"""

from __future__ import annotations

import json
import secrets
import sys
import types
import uuid
from urllib.parse import quote

import psycopg2
import psycopg2.extras
import pytest
from psycopg2 import sql

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook


class FakeRdsClient:
    """``boto3.client("rds")`` as far as PostgresHook uses it: the one cloud call, faked."""

    def __init__(self, token: str, calls: list) -> None:
        self.token, self.calls = token, calls

    def generate_db_auth_token(self, host, port, user):
        self.calls.append(("generate_db_auth_token", host, port, user))
        return self.token


@pytest.fixture
def iam_role(publisher, monkeypatch):
    """A role whose password only the (fake) token service knows, and the AWS hook module handing it out."""
    role = f"iam_{uuid.uuid4().hex[:8]}"
    token = secrets.token_urlsafe(24)
    conn = publisher.connect()
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(sql.Identifier(role), sql.Literal(token)))
        cur.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(publisher.name), sql.Identifier(role)))
    calls: list = []

    class AwsBaseHook:
        def __init__(self, aws_conn_id, client_type):
            calls.append(("AwsBaseHook", aws_conn_id, client_type))
            self.conn = FakeRdsClient(token, calls)

    fake = types.ModuleType("airflow.providers.amazon.aws.hooks.base_aws")
    fake.AwsBaseHook = AwsBaseHook
    monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", fake)
    yield role, calls
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        cur.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        cur.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    conn.close()


def _register(monkeypatch, conn_id: str, publisher, login: str, password: str, **extras) -> None:
    query = "&".join(f"{k}={quote(str(v))}" for k, v in extras.items())
    cluster = publisher.cluster
    uri = f"postgres://{login}:{quote(password)}@{cluster.host}:{cluster.port}/{publisher.name}?{query}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", uri)


def test_iam_connection_logs_in_through_postgres_hooks_token_path(publisher, iam_role, monkeypatch):
    role, calls = iam_role
    _register(monkeypatch, "pg_iam", publisher, role, "not-the-password", iam="true", aws_conn_id="aws_test",
              sslmode="disable", application_name="pglogical-iam-test")
    hook = PgLogicalHook(postgres_conn_id="pg_iam")
    conn = hook.get_conn()
    try:
        assert isinstance(conn, psycopg2.extensions.connection)
        with conn.cursor() as cur:
            cur.execute("SELECT current_user, current_setting('application_name'), "
                        "(SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid())")
            assert cur.fetchone() == (role, "pglogical-iam-test", False)
    finally:
        conn.close()
    # the replication protocol connection logs in with the same token
    with hook.exported_snapshot("iam_slot") as snapshot:
        assert snapshot.slot == "iam_slot" and snapshot.snapshot_name
    assert hook.get_slot("iam_slot").plugin == "pgoutput"
    hook.drop_slot("iam_slot")
    assert calls[0] == ("AwsBaseHook", "aws_test", "rds")
    assert calls[1] == ("generate_db_auth_token", publisher.cluster.host, publisher.cluster.port, role)
    assert len(calls) == 2  # one token, reused by every connection of the hook meanwhile
    kwargs = hook.connect_kwargs()
    assert not {"iam", "aws_conn_id"} & set(kwargs) and kwargs["sslmode"] == "disable"


def test_without_the_iam_extra_the_connection_password_is_used_and_refused(publisher, iam_role, monkeypatch):
    role, calls = iam_role
    _register(monkeypatch, "pg_no_iam", publisher, role, "not-the-password", aws_conn_id="aws_test")
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        PgLogicalHook(postgres_conn_id="pg_no_iam").get_conn()
    assert calls == []


def test_options_cursor_extra_and_bulk_copy_use_psycopg2(publisher, monkeypatch, tmp_path):
    cluster = publisher.cluster
    _register(monkeypatch, "pg_dict", publisher, cluster.superuser, cluster.password, cursor="dictcursor",
              connect_timeout="5")
    hook = PgLogicalHook(postgres_conn_id="pg_dict", options="-c statement_timeout=4321")
    conn = hook.get_conn()
    try:
        with conn.cursor() as cur:
            assert isinstance(cur, psycopg2.extras.DictCursor)
            cur.execute("SELECT current_setting('statement_timeout') AS timeout")
            assert cur.fetchone()["timeout"] == "4321ms"
    finally:
        conn.close()
    publisher.execute("CREATE TABLE src(id int, name text); INSERT INTO src VALUES (1, 'a'), (2, 'tab\tin'), (3, NULL);"
                      "CREATE TABLE dst(id int, name text)")
    dump = tmp_path / "src.tsv"
    hook.bulk_dump("src", str(dump))
    hook.bulk_load("dst", str(dump))
    assert publisher.query("SELECT * FROM dst ORDER BY id") == [(1, "a"), (2, "tab\tin"), (3, None)]
    hook.insert_rows("dst", [(4, "json-ish {}"), (5, None)], target_fields=["id", "name"])
    assert publisher.query("SELECT count(*) FROM dst") == [(5,)]


def test_a_multi_host_connection_reaches_the_server_that_accepts_writes(publisher, monkeypatch):
    """Hosts in the host field, one port per host in the ``port`` extra (the first host is down here)."""
    cluster = publisher.cluster
    dead = _free_port()
    monkeypatch.setenv("AIRFLOW_CONN_PG_MULTI", json.dumps({
        "conn_type": "postgres", "host": f"{cluster.host},{cluster.host}", "login": cluster.superuser,
        "password": cluster.password, "schema": publisher.name,
        "extra": {"port": f"{dead},{cluster.port}", "target_session_attrs": "read-write", "connect_timeout": "5"},
    }))
    hook = PgLogicalHook(postgres_conn_id="pg_multi")
    with hook.autocommit_cursor() as cursor:
        cursor.execute("SELECT current_database(), current_setting('port')::int")
        assert cursor.fetchone() == (publisher.name, cluster.port)
    assert hook.get_slot("nope") is None  # what capture code calls goes through it too
    monkeypatch.setenv("AIRFLOW_CONN_PG_MULTI", json.dumps({
        "conn_type": "postgres", "host": f"{cluster.host},{cluster.host}", "login": cluster.superuser,
        "extra": {"port": f"{dead},{cluster.port},{cluster.port}"},
    }))
    with pytest.raises(ValueError, match=r"connection 'pg_multi' names 2 host\(s\) .* but 3 ports"):
        PgLogicalHook(postgres_conn_id="pg_multi").connect_kwargs()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
