"""The lakehouse's credentials, from Airflow connections to Spark without a command line or a log.

spark-submit's ``--conf`` values are visible to every user of the machine (``ps``) and in the
task log, so storage keys and the catalog's password go into a properties file only the task's
user can read (``--properties-file``, mode 0600), removed when the job ends. spark-submit reads
that file *instead of* ``spark-defaults.conf``, so the file starts with the properties the
submission would have read (``properties_file``, else ``$SPARK_CONF_DIR/spark-defaults.conf``).
Spark redacts such keys in its own logs and UI (``spark.redaction.regex``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from airflow.exceptions import AirflowException

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.catalog_kinds import CatalogConnection, FileIOKind
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig

_TRUE = ("1", "true", "yes", "on")


@dataclass
class LakehouseAccess:
    """Spark properties that reach the lakehouse: ``public`` ones may go on the command line,
    ``private`` ones (keys, passwords, tokens) only into the private properties file, and
    ``environment`` (Glue's AWS keys: the AWS SDK reads them nowhere else) only into the
    spark-submit's environment."""

    public: dict[str, str] = field(default_factory=dict)
    private: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)


def lakehouse_access(config: IcebergConfig) -> LakehouseAccess:
    """Read the config's Airflow connections (storage, catalog) into Spark properties."""
    access = LakehouseAccess()
    if config.storage_conn_id:
        storage_properties(config.storage_conn_id, access)
        if config.file_io() is FileIOKind.S3:
            s3_file_io_properties(config.storage_conn_id, f"spark.sql.catalog.{config.catalog}.", access)
    spec = config.spec
    if config.catalog_conn_id and spec is not None and spec.connection is not None:
        _CATALOG_CONNECTIONS[spec.connection](config, access)
    return access


def job_access(config: IcebergConfig, staging: LakehouseAccess | None = None) -> LakehouseAccess:
    """Everything one of our spark-submits needs: the lakehouse's Spark configuration and access,
    plus an object-store staging root's (``staging_roots.staging_access``). ``public`` goes into the
    job's ``conf``, ``private`` into its private properties file, ``environment`` into its
    environment, never onto the command line. A property both hold is left to the private file: a
    ``--conf`` value would win over it, and a connection's own extra (``rest-metrics-reporting-enabled``)
    must win over the kind's default (``CatalogSpec.defaults``)."""
    lake, staging = lakehouse_access(config), staging or LakehouseAccess()
    private = {**lake.private, **staging.private}
    public = {**config.spark_conf(), **lake.public, **staging.public}
    return LakehouseAccess(public={key: value for key, value in public.items() if key not in private},
                           private=private,
                           environment={**lake.environment, **staging.environment})


def get_connection(conn_id: str):
    """An Airflow connection, through the Task SDK's ``BaseHook`` (Airflow 3.1+) or, on 3.0, whose
    Task SDK has none, the core one."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:  # Airflow 3.0
        from airflow.hooks.base import BaseHook
    return BaseHook.get_connection(conn_id)


def storage_properties(conn_id: str, access: LakehouseAccess, prefix: str = "spark.hadoop.fs.s3a.") -> None:
    """An ``aws`` connection as S3A properties under ``prefix`` (``spark.hadoop.fs.s3a.bucket.<b>.`` for
    one bucket): keys in login/password (or extras), endpoint and region in extras."""
    conn = get_connection(conn_id)
    extra = conn.extra_dejson
    key, secret, token = _aws_keys(conn_id, conn)
    endpoint = extra.get("endpoint_url")
    if endpoint:
        access.public[f"{prefix}endpoint"] = str(endpoint)
        access.public[f"{prefix}connection.ssl.enabled"] = str(str(endpoint).startswith("https:")).lower()
    path_style = extra.get("path_style_access", bool(endpoint))
    access.public[f"{prefix}path.style.access"] = str(str(path_style).lower() in _TRUE).lower()
    if extra.get("region_name"):
        access.public[f"{prefix}endpoint.region"] = str(extra["region_name"])
    if key:
        access.private[f"{prefix}access.key"] = str(key)
        access.private[f"{prefix}secret.key"] = str(secret)
        if token:
            access.private[f"{prefix}session.token"] = str(token)
            access.public[f"{prefix}aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")


def _aws_keys(conn_id: str, conn) -> tuple[str | None, str | None, str | None]:
    """An ``aws`` connection's access key, secret and session token (login/password or extras)."""
    extra = conn.extra_dejson
    key = conn.login or extra.get("aws_access_key_id")
    secret = conn.password or extra.get("aws_secret_access_key")
    if bool(key) != bool(secret):
        raise InvalidInputError(
            f"Airflow connection {conn_id!r} has an access key without its secret (or the reverse): give both "
            "(login and password, or extras aws_access_key_id and aws_secret_access_key), or neither to use "
            "the machine's AWS credentials chain"
        )
    return key, secret, extra.get("aws_session_token")


def s3_file_io_properties(conn_id: str, prefix: str, access: LakehouseAccess) -> None:
    """An ``aws`` connection as Iceberg S3FileIO properties of a catalog (``prefix`` ends with a dot):
    endpoint, path-style access and region public, keys private."""
    conn = get_connection(conn_id)
    extra = conn.extra_dejson
    key, secret, token = _aws_keys(conn_id, conn)
    endpoint = extra.get("endpoint_url")
    if endpoint:
        access.public[f"{prefix}s3.endpoint"] = str(endpoint)
    path_style = extra.get("path_style_access", bool(endpoint))
    access.public[f"{prefix}s3.path-style-access"] = str(str(path_style).lower() in _TRUE).lower()
    if extra.get("region_name"):
        access.public[f"{prefix}client.region"] = str(extra["region_name"])
    if key:
        access.private[f"{prefix}s3.access-key-id"] = str(key)
        access.private[f"{prefix}s3.secret-access-key"] = str(secret)
        if token:
            access.private[f"{prefix}s3.session-token"] = str(token)


def _iceberg_catalog(config: IcebergConfig, access: LakehouseAccess) -> None:
    """An ``iceberg`` connection (the official Iceberg provider's type) for a REST catalog: host is
    the catalog's URI, login and password the OAuth2 client id and secret, extras more catalog
    properties (``scope``, ``oauth2-server-uri``, ``token``, ``warehouse``, ...). Everything but the
    URI goes into the private file: an extra may be a credential."""
    conn = get_connection(str(config.catalog_conn_id))
    prefix = f"spark.sql.catalog.{config.catalog}"
    if not config.catalog_uri:
        if not conn.host:
            raise InvalidInputError(
                f"Airflow connection {config.catalog_conn_id!r} names no catalog URI (its host) for the REST "
                f"catalog {config.catalog!r}: set the host to the catalog's URL, or pass IcebergConfig(catalog_uri=...)"
            )
        port = f":{conn.port}" if conn.port else ""
        access.public[f"{prefix}.uri"] = conn.host if "://" in conn.host else f"https://{conn.host}{port}"
    if bool(conn.login) != bool(conn.password):
        raise InvalidInputError(
            f"Airflow connection {config.catalog_conn_id!r} has an OAuth2 client id without its secret (or the "
            "reverse): give both (login = client id, password = client secret), or neither"
        )
    if conn.login:
        access.private[f"{prefix}.credential"] = f"{conn.login}:{conn.password}"
    for key, value in conn.extra_dejson.items():
        access.private[f"{prefix}.{key}"] = str(value)


def _glue_catalog(config: IcebergConfig, access: LakehouseAccess) -> None:
    """An ``aws`` connection for a Glue catalog: ``endpoint_url`` is Glue's endpoint (``glue.endpoint``),
    ``region_name`` its region; the keys go into the job's environment, where the AWS SDK's default
    chain reads them (Iceberg's Glue client takes no key property)."""
    conn = get_connection(str(config.catalog_conn_id))
    extra = conn.extra_dejson
    prefix = f"spark.sql.catalog.{config.catalog}"
    if extra.get("endpoint_url"):
        access.public[f"{prefix}.glue.endpoint"] = str(extra["endpoint_url"])
    if extra.get("region_name"):
        access.public[f"{prefix}.client.region"] = str(extra["region_name"])
        access.environment["AWS_REGION"] = str(extra["region_name"])
    key, secret, token = _aws_keys(str(config.catalog_conn_id), conn)
    if key:
        access.environment.update({"AWS_ACCESS_KEY_ID": str(key), "AWS_SECRET_ACCESS_KEY": str(secret)})
        if token:
            access.environment["AWS_SESSION_TOKEN"] = str(token)


def _catalog(config: IcebergConfig, access: LakehouseAccess) -> None:
    """A PostgreSQL connection for Iceberg's JDBC catalog: its uri, user and password."""
    conn = get_connection(str(config.catalog_conn_id))
    prefix = f"spark.sql.catalog.{config.catalog}"
    if not config.catalog_uri:
        if not conn.host or not conn.schema:
            raise InvalidInputError(
                f"Airflow connection {config.catalog_conn_id!r} names no host or database for the JDBC catalog "
                f"{config.catalog!r}: set them on the connection, or pass IcebergConfig(catalog_uri='jdbc:postgresql://...')"
            )
        access.public[f"{prefix}.uri"] = f"jdbc:postgresql://{conn.host}:{conn.port or 5432}/{conn.schema}"
    if conn.login:
        access.private[f"{prefix}.jdbc.user"] = str(conn.login)
    if conn.password:
        access.private[f"{prefix}.jdbc.password"] = str(conn.password)


_CATALOG_CONNECTIONS = {
    CatalogConnection.POSTGRES: _catalog,
    CatalogConnection.ICEBERG: _iceberg_catalog,
    CatalogConnection.AWS: _glue_catalog,
}


def spark_environment(access: LakehouseAccess, env_vars: dict | None, spark_conn_id: str) -> dict | None:
    """``env_vars`` of a spark-submit plus ``access.environment``. Refused on YARN and Kubernetes,
    where the Spark provider turns ``env_vars`` into ``--conf`` arguments on the command line."""
    if not access.environment:
        return env_vars
    master = (get_connection(spark_conn_id).host or "").lower()
    if master.startswith(("yarn", "k8s")):
        raise InvalidInputError(
            f"the lakehouse's AWS keys ({', '.join(sorted(access.environment))}) would reach the command line: on "
            f"{master} the Spark provider passes a job's environment as --conf arguments. Leave the keys out of "
            "the Glue catalog's aws connection and give the cluster an IAM role (the AWS SDK's default chain)"
        )
    return {**(env_vars or {}), **access.environment}


def jars_for_master(conf: dict[str, str], spark_conn_id: str) -> dict[str, str]:
    """``conf`` for the Spark connection's master: :func:`local_class_path` of it when the master is
    local; other masters keep ``spark.jars``, as their executors need the files."""
    try:
        master = (get_connection(spark_conn_id).host or "").lower()
    except AirflowException:  # no such connection: the Spark provider then submits to YARN, as here
        return conf
    return local_class_path(conf) if master.startswith("local") else conf


def local_class_path(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with its local ``spark.jars`` on the driver's class path instead, for a local master.

    A local master's executor copies every ``spark.jars`` entry into the driver's temporary directory
    at each start (374 MB with the S3 jars), and a killed driver leaves that copy behind in ``/tmp``.
    In local mode the executors run in the driver's JVM, so the class path is enough. Remote URLs
    (``s3://``, ``https://``) stay in ``spark.jars``.
    """
    jars = [jar for jar in conf.get("spark.jars", "").split(",") if jar]
    local = [jar for jar in jars if urlsplit(jar).scheme in ("", "file")]
    if not local:
        return conf
    moved = {key: value for key, value in conf.items() if key != "spark.jars"}
    if len(local) < len(jars):
        moved["spark.jars"] = ",".join(jar for jar in jars if jar not in local)
    paths = [urlsplit(jar).path if jar.startswith("file:") else jar for jar in local]
    given = conf.get("spark.driver.extraClassPath")
    moved["spark.driver.extraClassPath"] = os.pathsep.join([*([given] if given else []), *paths])
    return moved


def defaults_file(properties_file: str | None, environ=os.environ) -> Path | None:
    """The properties spark-submit would read without ``--properties-file``."""
    if properties_file:
        return Path(properties_file)
    conf_dir = environ.get("SPARK_CONF_DIR") or (
        os.path.join(environ["SPARK_HOME"], "conf") if environ.get("SPARK_HOME") else None)
    if conf_dir and Path(conf_dir, "spark-defaults.conf").is_file():
        return Path(conf_dir, "spark-defaults.conf")
    return None


def escape_property(text: str, key: bool = False) -> str:
    """``text`` as java.util.Properties reads it back exactly."""
    out = []
    for index, char in enumerate(text):
        if char == "\\":
            out.append("\\\\")
        elif char in "\n\r\t\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[char])
        elif (key and char in "=: #!") or (char == " " and index == 0) or (char in "#!" and index == 0):
            out.append("\\" + char)
        elif ord(char) > 126 or ord(char) < 32:  # UTF-16 units, as Java holds them
            units = char.encode("utf-16-be")
            out.extend(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
        else:
            out.append(char)
    return "".join(out)


@contextlib.contextmanager
def private_properties(private: dict[str, str], properties_file: str | None = None) -> Iterator[str | None]:
    """A 0600 properties file holding ``properties_file``'s (or spark-defaults') lines, then
    ``private``; yields its path (``None`` when there is nothing private) and removes it."""
    if not private:
        yield properties_file
        return
    base = defaults_file(properties_file)
    descriptor, path = tempfile.mkstemp(prefix="pglogical-spark-", suffix=".properties")  # mode 0600
    try:
        with os.fdopen(descriptor, "w", encoding="latin-1") as out:
            if base is not None:
                out.write(base.read_text(encoding="latin-1").rstrip("\n") + "\n")
            for key, value in private.items():
                out.write(f"{escape_property(key, key=True)}={escape_property(value)}\n")
        yield path
    finally:
        os.unlink(path)
