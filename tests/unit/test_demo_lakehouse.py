"""The demo's ``--lakehouse s3`` refuses to start, naming the install step, when what it needs is
missing, before it starts or removes anything (the run itself: ``bash scripts/demo.sh --lakehouse s3``)."""

from __future__ import annotations

import importlib.util

import pytest

from airflow_provider_pglogical.embedded import demo, object_store


def test_without_the_s3a_jars_the_s3_demo_stops_before_it_touches_anything(monkeypatch, tmp_path):
    monkeypatch.setenv("PGLOGICAL_JARS_DIR", str(tmp_path / "no-jars"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "earlier-run").write_text("kept")
    with pytest.raises(SystemExit) as stopped:
        demo.main(["--lakehouse", "s3", "--home", str(home)])
    message = str(stopped.value.code)
    assert message.startswith("demo: --lakehouse s3: the S3A file system's jars"), message
    assert "bash scripts/setup.sh" in message and str(tmp_path / "no-jars") in message, message
    # the previous run's home is left as it was: nothing started, nothing removed
    assert [p.name for p in home.iterdir()] == ["earlier-run"]


def test_without_moto_the_s3_demo_names_the_install_step(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "moto" else real(name, *a))
    with pytest.raises(SystemExit) as stopped:
        demo.main(["--lakehouse", "s3", "--home", str(tmp_path / "home")])
    message = str(stopped.value.code)
    assert "moto[server] (moto not installed)" in message and "bash scripts/setup.sh" in message, message
    assert "pip install 'moto[server]" in message, message
    assert not (tmp_path / "home").exists()
    with pytest.raises(object_store.S3ServerUnavailable):
        object_store.start_s3_server()
