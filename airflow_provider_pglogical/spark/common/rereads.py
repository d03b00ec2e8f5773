"""A small file another process replaces while the job reads it is read again, not an error.

On an object store a writer replaces a small file whole (a PUT over it, or a copy and a delete):
S3A's change detection then fails an open whose HEAD saw the old version and whose GET meets the
new one (``RemoteFileChangedException``), and a reader between a delete and a rename meets no
file (``FileNotFoundException``). Both are the reader's timing, not damage: reading again gets the
whole new file. Seen in a streaming window on S3 staging reading ``_pipeline.json`` while a pull
rewrote it (``bench/bench_catalogs.py``, 2026-11-28); a local file is replaced by an atomic rename.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the Java errors of a file replaced while it was read
REPLACED_WHILE_READ = frozenset({"org.apache.hadoop.fs.s3a.RemoteFileChangedException", "java.io.FileNotFoundException"})
#: reads in all: the writer replaces the file once per pull, so a second read almost always sees it whole
ATTEMPTS = 3


def reread(read: Callable[[], T], name: str, attempts: int = ATTEMPTS, pause: float = 0.2) -> T:
    """``read()``, again (after ``pause`` × attempt seconds) when it failed because the file was
    replaced meanwhile; any other error, or the last attempt's, is raised as it is."""
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except Exception as error:
            java = getattr(error, "java_exception", None)
            kind = java.getClass().getName() if java is not None else None
            if attempt == attempts or kind not in REPLACED_WHILE_READ:
                raise
            log.info("%s changed while it was read (%s): reading it again", name, kind)
            time.sleep(pause * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")
