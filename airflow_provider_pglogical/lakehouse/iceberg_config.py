"""Where the lakehouse is and how Spark reaches it: the Iceberg catalog, its jars and its warehouse.

Plain data (no Airflow import), used by the apply, verify and maintenance operators, the demo and
the tests alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.catalog_kinds import (
    CATALOGS,
    CatalogKind,
    CatalogSpec,
    FileIOKind,
    UnknownCatalogKind,
    catalog_kind,
)
from airflow_provider_pglogical.lakehouse.jar_cache import IcebergJarNotFound, jar_paths, jars_directory
from airflow_provider_pglogical.lakehouse.jar_sets import JarRole

__all__ = ["IcebergConfig", "IcebergJarNotFound", "iceberg_aws_jars", "iceberg_runtime_jar", "jars_directory",
           "postgresql_jdbc_jar", "s3a_jars"]

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
WRITE_MODES = ("merge-on-read", "copy-on-write")
#: Iceberg format versions of the tables the apply writes (``spark/apply/format_versions.py``)
FORMAT_VERSIONS = (2, 3)
#: warehouse schemes of object stores: no atomic rename, so no Hadoop catalog there
OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos", "r2")


def iceberg_runtime_jar() -> str:
    """Path of the installed Spark's pinned ``iceberg-spark-runtime`` jar in the local jar cache."""
    return jar_paths(JarRole.ICEBERG_RUNTIME)[0]


def iceberg_aws_jars() -> list[str]:
    """Path of ``iceberg-aws-bundle`` (S3FileIO, Glue, a REST catalog's AWS signing) in the jar cache."""
    return jar_paths(JarRole.ICEBERG_AWS)


def s3a_jars() -> list[str]:
    """Paths of ``hadoop-aws`` of the Spark build's Hadoop and the AWS SDK it was built with, for a
    warehouse on ``s3a://``/``s3://``."""
    return jar_paths(JarRole.S3A)


def postgresql_jdbc_jar() -> str:
    """Path of the PostgreSQL JDBC driver, for Iceberg's JDBC catalog on PostgreSQL."""
    return jar_paths(JarRole.POSTGRESQL_JDBC)[0]


def scheme_of(uri: str) -> str:
    """The URI's scheme, lower case ('' for a plain path)."""
    scheme, sep, _rest = uri.partition("://")
    return scheme.lower() if sep else ""


def default_warehouse() -> str:
    """``$AIRFLOW_HOME/lakehouse`` as a ``file://`` URI: the embedded warehouse."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return Path(home, "lakehouse").resolve().as_uri()


@dataclass
class IcebergConfig:
    """Where the lakehouse is and how Spark reaches it.

    :param catalog: Spark catalog name the tables are addressed by (``lake.<namespace>.<table>``).
    :param catalog_type: Iceberg ``type``, a :class:`CatalogKind` or its name (``hadoop``, ``jdbc``,
        ``rest``, ``glue``, ``hive``, ``nessie``); ignored when ``catalog_impl`` is given.
    :param catalog_impl: a catalog class (``org.apache.iceberg.aws.glue.GlueCatalog``) instead of a type.
    :param catalog_uri: the catalog's ``uri`` (``jdbc:postgresql://host:5432/db``, a REST URL); for
        ``jdbc`` it is built from ``catalog_conn_id`` when not given.
    :param catalog_conn_id: Airflow connection of the catalog, of the type its kind takes
        (``CatalogSpec.connection``): for ``jdbc`` a PostgreSQL connection; for ``rest`` an ``iceberg``
        connection (host = catalog URI, login/password = OAuth2 client id/secret); for ``glue`` an
        ``aws`` connection. Its secrets reach Spark through a private properties file (Glue's keys
        through the job's environment), never the command line.
    :param warehouse: warehouse URI; default ``$AIRFLOW_HOME/lakehouse`` (embedded Hadoop catalog).
        On an object store (``s3a://``, ``s3://``, ``gs://``, ...) the catalog must be a transactional
        one (``jdbc``, ``rest``, ``glue``): a Hadoop catalog there is refused.
    :param storage_conn_id: Airflow ``aws`` connection of the warehouse's S3 store: access key (login),
        secret (password), extras ``endpoint_url``, ``region_name``, ``path_style_access`` (default
        true when an endpoint is given). The keys reach Spark through the private properties file.
    :param namespace: Iceberg namespace of the target tables and of ``_pglogical_state``.
    :param jars: jar paths (or URLs) for ``spark.jars``, instead of the defaults: the installed Spark's
        pinned jars from the local cache that ``scripts/setup.sh`` resolves (``lakehouse/jar_sets.py``).
    :param packages: Maven coordinates for ``spark.jars.packages`` (resolved by Spark's Ivy at each
        start, e.g. a cluster's own Iceberg version); with ``packages`` and no ``jars`` no default jar
        is added.
    :param extra_conf: more Spark conf (``spark.sql.catalog.lake.uri``, S3 credentials provider, ...).
    :param write_mode: ``merge-on-read`` (default) or ``copy-on-write`` for tables the job creates.
    :param bucket_count: partition tables the job creates by ``bucket(N, first key column)``.
    :param format_version: Iceberg format version of the tables the job creates: 2 (default; every
        engine reads it, Athena and older readers included) or 3 (deletion vectors, row lineage,
        default values). An existing table of another version is refused before anything is written.
    :param upgrade_format_version: upgrade existing tables of an older version to ``format_version``
        (a metadata commit; it cannot be undone, and readers of the old version may no longer read them).
    """

    catalog: str = "lake"
    catalog_type: CatalogKind | str | None = CatalogKind.HADOOP
    catalog_impl: str | None = None
    catalog_uri: str | None = None
    catalog_conn_id: str | None = None
    warehouse: str | None = None
    storage_conn_id: str | None = None
    namespace: str = "pglogical"
    jars: list[str] | None = None
    packages: list[str] | None = None
    extra_conf: dict[str, str] = field(default_factory=dict)
    write_mode: str = "merge-on-read"
    bucket_count: int | None = None
    format_version: int = 2
    upgrade_format_version: bool = False

    #: rendered when an operator holding this config renders its templates
    template_fields = ("catalog", "catalog_uri", "warehouse", "namespace", "extra_conf")

    def __post_init__(self) -> None:
        if self.write_mode not in WRITE_MODES:
            raise ValueError(f"write_mode must be one of {WRITE_MODES}, not {self.write_mode!r}")
        if self.format_version not in FORMAT_VERSIONS:
            raise InvalidInputError(
                f"IcebergConfig(format_version={self.format_version!r}): Iceberg tables are written as format "
                f"version {' or '.join(map(str, FORMAT_VERSIONS))}; use 2 (the default, read by every engine) or 3")

    @property
    def kind(self) -> CatalogKind | None:
        """The catalog's kind (``None``: a ``catalog_impl`` of the user's own)."""
        try:
            return catalog_kind(self.catalog_type, self.catalog_impl)
        except UnknownCatalogKind as error:
            raise InvalidInputError(f"Iceberg catalog {self.catalog!r}: {error}") from None

    @property
    def spec(self) -> CatalogSpec | None:
        """What the catalog's kind needs (:data:`~.catalog_kinds.CATALOGS`)."""
        kind = self.kind
        return None if kind is None else CATALOGS[kind]

    def file_io(self) -> FileIOKind:
        """The FileIO of the warehouse: S3FileIO for a REST or Glue catalog on S3, else Hadoop's."""
        spec = self.spec
        return spec.file_io_on_s3 if spec is not None and self.on_s3() else FileIOKind.HADOOP

    def check(self) -> None:
        """Refuse what cannot be safe or cannot work, before anything runs: an unknown catalog type, a
        setting the kind requires left out, a Hadoop catalog on an object store."""
        warehouse = self.warehouse or ""
        spec = self.spec
        if spec is not None and spec.required and not any(getattr(self, name) for name in spec.required):
            raise InvalidInputError(
                f"Iceberg catalog {self.catalog!r} is a {spec.kind.value} catalog without "
                f"{' or '.join(spec.required)}: set one of them (docs/lakehouse.md shows each catalog's settings)"
            )
        if spec is not None and not spec.transactional and scheme_of(warehouse) in OBJECT_STORE_SCHEMES:
            raise InvalidInputError(
                f"Iceberg catalog {self.catalog!r} is a Hadoop catalog on the object store warehouse {warehouse}: "
                "its commits rely on an atomic rename, which object stores do not have, so two commits can "
                "silently lose one another. Use a transactional catalog instead: catalog_type='jdbc' "
                "(catalog_conn_id or catalog_uri='jdbc:postgresql://...'), catalog_type='rest' (Polaris, "
                "Nessie, Lakekeeper, Unity), or catalog_type='glue' (docs/lakehouse.md)"
            )

    def on_s3(self) -> bool:
        """The warehouse is on S3 (through Hadoop's S3A file system)."""
        return scheme_of(self.warehouse or "") in ("s3", "s3a", "s3n")

    def needs_aws(self) -> bool:
        """The catalog or its FileIO uses Iceberg's AWS module: a kind whose entry says so (Glue, REST:
        S3FileIO, SigV4), S3FileIO, or an ``org.apache.iceberg.aws`` class named in ``extra_conf``."""
        spec = self.spec
        return (spec is not None and spec.aws_module) or self.file_io() is FileIOKind.S3 or any(
            "org.apache.iceberg.aws." in value for value in self.extra_conf.values())

    def default_jars(self) -> list[str]:
        """The Iceberg runtime, plus S3A's jars on S3, ``iceberg-aws-bundle`` for AWS catalogs and
        FileIO, and the PostgreSQL driver for a JDBC catalog: the local paths, so no run resolves."""
        jars = [iceberg_runtime_jar()]
        if self.on_s3():
            jars += s3a_jars()
        if self.needs_aws():
            jars += iceberg_aws_jars()
        if self.kind is CatalogKind.JDBC and (self.catalog_conn_id or (self.catalog_uri or "").startswith("jdbc:postgresql:")):
            jars.append(postgresql_jdbc_jar())
        return jars

    def spark_conf(self) -> dict[str, str]:
        """Spark properties that register the Iceberg catalog, its SQL extensions and its jars
        (never a credential: see :mod:`airflow_provider_pglogical.lakehouse.lakehouse_access`)."""
        self.check()
        prefix = f"spark.sql.catalog.{self.catalog}"
        conf = {
            "spark.sql.extensions": ICEBERG_EXTENSIONS,
            prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.warehouse": self.warehouse or default_warehouse(),
        }
        if self.catalog_impl:
            conf[f"{prefix}.catalog-impl"] = self.catalog_impl
        elif self.kind is not None:
            conf[f"{prefix}.type"] = self.kind.value
        if self.catalog_uri:
            conf[f"{prefix}.uri"] = self.catalog_uri
        if self.file_io() is FileIOKind.S3:
            conf[f"{prefix}.io-impl"] = FileIOKind.S3.value
        spec = self.spec
        conf.update({f"{prefix}.{key}": value for key, value in (spec.defaults if spec is not None else ())})
        if self.on_s3():  # s3:// and s3n:// through S3A too, as on EMR
            conf.update({f"spark.hadoop.fs.{scheme}.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"
                         for scheme in ("s3", "s3n")})
        if self.packages:
            conf["spark.jars.packages"] = ",".join(self.packages)
        jars = self.jars if self.jars is not None else ([] if self.packages else self.default_jars())
        if jars:
            conf["spark.jars"] = ",".join(jars)
        conf.update(self.extra_conf)
        return conf
