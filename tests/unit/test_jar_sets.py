"""The jar sets: the installed Spark's jars, resolved by set-up from Maven Central, pinned and checked;
clear refusals for a Spark line without an Iceberg runtime and for a file that is not the pinned one;
a user's own coordinates or paths instead of the defaults; the version ranges of setup.cfg."""

from __future__ import annotations

import configparser
import os
from importlib import metadata
from pathlib import Path

import pytest

from airflow_provider_pglogical.lakehouse import jar_cache
from airflow_provider_pglogical.lakehouse.iceberg_config import (
    IcebergConfig,
    iceberg_aws_jars,
    iceberg_runtime_jar,
    postgresql_jdbc_jar,
    s3a_jars,
)
from airflow_provider_pglogical.lakehouse.jar_sets import (
    ICEBERG_VERSION,
    JAR_SETS,
    IcebergJarNotFound,
    JarRole,
    UnsupportedSparkError,
    installed_pyspark_version,
    jar_set_for,
    spark_line,
)

REPO = Path(__file__).resolve().parents[2]


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def test_the_installed_spark_gets_its_runtime_and_the_hadoop_aws_of_its_own_hadoop():
    jar_set = jar_set_for()
    assert jar_set.spark == spark_line(installed_pyspark_version())
    scala = next(_pyspark_jars().glob("scala-library-*.jar")).name.removeprefix("scala-library-")
    assert scala.startswith(jar_set.scala + ".")
    assert (_pyspark_jars() / f"hadoop-client-api-{jar_set.hadoop}.jar").is_file()
    assert f"org.apache.hadoop:hadoop-aws:{jar_set.hadoop}" in jar_set.packages
    assert f"org.apache.iceberg:iceberg-spark-runtime-{jar_set.spark}_{jar_set.scala}:{ICEBERG_VERSION}" in jar_set.packages


def test_every_pinned_jar_of_the_installed_spark_is_in_the_cache_with_its_checksum():
    jar_set = jar_set_for()
    assert jar_cache.problems(jar_set) == []
    roles = {jar.role for jar in jar_set.jars}
    assert roles == set(JarRole)
    assert Path(iceberg_runtime_jar()).is_file() and Path(postgresql_jdbc_jar()).is_file()
    assert [Path(jar).name for jar in iceberg_aws_jars()] == [f"org.apache.iceberg_iceberg-aws-bundle-{ICEBERG_VERSION}.jar"]
    assert all(Path(jar).is_file() for jar in s3a_jars())


@pytest.mark.parametrize("line", sorted(JAR_SETS))
def test_each_jar_set_pins_a_sha256_for_each_file_of_one_iceberg_version(line):
    jar_set = JAR_SETS[line]
    assert all(len(jar.sha256) == 64 and int(jar.sha256, 16) >= 0 for jar in jar_set.jars)
    pinned = {jar.coordinate for jar in jar_set.jars}
    assert set(jar_set.packages) <= pinned  # every top-level coordinate, and what Ivy adds for them
    iceberg = [c for c in pinned if c.startswith("org.apache.iceberg:")]
    assert {c.rsplit(":", 1)[1] for c in iceberg} == {ICEBERG_VERSION}


@pytest.mark.parametrize("version", ["4.1.0", "4.3.0", "3.4.4"])
def test_a_spark_line_without_an_iceberg_runtime_is_refused_naming_what_is_supported(version):
    with pytest.raises(UnsupportedSparkError) as refused:
        jar_set_for(version)
    message = str(refused.value)
    assert f"PySpark {version}" in message and "Spark 3.5.x, 4.0.x only" in message
    assert "install pyspark 3.5.* or 4.0.*" in message
    assert f"iceberg-spark-runtime-{spark_line(version)}_2.13:<version>" in message


def test_a_pyspark_client_of_another_version_is_refused_naming_the_pin(monkeypatch):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "4.2.0" if name == "pyspark-client" else real(name))
    with pytest.raises(IcebergJarNotFound, match=r"pyspark-client 4\.2\.0 are both installed.*pip install "
                                                 r"'pyspark-client==\d"):
        installed_pyspark_version()


def test_a_file_that_is_not_the_pinned_one_is_refused_and_left_as_it_was(monkeypatch, tmp_path):
    jar_set = jar_set_for()
    for jar in jar_cache.cached(jar_set):
        (tmp_path / jar.path.name).symlink_to(jar.path)
    impostor = tmp_path / jar_set.of_role(JarRole.POSTGRESQL_JDBC)[0].file_name
    impostor.unlink()
    impostor.write_bytes(b"not the driver")
    monkeypatch.setenv("PGLOGICAL_JARS_DIR", str(tmp_path))
    with pytest.raises(IcebergJarNotFound) as refused:
        jar_cache.ensure(jar_set)  # a folder of the user's own: checked, never resolved into
    message = str(refused.value)
    assert f"{impostor.name} has sha256 {jar_cache.sha256_of(impostor)}, not the pinned" in message
    assert "do not use it" in message
    assert impostor.read_bytes() == b"not the driver" and len(os.listdir(tmp_path)) == len(jar_set.jars)


def test_a_cluster_names_its_own_coordinates_or_paths_instead_of_the_defaults():
    packages = ["org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.11.0", "org.apache.iceberg:iceberg-aws-bundle:1.11.0"]
    conf = IcebergConfig(catalog_type="glue", warehouse="s3://b/wh", packages=packages).spark_conf()
    assert conf["spark.jars.packages"] == ",".join(packages) and "spark.jars" not in conf
    conf = IcebergConfig(jars=["/opt/spark/extra/iceberg.jar"]).spark_conf()
    assert conf["spark.jars"] == "/opt/spark/extra/iceberg.jar" and "spark.jars.packages" not in conf


def test_aws_catalogs_and_s3_file_io_get_the_iceberg_aws_bundle_by_default():
    for config in (IcebergConfig(catalog_type="rest", catalog_uri="http://127.0.0.1:8181"),
                   IcebergConfig(catalog_type="glue"),
                   IcebergConfig(extra_conf={"spark.sql.catalog.lake.io-impl": "org.apache.iceberg.aws.s3.S3FileIO"})):
        assert config.spark_conf()["spark.jars"].split(",") == [iceberg_runtime_jar(), *iceberg_aws_jars()]
    assert IcebergConfig().spark_conf()["spark.jars"] == iceberg_runtime_jar()


def _requirement(lines: str, name: str) -> str:
    return next(line.strip() for line in lines.splitlines()
                if line.strip().split(">")[0].split("<")[0].split("=")[0].strip() == name)


def test_the_version_ranges_include_today_and_the_lowest_set_has_a_jar_set():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    requires = setup["options"]["install_requires"]
    assert _requirement(requires, "apache-airflow") == "apache-airflow>=3.0,<4"
    assert _requirement(requires, "apache-airflow-providers-apache-spark") == "apache-airflow-providers-apache-spark>=5.0,<7"
    assert _requirement(requires, "pyspark") == "pyspark>=3.5.2,<5"
    # the `spark` extra is what the default jars cover, each line of it has a jar set
    assert _requirement(setup["options.extras_require"]["spark"], "pyspark") == "pyspark>=3.5.2,<4.1"
    assert sorted(JAR_SETS) == ["3.5", "4.0"]
    lowest = (REPO / "scripts" / "lowest-constraints.txt").read_text()
    assert jar_set_for(_requirement(lowest, "pyspark").split("==")[1]).spark == "3.5"
