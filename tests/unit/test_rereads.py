"""``reread``: a small staging file replaced while the job read it (S3A's ``RemoteFileChangedException``,
or no file between a writer's delete and rename) is read again; any other error is raised at once,
and the last attempt's error is raised as it is. The Java side is stood in for by the attribute
py4j puts on its errors (``java_exception``), whose class name is all ``reread`` asks."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.spark.common.rereads import reread


class JavaClass:
    def __init__(self, name: str) -> None:
        self.name = name

    def getName(self) -> str:  # noqa: N802 (Java's name)
        return self.name


class JavaError(Exception):
    """What py4j raises for a Java exception: ``java_exception.getClass().getName()`` names it."""

    def __init__(self, java_class: str) -> None:
        super().__init__(java_class)
        self.java_exception = type("Java", (), {"getClass": lambda _self: JavaClass(java_class)})()


def reads(*outcomes):
    """A read that raises or returns each of ``outcomes`` in turn, and the count of reads made."""
    made = []

    def read():
        outcome = outcomes[len(made)]
        made.append(outcome)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return read, made


@pytest.mark.parametrize("java_class", ["org.apache.hadoop.fs.s3a.RemoteFileChangedException",
                                        "java.io.FileNotFoundException"])
def test_a_file_replaced_while_read_is_read_again(java_class):
    read, made = reads(JavaError(java_class), {"end_lsn": "0/1"})
    assert reread(read, "_pipeline.json", pause=0) == {"end_lsn": "0/1"}
    assert len(made) == 2


def test_any_other_error_is_raised_at_once():
    read, made = reads(JavaError("java.nio.file.AccessDeniedException"), {"never": "read"})
    with pytest.raises(JavaError, match="AccessDeniedException"):
        reread(read, "_pipeline.json", pause=0)
    read, made_python = reads(ValueError("not JSON"), {"never": "read"})
    with pytest.raises(ValueError, match="not JSON"):
        reread(read, "_pipeline.json", pause=0)
    assert len(made) == len(made_python) == 1


def test_the_last_attempts_error_is_raised_as_it_is():
    changed = "org.apache.hadoop.fs.s3a.RemoteFileChangedException"
    read, made = reads(JavaError(changed), JavaError(changed), JavaError(changed), {"never": "read"})
    with pytest.raises(JavaError, match="RemoteFileChangedException"):
        reread(read, "_pipeline.json", attempts=3, pause=0)
    assert len(made) == 3
