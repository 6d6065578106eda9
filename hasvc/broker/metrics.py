"""Prometheus metrics for a broker (``--metrics-listen HOST:PORT``), with prometheus-client.

Counters and the put latency histogram are updated on the put path; offsets, per-slave acks and
lags are read from the broker when scraped. The HTTP endpoint is prometheus-client's WSGI server, bounded
(``hasvc.metrics_http``), on a daemon thread; it only reads integers the trio thread writes.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from commitlog.store import MessageStore
from hasvc.metrics_http import start_metrics_server
from hasvc.state.replication import ReplicaSet
from hasvc.state.role import RoleState

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class PutMetrics:
    """What the put path and the client port update, in either mode: bytes and messages
    appended, put latency by final status, reads that met damage."""

    def __init__(self, *, registry: CollectorRegistry) -> None:
        self.appended_bytes = Counter("hasvc_appended_bytes", "Bytes appended to the commit log", registry=registry)
        self.appended_messages = Counter("hasvc_appended_messages", "Messages appended to the commit log", registry=registry)
        self.put_latency = Histogram("hasvc_put_latency_seconds", "Put latency after the append, by final status",
                                     ["status"], buckets=LATENCY_BUCKETS, registry=registry)  # fmt: skip
        self.damaged_reads = Counter("hasvc_damaged_reads", "PULL and READ requests that met a damaged record (not served)",
                                     ["kind"], registry=registry)  # fmt: skip

    def read_met_damage(self, kind: str) -> None:
        self.damaged_reads.labels(kind).inc()

    def appended(self, result) -> None:
        self.appended_bytes.inc(result.wrote_bytes)
        self.appended_messages.inc(len(result.offsets))

    def put_done(self, status: str, seconds: float) -> None:
        self.put_latency.labels(status).observe(seconds)

    def put_done_many(self, status: str, seconds: float, count: int) -> None:
        """``count`` puts answered together after the same wait."""
        histogram = self.put_latency.labels(status)
        for _ in range(count):
            histogram.observe(seconds)


class BrokerMetrics(PutMetrics):
    """The metrics of one broker: what it needs is passed in (the open store, the replica set,
    the role), read when scraped."""

    def __init__(self, *, store: MessageStore, replicas: ReplicaSet, role: RoleState, registry: CollectorRegistry,
                 clock: trio.abc.Clock, port_statistics: Callable[[], dict[str, int]] = dict) -> None:  # fmt: skip
        super().__init__(registry=registry)
        self.store = store
        self.port_statistics = port_statistics  # the ports' connections and queued bytes (STATUS's fields)
        self.replicas = replicas
        self.role = role
        # The broker's one clock (the replica set's times come from it), read from the scrape
        # thread: trio's clocks compute their time and may be read from any thread.
        self.clock = clock
        registry.register(self)

    def collect(self):
        store, replicas = self.store, self.replicas
        log = store.commit_log
        for name, value, text in (
            ("hasvc_max_offset", log.max_offset, "End of the readable commit log"),
            ("hasvc_min_offset", log.min_offset, "Oldest retained commit log offset"),
            ("hasvc_flushed_offset", log.flushed_offset, "Commit log offset known flushed"),
            ("hasvc_dispatched_offset", store.reput_from_offset, "Commit log offset indexed in consume queues"),
            ("hasvc_slave_connections", len(replicas.slaves), "Connected slaves"),
            ("hasvc_master_connected", int(self.role.master_connected), "Slave: connected to its master"),
            ("hasvc_damaged_ranges", len(store.damaged), "Damaged ranges the store has found (STATUS damaged)"),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        for name, value in self.port_statistics().items():
            yield GaugeMetricFamily(f"hasvc_{name}", f"STATUS {name} (README, limits)", value=value)
        ack = GaugeMetricFamily("hasvc_slave_ack_offset", "Offset each slave acknowledged", labels=["slave"])
        lag = GaugeMetricFamily("hasvc_slave_lag_bytes", "Bytes each slave is behind", labels=["slave"])
        lag_seconds = GaugeMetricFamily("hasvc_slave_lag_seconds", "Seconds since each slave was caught up", labels=["slave"])
        now = self.clock.current_time()
        for progress in list(replicas.slaves.values()):
            behind, seconds = replicas.lag(progress, master_max_offset=log.max_offset, now=now)
            ack.add_metric([progress.slave_id], progress.ack_offset)
            lag.add_metric([progress.slave_id], behind)
            lag_seconds.add_metric([progress.slave_id], seconds)
        yield ack
        yield lag
        yield lag_seconds


async def serve_metrics(address: tuple[str, int], *, store: MessageStore, replicas: ReplicaSet, role: RoleState,
                        port_statistics: Callable[[], dict[str, int]] = dict, task_status=trio.TASK_STATUS_IGNORED) -> None:  # fmt: skip
    """Serve the metrics on ``address`` until cancelled; ``task_status.started`` gets
    (the BrokerMetrics the put path updates, the address served)."""
    registry = CollectorRegistry()
    metrics = BrokerMetrics(store=store, replicas=replicas, role=role, registry=registry, clock=trio.lowlevel.current_clock(),
                            port_statistics=port_statistics)  # fmt: skip
    server, _thread = start_metrics_server(address, registry)
    task_status.started((metrics, server.server_address[:2]))
    try:
        await trio.sleep_forever()
    finally:
        server.shutdown()
        server.server_close()
