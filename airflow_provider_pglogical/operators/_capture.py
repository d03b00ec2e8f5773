"""What the capture operators (initial sync, backfill, pull) share: the publisher, publications and staging."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseOperator, ObjectStoragePath

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.staging_roots import staging_path
from airflow_provider_pglogical.lineage import CaptureLineageMixin
from airflow_provider_pglogical.management.validation import check_staging_root


class CaptureOperator(CaptureLineageMixin, BaseOperator):
    """Base of the operators that read the publisher and write a batch under staging.

    Each argument is kept as the attribute of its own name, as Airflow renders ``template_fields``
    by attribute name.
    """

    def __init__(
        self, *, publications: Sequence[str], pipeline: str, staging_root: str | None = None,
        type_overrides: dict[str, str] | None = None,
        postgres_conn_id: str = PgLogicalHook.default_conn_name, staging_path: str | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.publications = publications
        self.staging_root = staging_root_argument(staging_root, staging_path, self.task_id)
        self.pipeline = pipeline
        self.type_overrides = type_overrides
        self.postgres_conn_id = postgres_conn_id

    def publisher_and_staging(self) -> tuple[PgLogicalHook, ObjectStoragePath]:
        """The publisher's hook and the checked staging root (after templates are rendered)."""
        root = staging_path(check_staging_root(self.staging_root))  # its file system and connection, checked
        return PgLogicalHook(postgres_conn_id=self.postgres_conn_id), root


def staging_root_argument(staging_root: str | None, staging_path: str | None, task_id: str) -> str:
    """The staging root of an operator, also from its old name ``staging_path`` (deprecated: every
    operator, the apply job and the CLI call it the staging root)."""
    if staging_path is not None:
        if staging_root is not None:
            raise TypeError(f"task {task_id!r}: pass staging_root only (staging_path is its deprecated old name)")
        warnings.warn(f"task {task_id!r}: staging_path is deprecated, pass staging_root",
                      AirflowProviderDeprecationWarning, stacklevel=3)
        return staging_path
    if staging_root is None:
        raise TypeError(f"task {task_id!r}: staging_root is required (the staging area's root URI)")
    return staging_root
