"""Apache Airflow provider for PostgreSQL logical replication into an Apache Iceberg lakehouse."""

from __future__ import annotations

__version__ = "0.1.0"
#: where the documentation lives (docs/ of the source repository)
DOCUMENTATION_URL = "https://github.com/airflow-provider-pglogical/airflow-provider-pglogical/tree/main/docs"


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
                "python-modules": ["airflow_provider_pglogical.triggers.pglogical"],
            }
        ],
        "cli": ["airflow_provider_pglogical.cli.definition.get_pglogical_cli_commands"],
    }
