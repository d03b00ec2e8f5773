"""Smoke test of an installed airflow-provider-pglogical, run inside the environment to check
(e.g. one with the lowest allowed versions of every dependency, one with the highest):

    python scripts/smoke_test_install.py

Imports every module the provider info names, loads the example DAGs (no import errors, also
without the resolved jars), checks Airflow lists the provider and its ``airflow pglogical``
commands, then runs a publication, an initial sync and a pull against a throwaway PostgreSQL
cluster. Prints the versions it ran with; exits non-zero on any failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk", "apache-airflow-providers-postgres",
            "apache-airflow-providers-common-sql", "apache-airflow-providers-common-compat",
            "apache-airflow-providers-apache-spark", "pyspark", "psycopg2-binary", "pglast", "pyarrow", "numpy",
            "airflow-provider-pglogical"]


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="pglogical-smoke-"))
    os.environ.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                       "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags")})
    print(json.dumps({p: md.version(p) for p in PACKAGES}, indent=1))
    import airflow_provider_pglogical

    print(f"airflow_provider_pglogical from {Path(airflow_provider_pglogical.__file__).parent}")
    info = airflow_provider_pglogical.get_provider_info()
    for section in ("hooks", "operators", "sensors", "triggers"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    sys.path.insert(0, str(REPO / "dags"))
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow before 3.1
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    assert "pglogical_lakehouse_sync" in bag.dag_ids and "pglogical_orders_downstream" in bag.dag_ids
    airflow = str(Path(sys.executable).parent / "airflow")
    listed = subprocess.run([airflow, "providers", "list"], capture_output=True, text=True, check=True).stdout
    assert "airflow-provider-pglogical" in listed
    from airflow.providers_manager import ProvidersManager

    commands = [[str(Path(sys.executable).parent / "airflow-pglogical")]]
    if hasattr(ProvidersManager, "cli_command_functions"):  # Airflow loads CLI commands from providers
        commands.append([airflow, "pglogical"])
    for command in commands:
        helped = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True).stdout
        assert "status" in helped and "drop" in helped, helped
        print(f"{' '.join(command)} --help: ok")

    from airflow.sdk import ObjectStoragePath

    from airflow_provider_pglogical.embedded.postgres import LocalPostgres
    from airflow_provider_pglogical.operators.publication import PgCreatePublicationOperator
    from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
    from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator

    with LocalPostgres(name="smoke") as pg:
        pg.create_database("smoke")
        os.environ["AIRFLOW_CONN_SMOKE"] = pg.connection_uri("smoke")
        pg.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, 50) g",
                   dbname="smoke")
        staging = (home / "staging").as_uri()
        common = {"postgres_conn_id": "smoke", "staging_path": staging, "pipeline": "smoke"}
        PgCreatePublicationOperator(task_id="pub", publication="p", tables=["public.t"], postgres_conn_id="smoke").execute({})
        synced = PgInitialSyncOperator(task_id="sync", slot="s", publications=["p"], **common).execute({})
        assert synced["tables"] == {"public.t": 50}, synced
        pg.execute("UPDATE t SET v = 'y' WHERE id <= 5", dbname="smoke")
        pulled = PgSlotPullOperator(task_id="pull", slot="s", publications=["p"], **common).execute({})
        assert pulled["tables"] == {"public.t": 5}, pulled
        assert len([p for p in ObjectStoragePath(f"{staging}/smoke").iterdir() if p.name.endswith("-changes")]) == 1
        target = ["--conn-id", "smoke", "--staging-root", staging, "--pipeline", "smoke"]
        for command in commands:
            out = subprocess.run([*command, "status", *target, "-o", "json"], capture_output=True, text=True,
                                 check=True).stdout
            status = json.loads(out.strip().splitlines()[-1])
            assert (status["slot"], status["state"], status["committed_batches"]) == ("s", "streaming", 2), status
            assert status["confirmed_flush_lsn"] == pulled["advanced_to"], status
        subprocess.run([*commands[-1], "drop", *target, "--yes"], capture_output=True, text=True, check=True)
        assert pg.query("SELECT count(*) FROM pg_replication_slots", dbname="smoke") == [(0,)]
        assert not ObjectStoragePath(f"{staging}/smoke").exists()
        print("status and drop: ok")
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
