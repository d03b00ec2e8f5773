"""A StatsD server's socket on loopback: what Airflow's ``Stats`` sends, as a test reads it.

A UDP socket bound to a free port; Airflow is pointed at it with its own settings
(:meth:`StatsdListener.airflow_env`), and :meth:`StatsdListener.received` reads every datagram
already delivered (loopback delivers a datagram when it is sent, so nothing is waited for).
"""

from __future__ import annotations

import select
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One StatsD line: ``<name>[,tag=value...]:<value>|<type>``."""

    name: str
    value: float
    kind: str  # c (count), g (gauge), ms (timer)
    tags: dict[str, str]

    @classmethod
    def parse(cls, line: str) -> "Metric":
        head, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        name, *tags = head.split(",")
        return cls(name, float(value), kind.split("|")[0], dict(t.split("=", 1) for t in tags))


class StatsdListener:
    """The socket; use as a context manager."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.metrics: list[Metric] = []

    def __enter__(self) -> "StatsdListener":
        return self

    def __exit__(self, *exc) -> None:
        self.received()  # what was sent while the socket was open stays readable
        self.sock.close()

    def airflow_env(self, tags: bool = True) -> dict[str, str]:
        """Airflow's ``[metrics]`` settings for this socket, as environment variables (with the
        pipeline and table as InfluxDB-style tags when ``tags``)."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port), "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
                "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": str(tags)}

    def received(self) -> list[Metric]:
        """Every metric received so far (each datagram may hold several lines)."""
        while self.sock.fileno() >= 0 and select.select([self.sock], [], [], 0)[0]:
            data = self.sock.recv(65536).decode()
            self.metrics += [Metric.parse(line) for line in data.splitlines() if line]
        return list(self.metrics)

    def named(self, name: str, **tags: str) -> list[Metric]:
        """The metrics of ``name`` (with the StatsD prefix) whose tags include ``tags``."""
        return [m for m in self.received() if m.name == name and tags.items() <= m.tags.items()]
