"""What the loopback servers served: their request logs, read and counted by kind.

moto's S3 server (its web server logs each request's line and status) and the REST catalog fixture
(Jetty's request log, ``RestCatalogOnLoopback.java``) write one line per request they serve. The
benchmarks count them per tick and per round, the tests bound them ("a round of one table makes at
most K requests"): a request the product makes needlessly costs tens of milliseconds on a real
object store or catalog, which loopback servers hide. Only the method, the path, the query and the
status are read; neither server logs a header or a body.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

#: werkzeug's access line (moto): ``... "GET /bucket/key?x=1 HTTP/1.1" 200 -``, ANSI colours removed
_MOTO_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3})')
#: the terminal colours werkzeug puts around lines of some statuses (206, 404, ...)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
#: the REST fixture's (Jetty's ``CustomRequestLog`` format ``served %m %U%q %s %{ms}T``)
_JETTY_LINE = re.compile(r"served ([A-Z]+) (\S+) (\d{3}) (\d+)")


@dataclass(frozen=True)
class Served:
    """One request a server served."""

    method: str
    path: str
    query: str
    status: int


#: the path of a settling probe (:meth:`RequestLog.mark`): no one else asks for it
_PROBE = "pglogical-settle-"


class RequestLog:
    """A server's request log file, read from the last :meth:`mark` on (the file only grows).

    Both servers log a request after its answer is sent, so a client's last request may be logged
    after its next action began. Given the server's base URL, :meth:`mark` and :meth:`since_mark`
    first settle the log: they ask for a path no one asks for (answered 401 or 404, and logged like
    any request) and read up to its line, which is not counted.
    """

    def __init__(self, path: Path, fixture: bool) -> None:
        self.path, self._pattern, self._offset = Path(path), _JETTY_LINE if fixture else _MOTO_LINE, 0

    def mark(self, server: str | None = None) -> None:
        """Count from here on (``server``: once it logged every request it answered so far)."""
        self._offset = self._settled(server) if server else self.path.stat().st_size

    def since_mark(self, server: str | None = None) -> list[Served]:
        """The requests served since the last :meth:`mark` (whole lines only; ``server``: as there)."""
        end = self._settled(server) if server else None
        with open(self.path, "rb") as log:
            log.seek(self._offset)
            data = log.read() if end is None else log.read(end - self._offset)
        text = data.decode("utf-8", "replace")
        text = text[:text.rfind("\n") + 1]
        found = []
        for line in _COLOUR.sub("", text).splitlines():
            match = self._pattern.search(line)
            if match and _PROBE not in line:
                target = urlsplit(match.group(2))
                query = "" if target.query == "null" else target.query  # Jetty's %q without a query
                found.append(Served(match.group(1), unquote(target.path), query, int(match.group(3))))
        return found

    def _settled(self, server: str, timeout: float = 10) -> int:
        """Where the log ends once ``server`` logged a probe sent now: every request it answered
        before is logged by then."""
        token = f"{_PROBE}{uuid.uuid4().hex}"
        try:
            urllib.request.urlopen(f"{server.rstrip('/')}/{token}", timeout=timeout).close()
        except urllib.error.HTTPError:
            pass  # refused or not found: logged all the same
        deadline = time.monotonic() + timeout
        while True:
            with open(self.path, "rb") as log:
                text = log.read()
            at = text.find(token.encode())
            end = text.find(b"\n", at) if at >= 0 else -1
            if end >= 0:
                return end + 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server} did not log its request {token} within {timeout}s ({self.path})")
            time.sleep(0.01)


def rest_route(served: Served) -> str:
    """A REST request by its route: ``GET /v1/namespaces/{ns}/tables/{table}`` and the like."""
    parts = served.path.strip("/").split("/")
    for index in range(1, len(parts)):
        if parts[index - 1] in ("namespaces", "tables", "views") and parts[index] not in ("tables", "views"):
            parts[index] = "{" + {"namespaces": "ns", "tables": "table", "views": "view"}[parts[index - 1]] + "}"
    return f"{served.method} /{'/'.join(parts)}"


def s3_kind(served: Served, staging_marker: str = "/staging") -> str:
    """An S3 request by what it does and to what: ``PUT warehouse manifest``, ``GET bucket list``,
    ``HEAD staging object``; staging keys are those whose path holds ``staging_marker``."""
    query = dict(parse_qsl(served.query, keep_blank_values=True))
    parts = served.path.strip("/").split("/", 1)
    if len(parts) == 1 or not parts[1]:  # the bucket itself
        what = "list" if "list-type" in query or "prefix" in query or not query else "+".join(sorted(query))
        return f"{served.method} bucket {what}"
    key = parts[1]
    area = "staging" if staging_marker in served.path else "warehouse"
    name = key.rsplit("/", 1)[-1]
    if key.endswith("/"):
        thing = "directory marker"
    elif name.endswith(".metadata.json"):
        thing = "metadata.json"
    elif name.startswith("snap-") and name.endswith(".avro"):
        thing = "manifest list"
    elif name.endswith(".avro"):
        thing = "manifest"
    elif name.endswith(".parquet"):
        thing = "parquet"
    else:
        thing = "object"
    multipart = "+".join(sorted(k for k in query if k in ("uploads", "uploadId", "partNumber")))
    return f"{served.method} {area} {thing}" + (f" ({multipart})" if multipart else "")


def counted(requests: list[Served], kind) -> Counter:
    """``requests`` counted by ``kind`` (:func:`rest_route`, :func:`s3_kind`)."""
    return Counter(kind(request) for request in requests)
