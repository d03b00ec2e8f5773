#!/usr/bin/env bash
# Set up (if needed) and run the whole test-suite: unit tests and integration tests against
# real PostgreSQL clusters, real Spark (local mode) and a real Iceberg warehouse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
exec .venv/bin/python -m pytest "$@"
