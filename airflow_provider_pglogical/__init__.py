"""Apache Airflow provider for PostgreSQL logical replication into an Apache Iceberg lakehouse."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
#: where the documentation lives (docs/ of the source repository)
DOCUMENTATION_URL = "https://github.com/airflow-provider-pglogical/airflow-provider-pglogical/tree/main/docs"


#: the names a DAG imports from the package root, and the module each lives in. They load on first
#: use (PEP 562), so ``import airflow_provider_pglogical`` (Airflow's provider discovery does it)
#: stays cheap: no Airflow, psycopg2 or pyarrow until a DAG asks for a class.
_PUBLIC = {
    "PgLogicalHook": "airflow_provider_pglogical.hooks.pglogical",
    "PgCreatePublicationOperator": "airflow_provider_pglogical.operators.publication",
    "PgCheckPublisherOperator": "airflow_provider_pglogical.operators.publication",
    "PgInitialSyncOperator": "airflow_provider_pglogical.operators.sync",
    "PgBackfillOperator": "airflow_provider_pglogical.operators.sync",
    "PgSlotPullOperator": "airflow_provider_pglogical.operators.pull",
    "IcebergApplyOperator": "airflow_provider_pglogical.operators.iceberg_apply",
    "IcebergMaintenanceOperator": "airflow_provider_pglogical.operators.iceberg_maintenance",
    "PgVerifyOperator": "airflow_provider_pglogical.operators.verify",
    "PgCreateSubscriptionOperator": "airflow_provider_pglogical.operators.subscription",
    "PgDropSubscriptionOperator": "airflow_provider_pglogical.operators.subscription",
    "PgSlotLagSensor": "airflow_provider_pglogical.sensors.pglogical",
    "PgSubscriptionReadySensor": "airflow_provider_pglogical.sensors.pglogical",
    "PublishedTable": "airflow_provider_pglogical.management.publications",
    "IcebergConfig": "airflow_provider_pglogical.lakehouse.iceberg_config",
    "SparkCopy": "airflow_provider_pglogical.operators.spark_copy",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
    from airflow_provider_pglogical.management.publications import PublishedTable
    from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
    from airflow_provider_pglogical.operators.iceberg_maintenance import IcebergMaintenanceOperator
    from airflow_provider_pglogical.operators.publication import (
        PgCheckPublisherOperator,
        PgCreatePublicationOperator,
    )
    from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
    from airflow_provider_pglogical.operators.spark_copy import SparkCopy
    from airflow_provider_pglogical.operators.subscription import (
        PgCreateSubscriptionOperator,
        PgDropSubscriptionOperator,
    )
    from airflow_provider_pglogical.operators.sync import PgBackfillOperator, PgInitialSyncOperator
    from airflow_provider_pglogical.operators.verify import PgVerifyOperator
    from airflow_provider_pglogical.sensors.pglogical import PgSlotLagSensor, PgSubscriptionReadySensor


def __getattr__(name: str) -> Any:
    """Import a DAG-facing class from its module the first time it is asked for."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


def get_provider_info() -> dict:
    """Describe the provider to Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-pglogical",
        "name": "PostgreSQL logical replication",
        "description": "Publications, replication slots and subscriptions of PostgreSQL logical "
        "replication, and incremental sync of their changes into Apache Iceberg.",
        "versions": [__version__],
        "documentation-url": DOCUMENTATION_URL,
        "integrations": [
            {
                "integration-name": "PostgreSQL logical replication",
                "external-doc-url": "https://www.postgresql.org/docs/current/logical-replication.html",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": ["airflow_provider_pglogical.hooks.pglogical"],
            }
        ],
        "operators": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": [
                    "airflow_provider_pglogical.operators.publication",
                    "airflow_provider_pglogical.operators.sync",
                    "airflow_provider_pglogical.operators.pull",
                    "airflow_provider_pglogical.operators.iceberg_apply",
                    "airflow_provider_pglogical.operators.iceberg_maintenance",
                    "airflow_provider_pglogical.operators.verify",
                    "airflow_provider_pglogical.operators.subscription",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": ["airflow_provider_pglogical.sensors.pglogical"],
            }
        ],
        "triggers": [
            {
                "integration-name": "PostgreSQL logical replication",
                "python-modules": ["airflow_provider_pglogical.triggers.pglogical",
                                   "airflow_provider_pglogical.triggers.staged_batches"],
            }
        ],
        "cli": ["airflow_provider_pglogical.cli.definition.get_pglogical_cli_commands"],
        # the pipeline view in the Airflow UI (docs/ui.md): installing the provider registers it
        "plugins": [
            {"name": "pglogical", "plugin-class": "airflow_provider_pglogical.ui.plugin.PgLogicalPipelinesPlugin"},
        ],
    }
