"""Elections and leadership: roles, campaigns, votes, the leader lease, leadership transfer.

Theory of operation
-------------------
Election (rocketmq-notes §8.5) keeps DLedger's vote checks in DLedger's order and adds what DLedger
0.3 lacks: pre-vote (a candidate first asks whether it *could* win, without anyone changing term),
a leader lease (a member that heard from a live leader within ``election_timeout_min_seconds``
refuses to vote for a newcomer, so a member partitioned away and back cannot depose a healthy
leader), check-quorum (a leader that heard from no quorum for that long steps down), and the Raft
paper's commit rule (only an entry of the leader's own term commits by counting; a new leader
appends an empty no-op entry so the earlier ones commit with it). One deliberate difference from
DLedger: a vote request with a higher term makes the voter adopt the term and decide at once,
instead of answering REJECT_TERM_NOT_READY and waiting for the candidate to ask again. The counts
(votes won, check-quorum) are ``hasvc.state.raft.quorum``'s. A member with a catch-up mark votes
as if its log still ended there and stands for no election (node's "Lost entries").

Leadership transfer (DLedger's): to a follower at most ``leadership_transfer_wait_index_max``
entries behind and heard from within ``election_timeout_min_seconds``. The leader stops taking
proposals, waits until the target holds its whole log, then sends it TimeoutNow, on which the
target campaigns at once (no pre-vote, past the others' leases); not done within
``election_timeout_min_seconds``, the transfer is aborted. A ``preferred_leader_id`` that is
caught up is handed leadership the same way.

``Election`` is a part of ``RaftNode`` (``hasvc.state.raft.node``), written apart: its methods
work on the node's state, which ``RaftNode.__init__`` declares, and never stand alone.
"""

from __future__ import annotations

import dataclasses
import math

from hasvc.state.raft import quorum
from hasvc.state.raft.messages import TimeoutNow, VoteRequest, VoteResponse, VoteResult
from hasvc.state.raft.ready import (
    BecameCandidate,
    BecameFollower,
    BecameLeader,
    ProposalDone,
    ProposalStatus,
    RefusalStatus,
    Refused,
    Role,
)
from hasvc.state.raft.storage import Entry

NO_OP = b""  # the body of the entry a new leader appends in its term


@dataclasses.dataclass(slots=True)
class Campaign:
    pre_vote: bool
    accepted: set[str]


@dataclasses.dataclass(slots=True)
class Transfer:
    target: str
    deadline: float
    sent: bool = False


class Election:
    """Roles, campaigns, votes and leadership transfer: a part of ``RaftNode`` (see the module)."""

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
        if not quorum.vote_won(len(campaign.accepted), self.quorum):
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
        self._progress.clear()
        self._progress.start(self.peers, compare_from, now, self._log)
        self._heartbeat_at = now  # announce the new leader on the way out of this event
        self._tick_leader(now)

    def _lost_quorum(self, now: float) -> bool:
        """Check-quorum: no quorum heard from within the election timeout (DLedger: 3 heartbeats)."""
        window = self.config.election_timeout_min_seconds
        if not self.config.check_quorum or now - self._became_leader_at < window:
            return False
        return not self._progress.quorum_active(now, window, self.quorum)

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
        elif (not m.pre_vote and m.term > self.term and not self._in_lease(now)
              and refusal in (VoteResult.REJECT_EXPIRED_LEDGER_TERM, VoteResult.REJECT_SMALL_LEDGER_END_INDEX)):  # fmt: skip
            # Refused for its log, the candidate's term is still adopted (Raft §5.1; DLedger does
            # not): a voter that stayed behind would campaign in a term that members with older
            # logs already spent voting for each other, and lose every round (raft_sim seed 7784,
            # 5 nodes, without pre-vote: two empty logs outran a member that could win). Not
            # within a live leader's lease (check-quorum), which such a request must not disturb.
            self._become_follower(m.term, None, now)
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
            or self._progress[preferred].disk_full  # no room there: it would hand back (disk_room)
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
