#!/usr/bin/env bash
# The corners of the supported ranges that the whole suite (the README's test command, on .venv:
# setup.cfg's test extra) does not run on, each in a virtualenv of its own, through the same set-up
# step for the jars, then a real end-to-end subset there:
#   newest  .venv-corner  scripts/newest-constraints.txt (Airflow 3.3, Spark provider 6.x, PySpark 4.0,
#                         its own jar set: iceberg-spark-runtime-4.0_2.13, hadoop-aws 3.4.1 + AWS SDK v2)
#   oldest  .venv-oldest  scripts/lowest-constraints.txt (Airflow 3.0.0, Spark provider 5.0.0, PySpark
#                         3.5.2; the 3.5 jar set, taken from .venv's checked cache)
# The subset: the jar sets (tests/unit/test_jar_sets.py) and the operators driven end to end with real
# spark-submit (tests/integration/test_job_results.py: publication, initial sync, apply, pull, apply,
# the idle tick, a dropped table rebuilt, verify).
#   bash .ci/corner.sh [newest|oldest ...]   (default: both; run after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
SUBSET=(tests/unit/test_jar_sets.py tests/integration/test_job_results.py)

corner() {
  local name=$1 venv=$2 constraints=$3 started=$SECONDS
  if [ ! -x "$venv/bin/python" ]; then "$PYTHON" -m venv "$venv"; fi
  local stamp="$venv/.pglogical-installed" want
  want=$(cat setup.cfg pyproject.toml "$constraints" | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    { "$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip setuptools wheel &&
      "$venv/bin/python" -m pip install --disable-pip-version-check -q -c "$constraints" -e . \
        "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"; } >"$venv/pip-install.log" 2>&1 \
      || { tail -n 40 "$venv/pip-install.log"; echo "corner $name: pip install failed"; exit 1; }
    echo "$want" > "$stamp"
  fi
  local versions
  versions=$("$venv/bin/python" -c "from importlib.metadata import version as v; print(', '.join(f'{p} {v(p)}' for p in ('apache-airflow', 'apache-airflow-providers-apache-spark', 'pyspark')))")
  echo "corner $name: $versions (installed in $((SECONDS - started))s)"
  SPARK_LOCAL_IP=127.0.0.1 "$venv/bin/python" -m airflow_provider_pglogical.lakehouse.jar_cache >"$venv/jar-cache.log" 2>&1 \
    || { tail -n 30 "$venv/jar-cache.log"; echo "corner $name: the jars could not be resolved or checked"; exit 1; }
  PATH="$PWD/$venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "${SUBSET[@]}"
  echo "corner $name: took $((SECONDS - started))s"
}

for which in "${@:-newest oldest}"; do
  for name in $which; do
    case $name in
      newest) corner newest .venv-corner scripts/newest-constraints.txt ;;
      # the 3.5 jar set is the one .venv resolved: its cache is checked here, never resolved into
      oldest) PGLOGICAL_JARS_DIR="$PWD/.venv/share/airflow-provider-pglogical/ivy/jars" \
                corner oldest .venv-oldest scripts/lowest-constraints.txt ;;
      *) echo "corner: unknown corner $name (newest, oldest)"; exit 2 ;;
    esac
  done
done
