"""The provider is discoverable, and everything its provider info names imports."""

import importlib
import subprocess
import sys
from pathlib import Path

from airflow_provider_pglogical import get_provider_info


def test_every_module_in_provider_info_imports():
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-pglogical"
    modules = [m for section in ("hooks", "operators", "sensors", "triggers") for entry in info[section]
               for m in entry["python-modules"]]
    for module in modules:
        importlib.import_module(module)
    assert "airflow_provider_pglogical.hooks.pglogical" in modules


def test_airflow_providers_list_shows_the_provider(tmp_path):
    airflow = Path(sys.executable).parent / "airflow"
    out = subprocess.run([str(airflow), "providers", "list"], capture_output=True, text=True,
                         env={"AIRFLOW_HOME": str(tmp_path), "PATH": str(airflow.parent)}, check=True).stdout
    assert "airflow-provider-pglogical" in out


def test_hook_declares_itself_like_the_official_providers():
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    assert (PgLogicalHook.conn_name_attr, PgLogicalHook.default_conn_name, PgLogicalHook.conn_type) == (
        "postgres_conn_id", "postgres_default", "postgres")


def test_provider_info_names_its_documentation_and_cli_commands():
    info = get_provider_info()
    assert info["documentation-url"].startswith("https://")
    [path] = info["cli"]
    module, _, function = path.rpartition(".")
    [group] = getattr(importlib.import_module(module), function)()
    assert group.name == "pglogical" and sorted(c.name for c in group.subcommands) == ["drop", "status"]


def test_license_and_changelog_ship_with_the_source():
    root = Path(__file__).resolve().parents[2]
    license_text = (root / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert (root / "CHANGELOG.md").read_text().startswith("# Changelog")
