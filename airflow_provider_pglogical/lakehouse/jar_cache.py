"""The local jar cache: resolved once through Spark's own Ivy, checked against pinned checksums.

``python -m airflow_provider_pglogical.lakehouse.jar_cache`` (``scripts/setup.sh`` runs it) starts
one throw-away Spark session with ``spark.jars.packages`` set to the installed Spark's jar set
(:mod:`.jar_sets`) and ``spark.jars.ivy`` set to the cache, exactly as a Spark user pulls jars, and
then refuses any file whose sha256 differs from the pinned one. Everything else (the operators'
spark-submit, the tests, the demo) gets the cached files' paths through ``spark.jars``, so no later
run contacts a registry.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_pglogical.lakehouse.jar_sets import IcebergJarNotFound, JarRole, JarSet, PinnedJar, jar_set_for

#: the Ivy directory under the interpreter's prefix; the jars land in its ``jars/`` folder
IVY_SUBDIR = ("share", "airflow-provider-pglogical", "ivy")
#: where the coordinates are resolved from (``$PGLOGICAL_MAVEN_REPOSITORY`` names a mirror instead)
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
#: Spark's Ivy settings with that one repository: Spark's default chain also reads ``~/.m2``, whose
#: half-downloaded entries (a pom without its jar) fail the resolution
IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="maven"/>
  <resolvers>
    <ibiblio name="maven" m2compatible="true" root="{root}"/>
  </resolvers>
</ivysettings>
"""


@dataclass(frozen=True)
class CachedJar:
    """A pinned jar and where the cache has it."""

    pinned: PinnedJar
    path: Path

    def problem(self) -> str | None:
        """Why this file cannot be used (missing, or another checksum); None when it is the pinned one."""
        if not self.path.is_file():
            return f"{self.path.name} is missing"
        digest = sha256_of(self.path)
        if digest != self.pinned.sha256:
            return f"{self.path.name} has sha256 {digest}, not the pinned {self.pinned.sha256}"
        return None


def sha256_of(path: Path) -> str:
    """The file's sha256, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ivy_directory() -> Path:
    """``$PGLOGICAL_IVY_DIR``, else ``<sys.prefix>/share/airflow-provider-pglogical/ivy``."""
    return Path(os.environ.get("PGLOGICAL_IVY_DIR") or Path(sys.prefix, *IVY_SUBDIR))


def jars_directory() -> Path:
    """Where the resolved jars are: ``$PGLOGICAL_JARS_DIR`` (a folder of your own), else ``<ivy>/jars``."""
    return Path(os.environ.get("PGLOGICAL_JARS_DIR") or ivy_directory() / "jars")


def cached(jar_set: JarSet, role: JarRole | None = None) -> list[CachedJar]:
    """The set's jars (of ``role``, or all) with their paths in :func:`jars_directory`."""
    folder = jars_directory()
    return [CachedJar(jar, folder / jar.file_name) for jar in jar_set.jars if role is None or jar.role is role]


def jar_paths(role: JarRole, jar_set: JarSet | None = None) -> list[str]:
    """Paths of the installed Spark's jars of ``role``; :class:`IcebergJarNotFound` naming the fix if one
    is missing (the checksum is checked by set-up, not on every call: a run must stay cheap)."""
    jar_set = jar_set or jar_set_for()
    found = cached(jar_set, role)
    missing = [jar.path.name for jar in found if not jar.path.is_file()]
    if missing or not found:
        raise IcebergJarNotFound(
            f"the {role.description} of Spark {jar_set.spark} ({', '.join(missing) or 'none pinned'}) are not in "
            f"{jars_directory()}: run `bash scripts/setup.sh` or `python -m airflow_provider_pglogical.lakehouse."
            "jar_cache` (resolves them once from Maven Central through spark.jars.packages), set "
            "$PGLOGICAL_JARS_DIR to a folder holding them, or pass IcebergConfig(jars=[...]) or "
            f"IcebergConfig(packages=[{', '.join(repr(p) for p in jar_set.packages)}])"
        )
    return [str(jar.path) for jar in found]


def problems(jar_set: JarSet) -> list[str]:
    """What is wrong with the cache for ``jar_set``: missing files and checksum mismatches."""
    return [problem for jar in cached(jar_set) if (problem := jar.problem()) is not None]


def resolve(jar_set: JarSet) -> None:
    """Resolve ``jar_set.packages`` into :func:`ivy_directory` through Spark's own Ivy: one local session
    started with ``spark.jars.packages`` and ``spark.jars.ivy``, as a Spark user pulls jars."""
    from pyspark.sql import SparkSession

    ivy = ivy_directory()
    ivy.mkdir(parents=True, exist_ok=True)
    settings = ivy / "ivysettings.xml"
    settings.write_text(IVY_SETTINGS.format(root=os.environ.get("PGLOGICAL_MAVEN_REPOSITORY") or MAVEN_CENTRAL))
    session = (SparkSession.builder.master("local[1]").appName("pglogical-jar-resolution")
               .config("spark.jars.packages", ",".join(jar_set.packages))
               .config("spark.jars.ivy", str(ivy))
               .config("spark.jars.ivySettings", str(settings))
               .config("spark.ui.enabled", "false")
               .getOrCreate())
    session.stop()


def ensure(jar_set: JarSet | None = None) -> JarSet:
    """Resolve the installed Spark's jar set unless the cache has every pinned file, then check every
    checksum; :class:`IcebergJarNotFound` listing each bad file otherwise."""
    jar_set = jar_set or jar_set_for()
    if problems(jar_set) and not os.environ.get("PGLOGICAL_JARS_DIR"):
        resolve(jar_set)
    wrong = problems(jar_set)
    if wrong:
        raise IcebergJarNotFound(
            f"the jar cache {jars_directory()} does not hold the pinned jars of Spark {jar_set.spark}: "
            + "; ".join(wrong) + ". Fix: delete the listed files and run `bash scripts/setup.sh` again; if the "
            "checksum still differs, the registry served another file than the one pinned: do not use it"
        )
    return jar_set


def main() -> int:
    """Set-up's entry point: resolve and check, print one line per jar."""
    try:
        jar_set = ensure()
    except Exception as error:  # noqa: BLE001 - set-up prints the reason and stops
        print(f"jar_cache: {error}", file=sys.stderr)
        return 1
    for jar in cached(jar_set):
        print(f"jar_cache: {jar.pinned.sha256}  {jar.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
