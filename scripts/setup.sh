#!/usr/bin/env bash
# One-time (and idempotent) set-up of a fresh Debian 12 machine for this project:
# PostgreSQL server binaries, Java 17 for Spark, and a Python 3.11 virtualenv with the package.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# PostgreSQL server binaries (initdb, pg_ctl): tests and the demo start throwaway clusters.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "setup: installing the PostgreSQL server package"
  apt_install postgresql
fi
# PostgreSQL refuses to run as root; the clusters run as the 'postgres' OS user when we are root.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --create-home --shell /bin/bash postgres
fi
# Java 17 for Spark.
if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java 17"
  apt_install openjdk-17-jre-headless
fi

# The PostgreSQL JDBC driver (/usr/share/java/postgresql.jar) for Iceberg's JDBC catalog on PostgreSQL.
if [ ! -f /usr/share/java/postgresql.jar ]; then
  echo "setup: installing the PostgreSQL JDBC driver"
  apt_install libpostgresql-jdbc-java
fi

# Chromium, headless, for the pipeline view's browser test (tests/integration/test_ui.py).
if ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing Chromium"
  apt_install chromium
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.pglogical-installed
want=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the package and its dependencies into .venv (a few minutes the first time)"
  log=.venv/pip-install.log
  { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip setuptools wheel &&
    .venv/bin/python -m pip install --disable-pip-version-check -e '.[test]'; } >"$log" 2>&1 \
    || { tail -n 40 "$log"; echo "setup: pip install failed (full log: $log)"; exit 1; }
  .venv/bin/python -c "import airflow_provider_pglogical, pyspark, psycopg2, pyarrow, airflow.providers.apache.spark, airflow.providers.amazon, s3fs"
  echo "$want" > "$stamp"
fi

# Hadoop's S3A file system for a lakehouse on S3: hadoop-aws 3.3.1 and the AWS SDK bundle it was built
# with. Maven is not reachable from here; the PyPI sdist sagemaker-pyspark==1.4.5 ships both jars
# (its own package pins pyspark 3.3, so it is only downloaded, never installed). lakehouse/iceberg_config.py
# finds them under the interpreter's prefix.
jars=.venv/share/airflow-provider-pglogical/jars
if ! sha256sum --quiet -c - >/dev/null 2>&1 <<SUMS
6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e  $jars/hadoop-aws-3.3.1.jar
b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead  $jars/aws-java-sdk-bundle-1.11.901.jar
SUMS
then
  echo "setup: taking the S3A jars from the PyPI sdist sagemaker-pyspark==1.4.5 (180 MB, once)"
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download --disable-pip-version-check --no-deps --no-binary :all: -q -d "$tmp" \
    sagemaker-pyspark==1.4.5
  mkdir -p "$jars"
  tar -xzf "$tmp"/sagemaker_pyspark-1.4.5.tar.gz -C "$tmp" sagemaker_pyspark-1.4.5/deps/jars/hadoop-aws-3.3.1.jar \
    sagemaker_pyspark-1.4.5/deps/jars/aws-java-sdk-bundle-1.11.901.jar
  mv "$tmp"/sagemaker_pyspark-1.4.5/deps/jars/*.jar "$jars"/
  rm -rf "$tmp"
  sha256sum --quiet -c - <<SUMS || { echo "setup: the S3A jars do not have the expected checksums"; exit 1; }
6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e  $jars/hadoop-aws-3.3.1.jar
b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead  $jars/aws-java-sdk-bundle-1.11.901.jar
SUMS
fi

# Iceberg's REST catalog fixture, for the tests and `demo.sh --lakehouse rest` (embedded/rest_catalog.py):
# Maven resolves its artifacts from Maven Central once into .venv/share/airflow-provider-pglogical/rest-catalog,
# and every file is checked against its pinned sha256. The JDK's source launcher starts it (a JDK, not a JRE).
command -v mvn >/dev/null 2>&1 || { echo "setup: installing Maven"; apt_install maven; }
command -v javac >/dev/null 2>&1 || { echo "setup: installing the JDK 17"; apt_install openjdk-17-jdk-headless; }
.venv/bin/python -m airflow_provider_pglogical.embedded.rest_catalog >.venv/rest-catalog.log 2>&1 \
  || { tail -n 30 .venv/rest-catalog.log; echo "setup: the REST catalog's jars could not be resolved (full log: .venv/rest-catalog.log)"; exit 1; }
# iceberg-aws-bundle of the Iceberg runtime (1.9.2): S3FileIO and the Glue catalog's AWS SDK v2
if ! sha256sum --quiet -c - >/dev/null 2>&1 <<SUMS
ea5b6fec1b547e2fe936f804c737943f5ee322d038560f63a8261deb766def1b  $jars/iceberg-aws-bundle-1.9.2.jar
SUMS
then
  echo "setup: resolving iceberg-aws-bundle 1.9.2 from Maven Central"
  mvn -q -B dependency:copy -Dartifact=org.apache.iceberg:iceberg-aws-bundle:1.9.2 -DoutputDirectory="$jars" >/dev/null
  sha256sum --quiet -c - <<SUMS || { echo "setup: iceberg-aws-bundle does not have the expected checksum"; exit 1; }
ea5b6fec1b547e2fe936f804c737943f5ee322d038560f63a8261deb766def1b  $jars/iceberg-aws-bundle-1.9.2.jar
SUMS
fi
