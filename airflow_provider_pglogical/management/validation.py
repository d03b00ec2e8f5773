"""Up-front checks of the names, numbers and paths a user passes, before anything is changed.

Each check raises :class:`InvalidInputError` naming the argument, the value, the problem and the
fix. Operators call them on their rendered (templated) values; the ``run_*`` functions call them
again, so a direct Python caller is held to the same rules.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Sequence

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.staging.contract import normal_table_key

#: PostgreSQL's NAMEDATALEN - 1: longer identifiers are silently truncated by the server
MAX_IDENTIFIER_BYTES = 63

#: a pipeline name is a directory under the staging root: plain characters, no separators
_PIPELINE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def check_identifier(value: Any, what: str) -> str:
    """A PostgreSQL object name (slot, publication): a non-empty string of at most 63 bytes.

    :param what: how the user knows the argument, e.g. ``"slot"`` or ``"publication"``.
    """
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} name {value!r} is not a non-empty string: pass the {what}'s name")
    if "\x00" in value:
        raise InvalidInputError(f"{what} name {value!r} holds a NUL character: PostgreSQL names cannot")
    size = len(value.encode())
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidInputError(
            f"{what} name {value!r} is {size} bytes long: PostgreSQL truncates names to "
            f"{MAX_IDENTIFIER_BYTES} bytes, so the object would never be found under this name. "
            f"Choose a {what} name of at most {MAX_IDENTIFIER_BYTES} bytes"
        )
    return value


def check_identifiers(values: Any, what: str) -> list[str]:
    """A non-empty list of object names (e.g. ``publications``); a lone string is an error, as
    iterating it would give its letters."""
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise InvalidInputError(f"{what}s {values!r} is not a non-empty list of names: pass e.g. {what}s=['name']")
    return [check_identifier(v, what) for v in values]


def check_slot_name(value: Any) -> str:
    """Slot names are stricter than other names: lower-case letters, digits and underscores."""
    check_identifier(value, "slot")
    if not re.fullmatch(r"[a-z0-9_]+", value):
        raise InvalidInputError(
            f"slot name {value!r} is not valid: PostgreSQL allows only lower-case letters, digits and "
            "underscores in replication slot names"
        )
    return value


def check_pipeline_name(value: Any) -> str:
    """The pipeline's name is its directory under the staging root: no separators, no ``..``."""
    check_identifier(value, "pipeline")
    if not _PIPELINE_NAME.fullmatch(value) or ".." in value:
        raise InvalidInputError(
            f"pipeline name {value!r} is not a plain directory name (it must not hold '/', '\\', '..' or "
            "start with '.'; letters, digits, '_', '-' and '.' are allowed): it would write outside its "
            "staging directory. Choose a name such as 'orders'"
        )
    return value


def check_staging_root(root: Any) -> Any:
    """The staging root is an absolute URI (``file:///abs/path``, ``s3://bucket/prefix``).

    A relative path would land under whichever working directory the worker has, and differ
    between the pull and the apply.
    """
    protocol = getattr(root, "protocol", None)
    text = str(root)
    if protocol is not None:  # an ObjectStoragePath: its string form drops file://
        absolute = bool(protocol) and (protocol not in ("file", "local") or str(root.path).startswith("/"))
        path = str(root.path)
    else:
        absolute = bool(_URI_SCHEME.match(text)) and (not text.startswith("file:") or text.startswith("file:///"))
        path = text
    if not absolute or ".." in path.split("/"):
        raise InvalidInputError(
            f"staging path {text!r} is not an absolute URI: pass e.g. 'file:///data/staging' or "
            "'s3://bucket/staging' (no relative parts, no '..')"
        )
    return root


def check_count(value: Any, what: str, *, optional: bool = False) -> int | None:
    """A whole number >= 1 (after templating, so digit strings count); ``None`` if ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(
            f"{what} must be a whole number, 1 or more (got {value!r})"
            + ("; leave it unset for no limit" if optional else "")
        )
    return value


def check_seconds(value: Any, what: str, *, optional: bool = False) -> float | None:
    """A duration in seconds > 0: a ``timedelta``, a number or (after templating) a number's text;
    ``None``, ``0`` and ``""`` mean off when ``optional``."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    elif isinstance(value, str) and not isinstance(value, bool):
        try:
            value = float(value.strip()) if value.strip() else None
        except ValueError:
            pass
    if optional and (value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise InvalidInputError(
            f"{what} must be a positive duration: a timedelta or a number of seconds (got {value!r})"
            + ("; leave it unset (or 0) to switch it off" if optional else ""))
    return float(value)


def check_table_map(value: Any) -> dict[str, str]:
    """``table_map`` (source ``schema.table`` -> Iceberg table): every key one table (a name holding
    a dot in double quotes, ``'"x.y".z'``), every target a non-empty name, no target for two sources."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"table_map {value!r} is not a dict: pass {{'schema.table': 'iceberg_table'}}")
    out: dict[str, str] = {}
    targets: dict[str, str] = {}
    for key, target in value.items():
        try:
            source = normal_table_key(key) if isinstance(key, str) else normal_table_key("")
        except ValueError as error:
            raise InvalidInputError(f"table_map: {error}") from None
        if not isinstance(target, str) or not target:
            raise InvalidInputError(f"table_map[{key!r}] = {target!r}: pass the Iceberg table's name")
        if source in out:
            raise InvalidInputError(f"table_map names source table {source} twice: keep one entry")
        other = targets.setdefault(target.lower(), source)
        if other != source:
            raise InvalidInputError(
                f"table_map maps source tables {other} and {source} onto one Iceberg table {target!r}: give each "
                "source its own target")
        out[source] = target
    return out
