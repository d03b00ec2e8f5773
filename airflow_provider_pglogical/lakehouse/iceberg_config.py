"""Where the lakehouse is and how Spark reaches it: the Iceberg catalog, its jar and its warehouse.

Plain data (no Airflow import), used by the apply, verify and maintenance operators, the demo and
the tests alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ICEBERG_RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.9.2.jar"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
WRITE_MODES = ("merge-on-read", "copy-on-write")


class IcebergJarNotFound(RuntimeError):
    """The pinned Iceberg Spark runtime jar is not installed."""


def iceberg_runtime_jar() -> str:
    """Path of the pinned ``iceberg-spark-runtime-3.5_2.12-1.9.2.jar`` shipped by the ``iceberg-jar`` extra."""
    try:
        from importlib.resources import files

        jar = files("snowpark_connect_deps_iceberg") / "jars" / ICEBERG_RUNTIME_JAR
    except ModuleNotFoundError:
        jar = None
    if jar is None or not jar.is_file():
        raise IcebergJarNotFound(
            f"{ICEBERG_RUNTIME_JAR} was not found: install it with "
            "`pip install airflow-provider-pglogical[iceberg-jar]` (the PyPI wheel "
            "snowpark-connect-deps-iceberg==1.0.1), or pass IcebergConfig(jars=[...]) or "
            "IcebergConfig(packages=['org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.9.2'])"
        )
    return str(jar)


def default_warehouse() -> str:
    """``$AIRFLOW_HOME/lakehouse`` as a ``file://`` URI: the embedded warehouse."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return Path(home, "lakehouse").resolve().as_uri()


@dataclass
class IcebergConfig:
    """Where the lakehouse is and how Spark reaches it.

    :param catalog: Spark catalog name the tables are addressed by (``lake.<namespace>.<table>``).
    :param catalog_type: Iceberg ``type`` (``hadoop``, ``hive``, ``rest``, ``glue``, ``jdbc``, ``nessie``);
        ignored when ``catalog_impl`` is given.
    :param catalog_impl: a catalog class (``org.apache.iceberg.aws.glue.GlueCatalog``) instead of a type.
    :param warehouse: warehouse URI; default ``$AIRFLOW_HOME/lakehouse`` (embedded Hadoop catalog).
    :param namespace: Iceberg namespace of the target tables and of ``_pglogical_state``.
    :param jars: jar paths for ``spark.jars``; default the pinned runtime jar, unless ``packages`` is set.
    :param packages: Maven coordinates for ``spark.jars.packages``.
    :param extra_conf: more Spark conf (``spark.sql.catalog.lake.uri``, S3 credentials provider, ...).
    :param write_mode: ``merge-on-read`` (default) or ``copy-on-write`` for tables the job creates.
    :param bucket_count: partition tables the job creates by ``bucket(N, first key column)``.
    """

    catalog: str = "lake"
    catalog_type: str | None = "hadoop"
    catalog_impl: str | None = None
    warehouse: str | None = None
    namespace: str = "pglogical"
    jars: list[str] | None = None
    packages: list[str] | None = None
    extra_conf: dict[str, str] = field(default_factory=dict)
    write_mode: str = "merge-on-read"
    bucket_count: int | None = None

    #: rendered when an operator holding this config renders its templates
    template_fields = ("catalog", "warehouse", "namespace", "extra_conf")

    def __post_init__(self) -> None:
        if self.write_mode not in WRITE_MODES:
            raise ValueError(f"write_mode must be one of {WRITE_MODES}, not {self.write_mode!r}")

    def spark_conf(self) -> dict[str, str]:
        """Spark properties that register the Iceberg catalog, its SQL extensions and its jars."""
        prefix = f"spark.sql.catalog.{self.catalog}"
        conf = {
            "spark.sql.extensions": ICEBERG_EXTENSIONS,
            prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.warehouse": self.warehouse or default_warehouse(),
        }
        if self.catalog_impl:
            conf[f"{prefix}.catalog-impl"] = self.catalog_impl
        elif self.catalog_type:
            conf[f"{prefix}.type"] = self.catalog_type
        if self.packages:
            conf["spark.jars.packages"] = ",".join(self.packages)
        jars = self.jars if self.jars is not None else ([] if self.packages else [iceberg_runtime_jar()])
        if jars:
            conf["spark.jars"] = ",".join(jars)
        conf.update(self.extra_conf)
        return conf

    def job_args(self) -> list[str]:
        """The lakehouse arguments of the apply job's command line."""
        args = ["--catalog", self.catalog, "--namespace", self.namespace, "--write-mode", self.write_mode]
        if self.bucket_count:
            args += ["--bucket-count", str(self.bucket_count)]
        return args
