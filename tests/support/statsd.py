"""What Airflow's ``Stats`` sends, as a test reads it: a StatsD server's socket on loopback, and an
OpenTelemetry collector's OTLP/HTTP endpoint.

A UDP socket bound to a free port; Airflow is pointed at it with its own settings
(:meth:`StatsdListener.airflow_env`), and :meth:`StatsdListener.received` reads every datagram
already delivered (loopback delivers a datagram when it is sent, so nothing is waited for).
:class:`OtlpReceiver` answers ``POST /v1/metrics`` and decodes each export with the OTLP protobuf
classes Airflow's exporter uses.
"""

from __future__ import annotations

import gzip
import select
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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


class OtlpReceiver:
    """An OTLP/HTTP metrics endpoint on loopback; :attr:`points` holds ``(name, value, attributes)``."""

    def __init__(self) -> None:
        receiver = self
        self.points: list[tuple[str, float, dict[str, str]]] = []
        self.errors: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    receiver.decode(body)
                except Exception as err:  # noqa: BLE001 - the test reads what went wrong
                    receiver.errors.append(repr(err))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "OtlpReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def decode(self, body: bytes) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        request = ExportMetricsServiceRequest.FromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        value = (point.sum if "histogram" in kind.lower() else
                                 point.as_double if point.WhichOneof("value") == "as_double" else point.as_int)
                        attributes = {a.key: a.value.string_value for a in point.attributes}
                        self.points.append((metric.name, value, attributes))

    def airflow_env(self) -> dict[str, str]:
        """Airflow's ``[metrics]`` settings for OpenTelemetry to this endpoint, exporting every 200 ms."""
        return {"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__OTEL_PORT": str(self.port), "AIRFLOW__METRICS__OTEL_SSL_ACTIVE": "False",
                "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "200", "AIRFLOW__METRICS__STATSD_ON": "False"}
