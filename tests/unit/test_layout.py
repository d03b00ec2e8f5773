"""The package's layout limits (shared/STYLE.md, issue 34): short modules in small folders, so a
newcomer finds a job's code by its folder's name. A module or folder over the limit is split by job."""

from __future__ import annotations

import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "airflow_provider_pglogical"
MAX_LINES = 400
MAX_MODULES = 12


def test_no_module_is_over_400_lines():
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by job: {long}"


def test_no_folder_holds_more_than_12_modules():
    crowded = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES:
            crowded[str(folder.relative_to(PACKAGE.parent))] = len(modules)
    assert crowded == {}, f"group these folders' modules into sub-packages: {crowded}"
