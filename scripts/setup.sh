#!/usr/bin/env bash
# One-time (and idempotent) set-up of a fresh Debian 12 machine for this project:
# PostgreSQL server binaries, Java 17 for Spark, a Python 3.11 virtualenv with the package, and the
# lakehouse's jars from Maven Central.
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

# The lakehouse's jars, from their Maven Central coordinates: the Iceberg Spark runtime built for the
# installed PySpark, iceberg-aws-bundle, hadoop-aws of PySpark's Hadoop with its AWS SDK, and the
# PostgreSQL JDBC driver (lakehouse/jar_sets.py pins the versions and sha256 of each file). Resolved
# once by a throw-away Spark session through spark.jars.packages (Spark's own Ivy) into
# .venv/share/airflow-provider-pglogical/ivy; every file is checked against its pinned checksum, here
# and on every later run. Tests and the demo then use the local paths (spark.jars): offline.
echo "setup: checking the lakehouse's jars (resolved from Maven Central the first time)"
SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1} .venv/bin/python -m airflow_provider_pglogical.lakehouse.jar_cache \
  >.venv/jar-cache.log 2>&1 || { tail -n 30 .venv/jar-cache.log; echo "setup: the jars could not be resolved or checked (full log: .venv/jar-cache.log)"; exit 1; }

# Iceberg's REST catalog fixture, for the tests and `demo.sh --lakehouse rest` (embedded/rest_catalog.py):
# Maven resolves its artifacts from Maven Central once into .venv/share/airflow-provider-pglogical/rest-catalog,
# and every file is checked against its pinned sha256. The JDK's source launcher starts it (a JDK, not a JRE).
command -v mvn >/dev/null 2>&1 || { echo "setup: installing Maven"; apt_install maven; }
command -v javac >/dev/null 2>&1 || { echo "setup: installing the JDK 17"; apt_install openjdk-17-jdk-headless; }
.venv/bin/python -m airflow_provider_pglogical.embedded.rest_catalog >.venv/rest-catalog.log 2>&1 \
  || { tail -n 30 .venv/rest-catalog.log; echo "setup: the REST catalog's jars could not be resolved (full log: .venv/rest-catalog.log)"; exit 1; }
