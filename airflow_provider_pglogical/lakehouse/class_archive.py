"""A class-data-sharing archive for the Spark driver JVM that spark-submit starts on this machine.

Why: a large part of an apply task's fixed cost is a fresh JVM reading, parsing and verifying the
classes of Spark, Catalyst and Iceberg from their jars, every tick. Java 13+ can write the classes
a run loaded into an archive when it exits (``-XX:ArchiveClassesAtExit``) and map that archive,
ready to use, into the next JVM (``-XX:SharedArchiveFile``): the same work starts seconds sooner.

Safe by construction: the JVM checks an archive against its own build and class path when it
starts and, if they differ, prints a warning and runs without it. Pure (no Airflow, no Spark):
the operators decide when the driver runs here (``operators/_class_archive.py``).

An archive is written on the second run that finds the directory (the first leaves a marker), so
a worker whose disk does not outlive its task never pays for writing one it cannot keep.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: the first Java with dynamic archives (JEP 350); older JVMs refuse the options and would not start
MIN_JAVA_FEATURE = 13
#: archives of other installations (an upgraded Spark or JDK) are deleted after this long unused
UNUSED_DAYS = 7
#: the archive is ~150 MB of class metadata; the dump prints one warning per class it skips
QUIET_DUMP = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def default_directory(env: Mapping[str, str] | None = None) -> Path:
    """``$PGLOGICAL_CLASS_ARCHIVE_DIR``, else ``$XDG_CACHE_HOME/airflow-provider-pglogical/class-archives``
    (``~/.cache`` by default)."""
    env = os.environ if env is None else env
    if env.get("PGLOGICAL_CLASS_ARCHIVE_DIR"):
        return Path(env["PGLOGICAL_CLASS_ARCHIVE_DIR"])
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache, "airflow-provider-pglogical", "class-archives")


def java_command(env: Mapping[str, str]) -> str | None:
    """The ``java`` spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    if env.get("JAVA_HOME"):
        return os.path.join(env["JAVA_HOME"], "bin", "java")
    return shutil.which("java", path=env.get("PATH"))


def java_feature_version(java: str) -> int | None:
    """The feature version (17 for 17.0.15) from the JDK's ``release`` file, without starting a JVM."""
    try:
        release = (Path(os.path.realpath(java)).parent.parent / "release").read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(?:1\.)?(\d+)', release, re.MULTILINE)
    return int(found.group(1)) if found else None


def spark_jars_directory(spark_binary: str, env: Mapping[str, str]) -> Path | None:
    """The ``jars/`` directory of the Spark that ``spark_binary`` starts (its class path)."""
    homes = [env.get("SPARK_HOME")]
    located = shutil.which(spark_binary, path=env.get("PATH"))
    if located:
        homes.append(str(Path(os.path.realpath(located)).parent.parent))
    try:  # pip's pyspark: bin/spark-submit finds its home in the pyspark package
        import pyspark

        homes.append(os.path.dirname(pyspark.__file__))
    except ImportError:
        pass
    for home in homes:
        if home and Path(home, "jars").is_dir():
            return Path(home, "jars")
    return None


def archive_key(java: str, feature: int, jars: Path) -> str:
    """Names the archive after what it depends on: the JVM and every jar on Spark's class path."""
    digest = hashlib.sha256(f"{os.path.realpath(java)}\0{feature}".encode())
    for jar in sorted(jars.iterdir()):
        stat = jar.stat()
        digest.update(f"\0{jar.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ArchiveRun:
    """The JVM options of one run, and where its dump goes (None: this run writes no archive)."""

    options: tuple[str, ...]
    pending: Path | None
    archive: Path


@dataclass(frozen=True)
class ClassArchive:
    """The archive of one JVM and Spark installation under ``directory``."""

    directory: Path
    key: str

    @property
    def path(self) -> Path:
        return self.directory / f"{self.key}.jsa"

    @property
    def marker(self) -> Path:
        return self.directory / f"{self.key}.seen"

    def start(self) -> ArchiveRun:
        """Use the archive if there is one; else write it (second run) or leave the marker (first)."""
        if self.path.is_file():
            os.utime(self.path)  # its modification time says when it was last used
            return ArchiveRun((f"-XX:SharedArchiveFile={self.path}",), None, self.path)
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.marker.exists():
            self.marker.touch()
            return ArchiveRun((), None, self.path)
        pending = self.directory / f"{self.key}.jsa.{uuid.uuid4().hex[:12]}.tmp"  # runs may dump side by side
        return ArchiveRun((f"-XX:ArchiveClassesAtExit={pending}", *QUIET_DUMP), pending, self.path)

    def finish(self, run: ArchiveRun, succeeded: bool) -> bool:
        """Keep a successful run's dump as the archive (atomically); True when one was kept."""
        if run.pending is None:
            return False
        if not (succeeded and run.pending.is_file() and run.pending.stat().st_size > 0):
            run.pending.unlink(missing_ok=True)
            return False
        os.replace(run.pending, self.path)
        self.prune()
        return True

    def prune(self, now: float | None = None) -> list[Path]:
        """Delete other installations' archives (and stale dumps) unused for :data:`UNUSED_DAYS`."""
        cutoff = (now or time.time()) - UNUSED_DAYS * 86400
        removed = []
        for path in self.directory.iterdir():
            if path.name.startswith(self.key + ".jsa") and not path.name.endswith(".tmp"):
                continue
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed.append(path)
            except FileNotFoundError:  # another run pruned it first
                pass
        return removed


def class_archive_for(directory: Path, spark_binary: str, env: Mapping[str, str]) -> tuple[ClassArchive | None, str]:
    """The archive for the JVM and Spark this environment starts, or None and why not."""
    java = java_command(env)
    if not java or not os.path.exists(java):
        return None, "no java found (JAVA_HOME, PATH)"
    feature = java_feature_version(java)
    if feature is None or feature < MIN_JAVA_FEATURE:
        return None, f"Java {feature or 'of unknown version'} has no dynamic class archives (Java {MIN_JAVA_FEATURE}+)"
    jars = spark_jars_directory(spark_binary, env)
    if jars is None:
        return None, f"the jars of {spark_binary} were not found (SPARK_HOME)"
    return ClassArchive(directory, archive_key(java, feature, jars)), ""


def with_java_options(conf: Mapping[str, str], options: tuple[str, ...]) -> dict[str, str]:
    """``conf`` with ``options`` appended to ``spark.driver.extraJavaOptions`` (the user's kept first)."""
    merged = dict(conf)
    if options:
        given = str(merged.get("spark.driver.extraJavaOptions", "")).strip()
        merged["spark.driver.extraJavaOptions"] = " ".join(filter(None, [given, *options]))
    return merged
