"""The leader's view of each follower (``hasvc.state.raft.tracker``), tested apart from any node:
COMPARE finds where a follower's log agrees with the leader's (a whole older term per round
trip), TRUNCATE and APPEND follow, a follower that lost entries is counted for no more than it
holds, the in-flight window and its re-push timer, RESET for a follower behind the leader's first
index, and the aggregates over all followers."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.state.raft.log_view import LogView
from hasvc.state.raft.messages import PushResponse, PushResult, PushType
from hasvc.state.raft.storage import Entry
from hasvc.state.raft.tracker import Progress, ProgressMap, last_index_with_term_at_most
from hasvc.testing.log import SimLog

LEADER_TERM = 9


def leader_log(terms, *, first_index=0):
    """A LogView over a SimLog holding entries of ``terms`` (retention ran below ``first_index``)."""
    log = SimLog()
    log.append([Entry(i, term, b"x%d" % i) for i, term in enumerate(terms)])
    if first_index:
        log.flush()
        log.compact(keep_from_index=first_index, committed_index=len(terms) - 1)
        assert log.first_index() == first_index
    return LogView(log)


def answer(kind, result, *, request_index, end_index, ack_index=-1, term_at_index=-1):
    return PushResponse("n1", "n0", LEADER_TERM, kind, result, request_index, ack_index, 0, end_index, term_at_index)


def started(log, *, now=0.0):
    """A new leader's progress for n1 (its end before the no-op: its last index but one)."""
    progress = ProgressMap()
    progress.start(["n1"], log.last_index() - 1, now, log)
    return progress["n1"]


def test_a_new_leader_compares_from_its_end_before_its_no_op():
    log = leader_log([1, 1, 2, 2, LEADER_TERM])
    progress = started(log, now=5.0)
    assert (progress.state, progress.index, progress.match_index, progress.last_contact_at) == (
        PushType.COMPARE, 3, -1, 5.0)  # fmt: skip


def test_a_new_leader_with_nothing_but_its_no_op_appends_from_zero():
    progress = started(leader_log([LEADER_TERM]))
    assert (progress.state, progress.index) == (PushType.APPEND, 0)


def test_compare_skips_a_whole_older_term_then_truncates_then_appends():
    # Leader: 0..2 of term 1, 3..5 of term 3, no-op 6. Follower: 0..2 of term 1, 3..7 of term 2.
    log = leader_log([1, 1, 1, 3, 3, 3, LEADER_TERM])
    progress = started(log)
    assert (progress.state, progress.index) == (PushType.COMPARE, 5)
    progress.on_response(answer(PushType.COMPARE, PushResult.MISMATCH, request_index=5, end_index=7,
                                term_at_index=2), 1.0, log)  # fmt: skip
    # Nothing of the leader's between the last entry of a term <= 2 (index 2) and 5 can match.
    assert (progress.state, progress.index, progress.compare_mismatch_from) == (PushType.COMPARE, 2, 3)
    progress.on_response(answer(PushType.COMPARE, PushResult.SUCCESS, request_index=2, end_index=7, ack_index=2),
                         2.0, log)  # fmt: skip
    assert (progress.state, progress.index, progress.match_index) == (PushType.TRUNCATE, 2, 2)
    progress.on_response(answer(PushType.TRUNCATE, PushResult.SUCCESS, request_index=2, end_index=2, ack_index=2),
                         3.0, log)  # fmt: skip
    assert (progress.state, progress.index, progress.sent_at) == (PushType.APPEND, 3, None)
    assert progress.last_contact_at == 3.0


def test_a_follower_without_the_compared_entry_is_compared_at_its_end():
    log = leader_log([1, 1, 1, 1, LEADER_TERM])
    progress = started(log)
    progress.on_response(answer(PushType.COMPARE, PushResult.MISMATCH, request_index=3, end_index=1), 1.0, log)
    assert (progress.state, progress.index, progress.follower_end) == (PushType.COMPARE, 1, 1)
    progress.on_response(answer(PushType.COMPARE, PushResult.SUCCESS, request_index=1, end_index=1, ack_index=1),
                         2.0, log)  # fmt: skip
    assert (progress.state, progress.index) == (PushType.APPEND, 2)  # its log is a prefix of ours


def test_a_response_to_another_request_changes_nothing_but_the_contact():
    log = leader_log([1, 1, 1, 1, LEADER_TERM])
    progress = started(log)
    progress.on_response(answer(PushType.COMPARE, PushResult.SUCCESS, request_index=1, end_index=3), 4.0, log)
    assert (progress.state, progress.index, progress.last_contact_at) == (PushType.COMPARE, 3, 4.0)
    progress.on_response(answer(PushType.TRUNCATE, PushResult.SUCCESS, request_index=3, end_index=3), 5.0, log)
    assert (progress.state, progress.index) == (PushType.COMPARE, 3)


def test_an_acknowledgement_beyond_the_leaders_log_is_refused():
    log = leader_log([1, LEADER_TERM])
    progress = started(log)
    with pytest.raises(ValueError, match="n1 acknowledges 5 beyond the leader's last index 1"):
        progress.on_response(answer(PushType.APPEND, PushResult.SUCCESS, request_index=0, end_index=5, ack_index=5),
                             1.0, log)  # fmt: skip


def appending(log, *, index, match_index, sent_at=None):
    return Progress(PushType.APPEND, index, match_index=match_index, sent_at=sent_at, follower_end=match_index)


def test_a_follower_that_lost_entries_is_counted_for_what_it_holds_and_compared_again():
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=11, match_index=10, sent_at=1.0)
    progress.on_response(answer(PushType.APPEND, PushResult.OUT_OF_ORDER, request_index=-1, end_index=6), 2.0, log)
    assert (progress.match_index, progress.state, progress.index, progress.follower_end) == (
        6, PushType.COMPARE, 6, 6)  # fmt: skip


def test_acknowledgements_raise_the_match_index_and_restart_the_timer():
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=11, match_index=3, sent_at=1.0)
    progress.on_response(answer(PushType.APPEND, PushResult.SUCCESS, request_index=4, end_index=8, ack_index=8),
                         2.0, log)  # fmt: skip
    assert (progress.match_index, progress.sent_at, progress.index) == (8, 2.0, 11)
    progress.on_response(answer(PushType.APPEND, PushResult.SUCCESS, request_index=4, end_index=8, ack_index=5),
                         3.0, log)  # fmt: skip
    assert (progress.match_index, progress.sent_at) == (8, 2.0)  # an older acknowledgement: no change


def test_an_append_out_of_order_goes_back_to_the_followers_end():
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=11, match_index=2)
    progress.on_response(answer(PushType.APPEND, PushResult.OUT_OF_ORDER, request_index=9, end_index=4), 1.0, log)
    assert (progress.state, progress.index) == (PushType.APPEND, 5)
    progress.match_index = 6  # acknowledged meanwhile (a response that passed the OUT_OF_ORDER)
    progress.on_response(answer(PushType.APPEND, PushResult.OUT_OF_ORDER, request_index=9, end_index=8), 1.0, log)
    assert progress.index == 7  # never at or below the match index


def test_an_append_refused_as_inconsistent_compares_again():
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=11, match_index=2)
    progress.on_response(answer(PushType.APPEND, PushResult.INCONSISTENT_STATE, request_index=9, end_index=8), 1.0,
                         log)  # fmt: skip
    assert (progress.state, progress.index) == (PushType.COMPARE, 8)


def test_the_in_flight_window_and_its_timer():
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=3, match_index=2)
    assert progress.window_open(3)
    progress.appended(2, 1.0)
    progress.appended(1, 1.5)
    assert (progress.index, progress.sent_at) == (6, 1.0)  # the oldest push is timed
    assert not progress.window_open(3) and progress.window_open(4)
    progress.appends_sent(1.5)
    assert progress.sent_at == 1.0
    progress.before_push(1.9, 1.0, log, log.first_index())
    assert (progress.index, progress.sent_at) == (6, 1.0)  # not yet timed out
    progress.before_push(2.0, 1.0, log, log.first_index())
    assert (progress.index, progress.sent_at) == (3, None)  # pushed again from the match index
    progress.match_index = 2
    progress.appends_sent(2.0)
    assert progress.sent_at is None  # nothing unacknowledged: nothing to time


def test_entries_the_follower_may_hold_already_are_timed():
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=8, match_index=2)  # COMPARE found 3..7 there, unacknowledged
    progress.appends_sent(4.0)
    assert progress.sent_at == 4.0


def test_a_follower_behind_the_leaders_first_index_is_reset_and_then_appended_to():
    log = leader_log([1] * 10 + [LEADER_TERM], first_index=6)
    progress = appending(log, index=4, match_index=3)
    assert progress.needs_deleted_entry(log)
    progress.before_push(1.0, 1.0, log, log.first_index())
    assert (progress.state, progress.index, progress.sent_at) == (PushType.RESET, 6, None)
    assert ProgressMap(n1=progress).statuses(log.last_index(), 1.0)["n1"].behind_log_start
    progress.on_response(answer(PushType.RESET, PushResult.SUCCESS, request_index=6, end_index=5, ack_index=5), 2.0,
                         log)  # fmt: skip
    assert (progress.state, progress.index, progress.match_index) == (PushType.APPEND, 6, 5)


def test_a_reset_refused_compares_again():
    log = leader_log([1] * 10 + [LEADER_TERM], first_index=6)
    progress = Progress(PushType.RESET, 6)
    progress.on_response(answer(PushType.RESET, PushResult.INCONSISTENT_STATE, request_index=6, end_index=8), 1.0,
                         log)  # fmt: skip
    assert (progress.state, progress.index) == (PushType.COMPARE, 8)


@pytest.mark.parametrize(("state", "index", "needs"), [
    (PushType.COMPARE, 5, True), (PushType.COMPARE, 6, False), (PushType.TRUNCATE, 5, True),
    (PushType.TRUNCATE, 6, False), (PushType.COMPARE, -1, False), (PushType.APPEND, 5, True),
    (PushType.APPEND, 6, False),
])  # fmt: skip
def test_which_pushes_would_name_a_deleted_entry(state, index, needs):
    log = leader_log([1] * 10 + [LEADER_TERM], first_index=6)
    assert Progress(state, index).needs_deleted_entry(log) is needs


def test_the_aggregates_over_all_followers():
    progress = ProgressMap(
        n1=Progress(PushType.APPEND, 8, match_index=7, sent_at=3.0, last_contact_at=9.5),
        n2=Progress(PushType.APPEND, 5, match_index=4, sent_at=None, last_contact_at=2.0),
        n3=Progress(PushType.COMPARE, 2, match_index=-1, sent_at=2.5, last_contact_at=9.0),
        n4=Progress(PushType.APPEND, 9, match_index=8, sent_at=None, last_contact_at=8.0),
    )
    assert progress.quorum_index(9, 3) == 7  # the leader at 9, followers at 8, 7, 4, -1
    assert progress.lowest_match(6) == -1
    assert progress.next_push_timeout(1.0) == 3.5
    assert progress.quorum_active(10.0, 1.5, 3)  # the leader, n1 and n3
    assert not progress.quorum_active(10.0, 1.0, 3)  # n3 heard from exactly a window ago: not live
    assert not progress.quorum_active(10.0, 0.75, 3)  # the leader and n1
    statuses = progress.statuses(9, 10.0)
    assert (statuses["n2"].match_index, statuses["n2"].lag_entries, statuses["n2"].last_contact_seconds) == (4, 5, 8.0)
    assert progress.match_index("n9") == -1 and progress.last_contact_at("n9") == -math.inf
    assert ProgressMap().next_push_timeout(1.0) == math.inf


def test_the_last_index_of_a_term_at_most():
    log = leader_log([1, 1, 3, 3, 5, 5, 5])
    assert [last_index_with_term_at_most(log, term, 6) for term in (0, 1, 2, 3, 4, 5)] == [-1, 1, 1, 3, 3, 6]
    assert last_index_with_term_at_most(log, 5, 2) == 2


@st.composite
def diverged_logs(draw):
    """A leader's log (odd terms, its no-op last) and a follower's that shares a prefix of it and
    then holds entries of even terms no leader's log has (so no (index, term) of its tail matches)."""
    leader = sorted(draw(st.lists(st.sampled_from([1, 3, 5]), max_size=12)))
    shared = draw(st.integers(min_value=0, max_value=len(leader)))
    floor = leader[shared - 1] if shared else 0
    tail = sorted(draw(st.lists(st.sampled_from([t for t in (2, 4, 6) if t > floor] or [6]), max_size=10)))
    return leader + [7], leader[:shared] + tail


@given(diverged_logs())
def test_compare_truncate_append_converges_on_the_shared_prefix(logs):
    """Against an honest follower, COMPARE narrows down to the end of the shared prefix, the
    follower's divergent tail (if any) is truncated, and APPEND starts right after it: the
    follower then holds exactly the shared prefix. An APPEND that overlaps a divergent tail (a
    new leader with nothing but its no-op appends at once) is refused and COMPARE starts again."""
    leader_terms, follower_terms = logs
    shared = next((i for i, (a, b) in enumerate(zip(leader_terms, follower_terms)) if a != b),
                  min(len(leader_terms), len(follower_terms)))  # fmt: skip
    log = leader_log(leader_terms)
    follower = list(follower_terms)
    progress = started(log)
    for now in range(2 * (len(leader_terms) + len(follower_terms)) + 5):
        index, end = progress.index, len(follower) - 1
        if progress.state is PushType.APPEND:
            overlap_end = min(end, len(leader_terms) - 1)
            if index > end or follower[overlap_end] == leader_terms[overlap_end]:
                break  # the follower takes the push (what it holds of it matches)
            progress.on_response(answer(PushType.APPEND, PushResult.INCONSISTENT_STATE, request_index=index,
                                        end_index=end), float(now), log)  # fmt: skip
        elif progress.state is PushType.COMPARE:
            same = index == -1 or (index <= end and follower[index] == leader_terms[index])
            result = PushResult.SUCCESS if same else PushResult.MISMATCH
            term_there = follower[index] if 0 <= index <= end else -1
            progress.on_response(answer(PushType.COMPARE, result, request_index=index, end_index=end,
                                        term_at_index=-1 if same else term_there), float(now), log)  # fmt: skip
        else:
            assert progress.state is PushType.TRUNCATE
            assert index == shared - 1  # only the divergent tail goes
            del follower[index + 1:]
            progress.on_response(answer(PushType.TRUNCATE, PushResult.SUCCESS, request_index=index,
                                        end_index=index), float(now), log)  # fmt: skip
    else:
        raise AssertionError(f"no APPEND the follower takes: {progress}")
    assert progress.index == shared
    assert follower == leader_terms[:shared]


def test_after_out_of_order_one_batch_at_a_time_until_acknowledged():
    """etcd's probe: an OUT_OF_ORDER sends the leader back to the follower's end with one batch in
    flight; the same end said again while that batch's timer runs changes nothing (another push
    of the old window, a duplicate, a member whose rebuilt core forgot it answered); an
    acknowledgement opens the whole window again, a timeout sends the one batch again."""
    log = leader_log([1] * 10 + [LEADER_TERM])
    progress = appending(log, index=11, match_index=2, sent_at=1.0)
    out_of_order = answer(PushType.APPEND, PushResult.OUT_OF_ORDER, request_index=9, end_index=4)
    progress.on_response(out_of_order, 1.1, log)
    assert (progress.index, progress.probe_from) == (5, 5) and progress.window_open(1000)
    progress.appended(1, 1.1)
    assert progress.index == 6 and not progress.window_open(1000)  # the probe is in flight
    progress.on_response(out_of_order, 1.2, log)
    assert (progress.index, progress.probe_from) == (6, 5)  # said again: ignored
    progress.before_push(2.0, 0.5, log, log.first_index())  # the oldest push (at 1.0) timed out
    assert (progress.index, progress.probe_from, progress.sent_at) == (3, 3, None)
    progress.appended(1, 2.0)
    assert not progress.window_open(1000)  # again one batch
    progress.on_response(answer(PushType.APPEND, PushResult.SUCCESS, request_index=3, end_index=3, ack_index=3),
                         2.1, log)  # fmt: skip
    assert progress.probe_from is None and progress.window_open(1000)  # it appends: the whole window
    progress.on_response(answer(PushType.APPEND, PushResult.OUT_OF_ORDER, request_index=9, end_index=7), 2.2, log)
    assert (progress.index, progress.probe_from) == (4, None)  # an end past ours: stale, nothing rewound
