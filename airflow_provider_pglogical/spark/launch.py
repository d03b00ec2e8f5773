"""How a Spark job is launched: its main file, and the jobs' code as one zip for ``--py-files``.

A job's main file (``spark/jobs/apply_changes.py``) imports the modules of ``spark/`` and the
staging contract (``staging/contract.py``, ``staging/column_types.py``). spark-submit ships only
the main file to a cluster, so the operators pass this zip too; Spark puts it on the driver's and
the executors' ``sys.path``. It holds nothing that needs Airflow, psycopg2 or pyarrow
(``tests/unit/test_job_bundle.py`` imports every module from it alone). Built once per content,
named by its hash, in the temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
#: the spark-submit main files of the three jobs
APPLY_JOB = PACKAGE / "spark" / "jobs" / "apply_changes.py"
MAINTENANCE_JOB = PACKAGE / "spark" / "jobs" / "maintenance.py"
VERIFY_JOB = PACKAGE / "spark" / "jobs" / "verify_tables.py"
#: the distributed snapshot copy runs the capture's own code on the executors (psycopg2, pyarrow)
COPY_JOB = PACKAGE / "capture" / "copy_job.py"
#: what the jobs import, relative to the package's parent directory
_MEMBERS = ("__init__.py", "staging/__init__.py", "staging/contract.py", "staging/column_types.py",
            "staging/seam/*.py",
            "spark/**/*.py")
#: what the copy job imports: the capture's copy and the staging writer (no Airflow)
COPY_MEMBERS = ("__init__.py", "lsn.py", "exceptions.py", "capture/*.py", "management/*.py", "staging/*.py",
                "staging/seam/*.py")
#: a fixed timestamp, so the same code gives the same zip (and the same name)
_EPOCH = (1980, 1, 1, 0, 0, 0)


def bundle_files(members: tuple[str, ...] = _MEMBERS) -> list[Path]:
    """The files in the bundle, in a stable order."""
    found: list[Path] = []
    for pattern in members:
        found += sorted(PACKAGE.glob(pattern))
    return found


def job_bundle(directory: str | Path | None = None, members: tuple[str, ...] = _MEMBERS) -> Path:
    """The zip of the jobs' code (built if this content has not been built yet); returns its path.

    :param members: which files (``COPY_MEMBERS`` for the copy job, whose executors run capture code).
    """
    files = bundle_files(members)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    directory = Path(directory or Path(tempfile.gettempdir()) / "pglogical-job-bundles")
    target = directory / f"pglogical_job-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{target.name}.{os.getpid()}.tmp"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(f"{PACKAGE.name}/{path.relative_to(PACKAGE).as_posix()}", _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    os.replace(partial, target)  # atomic: concurrent tasks build the same bytes under the same name
    return target


def with_job_bundle(py_files: str | None) -> str:
    """``--py-files`` with the bundle first, then whatever the user passed (comma-separated)."""
    bundle = str(job_bundle())
    return ",".join([bundle, *(path for path in (py_files or "").split(",") if path and path != bundle)])
