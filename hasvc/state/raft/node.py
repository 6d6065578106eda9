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

Election (rocketmq-notes §8.5) keeps DLedger's vote checks in DLedger's order and adds what DLedger
0.3 lacks: pre-vote (a candidate first asks whether it *could* win, without anyone changing term),
a leader lease (a member that heard from a live leader within ``election_timeout_min_seconds``
refuses to vote for a newcomer, so a member partitioned away and back cannot depose a healthy
leader), check-quorum (a leader that heard from no quorum for that long steps down), and the Raft
paper's commit rule (only an entry of the leader's own term commits by counting; a new leader
appends an empty no-op entry so the earlier ones commit with it). One deliberate difference from
DLedger: a vote request with a higher term makes the voter adopt the term and decide at once,
instead of answering REJECT_TERM_NOT_READY and waiting for the candidate to ask again.

Replication (§8.6) is DLedger's EntryPusher per follower: COMPARE (walk back to the last index
where the follower's entry equals the leader's, skipping a whole older term per round trip) ->
TRUNCATE (the follower drops its divergent tail) -> APPEND (batched pushes, at most
``push_in_flight_max`` unacknowledged entries, re-pushed after ``push_timeout_seconds``). Every
append is guarded by the term of the entry before it, so logs that share an (index, term) share
the whole prefix. An APPEND carries an ``EntryRun``: the leader's core names the entries (first
index, count, last term) and its driver sends them as its store holds them, read at send time
(``EntryLog.read_runs``; by log matching, the same last term means the same entries); a
follower's core has the store check the run's bytes (``EntryLog.check_run``) before it appends
it (``Ready.runs``), so no entry is decoded into an ``Entry`` on either side.

Retention (``retention_floor``): a member's driver deletes only entries below the floor, which a
leader computes from its committed index and every peer's match index and announces in its
heartbeats. Those entries are committed and on every member, so a follower takes an entry below
its own first index as equal to the leader's.

RESET (Kafka's out-of-range follower, etcd's snapshot -- here the log is the state, so the
"snapshot" is empty). A clean forced by a full disk ignores the floor, so a follower may need an
entry below the leader's first index X: the next COMPARE, TRUNCATE or APPEND would name one. The
leader then sends ``ResetPush(index=X, prev_term=T, first_term, pos)``: "discard your log and
start it empty at X; the term of X - 1 is T; entry X lies at pos". The follower accepts only

* from the leader of its current term (``_accept_leader``, as every push: a stale term or another
  member is refused with EXPIRED_TERM / INCONSISTENT_LEADER), and
* only if its log does not hold the leader's entry X (``first_term`` differs or it has no entry
  there) and X is above its committed index; else it answers INCONSISTENT_STATE and the leader
  goes back to COMPARE (the follower holds the leader's log up to X: nothing below X is needed).

Why it is safe. Every entry below X was deleted by the leader's retention, which deletes only
committed entries, and every leader holds every committed entry: so indexes below X are committed
and gone group-wide ("gone, not changed"), and dropping the follower's copies of them loses no
data a member needs. Entries at or above X: the follower holds none equal to the leader's (its
entry X differs or is missing, and by log matching an equal entry above X would make X equal
too), so none of them is committed (the leader would hold it): dropping them is what TRUNCATE
would do. A delayed duplicate RESET after the follower has appended the leader's entry X is
refused by the same check. After a reset the follower's log is empty at X with last term T (so
its vote compares (X - 1, T), never more than it knew), its committed and flushed index are
X - 1 (the store makes the reset durable before the answer goes out: ``Ready.reset`` comes
before the messages), and it answers SUCCESS acknowledging X - 1; the leader goes on with APPEND
from X (the follower takes X - 1 as matching, being below its first index). The leader knows T
because its store records the term of the entry before its first when retention deletes (a store
that does not know it, ``term_before_first() == -1``, cannot reset: the follower stays
``behind_log_start`` and is not pushed to).

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

from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.log_view import LogView
from hasvc.state.raft.messages import (
    Heartbeat,
    HeartbeatResponse,
    HeartbeatResult,
    Message,
    Push,
    PushResponse,
    PushResult,
    PushType,
    ResetPush,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from hasvc.state.raft.ready import (
    PeerStatus,
    RaftStatus,
    BecameCandidate,
    BecameFollower,
    BecameLeader,
    ProposalDone,
    ProposalStatus,
    Proposed,
    Ready,
    RefusalStatus,
    Refused,
    Role,
    RoleChange,
    TransferAborted,
)
from hasvc.state.raft.storage import Entry, EntryLog, EntryRun, HardState, LogReset

NO_OP = b""  # the body of the entry a new leader appends in its term


@dataclasses.dataclass(slots=True)
class Progress:
    """The leader's view of one follower (DLedger's EntryDispatcher state).

    During COMPARE the leader narrows the window between ``compare_floor`` (the highest index known
    to match, -1 always does) and ``compare_mismatch_from`` (the lowest known to differ: by log
    matching every index above it differs too), until the follower's log is a prefix (APPEND) or
    its tail past the floor must go (TRUNCATE). Knowledge can go stale (pushes still in flight);
    the follower re-checks before it truncates, so staleness costs a round trip, never an entry.
    """

    state: PushType  # COMPARE, TRUNCATE, APPEND or RESET
    index: int  # COMPARE/TRUNCATE: the index compared or kept; APPEND: the next index to push; RESET: ours first
    match_index: int = -1  # acknowledged: matches the leader's log (flushed there with flush_sync)
    sent_at: float | None = None  # COMPARE/TRUNCATE sent, or oldest unacknowledged APPEND (None: none)
    last_contact_at: float = -math.inf  # last response of any kind in this term
    follower_end: int = -1  # the follower's last index, as last reported
    compare_floor: int = -1
    compare_mismatch_from: float = math.inf


@dataclasses.dataclass(slots=True)
class Campaign:
    pre_vote: bool
    accepted: set[str]


@dataclasses.dataclass(slots=True)
class Pending:
    first_index: int
    last_index: int
    term: int
    deadline: float


@dataclasses.dataclass(slots=True)
class Transfer:
    target: str
    deadline: float
    sent: bool = False


class RaftNode:
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
        self.quorum = len(self.members) // 2 + 1  # DLedger isQuorum: n >= peers/2 + 1 (peers incl. self)
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
        self._progress: dict[str, Progress] = {}
        self._pending: collections.deque[Pending] = collections.deque()
        self._pending_count = 0  # entries in self._pending
        self._transfer: Transfer | None = None
        self._matched_index = -1  # follower: every entry up to here equals the current leader's
        self._acked_index = -1  # follower: the highest ack_index sent to the current leader
        self._gap_reported_end = -2  # follower: OUT_OF_ORDER answered once per end index (no storms)
        self._retain_from_index = -1  # follower: the highest retention floor a leader announced
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
        timeout = self.config.push_timeout_seconds
        for progress in self._progress.values():  # a loop, not a generator: this runs after every Ready
            if progress.sent_at is not None:
                times.append(progress.sent_at + timeout)
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
        peers = {
            peer: PeerStatus(p.match_index, last - p.match_index, now - p.last_contact_at, p.state is PushType.RESET)
            for peer, p in self._progress.items()
        }
        return RaftStatus(self.self_id, self.role, self.term, self.leader_id, last, self.committed_index,
                          self.flushed_index, self._pending_count, peers,
                          -1 if self._catch_up is None else self._catch_up[1])  # fmt: skip

    def retention_floor(self) -> int:
        """The lowest index some member may still need from this member's log: retention keeps
        every entry at or above it (-1: keep everything). A leader's is its committed index and
        every peer's match index, whatever their last contact: a member that is down holds
        retention back until it returns (a forced clean above the disk ratio does not wait; a
        member it strands is RESET to the leader's first index). Entries below it are committed and
        held by every member, which never truncates at or below its committed index, so no
        member needs them again. A follower keeps from the highest floor a leader announced
        (heartbeats), at most its own committed index: it may lead later, and then must still
        hold what its followers need. With ``flush_sync`` the leader's own part is what it has
        flushed, too: a quorum of followers can commit entries the leader has not flushed yet,
        and a power loss would take them from its log; had the others deleted them meanwhile,
        the leader would come back to find them gone everywhere (raft_sim seed 722485)."""
        if self.role is Role.LEADER:
            own = min(self.committed_index, self.flushed_index) if self.config.flush_sync else self.committed_index
            return min([own, *(p.match_index for p in self._progress.values())])
        return min(self._retain_from_index, self.committed_index)

    def match_index(self, peer: str) -> int:
        """Leader: the last index `peer` acknowledged (-1 when unknown)."""
        progress = self._progress.get(peer)
        return -1 if progress is None else progress.match_index

    def last_contact_at(self, peer: str) -> float:
        progress = self._progress.get(peer)
        return -math.inf if progress is None else progress.last_contact_at

    # ------------------------------------------------------------------ roles

    def _election_timeout(self) -> float:
        return self._rng.uniform(self.config.election_timeout_min_seconds, self.config.election_timeout_max_seconds)

    def _set_term(self, term: int) -> None:
        assert term >= self.term, (term, self.term)
        if term > self.term:
            self.term = term
            self.voted_for = None
            self._hard_state_changed = True

    def _become_follower(self, term: int, leader_id: str | None, now: float) -> None:
        before = (self.role, self.term, self.leader_id)
        if self.role is Role.LEADER:
            self._leave_leadership()
        self._set_term(term)
        self.role = Role.FOLLOWER
        self._campaign = None
        if leader_id != self.leader_id or before[1] != term:
            self._matched_index = -1
            self._acked_index = -1
            self._gap_reported_end = -2
        self.leader_id = leader_id
        if leader_id is not None:
            self._leader_contact_at = now
        self._election_deadline = now + self._election_timeout()
        if (self.role, self.term, self.leader_id) != before:
            self._role_changes.append(BecameFollower(self.term, self.leader_id))

    def _leave_leadership(self) -> None:
        for pending in self._pending:
            self._proposals_done.append(
                ProposalDone(pending.first_index, pending.last_index, pending.term, ProposalStatus.TERM_CHANGED)
            )
        self._pending.clear()
        self._pending_count = 0
        self._progress.clear()
        self._transfer = None
        self._heartbeat_at = math.inf
        self._push_due_at = None

    def _campaign_start(self, now: float, *, pre_vote: bool, transfer: bool = False) -> None:
        if self.role is Role.LEADER:
            self._leave_leadership()
        entering = self.role is not Role.CANDIDATE
        self.role = Role.CANDIDATE
        self.leader_id = None
        self._matched_index = self._acked_index = -1
        if pre_vote:
            term = self.term + 1
        else:
            self._set_term(self.term + 1)
            self._record_vote(self.self_id)
            term = self.term
        if entering or not pre_vote:
            self._role_changes.append(BecameCandidate(self.term))
        self._campaign = Campaign(pre_vote, {self.self_id})
        self._election_deadline = now + self._election_timeout()
        for peer in self.peers:
            self._messages.append(VoteRequest(self.self_id, peer, term, self._log.last_index(),
                                              self._log.last_term(), pre_vote, transfer))  # fmt: skip
        self._campaign_check(now)

    def _campaign_check(self, now: float) -> None:
        campaign = self._campaign
        assert campaign is not None
        if len(campaign.accepted) < self.quorum:
            return
        if campaign.pre_vote:
            self._campaign_start(now, pre_vote=False)
        else:
            self._become_leader(now)

    def _record_vote(self, candidate: str) -> None:
        assert self.voted_for in (None, candidate), ("two votes in one term", self.term, self.voted_for, candidate)
        if self.voted_for != candidate:
            self.voted_for = candidate
            self._hard_state_changed = True

    def _become_leader(self, now: float) -> None:
        assert self.role is Role.CANDIDATE and self.voted_for == self.self_id
        assert self._catch_up is None, ("a member that lost entries won an election", self._catch_up)
        self.role = Role.LEADER
        self.leader_id = self.self_id
        self._campaign = None
        self._became_leader_at = now
        self._role_changes.append(BecameLeader(self.term))
        compare_from = self._log.last_index()  # DLedger compares from the leader's end first
        self._log.append([Entry(self._log.last_index() + 1, self.term, NO_OP)])
        self._progress = {}
        for peer in self.peers:
            self._progress[peer] = Progress(PushType.COMPARE, compare_from, last_contact_at=now)
            self._start_compare(self._progress[peer], compare_from)
        self._heartbeat_at = now  # announce the new leader on the way out of this event
        self._tick_leader(now)

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
        while self._pending and self._pending[0].deadline <= now:
            pending = self._pending.popleft()
            self._pending_count -= pending.last_index - pending.first_index + 1
            self._proposals_done.append(ProposalDone(pending.first_index, pending.last_index, pending.term,
                                                     ProposalStatus.WAIT_QUORUM_ACK_TIMEOUT))  # fmt: skip
        if self._transfer is not None and now >= self._transfer.deadline:
            self._transfers_aborted.append(TransferAborted(self._transfer.target))
            self._transfer = None

    def _lost_quorum(self, now: float) -> bool:
        """Check-quorum: no quorum heard from within the election timeout (DLedger: 3 heartbeats)."""
        window = self.config.election_timeout_min_seconds
        if not self.config.check_quorum or now - self._became_leader_at < window:
            return False
        live = 1 + sum(1 for p in self._progress.values() if now - p.last_contact_at < window)
        return live < self.quorum

    def _in_lease(self, now: float) -> bool:
        """A live leader is known: a vote for a newcomer would depose it."""
        if not self.config.check_quorum:
            return False
        if self.role is Role.LEADER:
            return True
        return self.leader_id is not None and now - self._leader_contact_at < self.config.election_timeout_min_seconds

    # ------------------------------------------------------------------ votes

    def _vote_refusal(self, m: VoteRequest, now: float) -> VoteResult | None:
        """DLedger's handleVote checks, in its order, up to the term; then our lease check."""
        if m.source not in self.members:
            return VoteResult.REJECT_UNKNOWN_LEADER
        if m.source == self.self_id:
            return VoteResult.REJECT_UNEXPECTED_LEADER
        # Lost entries: compared as if our log still ended at the catch-up mark.
        end_term, end_index = max((self._log.last_term(), self._log.last_index()), self._catch_up or (-1, -1))
        if m.ledger_end_term < end_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if m.ledger_end_term == end_term and m.ledger_end_index < end_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        if m.term < self.term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if m.term > self.term and not m.transfer and self._in_lease(now):
            return VoteResult.REJECT_LEADER_LEASE
        return None

    def _vote_refusal_same_term(self, m: VoteRequest) -> VoteResult | None:
        """The checks after the voter is in the request's term."""
        if self.voted_for not in (None, m.source) or self.leader_id not in (None, m.source):
            return VoteResult.REJECT_ALREADY_HAS_LEADER if self.leader_id else VoteResult.REJECT_ALREADY_VOTED
        if m.term < self._log.last_term():
            return VoteResult.REJECT_TERM_SMALL_THAN_LEDGER
        return None

    def _on_vote_request(self, m: VoteRequest, now: float) -> None:
        refusal = self._vote_refusal(m, now)
        if refusal is None and m.pre_vote:
            if m.term == self.term:
                refusal = self._vote_refusal_same_term(m)
        elif refusal is None:
            if m.term > self.term:
                self._become_follower(m.term, None, now)
            refusal = self._vote_refusal_same_term(m)
            if refusal is None:
                self._record_vote(m.source)
                self._election_deadline = now + self._election_timeout()
        result = VoteResult.ACCEPT if refusal is None else refusal
        term = m.term if (m.pre_vote and result is VoteResult.ACCEPT) else self.term
        self._messages.append(VoteResponse(self.self_id, m.source, term, result, m.pre_vote))
        if m.pre_vote and result is VoteResult.ACCEPT:
            self._give_way(m, now)

    def _give_way(self, m: VoteRequest, now: float) -> None:
        """Having granted ``m.source`` a pre-vote, let its campaign run (the config's
        ``pre_vote_granted_hold_seconds``): a follower starts none of its own before the hold
        ends; a pre-candidate gives its own up when the other's log is newer than ours, or as new
        and its id lower, so that of two whose pre-votes crossed exactly one goes on."""
        hold = min(self.config.pre_vote_granted_hold_seconds, self.config.election_timeout_min_seconds / 2)
        if hold <= 0:
            return
        if self.role is Role.FOLLOWER:
            self._election_deadline = max(self._election_deadline, now + hold)
            return
        campaign = self._campaign
        if self.role is not Role.CANDIDATE or campaign is None or not campaign.pre_vote:
            return
        theirs, ours = (m.ledger_end_term, m.ledger_end_index), (self._log.last_term(), self._log.last_index())
        if theirs > ours or (theirs == ours and m.source < self.self_id):
            self._become_follower(self.term, None, now)
            self._election_deadline = now + hold

    def _on_vote_response(self, m: VoteResponse, now: float) -> None:
        if m.term > self.term and not (m.pre_vote and m.result is VoteResult.ACCEPT):
            self._become_follower(m.term, None, now)
            return
        campaign = self._campaign
        if self.role is not Role.CANDIDATE or campaign is None or campaign.pre_vote != m.pre_vote:
            return
        if m.result is not VoteResult.ACCEPT or m.term != self.term + (1 if m.pre_vote else 0):
            return
        campaign.accepted.add(m.source)
        self._campaign_check(now)

    def _on_timeout_now(self, m: TimeoutNow, now: float) -> None:
        if m.term == self.term and self.role is Role.FOLLOWER and self.leader_id == m.source and self._catch_up is None:
            self._campaign_start(now, pre_vote=False, transfer=True)

    # ------------------------------------------------------------------ follower side of replication

    def _accept_leader(self, source: str, term: int, now: float) -> HeartbeatResult:
        """Whether `source` leads `term` as far as this member knows (and follow it if so)."""
        if term < self.term:
            return HeartbeatResult.EXPIRED_TERM
        if term == self.term and self.role is Role.LEADER:
            return HeartbeatResult.INCONSISTENT_LEADER
        if term == self.term and self.role is Role.FOLLOWER and self.leader_id not in (None, source):
            return HeartbeatResult.INCONSISTENT_LEADER
        self._become_follower(term, source, now)
        return HeartbeatResult.SUCCESS

    def _on_heartbeat(self, m: Heartbeat, now: float) -> None:
        result = self._accept_leader(m.source, m.term, now)
        if result is HeartbeatResult.SUCCESS:
            # The leader vouches that our entries up to m.commit_index equal its own.
            last = self._log.last_index()
            self._matched_index = max(self._matched_index, min(m.commit_index, last))
            self._follow_commit(m.commit_index)
            self._retain_from_index = max(self._retain_from_index, m.retain_from_index)
            self._gap_reported_end = -2  # OUT_OF_ORDER may be answered again (the last one may be lost)
            if m.commit_index > last:
                # Capped at our match index there: the leader believes we hold entries we lost
                # (see "Lost entries"). Say where our log ends, or it would wait for a proposal.
                self._gap_reported_end = last
                self._send_push_response(m.source, PushType.APPEND, PushResult.OUT_OF_ORDER, -1)
        self._messages.append(HeartbeatResponse(self.self_id, m.source, self.term, result))

    def _follow_commit(self, leader_commit: int) -> None:
        commit = min(leader_commit, self._matched_index)
        if commit > self.committed_index:
            self.committed_index = commit

    def _ack_index(self) -> int:
        if self.config.flush_sync:
            return min(self._matched_index, self.flushed_index)
        return self._matched_index

    def _send_push_response(self, leader: str, kind: PushType, result: PushResult, request_index: int,
                            term_at_index: int = -1) -> None:  # fmt: skip
        ack = self._ack_index() if result is PushResult.SUCCESS else -1
        self._acked_index = max(self._acked_index, ack)
        self._messages.append(PushResponse(self.self_id, leader, self.term, kind, result, request_index, ack,
                                           self._log.first_index(), self._log.last_index(), term_at_index))  # fmt: skip

    def _accepts_push_from(self, source: str, term: int, now: float, kind: PushType, index: int) -> bool:
        """Whether ``source`` leads ``term`` as far as we know (adopting it); if not, the push
        (of ``kind`` at ``index``) is answered EXPIRED_TERM or INCONSISTENT_LEADER here."""
        leadership = self._accept_leader(source, term, now)
        if leadership is HeartbeatResult.SUCCESS:
            return True
        result = (
            PushResult.EXPIRED_TERM if leadership is HeartbeatResult.EXPIRED_TERM else PushResult.INCONSISTENT_LEADER
        )
        self._send_push_response(source, kind, result, index)
        return False

    def _on_push(self, m: Push, now: float) -> None:
        if not self._accepts_push_from(m.source, m.term, now, m.type, m.index):
            return
        if m.type is PushType.RESET:
            raise ValueError("a RESET comes as a ResetPush, not in a PUSH frame")
        if m.type is PushType.COMPARE:
            self._on_compare(m)
        elif m.type is PushType.TRUNCATE:
            self._on_truncate(m)
        else:
            self._on_append(m)
        self._follow_commit(m.commit_index)

    def _on_reset_push(self, m: ResetPush, now: float) -> None:
        if not self._accepts_push_from(m.source, m.term, now, PushType.RESET, m.index):
            return
        self._on_reset(m)
        self._follow_commit(m.commit_index)

    def _on_reset(self, m: ResetPush) -> None:
        """Start the log empty at ``m.index`` -- unless we hold the leader's entry there or
        committed it (see the module: what may be dropped and why)."""
        if m.index < 1 or not 0 <= m.prev_term <= m.first_term <= m.term or m.pos < 0:
            raise ValueError(f"RESET to index {m.index}, terms {m.prev_term}/{m.first_term} in term {m.term}, "
                             f"pos {m.pos}")  # fmt: skip
        if m.index <= self.committed_index or self._same_as_ours(m.index, m.first_term):
            self._send_push_response(m.source, PushType.RESET, PushResult.INCONSISTENT_STATE, m.index)
            return
        self._log.reset(LogReset(m.index, m.prev_term, m.pos))
        self.flushed_index = m.index - 1  # the driver makes the reset durable before it sends
        self._matched_index = m.index - 1
        self.committed_index = max(self.committed_index, m.index - 1)
        self._gap_reported_end = -2
        self._send_push_response(m.source, PushType.RESET, PushResult.SUCCESS, m.index)

    def _matches(self, index: int, entries: tuple[Entry, ...]) -> bool:
        """Whether our entry at `index` equals the leader's (index -1: the empty prefix always does)."""
        if index == -1:
            return True
        if not entries or entries[0].index != index:
            raise ValueError(f"push names index {index} but carries {entries[:1]}")
        return self._same_as_ours(index, entries[0].term)

    def _same_as_ours(self, index: int, term: int) -> bool:
        """Whether the leader's entry (index, term) equals ours. Below our first index, retention
        deleted it: it was committed (retention keeps the committed entry) and a leader holds
        every committed entry, so it does."""
        if 0 <= index < self._log.first_index():
            return True
        return self._log.term_or_missing(index) == term

    def _on_compare(self, m: Push) -> None:
        if self._matches(m.index, m.entries):
            self._matched_index = max(self._matched_index, m.index)
            self._send_push_response(m.source, m.type, PushResult.SUCCESS, m.index)
        else:
            self._send_push_response(m.source, m.type, PushResult.MISMATCH, m.index, self._log.term_or_missing(m.index))

    def _on_truncate(self, m: Push) -> None:
        """Drop the tail after `index` -- only if our entry there equals the leader's and the next one
        differs from the leader's next (or the leader has none): so no entry the leader has, and hence
        no committed entry, is ever dropped, however stale the leader's view of us was."""
        ours = [e for e in m.entries if e.index == m.index]
        theirs_next = [e for e in m.entries if e.index == m.index + 1]
        if len(ours) + len(theirs_next) != len(m.entries):
            raise ValueError(f"TRUNCATE at {m.index} carries {m.entries}")
        if not self._matches(m.index, tuple(ours)) or (
            theirs_next and self._same_as_ours(m.index + 1, theirs_next[0].term)
        ):
            self._send_push_response(m.source, m.type, PushResult.INCONSISTENT_STATE, m.index)
            return
        if m.index < self._log.last_index():
            assert m.index >= self.committed_index, ("truncating committed entries", m.index, self.committed_index)
            self._log.truncate(after_index=m.index)
            self.flushed_index = min(self.flushed_index, m.index)
        self._matched_index = m.index
        self._send_push_response(m.source, m.type, PushResult.SUCCESS, m.index)

    def _on_append(self, m: Push) -> None:
        """Append the leader's run after checking it against our log: the entry before it (its
        previous term), where it overlaps ours the last overlapping entry (by log matching, equal
        there means equal before), and the new part's bytes by the store (``check_run``: one native
        walk -- indexes, terms, positions, CRCs). A run the store refuses is answered
        INCONSISTENT_STATE (the leader compares again) and named in ``Ready.refused_runs``."""
        run = m.entries
        if not isinstance(run, EntryRun) or run.data is None or run.first_index != m.index or run.count < 1:
            raise ValueError(f"APPEND at {m.index} carries {run!r:.80}")
        last = self._log.last_index()
        if m.index > last + 1:  # an earlier push was lost: say where we are, once per end index
            if self._gap_reported_end != last:
                self._gap_reported_end = last
                self._send_push_response(m.source, m.type, PushResult.OUT_OF_ORDER, m.index)
            return
        new: EntryRun | None = run
        prev_term = m.prev_term
        consistent = self._same_as_ours(m.index - 1, m.prev_term)
        if consistent and run.first_index <= last:  # overlap (a push sent again): skip what we hold
            overlap_end = min(last, run.last_index)
            try:
                prev_term, new = run.split_after(overlap_end)
            except ValueError as error:  # bytes a walk cannot follow
                self._refused_runs.append(f"from {m.source}: entries {run.first_index}..{run.last_index}: {error}")
                consistent = False
            else:
                consistent = self._same_as_ours(overlap_end, prev_term)
        if consistent and new is not None:
            reason = self._log.check_run(new, prev_term=prev_term)
            if reason is not None:
                self._refused_runs.append(f"from {m.source}: entries {new.first_index}..{new.last_index}: {reason}")
                consistent = False
        if not consistent:
            self._send_push_response(m.source, m.type, PushResult.INCONSISTENT_STATE, m.index)
            return
        if new is not None:
            self._log.append_run(new)
        self._matched_index = max(self._matched_index, run.last_index)
        if new is not None and self.config.flush_sync and self._ack_index() <= self._acked_index:
            # Nothing to acknowledge before these entries are flushed, and persisted() sends
            # that acknowledgement: a response now would tell the leader nothing (its window
            # counts acknowledged entries, not responses), at a message per push each way.
            return
        self._send_push_response(m.source, m.type, PushResult.SUCCESS, m.index)

    # ------------------------------------------------------------------ leader side of replication

    def _on_heartbeat_response(self, m: HeartbeatResponse, now: float) -> None:
        if m.term > self.term:
            self._become_follower(m.term, None, now)
        elif m.term == self.term and self.role is Role.LEADER:
            self._progress[m.source].last_contact_at = now

    def _on_push_response(self, m: PushResponse, now: float) -> None:
        if m.term > self.term:
            self._become_follower(m.term, None, now)
            return
        if m.term < self.term or self.role is not Role.LEADER:
            return
        progress = self._progress[m.source]
        progress.last_contact_at = now
        last = self._log.last_index()
        if m.ack_index > last:
            raise ValueError(f"{m.source} acknowledges {m.ack_index} beyond the leader's last index {last}")
        if m.end_index < progress.match_index:
            # It lost entries it acknowledged (or the response is stale): count no more than it
            # holds, and find where it matches from its end (see "Lost entries").
            progress.match_index = m.end_index
            progress.sent_at = None
            self._start_compare(progress, m.end_index)
            return
        if m.ack_index > progress.match_index:
            progress.match_index = m.ack_index
            progress.sent_at = now if progress.state is PushType.APPEND else progress.sent_at
        if progress.state is PushType.APPEND:
            if m.type is PushType.APPEND:
                self._on_append_response(progress, m)
        elif m.type is progress.state and m.request_index == progress.index:
            if m.type is PushType.COMPARE:
                self._on_compare_response(progress, m)
            elif m.type is PushType.RESET:
                self._on_reset_response(progress, m)
            else:
                self._on_truncate_response(progress, m)

    def _on_compare_response(self, progress: Progress, m: PushResponse) -> None:
        compared = progress.index
        progress.follower_end = m.end_index
        if m.result is PushResult.SUCCESS:
            progress.compare_floor = max(progress.compare_floor, compared)
        elif m.result is PushResult.MISMATCH:
            if m.term_at_index == -1:  # no entry there at all
                progress.compare_mismatch_from = min(progress.compare_mismatch_from, compared)
            else:  # nothing between the last index of a term <= the follower's and `compared` can match
                below = self._last_index_with_term_at_most(m.term_at_index, compared - 1)
                progress.compare_mismatch_from = min(
                    progress.compare_mismatch_from, max(below, progress.compare_floor) + 1
                )
        self._compare_next(progress)

    def _compare_next(self, progress: Progress) -> None:
        """COMPARE again, TRUNCATE, or APPEND, from what the window says."""
        floor, end, last = progress.compare_floor, progress.follower_end, self._log.last_index()
        progress.sent_at = None
        if floor >= end:  # the follower's log is a prefix of ours
            self._start_append(progress, min(floor, end) + 1)
        elif floor >= last or progress.compare_mismatch_from == floor + 1:
            progress.state, progress.index = PushType.TRUNCATE, floor
        else:
            progress.state = PushType.COMPARE
            progress.index = int(min(last, end, progress.compare_mismatch_from - 1))

    def _on_truncate_response(self, progress: Progress, m: PushResponse) -> None:
        if m.result is PushResult.SUCCESS:
            self._start_append(progress, progress.index + 1)
        else:
            self._start_compare(progress, m.end_index)

    def _on_reset_response(self, progress: Progress, m: PushResponse) -> None:
        if m.result is PushResult.SUCCESS:  # its log is empty at our first index: push from there
            self._start_append(progress, progress.index)
        else:  # it holds our entry there after all (a stale view): find where we agree
            self._start_compare(progress, m.end_index)

    def _on_append_response(self, progress: Progress, m: PushResponse) -> None:
        if m.result is PushResult.OUT_OF_ORDER:
            progress.index = max(progress.match_index + 1, min(progress.index, m.end_index + 1))
        elif m.result is PushResult.INCONSISTENT_STATE:
            self._start_compare(progress, m.end_index)

    def _start_append(self, progress: Progress, next_index: int) -> None:
        progress.state, progress.index, progress.sent_at = PushType.APPEND, next_index, None

    def _start_compare(self, progress: Progress, follower_end: int) -> None:
        """A new COMPARE session: nothing known but the follower's end."""
        progress.follower_end = follower_end
        progress.compare_floor = -1
        progress.compare_mismatch_from = math.inf
        self._compare_next(progress)

    def _last_index_with_term_at_most(self, term: int, hi: int) -> int:
        """The largest index <= hi whose term is <= `term` (-1 if none): no entry between there and
        the mismatch can equal the follower's, whose terms are all <= `term` (etcd's findConflictByTerm)."""
        lo = self._log.first_index() - 1
        hi = min(hi, self._log.last_index())
        while lo < hi:  # terms never decrease along the log: binary search
            mid = (lo + hi + 1) // 2
            if self._log.term_at(mid) <= term:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _push(self, peer: str, progress: Progress, now: float, first: int, last: int) -> None:
        """Push to ``peer`` what ``progress`` says is due; ``first`` and ``last`` are the log's ends
        (read once by ``_after_event`` for every peer: pushing does not change the log)."""
        timeout = self.config.push_timeout_seconds
        if (
            progress.state is PushType.APPEND
            and progress.sent_at is not None
            and progress.index > progress.match_index + 1
            and now >= progress.sent_at + timeout
        ):
            progress.index = progress.match_index + 1  # DLedger: re-push what waited past maxPushTimeOutMs
            progress.sent_at = None
        if progress.state is PushType.APPEND:
            if progress.index < first:  # _needs_deleted_entry of an APPEND, written out (every peer, every event)
                progress.state, progress.index, progress.sent_at = PushType.RESET, first, None
        elif progress.state is not PushType.RESET and self._needs_deleted_entry(progress):
            progress.state, progress.index, progress.sent_at = PushType.RESET, first, None
        if progress.state is not PushType.APPEND:
            if progress.sent_at is None or now >= progress.sent_at + timeout:
                message = self._control_push(peer, progress)
                if message is not None:
                    self._messages.append(message)
                progress.sent_at = None if message is None else now  # None: nothing in flight to time
            return
        while progress.index <= last and progress.index - progress.match_index - 1 < self.config.push_in_flight_max:
            # Whole batches (a window that opens by one entry must not make one-entry pushes):
            # in flight may pass push_in_flight_max by less than a batch. The push names the
            # entries (a reference run): the driver sends them as its store holds them.
            count = self._log.count_within(progress.index, last + 1, size_max=self.config.push_batch_size_max)
            run = EntryRun(progress.index, count, self._log.term_at(progress.index + count - 1))
            prev_term = self._log.term_or_missing(progress.index - 1)
            self._messages.append(Push(self.self_id, peer, self.term, PushType.APPEND, progress.index, prev_term,
                                       self.committed_index, run))  # fmt: skip
            progress.index += count
            progress.sent_at = now if progress.sent_at is None else progress.sent_at
        if progress.index <= progress.match_index + 1:
            progress.sent_at = None
        elif progress.sent_at is None:
            # Unacknowledged entries the follower may hold already (COMPARE found them; with
            # flush_sync their acknowledgement waits for its flush, and may be lost): time them.
            progress.sent_at = now

    def _control_push(self, peer: str, progress: Progress) -> Push | ResetPush | None:
        """The COMPARE, TRUNCATE or RESET for ``progress`` (None: a RESET we cannot send)."""
        index = progress.index
        if progress.state is PushType.RESET:
            first = progress.index = self._log.first_index()  # retention may have moved it since
            prev_term = self._log.term_before_first()
            if prev_term < 0:  # our store does not know the term before its first entry
                return None
            return ResetPush(self.self_id, peer, self.term, first, prev_term, self._log.term_at(first),
                             self._log.first_offset(), self.committed_index)  # fmt: skip
        # COMPARE carries our entry at index; TRUNCATE ours at index and index + 1 (where we have them)
        wanted = (index,) if progress.state is PushType.COMPARE else (index, index + 1)
        last = self._log.last_index()
        entries = tuple(self._log.read(i, i + 1, size_max=0)[0] for i in wanted if 0 <= i <= last)
        return Push(self.self_id, peer, self.term, progress.state, index, -1, self.committed_index, entries)

    def _needs_deleted_entry(self, progress: Progress) -> bool:
        """Whether the next push to this follower would name an entry below our first index:
        then COMPARE/TRUNCATE/APPEND cannot reach it any more, and a RESET must."""
        first = self._log.first_index()
        if progress.state is PushType.APPEND:
            return progress.index < first
        wanted = (progress.index,) if progress.state is PushType.COMPARE else (progress.index, progress.index + 1)
        return any(0 <= i < first and i <= self._log.last_index() for i in wanted)

    def _maybe_commit(self, last: int) -> None:
        """Commit what a quorum holds (``last``: the log's last index)."""
        own = self.flushed_index if self.config.flush_sync else last
        marks = [own]
        for progress in self._progress.values():
            marks.append(progress.match_index)
        marks.sort(reverse=True)
        quorum_index = marks[self.quorum - 1]
        # The Raft paper's rule (DLedger has none): count only entries of the leader's own term.
        if quorum_index > self.committed_index and self._log.term_at(quorum_index) == self.term:
            self.committed_index = quorum_index
        while self._pending and self._pending[0].last_index <= self.committed_index:
            pending = self._pending.popleft()
            self._pending_count -= pending.last_index - pending.first_index + 1
            self._proposals_done.append(
                ProposalDone(pending.first_index, pending.last_index, pending.term, ProposalStatus.SUCCESS)
            )

    # ------------------------------------------------------------------ leadership transfer

    def _transfer_refusal(self, target: str, now: float) -> Refused | None:
        if self.role is not Role.LEADER:
            return Refused(RefusalStatus.NOT_LEADER, self.leader_id, f"{self.self_id} is {self.role.value}")
        if target not in self.members:
            return Refused(
                RefusalStatus.UNKNOWN_MEMBER, self.self_id, f"{target!r} is not a member of {list(self.members)}"
            )
        if target == self.self_id:
            return Refused(RefusalStatus.ALREADY_LEADER, self.self_id, f"{target} leads already")
        if self._transfer is not None:
            return Refused(RefusalStatus.TRANSFER_IN_PROGRESS, self.self_id, f"handing over to {self._transfer.target}")
        progress = self._progress[target]
        behind = self._log.last_index() - progress.match_index
        if behind > self.config.leadership_transfer_wait_index_max:
            return Refused(RefusalStatus.FOLLOWER_FALL_BEHIND_TOO_MUCH, self.self_id,
                           f"{target} is {behind} entries behind (at most {self.config.leadership_transfer_wait_index_max})")  # fmt: skip
        silent = now - progress.last_contact_at
        if silent >= self.config.election_timeout_min_seconds:
            return Refused(RefusalStatus.FOLLOWER_NOT_REACHABLE, self.self_id, f"{target} silent for {silent:.3f} s")
        return None

    def _maybe_transfer_to_preferred(self, now: float) -> None:
        preferred = self.config.preferred_leader_id
        if (
            preferred is None
            or preferred == self.self_id
            or self._transfer is not None
            or preferred not in self._progress
        ):
            return
        if (
            self._progress[preferred].match_index == self._log.last_index()
            and self._transfer_refusal(preferred, now) is None
        ):
            self._transfer = Transfer(preferred, now + self.config.election_timeout_min_seconds)

    def _send_timeout_now(self, last: int) -> None:
        transfer = self._transfer
        if transfer is None or transfer.sent or self._progress[transfer.target].match_index != last:
            return
        transfer.sent = True
        self._messages.append(TimeoutNow(self.self_id, transfer.target, self.term))

    # ------------------------------------------------------------------ bookkeeping

    def _push_all(self, now: float) -> tuple[int, int]:
        """Push to every follower what is due; return the log's (first, last) index."""
        self._push_due_at = None  # whatever a proposal left goes now
        log = self._log
        first, last = log.first_index(), log.last_index()
        for peer, progress in self._progress.items():
            self._push(peer, progress, now, first, last)
        return first, last

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

    _HANDLERS = {
        VoteResponse: _on_vote_response,
        Heartbeat: _on_heartbeat,
        HeartbeatResponse: _on_heartbeat_response,
        Push: _on_push,
        ResetPush: _on_reset_push,
        PushResponse: _on_push_response,
        TimeoutNow: _on_timeout_now,
    }
