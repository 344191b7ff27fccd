"""An OTLP/HTTP metrics receiver on loopback, in a thread: what the OpenTelemetry SDK's
exporter sends, decoded with the OTLP protobuf classes."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Received:
    url: str
    bodies: list[bytes] = field(default_factory=list)
    status: int = 200  # what the receiver answers

    def metrics(self, i: int = -1) -> dict[str, Any]:
        """The metrics of the ``i``-th request, by name."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        request = ExportMetricsServiceRequest.FromString(self.bodies[i])
        return {
            m.name: m
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }


def points(metric: Any) -> dict[tuple[tuple[str, str], ...], float]:
    """A sum's or gauge's data points: attributes -> value."""
    data = metric.sum if metric.HasField("sum") else metric.gauge
    return {
        tuple((a.key, a.value.string_value) for a in p.attributes): (
            p.as_double if p.HasField("as_double") else p.as_int
        )
        for p in data.data_points
    }


@contextmanager
def otlp_receiver() -> Iterator[Received]:
    got = Received("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            got.bodies.append(body)
            self.send_response(got.status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.url = f"http://127.0.0.1:{server.server_address[1]}/v1/metrics"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()
