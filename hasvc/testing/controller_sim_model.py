"""The controller-mode simulation's vocabulary (``hasvc.testing.controller_sim``): its timings,
the messages brokers, controllers and the client exchange, the report of a seed, the invariants'
checker, and the mutations (one core rule broken on purpose, for the checker to catch)."""

from __future__ import annotations

import dataclasses
from typing import Any

from commitlog.epoch import EpochEntry
from hasvc.state.controller.elect import ElectionTracker
from hasvc.state.controller.sync_set import SyncStateSetTracker
from hasvc.state.controller.state import ControllerState
from hasvc.testing.checker import SafetyViolation


GROUP = "g"
CONTROLLERS = ("c0", "c1", "c2")
CLIENT = "client"
CHAOS_SECONDS = 4.0  # simulated seconds of faults
SETTLE_SECONDS = 4.0  # healed, all up: then the master must acknowledge writes again
SETTLE_PROGRESS_SECONDS = 1.0  # ... within this last part of the settle
DECIDE_EVERY_SECONDS = 0.05  # how often the controller leader runs decide()
COMMIT_DELAY_SECONDS = (0.002, 0.01)  # a controller proposal's Raft round trip
CONTROLLER_ELECTION_SECONDS = (0.4, 0.6)  # the controller group's election timeout (>= the master lease)
DEPOSED_TAIL_SECONDS = 0.05  # a deposed controller leader answers at most this long after the change
TRANSFER_EVERY_SECONDS = 0.005  # a master sends to each slave behind it this often
BATCH_SIZE_MAX = 32  # writes per transfer
HELLO_RETRY_SECONDS = 0.3  # a slave with no word from its master says hello again after this
SESSION_IDLE_SECONDS = 1.0  # a master drops a slave session silent this long (the HA housekeeping)
WRITE_TIMEOUT_SECONDS = 1.0  # a write waiting for acks longer than this fails (FLUSH_SLAVE_TIMEOUT)
CLIENT_RETRY_SECONDS = 0.3  # the client tries another broker after this long without an answer
UNCLEAN_SHARE = 0.1  # of the seeds allow unclean election (the loss checks are off there)
FLUSH_EVERY_SECONDS = 0.2  # a broker's asynchronous flush: a power loss keeps what it flushed
# Of the master kills in seeds with min_in_sync_replicas >= 2, these are power losses: the log
# loses a random part of its unflushed tail (with min_in_sync_replicas 1 a lone master
# acknowledges what only it holds, and a power loss loses it: that setting's stated cost).
POWER_LOSS_SHARE = 0.5
ASYNC_SHARE = 0.25  # of the seeds run their brokers as ASYNC_MASTER (acknowledged once the master holds it)
# ASYNC_MASTER's promise, as checked: the acknowledged writes one failover loses were all
# acknowledged within sync_set_lag_seconds_max plus this of each other (the new master stopped
# catching up at the first of them; its master proposed it out after the lag bound, and kept
# acknowledging until the controller accepted that: the proposal retried every 0.5 s over lossy
# links, a controller leader change of 0.4-0.6 s in between).
ASYNC_LOSS_SLACK_SECONDS = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class SeedReport:
    seed: int
    brokers: int
    min_in_sync_replicas: int
    unclean: bool
    events: int
    crashes: int
    acked: int
    elections: int
    controller_changes: int
    switchovers: int
    truncations: int
    set_changes: int
    # Simulated seconds from a master's kill to the first write acknowledged in a newer epoch,
    # one per kill of an acknowledging master followed by a failover (other faults may intervene).
    failovers: tuple[float, ...] = ()
    power_losses: int = 0  # master kills that also dropped an unflushed tail
    asynchronous: bool = False  # brokers ran as ASYNC_MASTER
    accepted_losses: int = 0  # ASYNC_MASTER: acknowledged writes a failover lost, as promised
    lost_tails: int = 0  # power losses that left the log ending before its last epoch's start


# -- messages ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerRequest:
    request_id: int
    body: Any  # Register | HeartbeatBody | AlterSyncStateSet


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatBody:
    broker_id: int
    epoch: int
    max_offset: int
    lost_tail: int | None = None  # the last epoch's start when past max_offset (a power loss cut it)


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerReply:
    request_id: int
    status: str  # OK, NOT_LEADER
    leader: str | None = None
    body: Any = None  # broker id (Register), HeartbeatAnswer, (accepted, set, set epoch) (Alter)


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    session: int
    slave_id: int
    epochs: tuple[EpochEntry, ...]
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class HelloAnswer:
    session: int
    epochs: tuple[EpochEntry, ...]
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class Transfer:
    session: int
    from_offset: int
    items: tuple[tuple[int, int], ...]  # (epoch, write id)


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    session: int
    slave_id: int
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Bye:
    session: int
    slave_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Put:
    write_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class PutReply:
    write_id: int
    ok: bool
    master: str | None = None


# -- the checker ---------------------------------------------------------------------------------


class ControllerChecker:
    """``loss_span_max``: with ASYNC_MASTER brokers (not None), a failover may lose acknowledged
    writes the new master had not received, all acknowledged within this many seconds of each
    other (the lag bound and its slack); they are counted as accepted losses, and no slave may cut
    (and no final master lack) an acknowledged write that is not one of them."""

    def __init__(self, unclean: bool, loss_span_max: float | None = None, lease_seconds: float = 0.0) -> None:
        self.unclean = unclean
        self.loss_span_max = loss_span_max
        self.lease_seconds = lease_seconds  # a deposed ASYNC_MASTER acknowledges at most this long after
        self.promoted_at: dict[int, float] = {}  # epoch -> when its master first took office
        self.late_acks = 0  # ASYNC_MASTER: acknowledged by a master already superseded (a switchover)
        self.loss_span_seen = 0.0  # ASYNC_MASTER: the widest span of one failover's accepted losses
        self.acked_at: dict[tuple[int, int], float] = {}
        self.accepted_lost: set[tuple[int, int]] = set()
        # (write id, offset) -> epoch; a duplicated Put is stored (and may be acknowledged) twice
        self.acked: dict[tuple[int, int], int] = {}
        self.ackers: dict[int, str] = {}  # epoch -> the broker that acknowledged in it
        self.acked_epoch_max = 0
        self.killed_master: tuple[float, int] | None = None  # (when, its epoch): a failover under way
        self.failovers: list[float] = []

    def on_kill(self, epoch: int, now: float) -> None:
        if self.killed_master is None and epoch == self.acked_epoch_max:
            self.killed_master = (now, epoch)

    def on_ack(self, broker: str, epoch: int, offset: int, write_id: int, now: float) -> None:
        if self.killed_master is not None and epoch > self.killed_master[1]:
            self.failovers.append(now - self.killed_master[0])
            self.killed_master = None
        other = self.ackers.setdefault(epoch, broker)
        if other != broker:
            raise SafetyViolation(f"{broker} and {other} both acknowledged writes in epoch {epoch}")
        if epoch < self.acked_epoch_max:
            raise SafetyViolation(f"{broker} acknowledged in epoch {epoch} after an acknowledgement in epoch "
                                  f"{self.acked_epoch_max}")  # fmt: skip
        self.acked_epoch_max = epoch
        assert (write_id, offset) not in self.acked
        self.acked[(write_id, offset)] = epoch
        if self.loss_span_max is not None:
            self.acked_at[(write_id, offset)] = now
            newer = [at for promoted, at in self.promoted_at.items() if promoted > epoch]
            if newer and not self.unclean:  # an operator's switchover: the old master's lease still held
                if now - min(newer) >= self.lease_seconds:
                    raise SafetyViolation(f"{broker} acknowledged in epoch {epoch} {now - min(newer):.3f} s after a "
                                          f"newer master took office, past its lease ({self.lease_seconds} s)")  # fmt: skip
                self.accepted_lost.add((write_id, offset))  # never in the newer master's history
                self.late_acks += 1

    def missing(self, log: list[int]) -> list[int]:
        return sorted(w for w, offset in self.acked
                      if (offset >= len(log) or log[offset] != w) and (w, offset) not in self.accepted_lost)  # fmt: skip

    def on_promote(self, broker: str, epoch: int, log: list[int], now: float = 0.0) -> None:
        self.promoted_at.setdefault(epoch, now)
        if self.unclean:
            return
        if self.loss_span_max is None:
            if lost := self.missing(log):
                raise SafetyViolation(f"{broker} became master in epoch {epoch} without acknowledged writes {lost[:5]}")
            return
        lost = [key for key in self.acked if key not in self.accepted_lost and (key[1] >= len(log) or log[key[1]] != key[0])]
        if lost:  # ASYNC_MASTER: what the new master had not received, within the lag bound
            times = [self.acked_at[key] for key in lost]
            self.loss_span_seen = max(self.loss_span_seen, max(times) - min(times))
            if max(times) - min(times) > self.loss_span_max:
                raise SafetyViolation(f"{broker} became master in epoch {epoch} without {len(lost)} acknowledged writes "
                                      f"acknowledged over {max(times) - min(times):.3f} s, more than the "
                                      f"{self.loss_span_max} s ASYNC_MASTER's lag bound allows")  # fmt: skip
            self.accepted_lost.update(lost)

    def on_truncate(self, broker: str, log: list[int], cut: int) -> None:
        if self.unclean:
            return
        gone = [w for offset, w in enumerate(log[cut:], cut) if (w, offset) in self.acked
                and (w, offset) not in self.accepted_lost]  # fmt: skip
        if gone:
            raise SafetyViolation(f"{broker} cut acknowledged writes {gone[:5]} (log cut to {cut})")

    def masters_at_once(self, masters: list[str], now: float, what: str) -> None:
        if len(masters) > 1:
            raise SafetyViolation(f"{masters} all act as master {what} at {now:.4f}")


# -- mutations: one core rule broken on purpose, to see the checker catch it ------------------------


class _ExpandAfterAccept(SyncStateSetTracker):
    """apache/rocketmq#5663: a pending expansion not waited for until the controller accepts it."""

    __slots__ = ()

    def counted_members(self) -> frozenset[int]:
        if self.proposal is not None and self.proposal.new_set > self.sync_state_set:
            return self.sync_state_set
        return super().counted_members()


class _ShrinkBeforeAccept(SyncStateSetTracker):
    """A pending shrink taken at once: the slave still in the controller's set stops being waited for."""

    __slots__ = ()

    def counted_members(self) -> frozenset[int]:
        if self.proposal is not None and self.proposal.new_set < self.sync_state_set:
            return self.proposal.new_set
        return super().counted_members()


class _AckWithoutLease(SyncStateSetTracker):
    __slots__ = ()

    def confirm_offset(self, now: float) -> int | None:
        return self.ack_watermark() if self.admit() else None


class _GrantWithoutHold(ElectionTracker):
    """Renew a lease to a master the leader decided lapsed, and to a new master at once."""

    __slots__ = ()

    def _may_grant(self, name, group, now) -> bool:
        return now >= self.leader_since


class _ElectOutsideSet(ElectionTracker):
    """Elect the best alive member whether in the SyncStateSet or not (unclean, unannounced)."""

    __slots__ = ()

    def _choose(self, name, group, now, *, exclude, heard=None):
        alive = [b for b in sorted(group.members) if b != exclude and self.alive(name, b, now)]
        return self._best(name, alive), True


class _ResumeAfterRestart(ElectionTracker):
    """Restarts ignored (the rule before a power loss was considered): a restarted master is
    named again in its own epoch with its lease, its shorter log serving the epoch whose writes
    it acknowledged."""

    __slots__ = ()

    def decide(self, state, now):
        return super().decide(_without_restarts(state), now)

    def answer(self, state, group, broker_id, now):
        return super().answer(_without_restarts(state), group, broker_id, now)


def _without_restarts(state: ControllerState) -> ControllerState:
    groups = {name: dataclasses.replace(group, restarted=frozenset()) for name, group in state.groups.items()}
    return ControllerState(groups, state.applied_index)


class _IgnoreLostTail(ElectionTracker):
    """A lost tail unheeded (the rule before it was reported): a SyncStateSet of one whose log
    ends before what it held when its epoch began is elected again on that log, the old master
    outside the set, which holds the tail, then cuts it at the handshake."""

    __slots__ = ()

    def lost_end(self, name, group, broker_id):
        return None


MUTATIONS = {"expand-after-accept": "tracker", "shrink-before-accept": "tracker", "ack-without-lease": "tracker",
             "grant-without-hold": "elect", "elect-outside-set": "elect", "resume-after-restart": "elect",
             "ignore-lost-tail": "elect"}  # fmt: skip
_MUTATED = {"expand-after-accept": _ExpandAfterAccept, "shrink-before-accept": _ShrinkBeforeAccept,
            "ack-without-lease": _AckWithoutLease, "grant-without-hold": _GrantWithoutHold,
            "elect-outside-set": _ElectOutsideSet, "resume-after-restart": _ResumeAfterRestart,
            "ignore-lost-tail": _IgnoreLostTail}  # fmt: skip
