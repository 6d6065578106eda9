"""The controller leader's soft state: which brokers are alive, when a master has lapsed, whom to
elect, and what a heartbeat's answer tells a broker (with or without a lease).

Theory of operation
-------------------
Only the controller leader runs this, beside the replicated ``ControllerState``. It is soft state:
a new leader starts with none (``became_leader(now)``) and counts every broker's silence from
that moment, so it never elects on what an older leader heard.

* ``heartbeat(group, broker_id, epoch, max_offset, now)`` records that a broker is alive, the
  last epoch of its log and where its log ends. A broker is **alive** while its last heartbeat
  (received since this leader took office) is at most ``broker_heartbeat_timeout_seconds`` old.
* ``decide(state, now)`` returns the ``Elect`` commands to propose: for a group whose master has
  **lapsed** (no heartbeat for the timeout, counted from ``max(last heartbeat, became leader)``),
  the alive member of the SyncStateSet with the highest ``(epoch, max_offset)``, ties to the
  lowest id; ``None`` ("no master") when no member of the set is alive, unless
  ``allow_unclean_election``, which then picks among all alive members (the reason says that
  acknowledged writes may be lost). A group with no master gets one as soon as a member it may
  elect is alive: any member before the first election (epoch 0: all stores are empty or the
  best of them wins, so the first to heartbeat is the first master), else a member of the set
  (or, unclean, any). A decision is made once per (group, epoch, master); it is proposed again
  after another heartbeat timeout if the state has not moved (a lost proposal). A stale decision
  is harmless: ``Elect`` carries the epoch it was made in.
* A master that **restarted** (in ``GroupState.restarted``: it registered again) may have
  lost unflushed bytes it acknowledged (a power loss; a process kill loses nothing, the page
  cache survives), so it is not named again in its epoch: once every member of the SyncStateSet
  has heartbeaten since this leader noticed the restart or lapsed (their log ends cannot grow while their master is down, and every one of them holds
  every acknowledged write), the member of the set so heard with the highest ``(epoch,
  max_offset)`` is elected into a new epoch -- the
  restarted master itself when its log is the longest (ties to the lowest id). A member that
  lost entries it acknowledged does not count until caught up (the DLedger side's rule): the
  restarted master never serves its shorter log in the epoch whose writes it acknowledged (until
  the election the answers name no master: a power loss may have cut the epoch's entry from its
  table too, and it must not open that epoch again at another offset). Any
  election from a set with a restarted member (a lapsed master, a group with no master) waits
  the same way and counts only the members heard since; and a restarted member is elected only
  when every member of the set was heard since (a lapsed one -- down, or cut off from the
  controllers -- may hold what it lost).
* A member that reports a **lost tail** (``heartbeat(..., lost_tail=X)``: its newest epoch starts
  at X, past its log's end; the epoch file is fsynced, the log's tail is not, so a power loss
  cut bytes it held when that epoch began) is never elected cleanly. When every member of the
  SyncStateSet reports one in the group's epoch (a set of one, typically: elected on a slave's
  log, then its power failed), the member outside the set whose log covers X is elected (its
  last epoch the group's or the one before, so a prefix of the same history; the best by
  ``(epoch, max_offset)``), once every member outside the set is alive and heard since the
  restart (one down may hold more); until then nobody (``_cover_lost_tail`` says why this loses
  nothing). A restarted set of one that never opened the group's epoch (its power failed before
  its promotion fsynced the epoch's entry) reports no lost tail: it counts as having lost up to
  the longest log of its history (``_unopened_cover``), and waits for every member to be heard.
* ``answer(state, group, broker_id, now)`` is what the leader tells a heartbeating broker: the
  master, its addresses, the epoch and the SyncStateSet, and ``lease``: whether the master may
  acknowledge for ``master_lease_seconds`` from when it sent this heartbeat. The lease is
  withheld (1) from a master this leader has decided lapsed (its ``Elect`` may be in flight: a
  renewed lease would let it acknowledge after its successor starts) or that restarted, and (2) from the first
  master of a newer epoch until ``master_lease_seconds`` after this leader last granted a lease
  to an older epoch's master (an operator's switchover elects while the old master's lease
  holds; an election on a lapse waited far longer than that already).

What the driver (the controller process) must add for the lease to mean "never two masters":
answer heartbeats only while holding the Raft leader lease (check-quorum), only after applying
an entry of its own term (every command an older leader committed is then applied, so no stale
``Elect`` lands after an answer), and with a Raft election timeout not below
``master_lease_seconds`` (a lease an older leader granted has run out when a new leader answers).
"""

from __future__ import annotations

import dataclasses
import math

from hasvc.state.controller.config import ControllerTimings
from hasvc.state.controller.state import ControllerState, Elect, GroupState


# ``lost_end`` while a member that may hold what a restarted set of one lost is not heard yet:
# beyond every log, so no member covers it and nobody is elected cleanly until it is heard.
LOST_END_UNKNOWN = 1 << 62


@dataclasses.dataclass(frozen=True, slots=True)
class Liveness:
    """The last heartbeat this leader received from one broker."""

    received_at: float  # this leader's clock
    epoch: int  # the last epoch in the broker's log
    max_offset: int  # where the broker's log ends
    lost_tail: int | None = None  # that epoch's start, past max_offset: a power loss cut what it held then


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """What the controller leader tells a broker about its group (docs/design/controller.md)."""

    group: str
    broker_id: int  # the broker asking
    master_id: int | None  # None: no master now
    master_client_address: str | None
    master_ha_address: str | None
    epoch: int  # the group's master epoch
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    lease: bool  # the asking broker is the master and may acknowledge for master_lease_seconds from its send


@dataclasses.dataclass(frozen=True, slots=True)
class _Decision:
    epoch: int
    master_id: int | None
    decided_at: float


class ElectionTracker:
    """The controller leader's view of the brokers (see the module's theory of operation)."""

    __slots__ = ("timings", "leader_since", "_liveness", "_decisions", "_grants", "_restarts")

    def __init__(self, timings: ControllerTimings) -> None:
        self.timings = timings.validate()
        self.leader_since = math.inf  # not a leader: decide() does nothing
        self._liveness: dict[tuple[str, int], Liveness] = {}
        self._decisions: dict[str, _Decision] = {}  # group -> the Elect last proposed for it
        self._grants: dict[str, tuple[int, float]] = {}  # group -> (epoch, when) of the last lease granted
        self._restarts: dict[str, tuple[tuple, float]] = {}  # group -> ((epoch, restarted), when this leader noticed them)

    def became_leader(self, now: float) -> None:
        """This controller leads from ``now``: forget everything an earlier term heard."""
        self.leader_since = now
        self._liveness.clear()
        self._decisions.clear()
        self._grants.clear()
        self._restarts.clear()

    def stepped_down(self) -> None:
        self.leader_since = math.inf
        self._liveness.clear()
        self._decisions.clear()
        self._grants.clear()
        self._restarts.clear()

    def heartbeat(self, group: str, broker_id: int, epoch: int, max_offset: int, now: float, *,
                  lost_tail: int | None = None) -> None:  # fmt: skip
        if lost_tail is not None and lost_tail <= max_offset:
            lost_tail = None  # the epoch starts within the log: nothing it held then is missing
        self._liveness[(group, broker_id)] = Liveness(now, epoch, max_offset, lost_tail)

    def lost_tail(self, group: str, broker_id: int) -> int | None:
        seen = self._liveness.get((group, broker_id))
        return None if seen is None else seen.lost_tail

    def liveness(self, group: str, broker_id: int) -> Liveness | None:
        return self._liveness.get((group, broker_id))

    def alive(self, group: str, broker_id: int, now: float) -> bool:
        seen = self._liveness.get((group, broker_id))
        return seen is not None and now - seen.received_at <= self.timings.broker_heartbeat_timeout_seconds

    def lapsed(self, group: str, broker_id: int, now: float) -> bool:
        """Silent for the heartbeat timeout, counted from when this leader took office at the earliest."""
        seen = self._liveness.get((group, broker_id))
        since = max(seen.received_at if seen is not None else -math.inf, self.leader_since)
        return now - since > self.timings.broker_heartbeat_timeout_seconds

    # -- elections -------------------------------------------------------------------------

    def decide(self, state: ControllerState, now: float) -> list[Elect]:
        """The elections to propose now (at most one per group)."""
        if now < self.leader_since:
            return []
        elections = []
        for name, group in sorted(state.groups.items()):
            decision = self._decisions.get(name)
            if decision is not None and (decision.epoch, decision.master_id) == (group.epoch, group.master_id):
                if now - decision.decided_at <= self.timings.broker_heartbeat_timeout_seconds:
                    continue  # proposed already; not yet applied (or lost: proposed again after this)
            elect = self._decide_group(name, group, now)
            if elect is not None:
                elect = self.stamped(elect)
                self._decisions[name] = _Decision(group.epoch, group.master_id, now)
                elections.append(elect)
        return elections

    def stamped(self, elect: Elect) -> Elect:
        """``elect`` with the new master's log end as last heard (``GroupState.master_end``)."""
        seen = self._liveness.get((elect.group, elect.new_master_id)) if elect.new_master_id is not None else None
        return dataclasses.replace(elect, master_end=seen.max_offset if seen is not None else None)

    def lost_end(self, name: str, group: GroupState, broker_id: int) -> int | None:
        """The offset this member's log no longer reaches though it held it when its group's
        epoch began, or None: the ``lost_tail`` it reports, or, for the set of one elected into
        the group's epoch that never opened it (its log's last epoch is older: the epoch file is
        fsynced before a master serves, so it acknowledged nothing in it) and restarted, the end
        of a longer log of its history (``_unopened_cover``: a power loss before its promotion).
        ``master_end``, the end it was elected with, is not the measure: the old master may
        acknowledge past it (its lease), and a heartbeat from before a slave's truncation can
        place it above anything any member holds (a group left without a master for good)."""
        seen = self._liveness.get((name, broker_id))
        if seen is None:
            return None
        ends = [seen.lost_tail] if seen.lost_tail is not None else []
        if group.sync_state_set == {broker_id} and broker_id in group.restarted and seen.epoch < group.epoch:
            ends.append(self._unopened_cover(name, group, broker_id, seen))
        return max((end for end in ends if end is not None), default=None)

    def _unopened_cover(self, name: str, group: GroupState, broker_id: int, seen: Liveness) -> int | None:
        """For a restarted set of one that never opened the group's epoch: the longest log end of
        a member of the same history heard since the restart, when it is longer than this one's;
        ``LOST_END_UNKNOWN`` while a member is not heard since; None when none is longer.

        ``master_end`` is the end heard when the ``Elect`` was made, and the old master may
        acknowledge after that (its lease holds through a switchover; a heartbeat is a moment old)
        writes this member held as its slave and lost with its power before it heard of its
        election and fsynced the epoch's entry. Nothing was acknowledged in the unopened epoch, so
        every acknowledged write is in the old master's log, and in every member that followed
        it as far. The newest epoch any member's log holds below the group's (``opened``) is the
        last one whose master served: nothing was acknowledged in the epochs after it, and its
        master held every write acknowledged before. A member whose last epoch is that one
        followed that master (or is it), so it holds a prefix of that log: one longer than this
        member may hold what this one lost (or unacknowledged writes only: electing it then costs
        nothing). A member with an older last epoch and a longer log may hold a branch that
        epoch cut: it does not count. One not heard since the restart may hold more: wait for it
        (no master; an operator's unclean election may still name one)."""
        noticed = self._restarts.get(name)
        if noticed is None or noticed[0] != (group.epoch, group.restarted):
            return LOST_END_UNKNOWN  # this restart not noticed yet (``_heard_since_restart`` notes it)
        others = []
        for other in sorted(group.members.keys() - {broker_id}):
            heard = self._liveness.get((name, other))
            if heard is None or heard.received_at < noticed[1]:
                return LOST_END_UNKNOWN
            others.append(heard)
        opened = self._opened_epoch(name, group)
        longest = max([seen.max_offset, *(heard.max_offset for heard in others
                                          if heard.epoch == opened and heard.lost_tail is None)])  # fmt: skip
        return longest if longest > seen.max_offset else None

    def _decide_group(self, name: str, group: GroupState, now: float) -> Elect | None:
        if group.master_id is not None and not self.lapsed(name, group.master_id, now):
            return self._decide_restarted(name, group, now) if group.master_restarted else None
        heard = None  # with a restarted member in the set: the members heard since (None: all alive count)
        if group.restarted:
            heard = self._heard_since_restart(name, group, now)
            if heard is None:
                return None
        if heard is not None:  # before an unclean choice: this one is proven to lose nothing
            covered = self._cover_lost_tail(name, group, heard, now)
            if covered is not None:
                return covered
        if group.master_id is not None:
            chosen, clean = self._choose(name, group, now, exclude=group.master_id, heard=heard)
            if chosen is None:
                return Elect(name, None, group.epoch, f"master {group.master_id} lapsed; no member of the "
                             f"SyncStateSet {sorted(group.sync_state_set)} is alive")  # fmt: skip
            return Elect(name, chosen, group.epoch, f"master {group.master_id} lapsed" + _unclean_note(clean))
        chosen, clean = self._choose(name, group, now, exclude=None, heard=heard)
        if chosen is None:
            return None
        why = "first master of the group" if group.epoch == 0 else "a member the group may elect is back"
        return Elect(name, chosen, group.epoch, why + _unclean_note(clean))

    def _decide_restarted(self, name: str, group: GroupState, now: float) -> Elect | None:
        """A restarted master that is alive: the longest log of the SyncStateSet heard since (the
        master included) into a new epoch."""
        heard = self._heard_since_restart(name, group, now)
        if heard is None or group.master_id not in heard:
            return None  # wait; or the master lapsed meanwhile: the lapse rule elects another
        chosen = self._safe_after_restart(name, group, heard, [b for b in heard if self.alive(name, b, now)])
        if chosen is None:
            return self._cover_lost_tail(name, group, heard, now)
        return Elect(name, chosen, group.epoch, f"master {group.master_id} restarted (it may have lost unflushed "
                     f"writes): broker {chosen} has the longest log of the SyncStateSet {sorted(group.sync_state_set)}")  # fmt: skip

    def _heard_since_restart(self, name: str, group: GroupState, now: float) -> list[int] | None:
        """The members of the set heard since this leader noticed the group's latest restart; None
        while one is neither heard since nor lapsed (its log end from before may be short of what
        it holds; a restarted one's, long of what it kept)."""
        key = (group.epoch, group.restarted)
        noticed = self._restarts.get(name)
        if noticed is None or noticed[0] != key:
            noticed = self._restarts[name] = (key, now)
        heard = []
        for broker_id in sorted(group.sync_state_set):
            seen = self._liveness.get((name, broker_id))
            if seen is not None and seen.received_at >= noticed[1]:
                heard.append(broker_id)
            elif not self.lapsed(name, broker_id, now):
                return None
        return heard

    def _safe_after_restart(self, name: str, group: GroupState, heard: list[int], candidates: list[int]) -> int | None:
        """The best of ``candidates``, unless it restarted and a member of the set not heard since,
        or heard with a longer log (down since), may hold what it lost: None."""
        chosen = self._best(name, [b for b in candidates if self.lost_end(name, group, b) is None])
        if chosen is None or chosen not in group.restarted:
            return chosen  # never restarted since it entered the set: it holds every acknowledged write
        if len(heard) < len(group.sync_state_set):
            return None
        seen = self._liveness[(name, chosen)]
        longest = max((self._liveness[(name, b)].epoch, self._liveness[(name, b)].max_offset) for b in heard)
        return chosen if (seen.epoch, seen.max_offset) >= longest else None

    def _choose(self, name: str, group: GroupState, now: float, *, exclude: int | None,
                heard: list[int] | None = None) -> tuple[int | None, bool]:  # fmt: skip
        """(broker id, clean) of the best alive candidate; (None, True) when none may be elected.
        ``heard``: the set's members that count (a restart in the set: those heard since)."""
        alive = [broker_id for broker_id in sorted(group.members)
                 if broker_id != exclude and self.alive(name, broker_id, now)]  # fmt: skip
        if group.epoch == 0:
            return self._best(name, alive), True  # never elected: nothing was ever acknowledged
        in_set = [b for b in alive if b in group.sync_state_set and (heard is None or b in heard)
                  and self.lost_end(name, group, b) is None]  # fmt: skip
        if in_set:
            if heard is not None:
                return self._safe_after_restart(name, group, heard, in_set), True
            return self._best(name, in_set), True
        if self.timings.allow_unclean_election and alive:
            whole = [b for b in alive if self.lost_end(name, group, b) is None]  # a lost tail last: its epoch ranks it high
            return self._best(name, whole or alive), False
        return None, True

    def _opened_epoch(self, name: str, group: GroupState) -> int:
        """The newest last epoch a member of ``group`` reports below the group's (0: none): the
        last epoch whose master served (``_unopened_cover``)."""
        seen = (self._liveness.get((name, b)) for b in group.members)
        return max((s.epoch for s in seen if s is not None and s.epoch < group.epoch), default=0)

    def _cover_lost_tail(self, name: str, group: GroupState, heard: list[int], now: float) -> Elect | None:
        """Every member of the SyncStateSet lost the tail of the group's epoch (its log ends
        before that epoch's start X, the epoch file survived: a power loss): the member outside
        the set whose log covers X, when every member of the group is heard since the restart.

        Why that is safe: the set's member took office at X holding every write acknowledged
        before (it was elected from the previous epoch's set), so every one of them is in
        ``[0, X)`` of that history; a member whose log's last epoch is the previous one (it
        followed that epoch's master) or this one (it followed this master) holds a prefix of the
        same history, so one that reaches X holds all of them. Writes acknowledged in this epoch
        past X were held by the members in the set at the time, which followed this master and
        so have this epoch: the best by ``(epoch, max_offset)`` is the longest of them. Every
        member must be heard (one down may hold more); None while one is not: the group then
        stays without a master (an operator's unclean election may still name one, a loss)."""
        if len(heard) < len(group.sync_state_set) or group.epoch == 0:
            return None
        tails = {b: self.lost_end(name, group, b) for b in heard}
        if any(tail is None for tail in tails.values()):
            return None  # a member of the set holds all it held when the epoch began
        noticed = self._restarts[name][1]
        for broker_id in sorted(group.members.keys() - group.sync_state_set):
            seen = self._liveness.get((name, broker_id))
            if seen is None or seen.received_at < noticed or not self.alive(name, broker_id, now):
                return None
        covers = max(tails.values())
        # Histories a prefix of the set's: the epoch before the group's (whose master the set's
        # member followed), the group's (its own), and the one a member that never opened the
        # group's epoch reports (the one it followed, when an epoch between was never opened),
        # and the newest one any member's log holds below the group's, whose master served last
        # (``_unopened_cover``: a set of one that never opened the group's epoch).
        epochs = {group.epoch - 1, group.epoch} | {self._liveness[(name, b)].epoch for b in heard}
        epochs.add(self._opened_epoch(name, group))
        candidates = [b for b in sorted(group.members) if b not in group.sync_state_set and self.lost_tail(name, b) is None
                      and self._liveness[(name, b)].epoch in epochs
                      and self._liveness[(name, b)].max_offset >= covers]  # fmt: skip
        chosen = self._best(name, candidates)
        if chosen is None:
            return None
        lost = ", ".join(f"broker {b} ends at {self._liveness[(name, b)].max_offset}" for b in heard)
        return Elect(name, chosen, group.epoch, f"the SyncStateSet {sorted(group.sync_state_set)} lost the tail it held "
                     f"when epoch {group.epoch} began, up to {covers} ({lost}: a power loss); broker {chosen}'s log "
                     f"covers it (outside the set, it holds every acknowledged write)")  # fmt: skip

    def _best(self, name: str, candidates: list[int]) -> int | None:
        """Highest (epoch, max_offset), ties to the lowest id (RocketMQ's DefaultElectPolicy order)."""
        best = None
        for broker_id in candidates:  # ascending ids: a later one wins only when strictly better
            seen = self._liveness[(name, broker_id)]
            if best is None or (seen.epoch, seen.max_offset) > best[0]:
                best = ((seen.epoch, seen.max_offset), broker_id)
        return None if best is None else best[1]

    # -- answers ---------------------------------------------------------------------------

    def answer(self, state: ControllerState, group: str, broker_id: int, now: float) -> HeartbeatAnswer:
        """What to tell ``broker_id`` of ``group`` (a member: the driver checks that first)."""
        current = state.groups[group]
        if current.master_restarted:  # named by nobody until elected again: it must not reopen its epoch
            current = dataclasses.replace(current, master_id=None)
        master = current.members.get(current.master_id) if current.master_id is not None else None
        lease = current.master_id == broker_id and self._may_grant(group, current, now)
        if lease:
            self._grants[group] = (current.epoch, now)
        return HeartbeatAnswer(group, broker_id, current.master_id, master.client_address if master else None,
                               master.ha_address if master else None, current.epoch, current.sync_state_set,
                               current.sync_state_set_epoch, lease)  # fmt: skip

    def _may_grant(self, name: str, group: GroupState, now: float) -> bool:
        if now < self.leader_since or group.master_restarted:
            return False
        decision = self._decisions.get(name)
        if decision is not None and (decision.epoch, decision.master_id) == (group.epoch, group.master_id):
            return False  # decided lapsed: its successor may be elected any moment
        granted = self._grants.get(name)
        if granted is not None and granted[0] < group.epoch:
            return now >= granted[1] + self.timings.master_lease_seconds  # the older master's lease runs out first
        return True


def _unclean_note(clean: bool) -> str:
    return "" if clean else "; UNCLEAN: elected outside the SyncStateSet, acknowledged writes may be lost"
