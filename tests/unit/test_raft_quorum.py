"""The Raft core's majority counts (``hasvc.state.raft.quorum``), tested apart from any node:
the commit index is the highest index a quorum holds, commits never go back and count only the
leader's own term, two quorums always share a member, votes and check-quorum count to a majority."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.state.raft import quorum

MARKS = st.lists(st.integers(min_value=-1, max_value=50), min_size=1, max_size=9)


def test_a_quorum_is_a_majority():
    assert [quorum.quorum_size(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


@given(st.integers(min_value=1, max_value=101))
def test_two_quorums_always_share_a_member(members):
    size = quorum.quorum_size(members)
    assert size <= members and 2 * size > members
    assert not quorum.vote_won(size - 1, size) and quorum.vote_won(size, size)


def test_the_committed_index_is_what_a_quorum_holds():
    assert quorum.committed_index([9, 4, 7], 2) == 7  # the leader at 9, followers at 4 and 7
    assert quorum.committed_index([9, -1, -1], 2) == -1  # no follower holds anything yet
    assert quorum.committed_index([5, 5, 1, 0, 5], 3) == 5
    assert quorum.committed_index([5, 4, 1, 0, 5], 3) == 4
    assert quorum.committed_index([3], 1) == 3  # a group of one commits alone


def test_the_committed_index_needs_as_many_marks_as_the_quorum():
    with pytest.raises(AssertionError):
        quorum.committed_index([3, 4], 3)


@given(MARKS)
def test_the_committed_index_is_the_highest_index_a_majority_has(marks):
    size = quorum.quorum_size(len(marks))
    index = quorum.committed_index(marks, size)
    assert sum(1 for mark in marks if mark >= index) >= size  # a quorum holds it
    assert sum(1 for mark in marks if mark >= index + 1) < size  # and no higher one
    assert index in marks


@given(MARKS, st.data())
def test_the_committed_index_ignores_order_and_never_falls_when_a_mark_rises(marks, data):
    size = quorum.quorum_size(len(marks))
    index = quorum.committed_index(marks, size)
    assert quorum.committed_index(data.draw(st.permutations(marks)), size) == index
    raised = list(marks)
    at = data.draw(st.integers(min_value=0, max_value=len(marks) - 1))
    raised[at] += data.draw(st.integers(min_value=0, max_value=10))
    assert quorum.committed_index(raised, size) >= index


def _no_read(index):
    raise AssertionError(f"the log was read at {index}")


def test_the_leader_commits_by_counting_only_an_entry_of_its_own_term():
    terms = [1, 1, 2, 2, 3]  # the leader leads term 3; entries 0..4
    assert quorum.leader_commit(-1, 3, term=3, term_at=terms.__getitem__) == -1  # entry 3 is of term 2
    assert quorum.leader_commit(-1, 4, term=3, term_at=terms.__getitem__) == 4  # entry 4 carries 0..3 with it
    assert quorum.leader_commit(4, 3, term=3, term_at=_no_read) == 4  # never back, and no read for it
    assert quorum.leader_commit(4, 4, term=3, term_at=_no_read) == 4


@st.composite
def leader_terms(draw):
    """A leader's log: terms never decrease, the last entries (at least its no-op) of its own term."""
    earlier = draw(st.lists(st.integers(min_value=1, max_value=4), max_size=12))
    own = draw(st.integers(min_value=1, max_value=6))
    term = max(earlier, default=0) + draw(st.integers(min_value=1, max_value=2))
    return sorted(earlier) + [term] * own, term


@given(leader_terms(), st.integers(min_value=1, max_value=4), st.data())
def test_the_commit_index_never_decreases_within_a_term_and_lands_only_on_the_leaders_term(log, followers, data):
    """Acknowledgements arrive in any order (each follower's match index only rises within a
    term); the commit index after each is never lower, is always held by a quorum, and each
    rise lands on an entry of the leader's term. Once a quorum holds the last entry, it is committed."""
    terms, term = log
    last = len(terms) - 1
    size = quorum.quorum_size(followers + 1)
    matches = [-1] * followers
    committed = data.draw(st.integers(min_value=-1, max_value=terms.index(term) - 1))  # what earlier leaders did
    acknowledgements = data.draw(st.lists(st.tuples(st.integers(0, followers - 1), st.integers(-1, last)), max_size=30))
    for follower, index in itertools.chain(acknowledgements, ((f, last) for f in range(followers))):
        matches[follower] = max(matches[follower], index)
        quorum_index = quorum.committed_index([last, *matches], size)
        before = committed
        committed = quorum.leader_commit(committed, quorum_index, term=term, term_at=terms.__getitem__)
        assert committed >= before
        assert committed <= quorum_index or committed == before
        if committed != before:
            assert terms[committed] == term
    assert committed == last


def test_check_quorum_counts_the_leader_and_the_followers_heard_within_the_window():
    now, window = 10.0, 1.0
    assert quorum.quorum_active([], now=now, window=window, quorum=1)  # a group of one
    assert not quorum.quorum_active([8.0, 9.0], now=now, window=window, quorum=2)  # 9.0: exactly a window ago
    assert quorum.quorum_active([8.0, 9.5], now=now, window=window, quorum=2)
    assert not quorum.quorum_active([9.5, 2.0, float("-inf"), 9.9 - 5], now=now, window=window, quorum=3)
    assert quorum.quorum_active([9.5, 9.1, float("-inf"), 4.9], now=now, window=window, quorum=3)
