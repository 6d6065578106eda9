"""The pure Raft core of one DLedger member: events in, a ``Ready`` out (etcd-raft's RawNode shape).

Theory of operation
-------------------
``RaftNode`` owns no thread, socket, clock or file. Its driver feeds it events and carries out
what it says:

    tick(now)                     timers: heartbeats, elections, re-pushes, proposal timeouts
    step(message, now)            a message from a peer (``hasvc.state.raft.messages``)
    propose(bodies, now)          leader: append entries -> ``Proposed`` or ``Refused`` (pushed to
                                  the followers when the Ready is taken, or by the next event:
                                  proposals made before one Ready share their pushes)
    persisted(flushed_index, now) the store made entries up to here durable
    transfer_leadership(to, now)  hand leadership to a caught-up follower -> ``Refused`` or None
    peer_unreachable(peer, now)   the connection from ``peer`` ended (EOF/reset): if it is the
                                  leader, stop waiting for its heartbeats
    ready()                       the work accumulated since the last call (a ``Ready``)
    deadline()                    when tick() must be called next (if nothing else happens first)

The order contract (the driver's side, asserted where the core can see it):

1. ``ready.hard_state``, when set, is saved *and fsynced* first: a vote or a new term is never
   announced before it would survive a crash (at most one vote per term, terms never go back).
2. Then ``log.reset(ready.reset)`` (durable when it returns: a RESET's answer says the log is
   empty at its index), ``log.truncate(after_index=ready.truncate_after)`` and
   ``log.append(ready.entries)``, before the driver calls into the core again (the core reads the
   store; ``LogView.check_applied``).
3. Then ``ready.messages`` are sent. A follower acknowledges an index only once it is in its log
   (step 2 precedes step 3), and with ``flush_sync`` only once it is flushed: its acknowledgements
   carry ``min(matched, flushed)`` and ``persisted()`` sends the ones a flush released. A leader
   likewise counts itself for the quorum with its last index, or with ``flush_sync`` its flushed one.
4. ``committed_index``, role changes, finished proposals and aborted transfers are for the state
   machine and the clients. ``committed_index`` is the driver's to checkpoint when it likes
   (DLedger: every 3 s); it is only a hint after a restart.

The core is split by concern, as etcd-raft splits ``raft.go`` from ``tracker/`` and ``quorum/``:

    node.py         ``RaftNode``: the events above, the Ready, timers, proposals, invariants
    election.py     roles, campaigns (pre-vote), votes, the leader lease, leadership transfer
    replication.py  the follower's side of pushes and heartbeats, the leader's pushes; RESET
    tracker.py      the leader's ``Progress`` per follower: COMPARE/TRUNCATE/APPEND/RESET, in flight
    quorum.py       the majority counts: the commit rule, votes won, check-quorum

``RaftNode`` is one object: ``Election`` and ``Replication`` are parts of its class written in
modules of their own (each method works on the node's state, declared in ``__init__``), while
``ProgressMap`` and the ``quorum`` functions are pure and tested apart.

Lost entries ("Protocol-Aware Recovery", Alagappan et al., FAST 2018). A member's log can come
back shorter than what it acknowledged: recovery cut a damaged entry and everything after it, or
(``--flush async``) a crash took unflushed entries it had acknowledged. Two things then matter.

* The leader's view. A response whose ``end_index`` is below the member's match index (an
  OUT_OF_ORDER from the member's end, or any other) means it lost entries (or is a stale
  response: lowering is safe either way): the match index goes down to that end -- the entries
  up to it are a prefix of what it acknowledged in this term, so they still match -- and the
  progress goes back to COMPARE from there, as etcd's rejected ``MsgAppResp`` with a hint does.
  A leader never counts a member for more than it last said it holds. A restarted member whose
  leader still believes it holds more would not hear an APPEND while nothing new is proposed:
  a heartbeat whose commit index (capped at the leader's match index for it) passes its log's
  end makes it answer OUT_OF_ORDER with its end at once. OUT_OF_ORDER is answered once per end
  index, and again after each heartbeat (an answer lost on the way is not the end of it).
* Its vote. A committed entry survives because every quorum that could elect a leader holds a
  member that has it and votes only for logs at least as up to date as its own. A member that
  lost entries would break that. Its store records a catch-up mark in the hard state, durably
  and before recovery cuts anything: the (term, index) its log ended at before (the term may
  be an upper bound: the saved term). While its flushed log is below the mark, the member votes
  (and pre-votes) as if its log still ended at the mark -- exactly the votes it would have
  given before the loss, which standard Raft shows safe -- and stands for no election (its own
  log would be the one a vote checks), not even when a leader hands over. Once its flushed log
  is at or above the mark (a leader caught it up: its entries up to there match a leader's,
  so it again holds every committed entry it acknowledged), the mark is cleared in the next
  hard state. Acknowledgements are not held back: a member acknowledges only entries its log
  holds and that match the leader's, and the leader counts no more than that (above); the
  mark is what keeps a quorum of voters from electing a log that lacks a committed entry. The
  cost is availability, never safety: with the member's healthy peers down, the rest of the
  group may not elect a leader until one returns.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
from collections.abc import Sequence

from hasvc.state.raft import quorum
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.disk_room import disk_step_down_target
from hasvc.state.raft.election import NO_OP, Campaign, Election, Transfer
from hasvc.state.raft.log_view import LogView
from hasvc.state.raft.messages import (
    Heartbeat,
    HeartbeatResponse,
    Message,
    Push,
    PushResponse,
    PushResult,
    PushType,
    ResetPush,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from hasvc.state.raft.ready import (
    ProposalDone,
    ProposalStatus,
    Proposed,
    RaftStatus,
    Ready,
    RefusalStatus,
    Refused,
    Role,
    RoleChange,
    TransferAborted,
)
from hasvc.state.raft.replication import Replication
from hasvc.state.raft.storage import EntryLog, HardState
from hasvc.state.raft.tracker import Progress, ProgressMap

__all__ = ["NO_OP", "Progress", "RaftNode"]  # Progress and NO_OP: where they were first defined


@dataclasses.dataclass(slots=True)
class Pending:
    first_index: int
    last_index: int
    term: int
    deadline: float


class RaftNode(Election, Replication):
    """One member's Raft core (see the module): events in, a ``Ready`` out. Its election and
    replication handling are the ``Election`` and ``Replication`` parts of this class."""

    def __init__(
        self, *, self_id: str, members: Sequence[str], log: EntryLog, config: RaftConfig, rng: random.Random, now: float
    ) -> None:
        config.validate()
        if self_id not in members:
            raise ValueError(f"self id {self_id!r} is not among the members {list(members)}")
        if len(set(members)) != len(members):
            raise ValueError(f"members repeat an id: {list(members)}")
        self.self_id = self_id
        self.members = tuple(members)
        self.peers = tuple(m for m in members if m != self_id)
        self.quorum = quorum.quorum_size(len(self.members))  # DLedger isQuorum: n >= peers/2 + 1 (peers incl. self)
        self.config = config
        self._rng = rng
        self._log = LogView(log)
        state = log.load_hard_state()
        self.term = state.term
        self.voted_for = state.voted_for
        # Entries below the first index were deleted by retention or a reset, both of which take
        # committed entries only: they are committed, whatever the (stale) saved hint says.
        self.committed_index = max(-1, min(state.committed_index, self._log.last_index()), self._log.first_index() - 1)
        self.flushed_index = min(log.flushed_index(), self._log.last_index())
        # (term, index) the flushed log must reach before this member votes as itself (see "Lost entries").
        self._catch_up: tuple[int, int] | None = None
        if state.catch_up_index >= 0:
            self._catch_up = (state.catch_up_term, state.catch_up_index)
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self._campaign: Campaign | None = None
        self._progress = ProgressMap()  # the leader's view of each follower (empty unless leading)
        self._pending: collections.deque[Pending] = collections.deque()
        self._pending_count = 0  # entries in self._pending
        self._transfer: Transfer | None = None
        self._matched_index = -1  # follower: every entry up to here equals the current leader's
        self._acked_index = -1  # follower: the highest ack_index sent to the current leader
        self._gap_reported_end = -2  # follower: OUT_OF_ORDER answered once per end index (no storms)
        self._retain_from_index = -1  # follower: the highest retention floor a leader announced
        # Set by the driver before each event: this member cannot append now (a full disk). A
        # follower says so in its heartbeat responses; a leader hands over to a member with room.
        self.disk_full = False
        self._disk_full_since: float | None = None  # leader: when a tick first saw disk_full (None: room)
        self._leader_contact_at = -math.inf
        self._election_deadline = now + self._election_timeout()
        self._heartbeat_at = math.inf
        self._became_leader_at = -math.inf
        # Outputs, drained by ready().
        self._messages: list[Message] = []
        self._role_changes: list[RoleChange] = []
        self._proposals_done: list[ProposalDone] = []
        self._transfers_aborted: list[TransferAborted] = []
        self._refused_runs: list[str] = []
        self._push_due_at: float | None = None  # leader: proposals not pushed yet, the last one's time
        self._hard_state_changed = False
        self._committed_reported = self.committed_index
        # Invariant floors.
        self._term_floor = self.term
        self._committed_floor = self.committed_index
        self._maybe_caught_up()
        self._check_invariants()

    # ------------------------------------------------------------------ events

    def tick(self, now: float) -> None:
        self._log.check_applied()
        if self.role is Role.LEADER:
            self._tick_leader(now)
        elif now >= self._election_deadline:
            if self._catch_up is None:
                self._campaign_start(now, pre_vote=self.config.pre_vote)
            else:  # lost entries: it stands for no election until a leader caught it up
                self._election_deadline = now + self._election_timeout()
        self._after_event(now)

    def step(self, message: Message, now: float) -> None:
        """Handle one message addressed to this member. ValueError: a message that no member could send."""
        self._log.check_applied()
        if message.target != self.self_id:
            raise ValueError(f"message for {message.target!r} delivered to {self.self_id!r}")
        if isinstance(message, VoteRequest):
            self._on_vote_request(message, now)
        else:
            if message.source not in self.peers:
                raise ValueError(f"{type(message).__name__} from {message.source!r}, not a peer of {self.self_id!r}")
            handler = self._HANDLERS[type(message)]
            handler(self, message, now)
        self._after_event(now)

    def propose(self, bodies: Sequence[bytes], now: float) -> Proposed | Refused:
        """Append `bodies` (``bytes``, kept as they are: not copied) as entries of this leader's
        term; their outcome comes later as a ProposalDone."""
        self._log.check_applied()
        if not bodies:
            raise ValueError("propose() needs at least one body")
        if self.role is not Role.LEADER:
            return Refused(RefusalStatus.NOT_LEADER, self.leader_id, f"{self.self_id} is {self.role.value}")
        if self._transfer is not None:
            return Refused(RefusalStatus.LEADER_TRANSFERRING, None, f"handing over to {self._transfer.target}")
        if self._pending_count >= self.config.pending_max:
            return Refused(RefusalStatus.LEADER_PENDING_FULL, self.self_id,
                           f"{self._pending_count} proposals wait for a quorum (pending_max {self.config.pending_max})")  # fmt: skip
        first = self._log.last_index() + 1
        assert not self._pending or self._pending[-1].last_index + 1 == first, ("proposals not consecutive", first)
        self._log.append_proposal(first, self.term, bodies)
        last = first + len(bodies) - 1
        self._pending.append(Pending(first, last, self.term, now + self.config.quorum_ack_timeout_seconds))
        self._pending_count += len(bodies)
        # Pushed when the Ready is taken (or by the next event): proposals made before one Ready
        # go to each follower in one push, not one each.
        self._push_due_at = now
        self._after_event(now, push=False)
        return Proposed(first, last, self.term)

    def persisted(self, flushed_index: int, now: float) -> None:
        """The store's flushed_index() after a flush (entries up to there survive a crash)."""
        self._log.check_applied()
        self.flushed_index = max(self.flushed_index, min(flushed_index, self._log.stored_last_index()))
        if self.role is Role.FOLLOWER and self.leader_id is not None and self._ack_index() > self._acked_index:
            self._send_push_response(self.leader_id, PushType.APPEND, PushResult.SUCCESS, -1)
        self._after_event(now)

    def transfer_leadership(self, target: str, now: float) -> Refused | None:
        """Start handing leadership to `target` (TimeoutNow once it has every entry); None: started."""
        self._log.check_applied()
        refusal = self._transfer_refusal(target, now)
        if refusal is None:
            self._transfer = Transfer(target, now + self.config.election_timeout_min_seconds)
        self._after_event(now)
        return refusal

    def peer_unreachable(self, peer: str, now: float) -> None:
        """The connection from ``peer`` ended: EOF or a reset, which a process's death or shutdown
        gives its peers at once (a partition gives nothing: heartbeats time out as before). If
        ``peer`` is this follower's leader, its lease ends now and the election starts after a
        part of ``leader_lost_election_delay_max_seconds``: every follower of a dead leader sees
        this together, so the pre-vote finds a quorum without its leases. A follower whose
        connection alone broke is refused by the others' leases; the leader stays.

        The followers start one after the other, not at random moments: the upper half of the
        delay is cut into a slot per surviving member, in the order of their ids, and each starts
        in the first quarter of its slot. Two followers drawing moments a millisecond apart both
        passed the pre-vote, voted for themselves and split the vote, costing a whole election
        timeout (drill: 3 rounds in 50 at 1.3-1.7 s instead of ~0.35 s). In order, the first
        one's vote request reaches the others before their slots; if its log is behind, their
        pre-vote refusal leaves their own slots unchanged."""
        self._log.check_applied()
        delay_max = self.config.leader_lost_election_delay_max_seconds
        if (
            delay_max > 0 and self.config.pre_vote and self.config.check_quorum
            and self.role is Role.FOLLOWER and peer == self.leader_id
        ):  # fmt: skip
            self._leader_contact_at = -math.inf
            survivors = sorted(member for member in self.members if member != peer)
            slot = delay_max / 2 / len(survivors)
            start = delay_max / 2 + survivors.index(self.self_id) * slot
            self._election_deadline = min(self._election_deadline, now + self._rng.uniform(start, start + slot / 4))
        self._after_event(now)

    def ready(self) -> Ready:
        if self._push_due_at is not None:  # proposals since the last push (see ``propose``)
            now, self._push_due_at = self._push_due_at, None
            if self.role is Role.LEADER:
                self._push_all(now)
        reset, truncate_after, entries, runs = self._log.drain()
        committed = None
        if self.committed_index != self._committed_reported:
            committed = self._committed_reported = self.committed_index
        hard_state = None
        if self._hard_state_changed:
            mark = self._catch_up or (-1, -1)
            hard_state = HardState(self.term, self.voted_for, self.committed_index, mark[0], mark[1])
            self._hard_state_changed = False
        ready = Ready(hard_state=hard_state, reset=reset, truncate_after=truncate_after, entries=entries, runs=runs,
                      messages=tuple(self._messages), committed_index=committed,
                      role_changes=tuple(self._role_changes), proposals=tuple(self._proposals_done),
                      transfers_aborted=tuple(self._transfers_aborted), refused_runs=tuple(self._refused_runs))  # fmt: skip
        self._refused_runs.clear()
        self._messages.clear()
        self._role_changes.clear()
        self._proposals_done.clear()
        self._transfers_aborted.clear()
        return ready

    def deadline(self) -> float:
        """The time by which tick() must be called (earlier calls are harmless)."""
        if self.role is not Role.LEADER:
            return self._election_deadline
        times = [self._heartbeat_at]
        if self._pending:
            times.append(self._pending[0].deadline)
        if self._transfer is not None:
            times.append(self._transfer.deadline)
        times.append(self._progress.next_push_timeout(self.config.push_timeout_seconds))
        return min(times)

    # ------------------------------------------------------------------ read-only views

    @property
    def last_index(self) -> int:
        return self._log.last_index()

    @property
    def last_term(self) -> int:
        return self._log.last_term()

    @property
    def pending_count(self) -> int:
        return self._pending_count

    def status(self, now: float) -> RaftStatus:
        last = self._log.last_index()
        return RaftStatus(self.self_id, self.role, self.term, self.leader_id, last, self.committed_index,
                          self.flushed_index, self._pending_count, self._progress.statuses(last, now),
                          -1 if self._catch_up is None else self._catch_up[1])  # fmt: skip

    def retention_floor(self) -> int:
        """The lowest index some member may still need from this member's log: retention keeps
        every entry at or above it (-1: keep everything). A leader's is its committed index and
        every peer's match index, whatever their last contact: a member that is down holds
        retention back until it returns (above the disk ratio a leader leaves out only the members
        whose match it does not know: ``hasvc.state.raft.retention``; a member it strands is RESET
        to the leader's first index). Entries below it are committed and
        held by every member, which never truncates at or below its committed index, so no
        member needs them again. A follower keeps from the highest floor a leader announced
        (heartbeats), at most its own committed index: it may lead later, and then must still
        hold what its followers need. With ``flush_sync`` the leader's own part is what it has
        flushed, too: a quorum of followers can commit entries the leader has not flushed yet,
        and a power loss would take them from its log; had the others deleted them meanwhile,
        the leader would come back to find them gone everywhere (raft_sim seed 722485)."""
        if self.role is Role.LEADER:
            own = min(self.committed_index, self.flushed_index) if self.config.flush_sync else self.committed_index
            return self._progress.lowest_match(own)
        return min(self._retain_from_index, self.committed_index)

    def match_index(self, peer: str) -> int:
        """Leader: the last index `peer` acknowledged (-1 when unknown)."""
        return self._progress.match_index(peer)

    def last_contact_at(self, peer: str) -> float:
        return self._progress.last_contact_at(peer)

    # ------------------------------------------------------------------ leader timers and commit

    def _tick_leader(self, now: float) -> None:
        if now >= self._heartbeat_at:
            self._heartbeat_at = now + self.config.heartbeat_interval_seconds
            for peer, progress in self._progress.items():
                # Capped at what the follower acknowledged in this term: it may commit that much
                # even when it restarted and no longer knows where its log matches ours (etcd does so).
                commit = min(self.committed_index, progress.match_index)
                self._messages.append(Heartbeat(self.self_id, peer, self.term, commit, self.retention_floor()))
            if self._lost_quorum(now):
                self._become_follower(self.term, None, now)
                return
            self._maybe_transfer_to_preferred(now)
            self._maybe_step_down_for_disk(now)
        while self._pending and self._pending[0].deadline <= now:
            pending = self._pending.popleft()
            self._pending_count -= pending.last_index - pending.first_index + 1
            self._proposals_done.append(ProposalDone(pending.first_index, pending.last_index, pending.term,
                                                     ProposalStatus.WAIT_QUORUM_ACK_TIMEOUT))  # fmt: skip
        if self._transfer is not None and now >= self._transfer.deadline:
            self._transfers_aborted.append(TransferAborted(self._transfer.target))
            self._transfer = None

    def _maybe_step_down_for_disk(self, now: float) -> None:
        """A leader that cannot append hands leadership to a follower that said it has room
        (``disk_room.disk_step_down_target``: never to a full one, never twice in a cascade)."""
        if not self.disk_full:
            self._disk_full_since = None
            return
        if self._disk_full_since is None:
            self._disk_full_since = now
        followers = {peer: (p.disk_full, p.match_index, now - p.disk_said_at) for peer, p in self._progress.items()}
        target = disk_step_down_target(full_seconds=now - self._disk_full_since, led_seconds=now - self._became_leader_at,
                                       hold_seconds=self.config.election_timeout_max_seconds,
                                       transferring=self._transfer is not None, followers=followers,
                                       contact_window_seconds=self.config.election_timeout_min_seconds)  # fmt: skip
        if target is not None and self._transfer_refusal(target, now) is None:
            self._transfer = Transfer(target, now + self.config.election_timeout_min_seconds)

    def _maybe_commit(self, last: int) -> None:
        """Commit what a quorum holds (``last``: the log's last index)."""
        own = self.flushed_index if self.config.flush_sync else last
        quorum_index = self._progress.quorum_index(own, self.quorum)
        # The Raft paper's rule (DLedger has none): count only entries of the leader's own term.
        self.committed_index = quorum.leader_commit(self.committed_index, quorum_index, term=self.term,
                                                    term_at=self._log.term_at)  # fmt: skip
        while self._pending and self._pending[0].last_index <= self.committed_index:
            pending = self._pending.popleft()
            self._pending_count -= pending.last_index - pending.first_index + 1
            self._proposals_done.append(
                ProposalDone(pending.first_index, pending.last_index, pending.term, ProposalStatus.SUCCESS)
            )

    # ------------------------------------------------------------------ bookkeeping

    def _maybe_caught_up(self) -> None:
        """Clear the catch-up mark once the flushed log reached it (see "Lost entries")."""
        if self._catch_up is None:
            return
        flushed = self.flushed_index
        if flushed >= self._log.first_index():
            term = self._log.term_at(flushed)
        elif flushed == self._log.first_index() - 1:
            term = self._log.term_before_first() if flushed >= 0 else -1
        else:
            return
        if (term, flushed) >= self._catch_up:
            self._catch_up = None
            self._hard_state_changed = True

    def _after_event(self, now: float, *, push: bool = True) -> None:
        """What follows every event: a leader pushes (``push``: not after a proposal, whose
        entries go when the Ready is taken), commits and hands leadership over; invariants."""
        if self._catch_up is not None:
            self._maybe_caught_up()
        if self.role is Role.LEADER:
            if push:
                _, last = self._push_all(now)
            else:
                last = self._log.last_index()
            self._maybe_commit(last)
            if self._transfer is not None:
                self._send_timeout_now(last)
            self._check_invariants(last)
        else:
            self._check_invariants()

    def _check_invariants(self, last: int | None = None) -> None:
        """The core's invariants; ``last``: the log's last index when the caller has it."""
        assert self.term >= self._term_floor, ("term went back", self.term, self._term_floor)
        self._term_floor = self.term
        assert self.committed_index >= self._committed_floor, ("commit went back", self.committed_index)
        self._committed_floor = self.committed_index
        if last is None:
            last = self._log.last_index()
        assert self.committed_index <= last, ("commit beyond the log", self.committed_index, last)
        assert self._log.last_term() <= self.term, ("log term above current term", self._log.last_term(), self.term)
        assert self.flushed_index <= last, ("flushed beyond the log", self.flushed_index, last)
        if self.role is Role.LEADER:
            assert self.leader_id == self.self_id and self.voted_for == self.self_id
            # Proposals are consecutive (``propose`` asserts it), so their count is their span.
            pending = self._pending
            span = pending[-1].last_index - pending[0].first_index + 1 if pending else 0
            assert self._pending_count == span, ("pending count", self._pending_count, span)
            for progress in self._progress.values():
                assert progress.match_index <= last, ("match beyond the log", progress.match_index, last)
        else:
            assert not self._pending and not self._progress and self._transfer is None
            assert self._matched_index <= last
        assert (self.role is Role.CANDIDATE) == (self._campaign is not None)

    # step()'s handler for each message but a VoteRequest (from any member): plain functions, called with self.
    _HANDLERS = {
        VoteResponse: Election._on_vote_response,
        Heartbeat: Replication._on_heartbeat,
        HeartbeatResponse: Replication._on_heartbeat_response,
        Push: Replication._on_push,
        ResetPush: Replication._on_reset_push,
        PushResponse: Replication._on_push_response,
        TimeoutNow: Election._on_timeout_now,
    }
