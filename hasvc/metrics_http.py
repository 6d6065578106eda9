"""The metrics endpoint's HTTP server (a broker's and the proxy's ``--metrics-listen``): prometheus-
client's threaded WSGI server, bounded.

prometheus-client's own ``start_http_server`` starts a thread per connection and never times one
out: connections that send nothing held a thread each, without end. Here each connection's reads
and writes time out, and at most METRICS_CONNECTIONS_MAX are served at once; a new connection
beyond closes the oldest (a scrape takes milliseconds: the oldest is a stalled one), so a scrape
is served however many stalled connections came before it. A request's size is bounded by the
standard library's HTTP parser (a 64 KiB request line, 100 headers of 64 KiB at most).

The endpoint shows its own limits beside the rest: ``hasvc_metrics_connections`` (open now, at
most METRICS_CONNECTIONS_MAX) and ``hasvc_metrics_connections_evicted_total``. An answer waiting
for a client that does not read is one scrape's text in its thread, for at most
METRICS_REQUEST_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, make_wsgi_app
from wsgiref.simple_server import make_server

# Prometheus scrapes a target over one connection at a time; the rest is room for people with curl.
METRICS_CONNECTIONS_MAX = 8
# Each read and write of a request: Prometheus's scrape_timeout is 10 s by default, a scrape's
# request is sent at once, and its answer (a few KiB) written in milliseconds.
METRICS_REQUEST_TIMEOUT_SECONDS = 5.0


class _TimedHandler(_SilentHandler):
    timeout = METRICS_REQUEST_TIMEOUT_SECONDS  # StreamRequestHandler sets it on the socket


class BoundedMetricsServer(ThreadingWSGIServer):
    """At most METRICS_CONNECTIONS_MAX connections served; the oldest closed for a new one."""

    request_queue_size = 128  # the listen backlog (socketserver's 5 made a burst of connects wait for SYN retries)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._open: dict[socket.socket, None] = {}  # insertion order is age
        self.evicted = 0

    def process_request(self, request, client_address) -> None:
        with self._lock:
            while len(self._open) >= METRICS_CONNECTIONS_MAX:
                oldest = next(iter(self._open))
                del self._open[oldest]
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread's read or write fails: it ends
                self.evicted += 1
            self._open[request] = None
        super().process_request(request, client_address)

    @property
    def connections(self) -> int:
        return len(self._open)

    def shutdown_request(self, request) -> None:
        with self._lock:
            self._open.pop(request, None)
        super().shutdown_request(request)


class _ServerMetrics:
    """The endpoint's own connections, as metrics of the registry it serves."""

    def __init__(self, server: BoundedMetricsServer) -> None:
        self.server = server

    def collect(self):
        yield GaugeMetricFamily("hasvc_metrics_connections", "Connections open on the metrics endpoint "
                                f"(at most {METRICS_CONNECTIONS_MAX})", value=self.server.connections)  # fmt: skip
        yield CounterMetricFamily("hasvc_metrics_connections_evicted", "Metrics connections closed for a newer one "
                                  "(METRICS_CONNECTIONS_MAX)", value=self.server.evicted)  # fmt: skip


def start_metrics_server(address: tuple[str, int], registry: CollectorRegistry) -> tuple[BoundedMetricsServer, threading.Thread]:
    """Serve ``registry`` on ``address`` from a daemon thread; (the server, its thread)."""
    host, port = address

    class Server(BoundedMetricsServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_TimedHandler)
    registry.register(_ServerMetrics(server))
    thread = threading.Thread(target=server.serve_forever, name="hasvc metrics", daemon=True)
    thread.start()
    return server, thread
