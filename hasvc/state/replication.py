"""The master's view of its slaves, as plain state: no sockets, no trio, ``now`` passed in.

Theory of operation
-------------------
Each connected slave has a ``SlaveProgress``: where it asked to start (its first report), what it
has acknowledged (every later report), and when it was last caught up. Reports are checked here:
a slave may not acknowledge an offset beyond the master's end (RocketMQ issue #3015: a rogue peer
on the HA port could release SYNC_MASTER waiters early) nor go backwards (a confused or lying
peer). A violation raises ``ReplicationViolation``; the driver closes that connection alone.

``ack_watermark(k)`` is the offset that ``k`` slaves have all reached: a SYNC_MASTER put whose
records end at or below it is replicated. ``admit`` decides, before waiting, whether waiting makes
sense at all (RocketMQ 4.x ``isSlaveOK``): no slave, or the best slave more than
``ha_max_gap_not_in_sync`` behind, means SLAVE_NOT_AVAILABLE at once.
"""

from __future__ import annotations

import dataclasses
import enum


class ReplicationViolation(Exception):
    """A slave reported something it cannot have."""


@dataclasses.dataclass
class SlaveProgress:
    connection_id: int
    slave_id: str
    address: str
    connected_since: float  # wall clock, for display
    request_offset: int = -1
    ack_offset: int = -1
    # Monotonic time when its ack last reached the master's end; until it first does, when it
    # connected (so ``lag`` never counts from the clock's zero, the host's uptime).
    caught_up_at: float = 0.0


class Admission(enum.Enum):
    WAIT = "WAIT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class ReplicaSet:
    def __init__(self) -> None:
        self.slaves: dict[int, SlaveProgress] = {}

    def add(self, progress: SlaveProgress) -> None:
        assert progress.connection_id not in self.slaves
        self.slaves[progress.connection_id] = progress

    def remove(self, connection_id: int) -> None:
        self.slaves.pop(connection_id, None)

    def on_report(self, connection_id: int, offset: int, *, master_max_offset: int, now: float) -> bool:
        """Record a report; True when it was the first (the request offset)."""
        progress = self.slaves[connection_id]
        if offset > master_max_offset:
            raise ReplicationViolation(
                f"slave {progress.slave_id} at {progress.address} reported offset {offset}, beyond the master's end {master_max_offset}"
            )
        first = progress.request_offset < 0
        if first:
            progress.request_offset = offset
        elif offset < progress.ack_offset:
            raise ReplicationViolation(
                f"slave {progress.slave_id} at {progress.address} went back from {progress.ack_offset} to {offset}"
            )
        progress.ack_offset = offset
        if offset >= master_max_offset:
            progress.caught_up_at = now
        return first

    def ack_watermark(self, replicas: int) -> int:
        """The highest offset acknowledged by at least ``replicas`` slaves; -1 if fewer are connected."""
        if replicas <= 0:
            return 2**63 - 1
        if replicas == 1 and self.slaves:  # the common case, twice a put: a loop, not a generator's calls
            best = -1
            for progress in self.slaves.values():
                if progress.ack_offset > best:
                    best = progress.ack_offset
            return best
        acks = sorted((p.ack_offset for p in self.slaves.values()), reverse=True)
        if len(acks) < replicas:
            return -1
        return acks[replicas - 1]

    def in_sync_count(self, *, master_max_offset: int, max_gap: int) -> int:
        return sum(1 for p in self.slaves.values() if p.ack_offset >= 0 and master_max_offset - p.ack_offset < max_gap)

    def ready_count(self, *, next_offset: int, max_gap: int) -> int:
        """Slaves that have reported and are less than ``max_gap`` bytes behind ``next_offset``
        (the end of a put's records, after its append). Once a put: a loop, not a generator's calls."""
        count = 0
        for progress in self.slaves.values():
            if progress.ack_offset >= 0 and next_offset - progress.ack_offset < max_gap:
                count += 1
        return count

    def admit(self, *, next_offset: int, max_gap: int, replicas: int) -> Admission:
        """Whether a SYNC_MASTER put ending at ``next_offset`` should wait for acks (it is
        after the put's append, so ``next_offset`` is at most the master's end)."""
        if self.ready_count(next_offset=next_offset, max_gap=max_gap) < replicas:
            return Admission.SLAVE_NOT_AVAILABLE
        return Admission.WAIT

    def lag(self, progress: SlaveProgress, *, master_max_offset: int, now: float) -> tuple[int, float]:
        """(bytes behind, seconds behind) for status: 0 s when it has acknowledged the master's
        end, else the time since it last had (or, never having had it, since it connected).
        Before its first report it is behind by the whole log (``master_max_offset``)."""
        behind = master_max_offset if progress.ack_offset < 0 else max(0, master_max_offset - progress.ack_offset)
        return behind, 0.0 if behind == 0 else max(0.0, now - progress.caught_up_at)
