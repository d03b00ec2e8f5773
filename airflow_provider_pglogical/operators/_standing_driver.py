"""Where the apply operator hands its run to a standing driver (``lakehouse/standing_driver.py``).

Only when the driver runs on this machine (local master or client deploy mode): a driver in
cluster mode runs elsewhere, out of reach of a Unix socket here.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_pglogical.lakehouse.standing_driver import (
    StandingDriver,
    default_directory,
    driver_key,
    private_directory,
    start_process,
)

if TYPE_CHECKING:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

SERVER_APP = Path(__file__).resolve().parent.parent / "spark" / "apply_server.py"
#: runs one driver serves before it ends and the next tick starts a fresh one
DEFAULT_MAX_RUNS = 1000


def apply_on_standing_driver(operator: SparkSubmitOperator, job_args: list[str], idle: timedelta,
                             directory: str | None = None, max_runs: int = DEFAULT_MAX_RUNS) -> dict:
    """Run the apply with ``job_args`` on this configuration's driver (started if none listens);
    returns the job's summary. ``operator.conf`` must not hold per-run values (the result URI)."""
    application_args, name = operator.application_args, operator.name
    operator.application_args, operator.name = [], "pglogical-apply-driver"  # the same for every pipeline
    try:
        hook = operator._get_hook()
        command = hook._build_spark_submit_command(str(SERVER_APP))  # the operator's own spark-submit line
    finally:
        operator.application_args, operator.name = application_args, name
    env = {key: str(value) for key, value in (hook._env or {}).items()}
    driver = StandingDriver(private_directory(Path(directory) if directory else default_directory()),
                            driver_key(command, env))
    full = [*command, *driver.server_args(idle.total_seconds(), max_runs)]
    answer = driver.apply(job_args, lambda: start_process(full, {**os.environ, **env}, driver.log_path),
                          operator.log.info)
    operator.log.info("applied by standing driver %s (pid %s, its run %s)", driver.key, answer["driver"]["pid"],
                      answer["driver"]["run"])
    return {**answer["result"], "driver": answer["driver"]}
