"""The driver's class archive: when a run writes it, uses it, keeps it, and what it is keyed on
(pure functions over a fake JDK and Spark; a real spark-submit writes and maps one in
tests/integration/test_class_archive.py)."""

from __future__ import annotations

import os
import time

import pytest

from airflow_provider_pglogical.lakehouse.class_archive import (
    UNUSED_DAYS,
    ClassArchive,
    archive_key,
    class_archive_for,
    default_directory,
    java_feature_version,
    with_java_options,
)


def fake_jdk(root, version: str):
    (root / "bin").mkdir(parents=True)
    java = root / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    (root / "release").write_text(f'IMPLEMENTOR="Debian"\nJAVA_VERSION="{version}"\n')
    return str(java)


def fake_spark(root):
    jars = root / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core_2.12-3.5.9.jar").write_bytes(b"x" * 10)
    return jars


def test_java_feature_version_comes_from_the_release_file(tmp_path):
    assert java_feature_version(fake_jdk(tmp_path / "17", "17.0.15")) == 17
    assert java_feature_version(fake_jdk(tmp_path / "8", "1.8.0_392")) == 8
    assert java_feature_version(str(tmp_path / "none" / "bin" / "java")) is None


def test_old_java_or_missing_spark_gets_no_archive_and_says_why(tmp_path):
    jars = fake_spark(tmp_path / "spark")
    env = {"JAVA_HOME": os.path.dirname(os.path.dirname(fake_jdk(tmp_path / "jdk11", "11.0.2"))),
           "SPARK_HOME": str(jars.parent), "PATH": ""}
    archive, why = class_archive_for(tmp_path / "archives", "spark-submit", env)
    assert archive is None and "Java 11 has no dynamic class archives" in why
    env["JAVA_HOME"] = os.path.dirname(os.path.dirname(fake_jdk(tmp_path / "jdk17", "17.0.15")))
    archive, why = class_archive_for(tmp_path / "archives", "spark-submit", env)
    assert archive is not None and why == ""


def test_the_key_changes_with_the_jvm_or_any_spark_jar(tmp_path):
    java = fake_jdk(tmp_path / "jdk", "17.0.15")
    jars = fake_spark(tmp_path / "spark")
    key = archive_key(java, 17, jars)
    assert archive_key(java, 17, jars) == key
    assert archive_key(fake_jdk(tmp_path / "jdk2", "17.0.15"), 17, jars) != key
    (jars / "spark-core_2.12-3.5.9.jar").write_bytes(b"y" * 11)
    assert archive_key(java, 17, jars) != key


def test_first_run_marks_second_writes_third_maps(tmp_path):
    archive = ClassArchive(tmp_path / "archives", "k")
    first = archive.start()
    assert first.options == () and first.pending is None and archive.marker.exists()
    second = archive.start()
    assert second.pending is not None and second.options[0] == f"-XX:ArchiveClassesAtExit={second.pending}"
    second.pending.write_bytes(b"archive")  # what the JVM writes at exit
    assert archive.finish(second, succeeded=True) and archive.path.read_bytes() == b"archive"
    assert not second.pending.exists()
    third = archive.start()
    assert third.options == (f"-XX:SharedArchiveFile={archive.path}",) and third.pending is None
    assert not archive.finish(third, succeeded=True)


def test_a_failed_or_empty_dump_is_not_kept(tmp_path):
    archive = ClassArchive(tmp_path, "k")
    archive.start()
    failed = archive.start()
    failed.pending.write_bytes(b"half")
    assert not archive.finish(failed, succeeded=False)
    assert not failed.pending.exists() and not archive.path.exists()
    empty = archive.start()  # the JVM died before writing anything
    assert not archive.finish(empty, succeeded=True) and not archive.path.exists()


def test_using_an_archive_touches_it_and_other_installations_go_when_unused(tmp_path):
    archive = ClassArchive(tmp_path, "mine")
    old = time.time() - (UNUSED_DAYS + 1) * 86400
    for name in ("mine.jsa", "other.jsa", "recent.jsa", "mine.jsa.abc.tmp"):
        (tmp_path / name).write_bytes(b"a")
        os.utime(tmp_path / name, (old, old))
    os.utime(tmp_path / "recent.jsa")
    archive.start()  # maps mine.jsa: now recently used
    removed = archive.prune()
    assert sorted(p.name for p in removed) == ["mine.jsa.abc.tmp", "other.jsa"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsa", "recent.jsa"]


def test_java_options_are_appended_to_the_users(tmp_path):
    assert with_java_options({"a": "1"}, ()) == {"a": "1"}
    assert with_java_options({"spark.driver.extraJavaOptions": "-Dx=1"}, ("-XX:SharedArchiveFile=/a",)) == {
        "spark.driver.extraJavaOptions": "-Dx=1 -XX:SharedArchiveFile=/a"}
    assert with_java_options({}, ("-XX:SharedArchiveFile=/a",)) == {"spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/a"}


@pytest.mark.parametrize("env, expected", [
    ({"PGLOGICAL_CLASS_ARCHIVE_DIR": "/pinned", "XDG_CACHE_HOME": "/xdg"}, "/pinned"),
    ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/airflow-provider-pglogical/class-archives"),
])
def test_default_directory(env, expected):
    assert str(default_directory(env)) == expected
