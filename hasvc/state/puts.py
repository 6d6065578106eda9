"""A put's decisions: refused or stored, which waits it needs, and its final status.

Theory of operation
-------------------
A put (SEND) on a master goes through four steps (``hasvc/broker/put_service.py`` carries them out):

1. ``refusal``: a slave or a fenced master refuses it (SERVICE_NOT_AVAILABLE, from
   ``RoleState.write_refusal``); with ``min_in_sync_replicas``, too few slaves in sync refuse it
   too (IN_SYNC_REPLICAS_NOT_ENOUGH). Nothing is stored.
2. the driver appends it.
3. ``plan``: the waits it needs, registered together so they overlap: a flush wait under
   SYNC_FLUSH; under SYNC_MASTER an ack wait until ``in_sync_replicas`` slaves have reported past
   its records, unless they already have, or unless no slave is close enough to try
   (SLAVE_NOT_AVAILABLE at once, RocketMQ's ``isSlaveOK``). Deadlines are ``now`` plus
   ``flush_timeout_seconds`` / ``ack_timeout_seconds``.
4. ``final_status``: PUT_OK, or FLUSH_DISK_TIMEOUT (not known flushed in time: that one wins),
   FLUSH_SLAVE_TIMEOUT (no slave acknowledged in time) or SLAVE_NOT_AVAILABLE. In all three the
   records are stored on the master, and the status says exactly that.

The waits themselves (``commitlog.waiters.OffsetWaiters``) are released by the flush or the ack
that covers them and expired at their deadlines by the driver's timer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from commitlog.record import PutMessageStatus
from hasvc.config import BrokerRole
from hasvc.state.replication import Admission
from hasvc.state.role import RoleState

FLUSH_TIMEOUT_REASON = "stored, but not known to be flushed within sync_flush_timeout"
SLAVE_TIMEOUT_REASON = "stored on the master; no slave acknowledged it within slave_timeout"


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    status: PutMessageStatus
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class WaitPlan:
    """The waits a stored put registers, and its status should they all succeed."""

    flush: bool
    ack: bool
    status: PutMessageStatus = PutMessageStatus.PUT_OK
    reason: str = ""


class PutTracker:
    """The put rules of one broker's configuration; every answer is computed from arguments."""

    __slots__ = ("sync_flush", "in_sync_replicas", "min_in_sync_replicas", "flush_timeout_seconds", "ack_timeout_seconds")

    def __init__(self, *, sync_flush: bool, in_sync_replicas: int, min_in_sync_replicas: int,
                 flush_timeout_seconds: float, ack_timeout_seconds: float) -> None:  # fmt: skip
        assert in_sync_replicas >= 0 and min_in_sync_replicas >= 0
        assert flush_timeout_seconds > 0 and ack_timeout_seconds > 0
        self.sync_flush = sync_flush
        self.in_sync_replicas = in_sync_replicas
        self.min_in_sync_replicas = min_in_sync_replicas
        self.flush_timeout_seconds = flush_timeout_seconds
        self.ack_timeout_seconds = ack_timeout_seconds

    def refusal(self, role: RoleState, in_sync: Callable[[], int]) -> Refusal | None:
        """Step 1: why a put is refused before anything is stored, or None. ``in_sync`` counts
        the slaves in sync; it is called only when ``min_in_sync_replicas`` is set."""
        reason = role.write_refusal()
        if reason is not None:
            return Refusal(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason)
        if self.min_in_sync_replicas:
            count = in_sync()
            if count < self.min_in_sync_replicas:
                return Refusal(
                    PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH,
                    f"{count} slave(s) in sync, fewer than min_in_sync_replicas {self.min_in_sync_replicas}; not stored",
                )
        return None

    def waits_for_acks(self, role: RoleState) -> bool:
        return self.in_sync_replicas > 0 and role.role is BrokerRole.SYNC_MASTER

    def must_wait(self, role: RoleState) -> bool:
        """Whether a stored put waits at all (else it is answered at once). Twice per pass of
        puts: ``waits_for_acks`` is written out, not called."""
        return self.sync_flush or (self.in_sync_replicas > 0 and role.role is BrokerRole.SYNC_MASTER)

    def plan(self, next_offset: int, *, role: RoleState, replicated_to: int, admit: Callable[[], Admission],
             shortfall: Callable[[], str]) -> WaitPlan:  # fmt: skip
        """Step 3 for a put whose records end at ``next_offset``. ``replicated_to``: the offset
        ``in_sync_replicas`` slaves have all acknowledged; ``admit`` is asked only when that is
        not past the put, and ``shortfall`` (SLAVE_NOT_AVAILABLE's reason) only when it refuses."""
        # waits_for_acks, written out (once a put)
        ack = self.in_sync_replicas > 0 and role.role is BrokerRole.SYNC_MASTER and replicated_to < next_offset
        if ack and admit() is Admission.SLAVE_NOT_AVAILABLE:
            return WaitPlan(self.sync_flush, False, PutMessageStatus.SLAVE_NOT_AVAILABLE, shortfall())
        return WaitPlan(self.sync_flush, ack)

    def flush_deadline(self, now: float) -> float:
        return now + self.flush_timeout_seconds

    def ack_deadline(self, now: float) -> float:
        return now + self.ack_timeout_seconds


def final_status(status: PutMessageStatus, reason: str, *, flushed: bool | None, acked: bool | None) -> tuple[PutMessageStatus, str]:
    """Step 4: a put's status once its waits have ended (None: it had no such wait)."""
    if flushed is False:
        status, reason = PutMessageStatus.FLUSH_DISK_TIMEOUT, FLUSH_TIMEOUT_REASON
    if acked is False and status is PutMessageStatus.PUT_OK:
        status, reason = PutMessageStatus.FLUSH_SLAVE_TIMEOUT, SLAVE_TIMEOUT_REASON
    return status, reason
