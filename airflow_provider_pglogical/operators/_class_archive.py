"""Where the Spark operators use the driver's class archive (``lakehouse/class_archive.py``).

Only when the driver JVM starts on this machine (local master or client deploy mode): in cluster
mode the driver runs elsewhere, where this machine's archive means nothing.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_pglogical.lakehouse.class_archive import ArchiveRun, class_archive_for, default_directory, with_java_options

if TYPE_CHECKING:
    from collections.abc import Iterator

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


def driver_runs_here(connection: dict) -> bool:
    """True when the Spark connection (as ``SparkSubmitHook`` resolves it) starts the driver on
    this machine: a local master or client deploy mode, not cluster deploy mode."""
    return connection.get("deploy_mode") != "cluster"


@contextmanager
def driver_class_archive(operator: SparkSubmitOperator, directory: str | None,
                         enabled: bool = True) -> Iterator[ArchiveRun | None]:
    """Around ``SparkSubmitOperator.execute``: adds the archive's JVM options to ``operator.conf``,
    and keeps the archive a successful run wrote."""
    if not enabled:
        yield None
        return
    connection = operator._get_hook()._connection  # the master and deploy mode the hook resolves
    if not driver_runs_here(connection):
        yield None
        return
    env = {**os.environ, **(operator.env_vars or {})}
    archive, why_not = class_archive_for(Path(directory) if directory else default_directory(env),
                                         connection.get("spark_binary") or "spark-submit", env)
    if archive is None:
        operator.log.info("driver class archive not used: %s", why_not)
        yield None
        return
    try:
        run = archive.start()
    except OSError as error:  # an unwritable cache directory costs speed, never the task
        operator.log.warning("driver class archive not used: %s", error)
        yield None
        return
    operator.conf = with_java_options(operator.conf or {}, run.options)
    if run.pending:
        operator.log.info("this run writes the driver's class archive %s (later runs start faster)", archive.path)
    elif run.options:
        operator.log.info("driver class archive %s", archive.path)
    succeeded = False
    try:
        yield run
        succeeded = True
    finally:
        try:
            if archive.finish(run, succeeded):
                operator.log.info("driver class archive kept: %s", archive.path)
        except OSError as error:
            operator.log.warning("driver class archive not kept: %s", error)
