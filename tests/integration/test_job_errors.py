"""A job's refusal reaches the task as itself (issue 50, invariant 19).

When the apply job refuses its input, its own error (class, message, fix, whether a retry can
help) travels in its result file under staging, and ``IcebergApplyOperator`` raises it as the
task's error: an ``AirflowFailException`` when no retry can help, with no spark-submit command
line in it. Real PostgreSQL, the operator's real spark-submit, real Iceberg (Hadoop catalog);
"nothing changed" is read from the warehouse's and the staging's files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.exceptions import SparkJobError
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators._errors import PermanentError
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.ui.history import read_history

pytestmark = pytest.mark.spark


@pytest.fixture
def local_spark(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def apply_task(root: Path, pipeline: str, warehouse: Path, namespace: str) -> IcebergApplyOperator:
    return IcebergApplyOperator(task_id=f"apply_{pipeline}", staging_root=root.as_uri(), pipeline=pipeline,
                                iceberg=IcebergConfig(warehouse=warehouse.as_uri(), namespace=namespace),
                                conf={"spark.ui.enabled": "false"}, env_vars={"SPARK_LOCAL_IP": "127.0.0.1"},
                                asset_alias=None)


def files(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under ``directory`` and its hash (none whose path has a part starting with one of ``skip``)."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*"))
            if p.is_file() and not any(part.startswith(skip) for part in p.relative_to(directory).parts)}


def sync(hook, root: Path, pipeline: str) -> ObjectStoragePath:
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(hook, slot=f"slot_{pipeline}", publications=[f"pub_{pipeline}"], root=storage, pipeline=pipeline)
    return storage


def refused(operator: IcebergApplyOperator) -> SparkJobError:
    """Run the task; it must fail with the job's own permanent error, and no command line in it."""
    with pytest.raises(AirflowFailException) as raised:
        operator.execute({})
    error = raised.value
    assert isinstance(error, PermanentError) and isinstance(error, SparkJobError) and error.permanent
    chain, cause = [], error
    while cause is not None:  # what Airflow prints: the error and every cause it shows
        chain.append(str(cause))
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    assert not any("spark-submit" in text or "--conf" in text for text in chain), chain
    return error


def test_a_target_another_pipeline_owns_fails_the_task_with_the_jobs_error_and_no_retry(
        publisher, publisher_hook, tmp_path, local_spark):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM "
                      "generate_series(1, 5) g")
    for pipeline in ("p", "q"):
        publisher_hook.create_publication(f"pub_{pipeline}", [PublishedTable("t")])
        sync(publisher_hook, tmp_path / pipeline, pipeline)
    warehouse = tmp_path / "warehouse"
    assert apply_task(tmp_path / "p", "p", warehouse, "shared").execute({})["rows"] == 5
    lake, staged = files(warehouse), files(tmp_path / "q", skip=("_results",))

    error = refused(apply_task(tmp_path / "q", "q", warehouse, "shared"))

    assert error.error_class == "ApplyError" and error.job == "apply"
    assert error.fix == ("give each source its own target with table_map={source: target} on IcebergApplyOperator "
                         "(--table-map)")
    assert str(error).startswith("the apply job refused with ApplyError: Iceberg table `lake`.`shared`.`public__t` "
                                 'is owned by {"pipeline": "p"'), str(error)
    assert '"pipeline": "q"' in str(error) and "table_map={source: target}" in str(error)
    assert str(error).endswith("Nothing was applied")
    # nothing changed: the lakehouse holds the same files (the lease the refused run took and
    # released is a property of the state table: new metadata files only), staging the same batches
    after = files(warehouse)
    assert {name: digest for name, digest in after.items() if "/metadata/" not in name} == \
        {name: digest for name, digest in lake.items() if "/metadata/" not in name}
    assert not [name for name in set(after) - set(lake) if not name.startswith("shared/_pglogical_state/metadata/")]
    assert files(tmp_path / "q", skip=("_results", "_history")) == \
        {name: digest for name, digest in staged.items() if "_history" not in name}
    # the pipeline view records the job's error too, not a command line
    recorded = read_history(ObjectStoragePath((tmp_path / "q").as_uri()), "q", "apply")[-1]["error"]
    assert recorded.startswith("SparkJobError: the apply job refused with ApplyError: Iceberg table")


def test_a_gap_in_the_staging_chain_fails_the_task_with_the_jobs_error_and_no_retry(
        publisher, publisher_hook, tmp_path, local_spark):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM "
                      "generate_series(1, 5) g")
    publisher_hook.create_publication("pub_g", [PublishedTable("t")])
    root = tmp_path / "staging"
    storage = sync(publisher_hook, root, "g")
    batches = []
    for sql in ("UPDATE t SET v = 'one' WHERE id = 1", "DELETE FROM t WHERE id = 2"):
        publisher.execute(sql)
        batches.append(run_pull(publisher_hook, slot="slot_g", publications=["pub_g"], root=storage,
                                pipeline="g")["batch"].rsplit("/", 1)[1])
    shutil.move(root / "g" / batches[0], tmp_path / "aside")  # the first change batch is lost
    warehouse, staged = tmp_path / "warehouse", files(root, skip=("_results", "_history"))

    error = refused(apply_task(root, "g", warehouse, "gap"))

    assert error.error_class == "ApplyError" and error.fix.startswith("restore the missing or damaged batches")
    assert "no committed change batch covers LSN" in str(error) and f"before batch {batches[1]}" in str(error)
    assert "PgBackfillOperator(tables=['public.t'])" in str(error) and str(error).endswith("Nothing was applied")
    # nothing changed: no table and no data file was written (only the state table's metadata,
    # whose lease property the run took and released), and every staged file is as it was
    written = files(warehouse)
    assert written and all(name.startswith("gap/_pglogical_state/metadata/") for name in written), sorted(written)
    assert files(root, skip=("_results", "_history")) == staged
