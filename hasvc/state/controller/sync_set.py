"""The master's SyncStateSet tracker: which slaves to propose in or out, how far every member that
counts has acknowledged, whether writes are admitted, and the master's lease.

Theory of operation
-------------------
A master in controller mode acknowledges a SYNC_MASTER write once every member of the
SyncStateSet holds it: any of them may be elected next, so each must hold every acknowledged
write. The set is the controller's (``ControllerState``); the master only proposes changes
(``AlterSyncStateSet``) and takes one as its own only once the controller's answer says it was
applied. One proposal is in flight at a time.

The driver feeds it:

* ``on_ack(slave_id, offset, master_end, now)``: a slave's report that its log ends at
  ``offset``; ``master_end`` is where the master's log ended when it last sent that slave a batch
  (RocketMQ's ``lastMasterMaxOffset``: what the slave could hold by now). A slave whose ack reaches
  it is **caught up** at ``now``. A slave outside the set whose ack reaches the confirm offset over
  the set (every acknowledged write) and the start of the master's epoch is proposed **in**
  (RocketMQ's ``maybeExpandInSyncStateSet``).
* ``on_append(master_end)``: the master's own log grew (the master counts in the watermark).
* ``on_disconnect(slave_id, now)``: the slave's connection closed: a member is proposed **out**
  at once, in one step (apache/rocketmq#9897 kept dead slaves in the set through a
  ``removeConnection`` race and stretched every wait).
* ``tick(now)``: a member not caught up for ``sync_set_lag_seconds_max`` (or never connected to
  this master for that long) is proposed out; a proposal unanswered for
  ``sync_set_proposal_retry_seconds`` is sent again, the same one (its epochs make a second copy
  harmless).
* ``on_answer(proposal, accepted, new_set, epoch, master_epoch=)``: the controller applied
  ``proposal`` (accepted or refused) and its set is now ``new_set`` in set epoch ``epoch``: a
  newer set is adopted and the proposal is done; a refusal of the proposal in flight that left
  the set epoch alone ends it too. Only answers from the state machine count: a timeout or
  NOT_LEADER says nothing, the proposal stays in flight (it may still be applied) and is retried.
  ``on_heartbeat(set, epoch, master_epoch=)`` adopts a newer set seen in a heartbeat answer
  (which also settles a proposal it supersedes). Both ignore what belongs to another master
  epoch (this master was deposed: the agent demotes it).

``on_ack``, ``on_disconnect`` and ``tick`` return the ``AlterSyncStateSet`` to send now, or None;
after ``on_answer`` or ``on_heartbeat`` the driver calls ``tick(now)`` for the next change.

What counts while a change is in flight: the **union** of the current set and the proposed one.
A shrink thus takes effect only once accepted (until then the slave may still be elected, so the
master still waits for it); an expansion is waited for at once (apache/rocketmq#5663: an expansion
counted only after the controller applied it let the master acknowledge writes the new member
lacked, and that member could already be elected). ``ack_watermark()`` is the lowest ack over
those members (the master's own end for itself). ``admit()`` is False while the accepted set is
smaller than ``min_in_sync_replicas`` (the write is refused: SLAVE_NOT_AVAILABLE).

ASYNC_MASTER (``asynchronous=True``): the master acknowledges a write once its own log holds it,
as RocketMQ's ASYNC_MASTER does in controller mode; ``confirm_offset`` is then the master's end
while the lease holds, and ``admit`` takes every write (``min_in_sync_replicas`` is SYNC_MASTER's
promise). Everything else is the same: the set still shrinks and expands on the same rules and
only its members are electable, so a failover loses at most what the elected member had not
received, and a member of the set was caught up within ``sync_set_lag_seconds_max`` (the lease
still keeps one master acknowledging per epoch).

The lease: ``renew(sent_at)`` when a heartbeat answer grants it (``sent_at`` is when that
heartbeat was *sent*: the controller counts from receipt, later), ``lease_holds(now)`` while
``now < sent_at + master_lease_seconds``. ``confirm_offset(now)`` is what the driver may release
waiters up to: the watermark while the lease holds and writes are admitted, else None.

Invariants (``check_invariants``): the master is in its set and in any proposal; a proposal is
based on the current set epoch; acks never exceed the master's end; the set epoch only grows.
"""

from __future__ import annotations

import dataclasses
import math

from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.state import AlterSyncStateSet


@dataclasses.dataclass(slots=True)
class SlaveProgress:
    ack_offset: int = 0  # where the slave's log ends, as it last reported
    caught_up_at: float = -math.inf  # when its ack last reached what the master had sent it
    connected: bool = False
    seen_at: float = -math.inf  # its last report or disconnection


class SyncStateSetTracker:
    __slots__ = ("group", "master_id", "epoch", "epoch_start_offset", "timings", "sync_state_set",
                 "sync_state_set_epoch", "proposal", "proposed_at", "master_end", "slaves", "started_at",
                 "lease_until", "asynchronous", "alone_from")  # fmt: skip

    def __init__(self, group: str, master_id: int, epoch: int, *, epoch_start_offset: int, master_end: int,
                 sync_state_set: frozenset[int], sync_state_set_epoch: int, timings: ControllerTimings,
                 now: float, asynchronous: bool = False) -> None:  # fmt: skip
        self.group = group
        self.master_id = master_id
        self.epoch = epoch  # the master epoch this tracker serves (a new one: a new tracker)
        self.epoch_start_offset = epoch_start_offset  # where this epoch starts in the master's log
        self.timings = timings.validate()
        self.sync_state_set = frozenset(sync_state_set)  # the controller's, as last heard
        self.sync_state_set_epoch = sync_state_set_epoch
        self.proposal: AlterSyncStateSet | None = None  # in flight
        self.proposed_at = -math.inf
        self.master_end = master_end
        self.slaves: dict[int, SlaveProgress] = {}
        self.started_at = now
        self.lease_until = -math.inf  # no lease until a heartbeat answer grants one
        self.asynchronous = asynchronous  # ASYNC_MASTER: acknowledge what the master's own log holds
        self.alone_from = 0  # the master's end when it proposed a set of itself alone (the driver flushes that)
        self.check_invariants()

    def check_invariants(self) -> None:
        assert self.master_id in self.sync_state_set, (self.master_id, self.sync_state_set)
        assert self.epoch_start_offset <= self.master_end
        if self.proposal is not None:
            assert self.master_id in self.proposal.new_set
            assert self.proposal.sync_state_set_epoch == self.sync_state_set_epoch
            assert self.proposal.new_set != self.sync_state_set
        for progress in self.slaves.values():
            assert progress.ack_offset <= self.master_end, (progress.ack_offset, self.master_end)

    # -- inputs ------------------------------------------------------------------------------

    def on_append(self, master_end: int) -> None:
        assert master_end >= self.master_end, (master_end, self.master_end)
        self.master_end = master_end

    def on_ack(self, slave_id: int, offset: int, master_end: int, now: float) -> AlterSyncStateSet | None:
        """A slave's report; ``master_end``: the master's end when it last sent to this slave."""
        assert slave_id != self.master_id
        assert offset <= master_end <= self.master_end, (offset, master_end, self.master_end)
        progress = self.slaves.setdefault(slave_id, SlaveProgress())
        progress.ack_offset = offset
        progress.connected = True
        progress.seen_at = now
        if offset >= master_end:
            progress.caught_up_at = now
        return self._propose(now)

    def on_disconnect(self, slave_id: int, now: float) -> AlterSyncStateSet | None:
        progress = self.slaves.get(slave_id)
        if progress is not None:
            progress.connected = False
            progress.seen_at = now
        return self._propose(now)

    def tick(self, now: float) -> AlterSyncStateSet | None:
        if self.proposal is not None:
            if now - self.proposed_at >= self.timings.sync_set_proposal_retry_seconds:
                self.proposed_at = now
                return self.proposal  # the same proposal again
            return None
        return self._propose(now)

    def on_answer(self, proposal: AlterSyncStateSet, accepted: bool, new_set: frozenset[int], epoch: int, *,
                  master_epoch: int) -> None:  # fmt: skip
        """The controller applied ``proposal`` (``accepted`` or not); its set is ``new_set`` in set
        epoch ``epoch`` now, for the master of ``master_epoch``. A newer set is adopted (and
        settles the proposal in flight: its base epoch is gone, it can never apply). A refusal of
        the proposal in flight that leaves the set epoch where it was settles it too (it was
        applied, as a refusal: that entry cannot apply later). Nothing else settles it: the
        answer to an older copy or an older proposal (reordered, late) says nothing of this one.
        An answer of another master epoch says nothing of our set: this master was deposed (its
        lease was withheld first), and the next heartbeat answer demotes it."""
        if master_epoch != self.epoch:
            return
        if epoch > self.sync_state_set_epoch:
            self._adopt(frozenset(new_set), epoch)
        elif epoch == self.sync_state_set_epoch and not accepted and proposal == self.proposal:
            assert frozenset(new_set) == self.sync_state_set, (new_set, self.sync_state_set)
            self.proposal = None
            self.proposed_at = -math.inf
        self.check_invariants()

    def on_heartbeat(self, sync_state_set: frozenset[int], sync_state_set_epoch: int, *, master_epoch: int) -> None:
        """A heartbeat answer showed the controller's set (ignored unless for this master's epoch)."""
        if master_epoch == self.epoch and sync_state_set_epoch > self.sync_state_set_epoch:
            self._adopt(frozenset(sync_state_set), sync_state_set_epoch)
        self.check_invariants()

    def _adopt(self, new_set: frozenset[int], epoch: int) -> None:
        assert self.master_id in new_set, (self.master_id, new_set)
        assert epoch > self.sync_state_set_epoch
        self.sync_state_set = new_set
        self.sync_state_set_epoch = epoch
        if self.proposal is not None:
            assert self.proposal.sync_state_set_epoch < epoch
            self.proposal = None  # its base epoch is gone: it can never apply
            self.proposed_at = -math.inf

    # -- proposals ---------------------------------------------------------------------------

    def _propose(self, now: float) -> AlterSyncStateSet | None:
        if self.proposal is not None:
            return None  # one at a time; tick() retries it
        shrink, expand = self._to_shrink(now), self._to_expand()
        if not shrink and not expand:  # (shrink holds members only, expand none: either one changes the set)
            return None  # the common case, on every ack: no set built
        wanted = (self.sync_state_set - shrink) | expand
        self.proposal = AlterSyncStateSet(self.group, self.master_id, self.epoch, self.sync_state_set_epoch, wanted)
        self.proposed_at = now
        if wanted == {self.master_id}:
            self.alone_from = self.master_end
        self.check_invariants()
        return self.proposal

    def _to_shrink(self, now: float) -> frozenset[int]:
        lag_max = self.timings.sync_set_lag_seconds_max
        out = set()
        for slave_id in self.sync_state_set:
            if slave_id == self.master_id:
                continue
            progress = self.slaves.get(slave_id)
            if progress is None:
                if now - self.started_at > lag_max:
                    out.add(slave_id)  # never connected to this master
            elif not progress.connected or now - max(progress.caught_up_at, self.started_at) > lag_max:
                out.add(slave_id)
        return frozenset(out)

    def _to_expand(self) -> frozenset[int]:
        outside = [(slave_id, progress) for slave_id, progress in self.slaves.items()
                   if slave_id not in self.sync_state_set and progress.connected]  # fmt: skip
        if not outside:
            return frozenset()  # the common case, on every ack: no watermark computed
        confirm = self._watermark(self.sync_state_set)
        return frozenset(slave_id for slave_id, progress in outside
                         if progress.ack_offset >= confirm and progress.ack_offset >= self.epoch_start_offset)  # fmt: skip

    # -- what the master may acknowledge -------------------------------------------------------

    def counted_members(self) -> frozenset[int]:
        """The members a write waits for: the set, and while a change is in flight its union
        with the proposed set."""
        if self.proposal is None:
            return self.sync_state_set
        return self.sync_state_set | self.proposal.new_set

    def _watermark(self, members: frozenset[int]) -> int:
        watermark = self.master_end
        for slave_id in members:
            if slave_id == self.master_id:
                continue
            progress = self.slaves.get(slave_id)
            watermark = min(watermark, progress.ack_offset if progress is not None else 0)
        return watermark

    def ack_watermark(self) -> int:
        """The log offset every counted member holds."""
        return self._watermark(self.counted_members())

    def admit(self) -> bool:
        """Whether to take a SYNC_MASTER write now (False: SLAVE_NOT_AVAILABLE); an ASYNC_MASTER
        takes every write (it does not wait for the set)."""
        if self.asynchronous:
            return True
        return len(self.sync_state_set) >= self.timings.min_in_sync_replicas

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` was answered with a lease for this master."""
        self.lease_until = max(self.lease_until, sent_at + self.timings.master_lease_seconds)

    def lease_holds(self, now: float) -> bool:
        return now < self.lease_until

    def confirm_offset(self, now: float) -> int | None:
        """Release waiters up to this offset now; None: release none (no lease, or too few in sync).
        ASYNC_MASTER: the master's own end while the lease holds."""
        if not (self.lease_holds(now) and self.admit()):
            return None
        if self.asynchronous:
            return self.master_end
        if self.proposal is not None and self.proposal.new_set == {self.master_id}:
            # Alone once accepted: the driver flushes the log to alone_from before it sends the
            # proposal, and nothing past it is released meanwhile (a lagging slave's acks would
            # otherwise release writes only it and the unflushed master hold).
            return min(self.ack_watermark(), self.alone_from)
        return self.ack_watermark()
