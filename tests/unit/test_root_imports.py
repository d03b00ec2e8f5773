"""The DAG-facing API at the package root: every name resolves, lazily."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import airflow_provider_pglogical as package


@pytest.mark.parametrize("name", package.__all__)
def test_every_root_name_is_the_class_of_its_module(name: str) -> None:
    value = getattr(package, name)
    assert value is getattr(importlib.import_module(package._PUBLIC[name]), name)
    assert value.__name__ == name


def test_the_readme_import_line_works() -> None:
    from airflow_provider_pglogical import (  # noqa: F401
        IcebergApplyOperator,
        IcebergConfig,
        IcebergMaintenanceOperator,
        PgBackfillOperator,
        PgCreatePublicationOperator,
        PgInitialSyncOperator,
        PgLogicalHook,
        PgSlotPullOperator,
        PgVerifyOperator,
        PublishedTable,
    )


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="PgNoSuchOperator"):
        package.PgNoSuchOperator  # noqa: B018


def test_importing_the_package_loads_neither_airflow_nor_drivers() -> None:
    """Airflow's provider discovery imports the package: it must stay cheap."""
    code = ("import sys, json, airflow_provider_pglogical as p; p.get_provider_info(); "
            "print(json.dumps(sorted(m for m in ('airflow', 'psycopg2', 'pyarrow', 'pyspark') if m in sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    assert loaded == []
