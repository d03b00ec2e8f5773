"""The zip the operators pass to ``spark-submit --py-files`` holds everything the jobs import, and
nothing that needs Airflow, psycopg2 or pyarrow (a cluster has none of them)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from airflow_provider_pglogical.spark.launch import job_bundle, with_job_bundle

JOBS = ("jobs.apply_changes", "jobs.verify_tables", "jobs.maintenance")


def test_every_job_module_imports_from_the_bundle_alone(tmp_path):
    bundle = job_bundle(tmp_path)
    names = zipfile.ZipFile(bundle).namelist()
    assert "airflow_provider_pglogical/staging/contract.py" in names
    assert "airflow_provider_pglogical/staging/layout.py" not in names  # the Python side's, not the job's
    modules = sorted(n[:-3].replace("/", ".") for n in names if n.endswith(".py") and "__init__" not in n)
    # -S -E: no site-packages and no PYTHONPATH, so only the standard library and the zip are there
    code = ("import sys, importlib; sys.path.insert(0, sys.argv[1]); "
            "[importlib.import_module(m) for m in sys.argv[2:]]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'psycopg2', 'pyarrow', 'pyspark')))")
    done = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(bundle), *modules],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert {f"airflow_provider_pglogical.spark.{job}" for job in JOBS} <= set(modules)


def test_the_bundle_is_built_once_per_content(tmp_path):
    first = job_bundle(tmp_path)
    assert job_bundle(tmp_path) == first and len(list(tmp_path.iterdir())) == 1
    assert first.read_bytes() == job_bundle(tmp_path / "again").read_bytes()  # deterministic bytes


def test_py_files_keep_the_users_and_never_repeat_the_bundle():
    bundle = str(job_bundle())
    assert with_job_bundle(None) == bundle
    assert with_job_bundle("s3a://b/udf.zip") == f"{bundle},s3a://b/udf.zip"
    assert with_job_bundle(with_job_bundle("x.py")) == f"{bundle},x.py"
