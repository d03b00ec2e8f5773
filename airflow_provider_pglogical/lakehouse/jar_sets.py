"""Which jars the lakehouse needs for the installed Spark: Maven coordinates and pinned checksums.

A jar set is chosen by PySpark's ``major.minor``: the Iceberg runtime built for that Spark and its
Scala, ``iceberg-aws-bundle`` of the same Iceberg, ``hadoop-aws`` of the Hadoop that Spark build
ships (with the AWS SDK it was built with) and the PostgreSQL JDBC driver. ``jar_cache`` resolves
the coordinates through Spark's own Ivy (``spark.jars.packages``) once, checks every file against
the sha256 pinned here, and from then on Spark gets the local paths (``spark.jars``), offline.

Plain data: no Spark, no Airflow import.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

ICEBERG_VERSION = "1.10.1"
POSTGRESQL_JDBC_VERSION = "42.7.14"


class JarRole(enum.Enum):
    """What a jar is for, which decides when ``IcebergConfig`` puts it on ``spark.jars``."""

    ICEBERG_RUNTIME = "iceberg-runtime"
    #: S3FileIO, the Glue and the REST catalogs' AWS signing (AWS SDK v2, Iceberg's own bundle)
    ICEBERG_AWS = "iceberg-aws"
    #: Hadoop's S3A file system and the AWS SDK that hadoop-aws was built with
    S3A = "s3a"
    POSTGRESQL_JDBC = "postgresql-jdbc"

    @property
    def description(self) -> str:
        """The jars' name in an error message."""
        return {
            JarRole.ICEBERG_RUNTIME: "Iceberg Spark runtime jar",
            JarRole.ICEBERG_AWS: "Iceberg AWS bundle jar",
            JarRole.S3A: "S3A file system's jars",
            JarRole.POSTGRESQL_JDBC: "PostgreSQL JDBC driver's jars",
        }[self]


@dataclass(frozen=True)
class PinnedJar:
    """One file Spark's Ivy resolution leaves in ``<ivy>/jars``, named ``<group>_<artifact>-<version>.jar``.

    :param coordinate: ``group:artifact:version`` (a dependency Ivy brings in, too).
    :param sha256: the checksum set-up refuses any other file for.
    """

    coordinate: str
    sha256: str
    role: JarRole

    @property
    def file_name(self) -> str:
        """The name Spark's Ivy gives the file in ``<ivy>/jars``."""
        group, artifact, version = self.coordinate.split(":")
        return f"{group}_{artifact}-{version}.jar"


@dataclass(frozen=True)
class JarSet:
    """The jars of one Spark line (``3.5``, ``4.0``).

    :param packages: the top-level coordinates for ``spark.jars.packages``; Ivy adds their dependencies.
    :param jars: every file the resolution yields, each with its pinned checksum.
    """

    spark: str
    scala: str
    hadoop: str
    packages: tuple[str, ...]
    jars: tuple[PinnedJar, ...]

    def of_role(self, role: JarRole) -> list[PinnedJar]:
        """The jars that serve ``role``, in the order they are pinned."""
        return [jar for jar in self.jars if jar.role is role]


def _runtime(spark: str, scala: str) -> str:
    return f"org.apache.iceberg:iceberg-spark-runtime-{spark}_{scala}:{ICEBERG_VERSION}"


_AWS_BUNDLE = f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}"
_POSTGRESQL = f"org.postgresql:postgresql:{POSTGRESQL_JDBC_VERSION}"

_AWS_BUNDLE_JAR = PinnedJar(_AWS_BUNDLE, "86bf20892ea5b4c17688f19b075399885f6aa5303f6b2dc9f491e76ceef9633b",
                            JarRole.ICEBERG_AWS)
_POSTGRESQL_JARS = (
    PinnedJar(_POSTGRESQL, "73914527305a40cce504b0d3d90b23caf565136912d607ae8ae7c5895512332c", JarRole.POSTGRESQL_JDBC),
    # the driver's one dependency (annotations, unused at run time); Ivy brings it, so it is pinned too
    PinnedJar("org.checkerframework:checker-qual:3.55.1",
              "857658c8bdcbff794949a8d9922f88d63ee3751c203c7cd7d21ea97f9e745288", JarRole.POSTGRESQL_JDBC),
)

JAR_SETS: dict[str, JarSet] = {}


def _register(jar_set: JarSet) -> None:
    JAR_SETS[jar_set.spark] = jar_set


class IcebergJarNotFound(RuntimeError):
    """A jar the lakehouse needs is not available: not in the local cache, or no jar set fits."""


class UnsupportedSparkError(IcebergJarNotFound):
    """The installed PySpark has no jar set: no Iceberg runtime of the pinned version is built for it."""


def spark_line(version: str) -> str:
    """``major.minor`` of a Spark version string (``3.5.2`` -> ``3.5``, ``4.0.1.dev0`` -> ``4.0``)."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise UnsupportedSparkError(f"Spark version {version!r} is not of the form major.minor[.patch]")
    return f"{parts[0]}.{parts[1]}"


def installed_pyspark_version() -> str:
    """The installed PySpark's version (the client spark-submit and the local sessions run).

    The Spark provider 6.x requires ``pyspark-client``, which installs the same ``pyspark`` package
    without the jars: of another version it overwrites PySpark's Python files, and Spark then fails
    far from the cause. That is refused here, naming the fix.
    """
    from importlib import metadata

    try:
        version = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        raise IcebergJarNotFound("PySpark is not installed: pip install 'airflow-provider-pglogical[spark]'") from None
    try:
        client = metadata.version("pyspark-client")
    except metadata.PackageNotFoundError:
        return version
    if client != version:
        raise IcebergJarNotFound(
            f"pyspark {version} and pyspark-client {client} are both installed and write the same `pyspark` "
            f"package, so its Python files are of one version and its jars of another. Fix: pip install "
            f"'pyspark-client=={version}' (the Spark provider 6.x requires pyspark-client), or install the "
            f"pyspark of pyspark-client's version"
        )
    return version


def jar_set_for(version: str | None = None) -> JarSet:
    """The jar set of Spark ``version`` (default: the installed PySpark's); a clear refusal for others.

    :raises UnsupportedSparkError: naming the supported lines and the way to bring your own jars.
    """
    version = version or installed_pyspark_version()
    line = spark_line(version)
    if line not in JAR_SETS:
        supported = ", ".join(f"{spark}.x" for spark in sorted(JAR_SETS))
        raise UnsupportedSparkError(
            f"PySpark {version}: the provider's default jars cover Spark {supported} only (Iceberg "
            f"{ICEBERG_VERSION} publishes iceberg-spark-runtime for no other Spark line this provider is "
            f"tested on). Fix: install pyspark {' or '.join(f'{spark}.*' for spark in sorted(JAR_SETS))}, "
            "or name an Iceberg runtime built for your Spark yourself: IcebergConfig(packages=["
            f"'org.apache.iceberg:iceberg-spark-runtime-{line}_2.13:<version>', ...]) or IcebergConfig(jars=[...])"
        )
    return JAR_SETS[line]


# PySpark 3.5.x is built against Hadoop 3.3.4 (pyspark/jars/hadoop-client-api-3.3.4.jar), Scala 2.12.
_register(JarSet(
    spark="3.5", scala="2.12", hadoop="3.3.4",
    packages=(_runtime("3.5", "2.12"), _AWS_BUNDLE, "org.apache.hadoop:hadoop-aws:3.3.4", _POSTGRESQL),
    jars=(
        PinnedJar(_runtime("3.5", "2.12"), "39ea09e6c03550a300b9d9ab498949836d2d434e441da4c12a943a086e396940",
                  JarRole.ICEBERG_RUNTIME),
        _AWS_BUNDLE_JAR,
        PinnedJar("org.apache.hadoop:hadoop-aws:3.3.4",
                  "53f9ae03c681a30a50aa17524bd9790ab596b28481858e54efd989a826ed3a4a", JarRole.S3A),
        PinnedJar("com.amazonaws:aws-java-sdk-bundle:1.12.262",
                  "873fe7cf495126619997bec21c44de5d992544aea7e632fdc77adb1a0915bae5", JarRole.S3A),
        PinnedJar("org.wildfly.openssl:wildfly-openssl:1.0.7.Final",
                  "9f7058778978ec2ad90c7224401a4b0013d93e0dd3fa0f72b25244ffa3507ca8", JarRole.S3A),
        *_POSTGRESQL_JARS,
    ),
))
# PySpark 4.0.x is built against Hadoop 3.4.1 (pyspark/jars/hadoop-client-api-3.4.1.jar), Scala 2.13;
# hadoop-aws 3.4 talks to S3 through the AWS SDK v2.
_register(JarSet(
    spark="4.0", scala="2.13", hadoop="3.4.1",
    packages=(_runtime("4.0", "2.13"), _AWS_BUNDLE, "org.apache.hadoop:hadoop-aws:3.4.1", _POSTGRESQL),
    jars=(
        PinnedJar(_runtime("4.0", "2.13"), "2192a0881ed0f5773b5a83a8820d2b0b2069beec203028643a1c338551007f09",
                  JarRole.ICEBERG_RUNTIME),
        _AWS_BUNDLE_JAR,
        PinnedJar("org.apache.hadoop:hadoop-aws:3.4.1",
                  "01334a07e179cae2b7e251f24857f11e3759108c9d6a79dcbe362a4295227da2", JarRole.S3A),
        PinnedJar("software.amazon.awssdk:bundle:2.24.6",
                  "890bf9f2a80488f7a8aa8277d64d13a9ea3a3cdff8607ef3b63a878d8b467b41", JarRole.S3A),
        PinnedJar("org.wildfly.openssl:wildfly-openssl:1.1.3.Final",
                  "4e7d50a877822ba7561fa6a0109691b30b23a784eba3f3f8fbbf5ea866500786", JarRole.S3A),
        *_POSTGRESQL_JARS,
    ),
))
