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

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig

_TRUE = ("1", "true", "yes", "on")


@dataclass
class LakehouseAccess:
    """Spark properties that reach the lakehouse: ``public`` ones may go on the command line,
    ``private`` ones (keys, passwords) only into the private properties file."""

    public: dict[str, str] = field(default_factory=dict)
    private: dict[str, str] = field(default_factory=dict)


def lakehouse_access(config: IcebergConfig) -> LakehouseAccess:
    """Read the config's Airflow connections (storage, catalog) into Spark properties."""
    access = LakehouseAccess()
    if config.storage_conn_id:
        storage_properties(config.storage_conn_id, access)
    if config.catalog_conn_id:
        _catalog(config, access)
    return access


def job_access(config: IcebergConfig, staging: LakehouseAccess | None = None) -> LakehouseAccess:
    """Everything one of our spark-submits needs: the lakehouse's Spark configuration and access,
    plus an object-store staging root's (``staging_roots.staging_access``). ``public`` goes into the
    job's ``conf``, ``private`` into its private properties file, never onto the command line."""
    lake, staging = lakehouse_access(config), staging or LakehouseAccess()
    return LakehouseAccess(public={**config.spark_conf(), **lake.public, **staging.public},
                           private={**lake.private, **staging.private})


def _connection(conn_id: str):
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def storage_properties(conn_id: str, access: LakehouseAccess, prefix: str = "spark.hadoop.fs.s3a.") -> None:
    """An ``aws`` connection as S3A properties under ``prefix`` (``spark.hadoop.fs.s3a.bucket.<b>.`` for
    one bucket): keys in login/password (or extras), endpoint and region in extras."""
    conn = _connection(conn_id)
    extra = conn.extra_dejson
    key = conn.login or extra.get("aws_access_key_id")
    secret = conn.password or extra.get("aws_secret_access_key")
    if bool(key) != bool(secret):
        raise InvalidInputError(
            f"Airflow connection {conn_id!r} has an access key without its secret (or the reverse): give both "
            "(login and password, or extras aws_access_key_id and aws_secret_access_key), or neither to use "
            "the machine's AWS credentials chain"
        )
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
        token = extra.get("aws_session_token")
        if token:
            access.private[f"{prefix}session.token"] = str(token)
            access.public[f"{prefix}aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider")


def _catalog(config: IcebergConfig, access: LakehouseAccess) -> None:
    """A PostgreSQL connection for Iceberg's JDBC catalog: its uri, user and password."""
    conn = _connection(str(config.catalog_conn_id))
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
