"""Staged files and directories are created private on a local file system (0600 and 0700).

Why: staged batches hold the source's rows, and a process's default umask makes them readable by
every local user. ``PGLOGICAL_STAGING_FILE_MODE`` (``staging/contract.py``) widens them where
another user must read them. Object stores (s3://, gs://) have no modes: their access is the
bucket's policy, and these helpers write there as ``ObjectStoragePath`` always did.
"""

from __future__ import annotations

import errno
import os
import shutil
from typing import IO, Any

from airflow_provider_pglogical.exceptions import InvalidInputError, StagingFullError
from airflow_provider_pglogical.staging import contract


def file_mode() -> int:
    """The mode of staged files (``$PGLOGICAL_STAGING_FILE_MODE``, default 0600)."""
    try:
        return contract.staging_file_mode(os.environ.get(contract.STAGING_FILE_MODE_ENV))
    except ValueError as err:
        raise InvalidInputError(str(err)) from None


def local_path(path: Any) -> str | None:
    """The local file-system path of a staging path (``ObjectStoragePath`` with the ``file``
    protocol, or a ``pathlib.Path``); None on an object store."""
    protocol = getattr(path, "protocol", None)
    if protocol is None:
        return os.fspath(path) if isinstance(path, os.PathLike) else None
    return path.path if protocol in ("file", "local") else None


def make_dirs(path: Any) -> None:
    """``mkdir -p``; each directory this creates on a local file system gets the staging mode."""
    local = local_path(path)
    if local is None:
        path.mkdir(parents=True, exist_ok=True)
        return
    missing = []
    current = os.path.abspath(local)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    mode = contract.staging_directory_mode(file_mode())
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:  # another writer made it meanwhile: it chose the mode
            continue
        os.chmod(directory, mode)  # the umask may have narrowed it


def open_new(path: Any) -> IO[bytes]:
    """Open a staged file for writing: with the staging mode from its first byte on a local file
    system, else through ``ObjectStoragePath``."""
    local = local_path(path)
    if local is None:
        return path.open("wb")
    mode = file_mode()

    def opener(name: str, flags: int) -> int:
        fd = os.open(name, flags, mode)
        os.fchmod(fd, mode)  # a file that existed keeps its mode otherwise; the umask narrows new ones
        return fd

    return open(local, "wb", opener=opener)


def out_of_space(err: BaseException) -> bool:
    """Whether ``err`` is a full file system (``ENOSPC``), however the writer wrapped it (pyarrow
    re-raises the OS's error as an ``OSError`` that may carry only its text)."""
    while err is not None:
        if isinstance(err, OSError) and (err.errno == errno.ENOSPC or "No space left on device" in str(err)):
            return True
        err = err.__cause__ or err.__context__
    return False


def staging_full(path: Any, what: str) -> StagingFullError:
    """The error that names where the staging ran out of space and how much its file system has left."""
    local = local_path(path)
    free = None
    if local is not None:
        current = os.path.abspath(local)
        while not os.path.isdir(current) and current != os.path.dirname(current):
            current = os.path.dirname(current)
        free = shutil.disk_usage(current).free
    return StagingFullError(str(local or path), free, what)
