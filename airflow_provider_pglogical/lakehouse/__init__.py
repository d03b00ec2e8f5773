"""The lakehouse side, seen from Airflow: Iceberg configuration and verification against the source."""
