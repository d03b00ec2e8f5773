"""The layering rules of shared/DESIGN.md, checked on what each module really imports.

Each group is imported in a fresh interpreter and ``sys.modules`` is read afterwards, so an
indirect import (a module importing one that imports the forbidden package) counts too.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

PACKAGE = "airflow_provider_pglogical"

ROOT = pathlib.Path(__file__).resolve().parents[2] / PACKAGE


def modules_of(package: str) -> list[str]:
    """Every module of a sub-package and of its own sub-packages, found on disk so that a new module
    is checked too."""
    return sorted(".".join(path.relative_to(ROOT).with_suffix("").parts)
                  for path in (ROOT / package).rglob("*.py") if path.stem != "__init__")


#: (modules, packages none of them may pull in, why)
RULES = [
    (["lsn", *modules_of("decoding")],
     ["psycopg2", "airflow"], "decoding is pure: bytes in, Arrow tables out, no database and no Airflow"),
    (modules_of("management"),
     ["pyarrow", "airflow"], "management speaks SQL only: no Arrow, no Airflow"),
    (["staging.contract", "staging.column_types", *modules_of("staging/seam")],
     ["pyarrow", "psycopg2", "airflow", "pyspark"], "the staging contract ships with the Spark job: stdlib only"),
    (modules_of("spark"),
     ["airflow", "psycopg2", "pyarrow"],
     "the Spark jobs ship to a cluster with the staging contract only (tests/unit/test_job_bundle.py)"),
    (["capture.copy_job"],
     ["airflow"], "the snapshot copy job runs the capture's code on Spark executors, which have no Airflow"),
]


def test_every_layer_has_modules():
    """A rule over an empty list would pass for nothing: each layer must have been found."""
    assert all(modules for modules, _, _ in RULES)


@pytest.mark.parametrize("modules, forbidden, why", RULES, ids=["decoding", "management", "staging-contract", "spark", "copy-job"])
def test_modules_import_only_what_their_layer_may(modules, forbidden, why):
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module({PACKAGE!r} + '.' + name)\n"
        f"print(json.dumps(sorted(p for p in {forbidden!r} if p in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], why
