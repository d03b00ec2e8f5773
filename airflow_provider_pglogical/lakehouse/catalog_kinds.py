"""The Iceberg catalogs the provider knows, as one enum and one table of what each needs.

As pyiceberg keeps ``CatalogType`` and ``AVAILABLE_CATALOGS``, every place that depends on the
kind of catalog (the Spark properties, the check before anything runs, which Airflow connection
holds its credentials, which FileIO reads and writes the warehouse, whether the worker can list
its tables without a JVM) reads the entry of :data:`CATALOGS` here and compares no strings.
Adding a kind is one :class:`CatalogKind` member, one :class:`CatalogSpec` entry and its test
(``tests/unit/test_catalog_kinds.py``). Plain data: no Airflow, no Spark.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CatalogKind(str, enum.Enum):
    """An Iceberg catalog implementation, by the ``type`` name Iceberg's ``CatalogUtil`` knows it by."""

    HADOOP = "hadoop"
    JDBC = "jdbc"
    REST = "rest"
    GLUE = "glue"
    HIVE = "hive"
    NESSIE = "nessie"


class FileIOKind(str, enum.Enum):
    """How the catalog's tables read and write the warehouse's files."""

    #: Hadoop's FileSystem: the local disk, HDFS, or S3 through S3A (``hadoop-aws``)
    HADOOP = "org.apache.iceberg.hadoop.HadoopFileIO"
    #: Iceberg's own S3 client (AWS SDK v2, ``iceberg-aws-bundle``): ``s3.*`` catalog properties
    S3 = "org.apache.iceberg.aws.s3.S3FileIO"


class CatalogConnection(str, enum.Enum):
    """The Airflow connection type ``IcebergConfig.catalog_conn_id`` names for a kind."""

    #: PostgreSQL (host, port, database, login, password): the JDBC catalog's database
    POSTGRES = "postgres"
    #: the official ``apache-airflow-providers-apache-iceberg`` type: host = catalog URI,
    #: login/password = OAuth2 client id/secret, extra = more catalog properties
    ICEBERG = "iceberg"
    #: an ``aws`` connection (keys, ``region_name``, ``endpoint_url``): Glue's API
    AWS = "aws"


@dataclass(frozen=True)
class CatalogSpec:
    """What one kind of catalog needs.

    :param impl: the Iceberg catalog class (``catalog_impl`` naming it means this kind).
    :param transactional: a commit is an atomic swap in the catalog, not a file rename: safe on an
        object store. The Hadoop catalog is not.
    :param required: ``IcebergConfig`` settings of which at least one must be set (``catalog_uri``,
        ``catalog_conn_id``); empty: none.
    :param conf_keys: the catalog's own Spark properties (under ``spark.sql.catalog.<name>.``) the
        provider sets for it, besides ``type``/``catalog-impl`` and ``warehouse``.
    :param private_keys: those of them that are credentials: only ever in the private properties file.
    :param file_io_on_s3: the FileIO of a warehouse on S3.
    :param connection: the Airflow connection type of ``catalog_conn_id`` (``None``: the kind takes none).
    :param lists_tables_without_spark: the worker can ask the catalog which tables exist without a JVM
        (the idle tick's dropped-table check, :mod:`.catalog_tables`).
    :param aws_module: the catalog's client uses Iceberg's AWS module (``iceberg-aws-bundle`` on the
        classpath: Glue's client, a REST catalog's SigV4 signing and S3FileIO).
    :param defaults: catalog properties the provider sets unless the config (``extra_conf``) or the
        catalog's connection (its extras) sets them: each saves requests the apply does not need.
    """

    kind: CatalogKind
    impl: str
    transactional: bool
    required: tuple[str, ...] = ()
    conf_keys: tuple[str, ...] = ()
    private_keys: tuple[str, ...] = ()
    file_io_on_s3: FileIOKind = FileIOKind.HADOOP
    connection: CatalogConnection | None = None
    lists_tables_without_spark: bool = False
    aws_module: bool = False
    defaults: tuple[tuple[str, str], ...] = ()


#: Iceberg's REST client POSTs a metrics report to the catalog after every scan and every commit
#: (``RESTMetricsReporter``), in the thread that scanned or committed: two of every round's six
#: requests per table, which the apply reads nowhere (it keeps its own history). A deployment that
#: wants them in its catalog sets the property back to true (``extra_conf`` or the connection's extra).
REST_METRICS_REPORTING = ("rest-metrics-reporting-enabled", "false")


CATALOGS: dict[CatalogKind, CatalogSpec] = {
    CatalogKind.HADOOP: CatalogSpec(CatalogKind.HADOOP, "org.apache.iceberg.hadoop.HadoopCatalog",
                                    transactional=False),
    CatalogKind.JDBC: CatalogSpec(
        CatalogKind.JDBC, "org.apache.iceberg.jdbc.JdbcCatalog", transactional=True,
        required=("catalog_uri", "catalog_conn_id"), conf_keys=("uri", "jdbc.user", "jdbc.password"),
        private_keys=("jdbc.user", "jdbc.password"), connection=CatalogConnection.POSTGRES,
        lists_tables_without_spark=True),
    CatalogKind.REST: CatalogSpec(
        CatalogKind.REST, "org.apache.iceberg.rest.RESTCatalog", transactional=True,
        required=("catalog_uri", "catalog_conn_id"),
        conf_keys=("uri", "credential", "token", "oauth2-server-uri", "scope", "io-impl", "s3.endpoint",
                   "s3.path-style-access", "s3.access-key-id", "s3.secret-access-key", "s3.session-token",
                   "client.region"),
        private_keys=("credential", "token", "s3.access-key-id", "s3.secret-access-key", "s3.session-token"),
        file_io_on_s3=FileIOKind.S3, connection=CatalogConnection.ICEBERG, aws_module=True,
        defaults=(REST_METRICS_REPORTING,)),
    CatalogKind.GLUE: CatalogSpec(
        CatalogKind.GLUE, "org.apache.iceberg.aws.glue.GlueCatalog", transactional=True,
        conf_keys=("glue.endpoint", "client.region", "io-impl", "s3.endpoint", "s3.path-style-access",
                   "s3.access-key-id", "s3.secret-access-key", "s3.session-token"),
        private_keys=("s3.access-key-id", "s3.secret-access-key", "s3.session-token"),
        file_io_on_s3=FileIOKind.S3, connection=CatalogConnection.AWS, aws_module=True),
    CatalogKind.HIVE: CatalogSpec(CatalogKind.HIVE, "org.apache.iceberg.hive.HiveCatalog", transactional=True,
                                  conf_keys=("uri",)),
    CatalogKind.NESSIE: CatalogSpec(CatalogKind.NESSIE, "org.apache.iceberg.nessie.NessieCatalog",
                                    transactional=True, conf_keys=("uri",)),
}

_BY_IMPL = {spec.impl: spec.kind for spec in CATALOGS.values()}


class UnknownCatalogKind(ValueError):
    """A ``catalog_type`` that Iceberg does not know."""


def catalog_kind(catalog_type: str | None, catalog_impl: str | None = None) -> CatalogKind | None:
    """The kind a config names: by ``catalog_impl`` when given (``None`` for a class not in the table,
    a catalog of the user's own), else by ``catalog_type`` (any case).

    :raises UnknownCatalogKind: a ``catalog_type`` not in :class:`CatalogKind`, naming the known ones.
    """
    if catalog_impl:
        return _BY_IMPL.get(catalog_impl)
    if catalog_type is None:
        return None
    try:
        return CatalogKind(str(catalog_type.value if isinstance(catalog_type, CatalogKind) else catalog_type).lower())
    except ValueError:
        known = ", ".join(repr(kind.value) for kind in CatalogKind)
        raise UnknownCatalogKind(
            f"catalog_type {catalog_type!r} is not an Iceberg catalog type this provider knows ({known}): "
            "fix the name, or pass catalog_impl='<your catalog class>' for a catalog of your own") from None


def spec_of(catalog_type: str | None, catalog_impl: str | None = None) -> CatalogSpec | None:
    """The table's entry for the config's kind (``None``: a catalog class of the user's own)."""
    kind = catalog_kind(catalog_type, catalog_impl)
    return None if kind is None else CATALOGS[kind]
