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
from typing import ClassVar

from commitlog.setting import Rule, check_settings, setting


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerTimings:
    """Every field is a setting of the brokers and the controllers (``hasvc config list --mode
    controller``): its reason is why the default is what it is."""

    broker_heartbeat_interval_seconds: float = setting(
        0.1, "How often a controller-mode broker heartbeats to the controller leader. 0.1 s: several heartbeats fit in "
        "one lease, so one lost heartbeat (or answer) does not fence a healthy master.", above=0)  # fmt: skip
    master_lease_seconds: float = setting(
        0.4, "How long a master acknowledges after sending a heartbeat whose answer named it master. 0.4 s: short "
        "enough for sub-second failover, four heartbeat intervals long. Must be below "
        "broker_heartbeat_timeout_seconds (the old master's lease has run out when its successor is elected).",
        above=0)  # fmt: skip
    broker_heartbeat_timeout_seconds: float = setting(
        0.7, "Silence after which the controller leader counts a broker dead (and elects, if it was the master; "
        "RocketMQ's controllerHeartBeatTimeoutMills, 10 s). 0.7 s: above the lease with room for clock-rate and "
        "scheduling slack; it bounds failover (p50 about 1 s with the slave's catch-up and the client's retry).",
        above=0)  # fmt: skip
    sync_set_lag_seconds_max: float = setting(
        2.0, "A slave not caught up with the master for this long is proposed out of the SyncStateSet (RocketMQ's "
        "haMaxTimeSlaveNotCatchup, 15 s). 2.0 s: a slave that cannot keep up stalls SYNC_MASTER writes at most this "
        "long.", unit="s", above=0)  # fmt: skip
    min_in_sync_replicas: int = setting(
        2, "The SyncStateSet size (counting the master) below which the master refuses writes (RocketMQ's "
        "minInSyncReplicas). 2: SYNC_MASTER's promise, a write returns once a slave holds it; 1 lets a lone master "
        "go on.", unit="brokers", minimum=1)  # fmt: skip
    allow_unclean_election: bool = setting(
        False, "Elect a member outside the SyncStateSet when none in it is alive (RocketMQ's enableElectUncleanMaster; "
        "hasvc controller --allow-unclean-election). False: such a member may lack acknowledged writes, so an "
        "election outside the set may lose them.", processes=("controller",))  # fmt: skip
    sync_set_proposal_retry_seconds: float = setting(
        0.5, "A SyncStateSet change the master proposed and heard nothing about is sent again after this (the same "
        "proposal: its epochs make a second copy harmless). 0.5 s: a few controller round trips, and a controller "
        "leader change (election timeout 0.4-0.6 s) fits in about one retry.", processes=("broker",), above=0)  # fmt: skip

    SETTING_RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(("master_lease_seconds", "broker_heartbeat_timeout_seconds"), lambda lease, timeout: lease < timeout,
             "must be below {1}: an old master would still acknowledge when the controller elects its successor"),
        Rule(("broker_heartbeat_interval_seconds", "master_lease_seconds"), lambda interval, lease: interval < lease,
             "must be below {1}: a healthy master's lease would run out between two heartbeats"),
    )  # fmt: skip

    def validate(self) -> ControllerTimings:
        """Raise ValueError (a SettingError) naming the first impossible setting; returns self."""
        check_settings(self, self.SETTING_RULES)
        return self
