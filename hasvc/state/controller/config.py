"""Controller mode's timings and election policy: one frozen dataclass, checked by ``validate()``.

Theory of operation
-------------------
Three clocks meet here, and their order is the safety argument against two masters acknowledging
at once (docs/design/controller.md, "The master's lease"):

* a broker heartbeats every ``broker_heartbeat_interval_seconds``;
* a master acknowledges only while its lease holds: ``master_lease_seconds`` counted from when it
  *sent* the heartbeat whose answer named it master;
* the controller leader elects another master only ``broker_heartbeat_timeout_seconds`` after the
  last heartbeat it *received* from the master (or after it became leader, if later).

A heartbeat is received after it is sent, so with ``master_lease_seconds <
broker_heartbeat_timeout_seconds`` the old master's lease has run out before the election. The
interval sits below the lease so that a lost heartbeat or two does not fence a healthy master.
Both machines' clocks are monotonic and run at about the same rate; the gap between lease and
timeout is the room left for their drift and for scheduling delays.

RocketMQ's counterparts: ``controllerHeartBeatTimeoutMills`` (10 s), ``brokerHeartbeatInterval``
(1 s), ``haMaxTimeSlaveNotCatchup`` (15 s), ``minInSyncReplicas``, ``enableElectUncleanMaster``
(false). RocketMQ has no lease: its old master keeps acknowledging until it hears of the new one.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerTimings:
    # How often a broker heartbeats to the controller leader. 0.1 s: several heartbeats fit in
    # one lease, so one lost heartbeat (or answer) does not fence a healthy master.
    broker_heartbeat_interval_seconds: float = 0.1
    # How long a master acknowledges after sending a heartbeat whose answer named it master.
    # 0.4 s: short enough for sub-second failover, four heartbeat intervals long.
    master_lease_seconds: float = 0.4
    # Silence after which the controller leader counts a broker dead (and elects, if it was the
    # master). 0.7 s: above the lease with room for clock-rate and scheduling slack; it bounds
    # failover (p50 about 1 s with the slave's catch-up and the client's retry).
    broker_heartbeat_timeout_seconds: float = 0.7
    # A slave not caught up with the master for this long is proposed out of the SyncStateSet.
    # 2.0 s: a slave that cannot keep up stalls SYNC_MASTER writes at most this long.
    sync_set_lag_seconds_max: float = 2.0
    # The SyncStateSet size (counting the master) below which the master refuses writes.
    # 2: SYNC_MASTER's promise, a write returns once a slave holds it; 1 lets a lone master go on.
    min_in_sync_replicas: int = 2
    # Elect a member outside the SyncStateSet when none in it is alive. False: such a member may
    # lack acknowledged writes, so an election outside the set may lose them.
    allow_unclean_election: bool = False
    # A SyncStateSet change the master proposed and heard nothing about is sent again after this
    # (the same proposal: its epochs make a second copy harmless). 0.5 s: a few controller round
    # trips, and a controller leader change (election timeout 0.4-0.6 s) fits in about one retry.
    sync_set_proposal_retry_seconds: float = 0.5

    def validate(self) -> ControllerTimings:
        """Raise ValueError naming the first impossible setting; returns self."""
        positive = ("broker_heartbeat_interval_seconds", "master_lease_seconds", "broker_heartbeat_timeout_seconds",
                    "sync_set_lag_seconds_max", "sync_set_proposal_retry_seconds")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)!r}")
        if self.min_in_sync_replicas < 1:
            raise ValueError(f"min_in_sync_replicas must be >= 1 (the master counts), not {self.min_in_sync_replicas}")
        if not self.master_lease_seconds < self.broker_heartbeat_timeout_seconds:
            raise ValueError(
                f"master_lease_seconds ({self.master_lease_seconds}) must be below broker_heartbeat_timeout_seconds "
                f"({self.broker_heartbeat_timeout_seconds}): an old master would still acknowledge when the "
                "controller elects its successor"
            )  # fmt: skip
        if not self.broker_heartbeat_interval_seconds < self.master_lease_seconds:
            raise ValueError(
                f"broker_heartbeat_interval_seconds ({self.broker_heartbeat_interval_seconds}) must be below "
                f"master_lease_seconds ({self.master_lease_seconds}): a healthy master's lease would run out "
                "between two heartbeats"
            )  # fmt: skip
        return self
