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
# the idle tick, a dropped table rebuilt, verify). The newest corner also runs the lakehouse on the
# loopback S3 server (moto) through PySpark 4's own S3 jars: test_object_store_lakehouse.py's [rest]
# case (staging through S3A, hadoop-aws 3.4.1 with AWS SDK v2; the warehouse through S3FileIO,
# iceberg-aws-bundle; Iceberg's REST catalog from the fixture jars scripts/setup.sh resolved for .venv).
#   bash .ci/corner.sh [newest|oldest ...]   (default: both; run after scripts/setup.sh)
#   CORNER_STEP=install bash .ci/corner.sh   only builds the virtualenvs (and the newest corner's jar
#                         cache): .ci/run starts it beside the suite, whose cores it barely needs
#   CORNER_STEP=test bash .ci/corner.sh      only runs the subset (in virtualenvs already built)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
SUBSET=(tests/unit/test_jar_sets.py tests/integration/test_job_results.py)
#: the newest corner's S3 case: what it installs beyond the subset's (the s3 extra, moto's server), its test
S3_EXTRAS="[s3]"
S3_PACKAGES=("moto[server]>=5.1,<6")
S3_SUBSET=("tests/integration/test_object_store_lakehouse.py::test_keyed_and_keyless_tables_staged_and_landed_on_s3_through_each_catalog_and_no_secret_shows[rest]")

STEP=${CORNER_STEP:-all}

install() {
  local name=$1 venv=$2 constraints=$3 started=$SECONDS extras="" && local -a packages=()
  if [ "$name" = newest ]; then extras=$S3_EXTRAS; packages=("${S3_PACKAGES[@]}"); fi
  if [ ! -x "$venv/bin/python" ]; then "$PYTHON" -m venv "$venv"; fi
  local stamp="$venv/.pglogical-installed" want
  want=$( (cat setup.cfg pyproject.toml "$constraints"; echo "$extras ${packages[*]}") | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    { "$venv/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip setuptools wheel &&
      "$venv/bin/python" -m pip install --disable-pip-version-check -q -c "$constraints" -e ".$extras" \
        "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "${packages[@]}"; } >"$venv/pip-install.log" 2>&1 \
      || { tail -n 40 "$venv/pip-install.log"; echo "corner $name: pip install failed"; exit 1; }
    echo "$want" > "$stamp"
  fi
  echo "corner $name: installed in $((SECONDS - started))s"
}

jars() {
  local name=$1 venv=$2
  SPARK_LOCAL_IP=127.0.0.1 "$venv/bin/python" -m airflow_provider_pglogical.lakehouse.jar_cache >"$venv/jar-cache.log" 2>&1 \
    || { tail -n 30 "$venv/jar-cache.log"; echo "corner $name: the jars could not be resolved or checked"; exit 1; }
}

subset() {
  local name=$1 venv=$2 started=$SECONDS versions && local -a tests=("${SUBSET[@]}")
  if [ "$name" = newest ]; then tests+=("${S3_SUBSET[@]}"); fi
  versions=$("$venv/bin/python" -c "from importlib.metadata import version as v; print(', '.join(f'{p} {v(p)}' for p in ('apache-airflow', 'apache-airflow-providers-apache-spark', 'pyspark')))")
  echo "corner $name: $versions"
  PATH="$PWD/$venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 \
    PGLOGICAL_REST_CATALOG_JARS="$PWD/.venv/share/airflow-provider-pglogical/rest-catalog" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=5 "${tests[@]}"
  echo "corner $name: the subset took $((SECONDS - started))s"
}

corner() {
  local name=$1 venv=$2 constraints=$3
  case $STEP in
    install) install "$name" "$venv" "$constraints"
             # the oldest corner checks .venv's cache, which the suite's set-up may still be writing
             if [ "$name" = newest ]; then jars "$name" "$venv"; fi ;;
    test) jars "$name" "$venv"; subset "$name" "$venv" ;;
    all) install "$name" "$venv" "$constraints"; jars "$name" "$venv"; subset "$name" "$venv" ;;
    *) echo "corner: unknown CORNER_STEP $STEP (install, test, all)"; exit 2 ;;
  esac
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
