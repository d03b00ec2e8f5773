"""What the capture operators (initial sync, backfill, pull) share: the publisher, publications and staging."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.sdk import BaseOperator, ObjectStoragePath

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lineage import CaptureLineageMixin
from airflow_provider_pglogical.management.validation import check_staging_root


class CaptureOperator(CaptureLineageMixin, BaseOperator):
    """Base of the operators that read the publisher and write a batch under staging.

    Each argument is kept as the attribute of its own name, as Airflow renders ``template_fields``
    by attribute name.
    """

    def __init__(
        self, *, publications: Sequence[str], staging_path: str, pipeline: str,
        type_overrides: dict[str, str] | None = None,
        postgres_conn_id: str = PgLogicalHook.default_conn_name, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.publications = publications
        self.staging_path = staging_path
        self.pipeline = pipeline
        self.type_overrides = type_overrides
        self.postgres_conn_id = postgres_conn_id

    def publisher_and_staging(self) -> tuple[PgLogicalHook, ObjectStoragePath]:
        """The publisher's hook and the checked staging root (after templates are rendered)."""
        return PgLogicalHook(postgres_conn_id=self.postgres_conn_id), ObjectStoragePath(check_staging_root(self.staging_path))
