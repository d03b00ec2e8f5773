"""Iceberg format versions of the target tables: v2 by default, v3 on request, never a downgrade.

v2 is what every engine reads (Athena and older readers among them). v3 gives deletion vectors
(Spark's merge-on-read writes one per data file instead of position delete files), row lineage
(each row's ``_row_id`` and ``_last_updated_sequence_number``) and default values. A table's
version is checked before the run writes anything (``table_identity.check_run``): one newer than
the configured version is refused (Iceberg cannot downgrade), an older one is refused unless the
upgrade was asked for, and then upgraded before the first write.
"""

from __future__ import annotations

import logging

log = logging.getLogger("pglogical.apply")

FORMAT_VERSIONS = (2, 3)
DEFAULT_FORMAT_VERSION = 2
#: the table property Iceberg reads (and upgrades a table by)
FORMAT_PROPERTY = "format-version"


def format_version(table) -> int:
    """The format version of an Iceberg table (Java)."""
    return int(table.operations().current().formatVersion())


def format_problem(name: str, have: int, wanted: int, upgrade: bool) -> str | None:
    """Why a table at format ``have`` cannot be written by an apply configured for ``wanted``; None when it can."""
    if have == wanted or (have < wanted and upgrade):
        return None
    if have > wanted:
        return (f"Iceberg table {name} is format v{have}, but the apply is configured for v{wanted}, and Iceberg "
                f"cannot downgrade a table. Set IcebergConfig(format_version={have}), or "
                f"write v{wanted} tables elsewhere (another namespace or table_map)")
    return (f"Iceberg table {name} is format v{have}, but the apply is configured for v{wanted}: a table is "
            f"upgraded only on request, since readers of v{have} tables (Athena engine 2, older Trino, Spark or "
            f"pyiceberg) may not read v{wanted}, and it cannot be undone. Pass IcebergConfig(format_version={wanted}, "
            f"upgrade_format_version=True) to upgrade it, or "
            f"IcebergConfig(format_version={have}) to keep it")


def upgrade(table, name: str, wanted: int) -> None:
    """Raise a table's format version to ``wanted`` (a metadata commit; its data files stay)."""
    have = format_version(table)
    if have < wanted:
        table.updateProperties().set(FORMAT_PROPERTY, str(wanted)).commit()
        log.warning("upgraded Iceberg table %s from format v%d to v%d (as asked)", name, have, wanted)
