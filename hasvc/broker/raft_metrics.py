"""Prometheus metrics for a DLedger member (``hasvc node --metrics-listen HOST:PORT``).

Counters and the put latency histogram are the classic broker's (``PutMetrics``: the put path
updates them the same way in both modes). Everything else is the member's STATUS, read when
scraped: the scrape thread asks the trio thread for it (``trio.from_thread.run_sync``), so it sees
one consistent STATUS and never reads the Raft core's state while the trio thread changes it.
Every number in STATUS becomes a gauge ``hasvc_<field>`` (``hasvc_term``, ``hasvc_committed_index``,
``hasvc_raft_strangers_evicted``, ``hasvc_client_bytes_queued``, ...); the role is
``hasvc_raft_role{role=...}`` 1 for the member's role; each peer's numbers are gauges with a ``peer``
label (``hasvc_peer_match_index{peer="n1"}``, ``hasvc_peer_lag_entries``, ``hasvc_peer_connected``,
``hasvc_peer_last_contact_seconds``, ``hasvc_peer_bytes_queued``).

The Raft port's bytes: a member sends to a peer only on the connection it dialled (an inbound
connection is only read, a frame at most ``FRAME_SIZE_MAX_DEFAULT``), so what it holds for a peer
that reads too slowly, or not at all, is the rest of the one write its socket did not take
(``peers.*.bytes_queued``; appends queued behind it are references to the log,
``RAFT_SEND_QUEUE_MAX`` of them). Summed over the peers: ``hasvc_raft_bytes_queued``, and the
peers with such a write waiting, ``hasvc_raft_connections_muted``. A write not taken within
``raft_send_stalled_timeout_seconds`` closes that connection (``hasvc/broker/raft/peers.py``):
``hasvc_raft_connections_closed_stalled`` (STATUS ``raft_connections_closed_stalled``) and, per
peer, ``hasvc_peer_closed_stalled``.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from hasvc.broker.metrics import PutMetrics
from hasvc.metrics_http import start_metrics_server

RAFT_ROLES = ("LEADER", "CANDIDATE", "FOLLOWER")
# STATUS fields that are numbers but not measurements (the process id).
SKIPPED_FIELDS = frozenset({"pid"})


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class RaftMetrics(PutMetrics):
    """The metrics of one DLedger member; ``status`` is the member's STATUS, run in the trio thread."""

    def __init__(self, *, status: Callable[[], dict], registry: CollectorRegistry, trio_token: trio.lowlevel.TrioToken) -> None:
        super().__init__(registry=registry)
        self.status = status
        self.trio_token = trio_token
        registry.register(self)

    def collect(self):
        status = trio.from_thread.run_sync(self.status, trio_token=self.trio_token)
        for name, value in status.items():
            number = _number(value)
            if number is None or name in SKIPPED_FIELDS:
                continue
            yield GaugeMetricFamily(f"hasvc_{name}", f"STATUS {name} (docs/operations.md)", value=number)
        role = GaugeMetricFamily("hasvc_raft_role", "1 for this member's Raft role", labels=["role"])
        for name in RAFT_ROLES:
            role.add_metric([name], float(status.get("raft_role") == name))
        yield role
        scrub = status.get("scrub") or {}
        for name, value in scrub.items():
            number = _number(value)
            if number is not None:
                yield GaugeMetricFamily(f"hasvc_scrub_{name}", f"STATUS scrub.{name}", value=number)
        yield GaugeMetricFamily("hasvc_damaged_ranges", "Damaged ranges the store has found (STATUS damaged)",
                                value=len(status.get("damaged") or ()))  # fmt: skip
        peers = status.get("peers") or {}
        fields: dict[str, GaugeMetricFamily] = {}
        for peer, shown in peers.items():
            for name, value in shown.items():
                number = _number(value)
                if number is None:
                    continue
                family = fields.get(name)
                if family is None:
                    family = fields[name] = GaugeMetricFamily(f"hasvc_peer_{name}", f"STATUS peers.*.{name}", labels=["peer"])
                family.add_metric([peer], number)
        yield from fields.values()
        queued = [shown.get("bytes_queued") or 0 for shown in peers.values()]
        yield GaugeMetricFamily("hasvc_raft_bytes_queued", "Bytes the senders to every peer wait for their sockets to take",
                                value=sum(queued))  # fmt: skip
        yield GaugeMetricFamily("hasvc_raft_connections_muted", "Peers whose sender waits for its socket to take a write",
                                value=sum(1 for size in queued if size))  # fmt: skip


async def serve_raft_metrics(address: tuple[str, int], *, status: Callable[[], dict],
                             task_status=trio.TASK_STATUS_IGNORED) -> None:  # fmt: skip
    """Serve a member's metrics on ``address`` until cancelled; ``task_status.started`` gets
    (the RaftMetrics the put path updates, the address served)."""
    registry = CollectorRegistry()
    metrics = RaftMetrics(status=status, registry=registry, trio_token=trio.lowlevel.current_trio_token())
    server, _thread = start_metrics_server(address, registry)
    task_status.started((metrics, server.server_address[:2]))
    try:
        await trio.sleep_forever()
    finally:
        server.shutdown()
        server.server_close()
