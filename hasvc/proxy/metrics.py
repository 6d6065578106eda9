"""Prometheus metrics of the proxy (``--metrics-listen HOST:PORT``), with prometheus-client.

Request counts and send latency are updated by the gRPC handlers (asyncio thread); the gauges are
read from the gateway when scraped (integers and a copy of the progress table's values, written by
the trio thread). The HTTP endpoint is prometheus-client's own server on a daemon thread.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hasvc.broker.metrics import LATENCY_BUCKETS
from hasvc.metrics_http import start_metrics_server
from hasvc.proxy.pb import definition


class ProxyMetrics:
    def __init__(self, gate, servicer, registry: CollectorRegistry):
        self.gate = gate
        self.servicer = servicer
        self.requests = Counter("hasvc_proxy_requests", "gRPC requests answered, by method and RocketMQ code",
                                ["method", "code"], registry=registry)  # fmt: skip
        self.send_latency = Histogram("hasvc_proxy_send_latency_seconds", "SendMessage latency, by RocketMQ code", ["code"],
                                      buckets=LATENCY_BUCKETS, registry=registry)  # fmt: skip
        registry.register(self)

    def answered(self, method: str, code: int) -> None:
        self.requests.labels(method, definition.Code.Name(code) if code in definition.Code.values() else str(code)).inc()

    def sent(self, code: int, seconds: float) -> None:
        self.send_latency.labels(definition.Code.Name(code) if code in definition.Code.values() else str(code)).observe(seconds)

    def collect(self):
        stats = dict(self.gate.stats)
        for name, key, text in (
            ("hasvc_proxy_messages_sent", "sent", "Messages stored and acknowledged (OK) through the proxy"),
            ("hasvc_proxy_messages_delivered", "delivered", "Deliveries to consumers (redeliveries included)"),
            ("hasvc_proxy_messages_acked", "acked", "Acknowledgements by consumers"),
            ("hasvc_proxy_progress_events", "events", "Consumer progress events appended to the progress topic"),
            ("hasvc_proxy_progress_refused", "progress_refused", "Calls refused TOO_MANY_REQUESTS: their progress events "
             "would not fit under progress_events_queued_max (receives, acks, invisible-time changes, dead-letter forwards)"),
        ):
            yield CounterMetricFamily(name, text, value=stats.get(key, 0))
        yield CounterMetricFamily("hasvc_proxy_receives_refused", "ReceiveMessage calls refused TOO_MANY_REQUESTS: "
                                  "receive_bytes_held_max reached", value=self.servicer.receives_refused)  # fmt: skip
        lane = self.servicer.lane
        if lane is not None:
            lane_stats = dict(lane.stats)
            for name, key, text in (
                ("hasvc_proxy_send_lane_sends", "sent", "Sends the send lane stored (hasvc/proxy/lane.py)"),
                ("hasvc_proxy_send_lane_fallbacks", "fallbacks", "Sends the lane handed to the failover client (not connected, "
                 "connection lost, no answer in time, not the master)"),
                ("hasvc_proxy_send_lane_connects", "connects", "Connections the lane made to the master"),
            ):
                yield CounterMetricFamily(name, text, value=lane_stats.get(key, 0))
        interceptor = self.servicer.acl_interceptor
        if interceptor is not None:
            refused = CounterMetricFamily("hasvc_proxy_acl_refused", "Calls refused by --acl, by reason (unsigned, unknown_key, "
                                          "bad_signature, expired: UNAUTHORIZED; not_permitted: FORBIDDEN)", labels=["reason"])  # fmt: skip
            for reason, count in interceptor.refused.items():
                refused.add_metric([reason], count)
            yield refused
        queues = list(self.gate.table.queues.values())
        yield GaugeMetricFamily("hasvc_proxy_group_queues", "Consumer group queues with progress", value=len(queues))
        yield GaugeMetricFamily("hasvc_proxy_inflight_messages", "Messages delivered and not yet acknowledged",
                                value=sum(len(q.inflight) for q in queues))  # fmt: skip
        yield GaugeMetricFamily("hasvc_proxy_clients", "Clients with settings (open Telemetry streams)", value=len(self.servicer.settings))
        yield GaugeMetricFamily("hasvc_proxy_bytes_queued", "Bytes of ReceiveMessage answers handed to grpc and not yet taken "
                                "(a stream whose client does not read waits there)", value=self.servicer.bytes_queued)  # fmt: skip
        yield GaugeMetricFamily("hasvc_proxy_streams_muted", "ReceiveMessage streams waiting for grpc to take an answer",
                                value=self.servicer.streams_muted)  # fmt: skip
        yield GaugeMetricFamily("hasvc_proxy_progress_events_queued", "Consumer progress events waiting for the progress "
                                "topic's writer", value=self.gate.progress.events_queued)  # fmt: skip
        yield GaugeMetricFamily("hasvc_proxy_receive_bytes_held", "Bodies of the messages receives took from the brokers "
                                "and grpc has not yet taken (all of a receive's, not only the one handed to grpc)",
                                value=self.servicer.receive_bytes_held)  # fmt: skip
        yield GaugeMetricFamily("hasvc_proxy_receive_bytes_held_max", "The limit of hasvc_proxy_receive_bytes_held (the setting "
                                "receive_bytes_held_max)", value=self.servicer.receive_bytes_held_max)  # fmt: skip
        yield GaugeMetricFamily("hasvc_proxy_progress_events_queued_max", "The limit of hasvc_proxy_progress_events_queued "
                                "(the setting progress_events_queued_max)", value=self.gate.config.progress_events_queued_max)  # fmt: skip


def serve_metrics(gate, servicer, address: tuple[str, int]) -> tuple[ProxyMetrics, int]:
    """Start the HTTP endpoint; the metrics and the bound port."""
    registry = CollectorRegistry()
    metrics = ProxyMetrics(gate, servicer, registry)
    server, _ = start_metrics_server(address, registry)
    return metrics, server.server_port
