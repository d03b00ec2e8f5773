"""Staged files are private by default (0600 in 0700 directories); PGLOGICAL_STAGING_FILE_MODE widens them."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.contract import staging_directory_mode, staging_file_mode
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest, write_pipeline_file


@pytest.fixture(autouse=True)
def usual_umask():
    """The usual default umask: without the provider's modes, files would be 0644, directories 0755."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def write_batch(root) -> None:
    manifest = BatchManifest(pipeline="p", kind="snapshot", start_lsn=str(Lsn(16)), end_lsn=str(Lsn(16)))
    writer = BatchWriter(root, manifest)
    writer.add_table(TableManifest("public", "t", [{"name": "id", "type": "int4"}], ["id"]))
    writer.write_part("public.t", pa.table({"id": [1, 2]}))
    writer.commit()


@pytest.mark.parametrize("as_uri", [False, True])
def test_staged_files_are_private_by_default(tmp_path, monkeypatch, as_uri):
    monkeypatch.delenv("PGLOGICAL_STAGING_FILE_MODE", raising=False)
    root = ObjectStoragePath((tmp_path / "staging").as_uri()) if as_uri else tmp_path / "staging"
    write_pipeline_file(root, "p", "_record.json", {"slot": "s"})
    write_batch(root)
    paths = list((tmp_path / "staging").rglob("*"))
    assert paths and {mode(p) for p in paths if p.is_file()} == {0o600}
    assert {mode(p) for p in [tmp_path / "staging", *paths] if p.is_dir()} == {0o700}


def test_a_wider_mode_is_a_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("PGLOGICAL_STAGING_FILE_MODE", "640")
    write_pipeline_file(tmp_path / "staging", "p", "_record.json", {"slot": "s"})
    assert mode(tmp_path / "staging" / "p" / "_record.json") == 0o640
    assert mode(tmp_path / "staging" / "p") == mode(tmp_path / "staging") == 0o750


@pytest.mark.parametrize("given", ["rw-r-----", "0400", "1777", "9"])
def test_an_unusable_mode_is_refused_before_anything_is_written(tmp_path, monkeypatch, given):
    monkeypatch.setenv("PGLOGICAL_STAGING_FILE_MODE", given)
    with pytest.raises(InvalidInputError, match=r"PGLOGICAL_STAGING_FILE_MODE=.* is not a usable file mode: .*"
                                                r"e\.g\. 600 \(private, the default\) or 640"):
        write_pipeline_file(tmp_path / "staging", "p", "_record.json", {"slot": "s"})
    assert not (tmp_path / "staging").exists()


def test_directory_modes_follow_file_modes():
    assert staging_file_mode(None) == staging_file_mode("") == 0o600
    assert [staging_directory_mode(m) for m in (0o600, 0o640, 0o644, 0o660)] == [0o700, 0o750, 0o755, 0o770]
