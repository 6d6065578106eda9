"""What a controller shows: its STATUS (``hasvc status`` on the controller port) and its metrics
(``--metrics-listen``)."""

from __future__ import annotations

import os
import time

import trio

from hasvc.config import Address, format_address
from hasvc.state.raft.ready import Role


def controller_status(server) -> dict:
    """The controller's STATUS (``hasvc status`` on its port): its Raft role, its state, its groups."""
    now = trio.current_time()
    node = server.driver.node
    raft = node.status(now)
    leader = raft.leader_id
    groups = {}
    for name, group in sorted(server.state.groups.items()):
        members = {}
        for broker_id, member in sorted(group.members.items()):
            heartbeat = server.tracker.liveness(name, broker_id)
            members[str(broker_id)] = {
                "identity": member.identity, "client_address": member.client_address,
                "ha_address": member.ha_address,
                "alive": server.tracker.alive(name, broker_id, now) if server._serving else None,
                "last_heartbeat_seconds": round(now - heartbeat.received_at, 3) if heartbeat else None,
                "epoch": heartbeat.epoch if heartbeat else None,
                "max_offset": heartbeat.max_offset if heartbeat else None,
                "lost_tail": heartbeat.lost_tail if heartbeat else None}  # fmt: skip
        groups[name] = {"master_id": group.master_id, "epoch": group.epoch,
                        "sync_state_set": sorted(group.sync_state_set),
                        "sync_state_set_epoch": group.sync_state_set_epoch, "restarted": sorted(group.restarted),
                        "members": members}  # fmt: skip
    entries = server.store.entries
    return {
        "mode": "controller", "self_id": server.group.self_id, "raft_role": raft.role.value,
        "role": "LEADER" if server._serving else ("CANDIDATE" if raft.role is Role.LEADER else "FOLLOWER"),
        "term": raft.term, "leader_id": leader,
        "leader_address": server._announced_address() if leader == server.group.self_id else server._leader_address(),
        "holds_lease": server.holds_lease(now), "listen": format_address(server.listen_address),
        "raft_listen": format_address(server.raft_address), "pid": os.getpid(), "store": server.config.store,
        "uptime_seconds": round(time.time() - server.started_at, 3),
        "applied_index": server.applied_index, "committed_index": raft.committed_index,
        "snapshot_index": server.snapshot_index, "log_first_index": entries.first_index(),
        "snapshot_needed": not server.replayable(), "snapshots_installed": server.snapshots.installed,
        "log_last_index": entries.last_index(), "elections": server.elections, "requests": dict(server.requests),
        "controller_connections_refused": server.connections_refused, **server.admission.statistics(),
        "raft_messages_dropped": server.driver.dropped_messages,
        "raft_connections_refused": server.driver.refused_connections,
        "damaged": [damage.to_json() for damage in server.store.damaged],
        "peers": {peer: {"match_index": p.match_index,
                         "last_contact_seconds": None if p.last_contact_seconds == float("inf") else round(p.last_contact_seconds, 3),
                         "connected": server.driver.connected.get(peer, False)}
                  for peer, p in raft.peers.items()},
        "groups": groups,
    }  # fmt: skip



async def serve_controller_metrics(address: Address, server, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The controller's metrics on ``address`` (prometheus-client, ``hasvc.metrics_http``)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

    from hasvc.metrics_http import start_metrics_server

    class Collector:
        def collect(self):
            node = server.driver.node
            for name, value, text in (
                ("hasvc_controller_leader", int(server._serving), "This controller serves as the group's leader"),
                ("hasvc_controller_term", node.term, "The controller group's Raft term"),
                ("hasvc_controller_applied_index", server.applied_index, "The last Raft entry applied to the state"),
                ("hasvc_controller_snapshot_index", server.snapshot_index, "The Raft entry the snapshot reflects"),
                ("hasvc_controller_groups", len(server.state.groups), "Broker groups the controllers know"),
                ("hasvc_controller_elections", server.elections, "Elections this controller proposed and saw accepted"),
            ):
                yield GaugeMetricFamily(name, text, value=value)
            for name, value in server.admission.statistics().items():
                yield GaugeMetricFamily(f"hasvc_{name}", f"STATUS {name}", value=value)

    registry = CollectorRegistry()
    registry.register(Collector())
    http, _thread = start_metrics_server(address, registry)
    task_status.started(http.server_address[:2])
    try:
        await trio.sleep_forever()
    finally:
        http.shutdown()
        http.server_close()

