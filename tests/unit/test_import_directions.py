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
    (modules_of("capture"),
     ["airflow", "pyspark"], "capture runs without Airflow: the copy job's executors run it (the operators pass a Connector)"),
    (modules_of("staging"),
     ["airflow", "pyspark"], "staging is read and written without Airflow: Airflow's paths come in as a StagingPath"),
]

#: our packages from the bottom up: a package imports none of the ones its row names (found on
#: disk, so a new package must be placed here: test_every_package_is_placed)
ABOVE_LIBRARY = ["operators", "sensors", "triggers", "cli", "embedded"]
#: the staging contract and the seam's values: standard library only, every package may use them
SHARED = ("staging.contract", "staging.column_types", "staging.seam")
PACKAGE_RULES = {
    "decoding": ["verification", "management", "capture", "lakehouse", "hooks", "ui", "spark", *ABOVE_LIBRARY],
    "management": ["verification", "staging", "decoding", "capture", "lakehouse", "hooks", "ui", "spark", *ABOVE_LIBRARY],
    "staging": ["verification", "management", "decoding", "capture", "lakehouse", "hooks", "ui", "spark", *ABOVE_LIBRARY],
    "capture": ["verification", "lakehouse", "hooks", "ui", "spark", *ABOVE_LIBRARY],
    "spark": ["verification", "decoding", "management", "capture", "lakehouse", "hooks", "ui", *ABOVE_LIBRARY],
    "hooks": ["verification", "capture", "lakehouse", "ui", "spark", *ABOVE_LIBRARY],
    "lakehouse": ["verification", "capture", "hooks", "spark", "ui", *ABOVE_LIBRARY],
    "verification": ["ui", *ABOVE_LIBRARY],
    "ui": ["verification", *ABOVE_LIBRARY],
    "cli": ["operators", "sensors", "triggers", "embedded"],
    "embedded": ["operators", "sensors", "triggers", "cli"],
    "operators": ["cli", "embedded"],
    "sensors": ["cli", "embedded"],
    "triggers": ["operators", "sensors", "cli", "embedded"],
}
#: the Spark jobs' own packages from the bottom up: each imports only the ones named (and itself)
SPARK_RULES = {
    "common": [],
    "lookups": ["common"],
    "housekeeping": ["common"],
    "row_delta": ["common", "lookups"],
    "apply": ["common", "lookups", "row_delta"],
    "paths": ["common", "lookups", "row_delta", "apply"],
    "jobs": ["common", "lookups", "row_delta", "apply", "paths", "housekeeping"],
}


def test_every_layer_has_modules():
    """A rule over an empty list would pass for nothing: each layer must have been found."""
    assert all(modules for modules, _, _ in RULES)


@pytest.mark.parametrize("modules, forbidden, why", RULES, ids=["decoding", "management", "staging-contract", "spark", "copy-job",
                                                                 "capture", "staging"])
def test_modules_import_only_what_their_layer_may(modules, forbidden, why):
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module({PACKAGE!r} + '.' + name)\n"
        f"print(json.dumps(sorted(p for p in {forbidden!r} if p in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], why


def test_every_package_is_placed():
    """A new package must say where it stands (PACKAGE_RULES), or no rule would check it."""
    found = {path.name for path in ROOT.iterdir() if (path / "__init__.py").exists()}
    assert found == set(PACKAGE_RULES), found ^ set(PACKAGE_RULES)
    spark = {path.name for path in (ROOT / "spark").iterdir() if (path / "__init__.py").exists()}
    assert spark == set(SPARK_RULES), spark ^ set(SPARK_RULES)


def module_imports() -> dict[str, set[str]]:
    """Each of our modules and the modules of ours it imports when it is imported (its module-level
    import statements, not those inside functions: a lazy import is a deliberate, optional one)."""
    import ast

    found = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        targets, pending = set(), list(ast.parse(path.read_text()).body)
        while pending:
            node = pending.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                continue  # for annotations only: never imported
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
                targets.add(node.module[len(PACKAGE) + 1:])
            pending.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
        found[name] = targets
    return found


@pytest.mark.parametrize("package", sorted(PACKAGE_RULES))
def test_no_package_imports_one_above_it(package):
    """What a package's modules pull in, through any chain of our modules, holds none of the packages
    above it (read from the import statements: milliseconds, where an interpreter per package
    costs seconds)."""
    graph = module_imports()
    reached, pending = set(), [name for name in graph if name.split(".")[0] == package]
    while pending:
        name = pending.pop()
        for target in graph.get(name, ()):
            if target not in reached:
                reached.add(target)
                pending.append(target)
    wrong = sorted(name for name in reached if name.split(".")[0] in PACKAGE_RULES[package]
                   and not name.startswith(SHARED))
    assert wrong == [], f"{package} imports a package above it: {wrong}"


def test_the_spark_packages_form_no_loop():
    """Each of spark/'s packages imports only the ones below it (SPARK_RULES), read from the modules'
    own import statements: apply never from row_delta's callers, common from nothing of spark/."""
    import ast

    wrong = []
    for path in (ROOT / "spark").rglob("*.py"):
        parts = path.relative_to(ROOT / "spark").parts
        if len(parts) < 2:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{PACKAGE}.spark."):
                target = node.module.split(".")[2]
                if target != parts[0] and target not in SPARK_RULES[parts[0]] and target != "launch":
                    wrong.append(f"spark/{'/'.join(parts)} imports spark.{target}")
    assert wrong == []
