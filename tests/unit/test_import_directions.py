"""The layering rules of shared/DESIGN.md, checked on what each module really imports.

Each group is imported in a fresh interpreter and ``sys.modules`` is read afterwards, so an
indirect import (a module importing one that imports the forbidden package) counts too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PACKAGE = "airflow_provider_pglogical"

#: (modules, packages none of them may pull in, why)
RULES = [
    (["replication.pgoutput", "replication.pgoutput_messages", "replication.pgoutput_tuples",
      "replication.changes", "replication.transactions", "replication.columnar", "replication.change_batch",
      "replication.lsn"],
     ["psycopg2", "airflow"], "decoding is pure: bytes in, Arrow tables out, no database and no Airflow"),
    (["replication.publications", "replication.published", "replication.slots", "replication.subscriptions",
      "replication.health", "replication.publication_sync", "replication.validation", "replication.sql_fragments",
      "replication.consumer_lock"],
     ["pyarrow", "airflow"], "management speaks SQL only: no Arrow, no Airflow"),
    (["spark.apply_changes", "spark.verify_tables", "spark.maintenance"],
     ["airflow", "psycopg2"], "the Spark jobs ship to a cluster on their own: no Airflow, no database driver"),
]


@pytest.mark.parametrize("modules, forbidden, why", RULES, ids=["decoding", "management", "spark"])
def test_modules_import_only_what_their_layer_may(modules, forbidden, why):
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module({PACKAGE!r} + '.' + name)\n"
        f"print(json.dumps(sorted(p for p in {forbidden!r} if p in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], why
