"""Which of HotSpot's JIT compilers the Spark driver JVM uses, chosen by how much a run applies.

Why: every apply task starts a fresh JVM. HotSpot compiles hot code twice, quickly with C1 and
then optimised with C2; C2's compilations compete with the job for the same cores and pay off
only on long runs. A tick of small batches ends before they do: with C1 only
(``-XX:TieredStopAtLevel=1``) a 1-table tick took 0.80x as long, and the first 100k-change MERGE
of a fresh JVM 0.7x; a warm JVM's repeated 100k-change MERGEs into 5M rows took 1.1-1.4x
(docs/benchmarks.md). So C1 only is chosen when the pending batches are small, and never when
the user set the JIT themselves. Pure: the operator counts the pending rows.
"""

from __future__ import annotations

from collections.abc import Mapping

#: HotSpot's C1 compiler only (tiered compilation stops at level 1), with the code cache tiered
#: compilation has: stopped at level 1, HotSpot (17) reserves 48 MB, which a long-lived JVM fills
#: (Spark generates classes for every query); the JVM then stops compiling and fails method
#: handle calls ("Out of space in CodeCache"), as a 16-minute test session did
QUICK_JIT_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")
#: the largest pending work measured no slower in a fresh JVM with C1 only (one 100k-change batch)
DEFAULT_QUICK_JIT_MAX_ROWS = 100_000
#: JVM options by which a user has chosen the JIT already: theirs stand
_USER_JIT_FLAGS = ("TieredStopAtLevel", "TieredCompilation", "-Xint", "-Xcomp", "CICompilerCount",
                   "ReservedCodeCacheSize")


def user_chose_jit(conf: Mapping[str, object]) -> bool:
    """Whether ``spark.driver.extraJavaOptions`` already sets the JIT."""
    given = str(conf.get("spark.driver.extraJavaOptions", ""))
    return any(flag in given for flag in _USER_JIT_FLAGS)


def quick_jit_options(pending_rows: int | None, max_rows: int | None,
                      conf: Mapping[str, object]) -> tuple[str, ...]:
    """The driver JVM options for C1 only when at most ``max_rows`` staged rows are pending.

    ``pending_rows`` None (unknown: no apply marker yet) or ``max_rows`` None (turned off) keep
    the JVM's default, as does a JIT option the user set in ``conf``.
    """
    if pending_rows is None or max_rows is None or pending_rows > max_rows or user_chose_jit(conf):
        return ()
    return QUICK_JIT_OPTIONS

