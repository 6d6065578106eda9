"""The broker's agent in controller mode: what a heartbeat answer means for this broker's role.

Theory of operation
-------------------
A broker in controller mode has no ``--role``: the controller decides, and every heartbeat answer
(``elect.HeartbeatAnswer``) says who the group's master is, in which epoch, and whether the
asking master's lease is renewed. ``plan(local, answer, sent_at)`` compares that with what the
broker is (``LocalState``: its id, role, the last epoch in its log, where its log ends, whom it
follows) and returns the effects, in order, for the driver to carry out:

* named master in an epoch above the last one in its log → ``Promote(epoch)``: the classic
  promotion (cut a partial record, append the epoch at the log's end, rebuild the producer
  table), then serve slaves with a new ``SyncStateSetTracker`` (its set from the answer);
* named master in the epoch its log already ends in, but not serving as master (a restarted
  process) → ``Promote(epoch)`` too, but only on an answer that grants the lease: the driver
  resumes without appending the epoch again. Without the lease nothing: the controller does not
  let a restarted master resume in its epoch (it may have lost unflushed bytes it acknowledged;
  appending new writes at a shorter end would make its epoch differ from its slaves' at the
  same offsets) but elects the longest log of the SyncStateSet into a new epoch;
* named master and serving → ``RenewLease(sent_at)`` when the answer grants it (the
  tracker's ``renew``), nothing otherwise (the lease runs out by itself);
* another broker named master → ``FollowMaster(master_id, ha_address, client_address)`` unless
  it follows that one already (a master stops acknowledging and serving first, the driver's
  classic demotion; the epoch handshake then cuts only what the new master's history never had);
* no master named while serving as master → ``Fence``: acknowledge nothing (its lease would run
  out anyway; this makes it at once). A slave keeps following: its master may come back.

An answer from an older epoch than the broker's log knows (a stale controller leader, a reordered
answer) changes nothing. ``lease_change(fenced, lease_holds)`` turns the lease's state into a
``Fence``/``Unfence`` edge for a driver that shows it (STATUS, a log line); acknowledging itself
asks ``SyncStateSetTracker.confirm_offset(now)``, which checks the lease every time.
"""

from __future__ import annotations

import dataclasses
import enum

from hasvc.state.controller.elect import HeartbeatAnswer


class Role(enum.Enum):
    NONE = "none"  # started, not yet told by a controller
    MASTER = "master"
    SLAVE = "slave"


@dataclasses.dataclass(frozen=True, slots=True)
class LocalState:
    broker_id: int
    role: Role
    epoch: int  # the last epoch in this broker's log (0: none)
    log_end: int  # where its log ends
    following: int | None = None  # a slave: the broker id of the master it replicates from


@dataclasses.dataclass(frozen=True, slots=True)
class Promote:
    epoch: int  # the epoch to serve as master in (appended at the log's end if above the log's last)


@dataclasses.dataclass(frozen=True, slots=True)
class FollowMaster:
    master_id: int
    ha_address: str
    client_address: str | None  # for write refusals that name the master


@dataclasses.dataclass(frozen=True, slots=True)
class RenewLease:
    sent_at: float  # when the heartbeat this answers was sent


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Unfence:
    pass


Effect = Promote | FollowMaster | RenewLease | Fence | Unfence


def plan(local: LocalState, answer: HeartbeatAnswer, sent_at: float) -> list[Effect]:
    """The effects of one heartbeat answer, in order (see the module's theory of operation)."""
    assert answer.broker_id == local.broker_id
    if answer.epoch < local.epoch:
        return []  # an older view than our log's
    if answer.master_id is None:
        if local.role is Role.MASTER:
            return [Fence(f"the controller names no master of group {answer.group!r} in epoch {answer.epoch}")]
        return []
    if answer.master_id == local.broker_id:
        if local.role is not Role.MASTER and answer.epoch == local.epoch and not answer.lease:
            return []  # a restarted master: the controller elects into a new epoch (see the module)
        if local.role is not Role.MASTER or answer.epoch > local.epoch:
            effects: list[Effect] = [Promote(answer.epoch)]
        else:
            effects = []
        if answer.lease:
            effects.append(RenewLease(sent_at))
        return effects
    if local.role is Role.SLAVE and local.following == answer.master_id:
        return []
    assert answer.master_ha_address is not None, "a named master has addresses"
    return [FollowMaster(answer.master_id, answer.master_ha_address, answer.master_client_address)]


def lease_change(*, fenced: bool, lease_holds: bool) -> Fence | Unfence | None:
    """The edge to report when a master's lease state changes; None when it did not."""
    if lease_holds and fenced:
        return Unfence()
    if not lease_holds and not fenced:
        return Fence("the master's lease ran out: no controller leader renewed it")
    return None
