#!/usr/bin/env bash
# Set up (if needed) and run the whole test-suite: unit tests and integration tests against
# real PostgreSQL clusters, real Spark (local mode) and a real Iceberg warehouse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
# spark-submit and airflow live in the venv: the Spark provider and the tests call them by name.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
