"""The majority counts of the Raft core (etcd-raft's ``quorum`` package): pure functions of numbers.

Theory of operation
-------------------
A group of ``n`` members decides by majority: ``quorum_size(n)`` is ``n // 2 + 1`` (DLedger's
isQuorum), so any two quorums share a member. Everything the core decides by counting is here:

* ``committed_index(marks, quorum)``: the highest index that at least ``quorum`` members hold,
  from one mark per member (a follower's match index, the leader's own last or flushed index),
  etcd's ``MajorityConfig.CommittedIndex``;
* ``leader_commit(...)``: the Raft paper's commit rule on top of it (DLedger has none): a leader
  commits by counting only an entry of its own term -- earlier ones commit with it, by log
  matching -- and its commit index never goes back;
* ``vote_won(accepted, quorum)``: a campaign (pre-vote or vote) won;
* ``quorum_active(last_contacts, ...)``: check-quorum, the leader's lease: a leader that heard
  from no quorum (itself included) within the window steps down.

Nothing here knows a member, a log or a clock: the core passes what it read (``term_at`` is
called only when the rule needs it, as the core's log reads are not free).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def quorum_size(members: int) -> int:
    """How many of ``members`` make a majority (``members`` >= 1)."""
    assert members >= 1, members
    return members // 2 + 1


def committed_index(marks: Iterable[int], quorum: int) -> int:
    """The highest index that at least ``quorum`` of ``marks`` reach (one mark per member, -1:
    nothing); ``quorum`` <= the number of marks."""
    ordered = sorted(marks, reverse=True)
    assert 1 <= quorum <= len(ordered), (quorum, len(ordered))
    return ordered[quorum - 1]


def leader_commit(committed: int, quorum_index: int, *, term: int, term_at: Callable[[int], int]) -> int:
    """The leader's commit index after counting: ``quorum_index`` (from ``committed_index``) if
    it is above ``committed`` and its entry is of the leader's ``term`` (``term_at(index)``: the
    leader's log, read only then), else ``committed`` -- never lower."""
    if quorum_index > committed and term_at(quorum_index) == term:
        return quorum_index
    return committed


def vote_won(accepted: int, quorum: int) -> bool:
    """Whether ``accepted`` grants (the candidate's own included) win a campaign."""
    return accepted >= quorum


def quorum_active(last_contacts: Iterable[float], *, now: float, window: float, quorum: int) -> bool:
    """Check-quorum: whether the leader (always live to itself) and the followers whose last
    contact is less than ``window`` before ``now`` make a quorum."""
    live = 1 + sum(1 for contact in last_contacts if now - contact < window)
    return live >= quorum
