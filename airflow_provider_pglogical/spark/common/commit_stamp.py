"""Every snapshot a step commits says which source position it holds (invariant 17).

A step's commits happen in two ways: Spark writes (MERGE, overwrites) and Iceberg updates the
driver commits itself (row deltas, adopted snapshots). :func:`stamped` makes both carry the same
summary properties (``staging/contract.py``: ``SNAPSHOT_*``) while a step runs in this thread:

- Spark's Iceberg writes add ``CommitMetadata.commitProperties()`` to their commit, a Java
  thread-local that ``CommitMetadata.withCommitProperties`` sets around a Java ``Callable``. A
  Python step cannot be one, so the thread-local is set directly for the step's duration. PySpark
  runs each Python thread's calls on a JVM thread of its own (pinned threads, the default since
  3.2), and a Spark SQL write commits in the calling thread, so the properties reach exactly the
  step's own commits, even with several tables' steps running side by side.
- The driver's updates call :func:`stamp` before their commit.

A reader (``lakehouse/consistent_cut.py``) then finds, for each table, the snapshot that holds the
source exactly at one LSN.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from airflow_provider_pglogical.spark.common.java_classes import java_class

_local = threading.local()
COMMIT_METADATA = "org.apache.iceberg.spark.CommitMetadata"


def current() -> dict[str, str]:
    """The summary properties of the step running in this thread (empty outside a step)."""
    return dict(getattr(_local, "properties", None) or {})


def stamp(update) -> None:
    """Set the running step's properties on an Iceberg update (``RowDelta``, ``OverwriteFiles``)."""
    for name, value in current().items():
        update.set(name, value)


def _thread_local(spark):
    """Iceberg Spark's commit-properties thread-local (private; the public way needs a Java callable)."""
    field = java_class(spark, COMMIT_METADATA)._java_lang_class.getDeclaredField("COMMIT_PROPERTIES")
    field.setAccessible(True)
    return field.get(None)


@contextmanager
def stamped(spark, properties: dict[str, str]) -> Iterator[None]:
    """Every commit of this thread while inside records ``properties`` in its snapshot summary."""
    local = _thread_local(spark)
    java_map = spark.sparkContext._gateway.jvm.java.util.HashMap()
    for name, value in properties.items():
        java_map.put(name, value)
    _local.properties = dict(properties)
    local.set(java_map)
    try:
        yield
    finally:
        local.remove()
        _local.properties = None
