#!/usr/bin/env bash
# Set up (if needed) and run the main job end to end on the embedded default:
# a local PostgreSQL, Airflow (dags test), Spark local mode and a local Iceberg warehouse.
# `--lakehouse s3`: the warehouse on a local S3 server (moto) through Iceberg's JDBC catalog instead.
# `--lakehouse rest`: the warehouse on that S3 server through S3FileIO, the tables in Iceberg's REST catalog.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
# spark-submit and airflow live in the venv: the Spark provider and the tests call them by name.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m airflow_provider_pglogical.embedded.demo "$@"
