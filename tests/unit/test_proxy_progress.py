"""The proxy's consumer-group progress (hasvc/proxy/progress.py): events, invariants, replay."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hasvc.proxy.progress import DEADLINES_SLACK, DEADLINES_SLACK_MIN, INFLIGHT_PER_QUEUE_MAX, ProgressError, ProgressTable

KEY = ("G", "T", 0)


def ev(kind, *fields):
    return [kind, *KEY, *fields]


def test_acks_out_of_order_commit_only_a_contiguous_prefix():
    table = ProgressTable()
    for offset in range(4):
        table.apply(ev("d", offset, 100 + offset, 1000, 1))
    table.apply(ev("a", 2))
    progress = table.queues[KEY]
    assert (progress.committed, progress.next_new, sorted(progress.inflight), progress.acked) == (0, 4, [0, 1, 3], {2})
    table.apply(ev("a", 0))
    table.apply(ev("a", 1))
    assert (progress.committed, sorted(progress.inflight), progress.acked) == (3, [3], set())


def test_expired_deliveries_are_offered_again_and_a_change_moves_the_deadline():
    table = ProgressTable()
    table.apply(ev("d", 0, 7, 1000, 1))
    table.apply(ev("d", 1, 8, 5000, 1))
    progress = table.queues[KEY]
    assert progress.expired(999) == [] and progress.expired(1000) == [0]
    table.apply(ev("c", 0, 9, 6000))
    assert progress.expired(5000) == [1] and progress.inflight[0].nonce == 9 and progress.inflight[0].attempt == 1
    assert progress.next_deadline() == 5000


def test_a_delivery_of_an_acknowledged_offset_changes_nothing():
    table = ProgressTable()
    table.apply(ev("d", 0, 1, 10, 1))
    table.apply(ev("a", 0))
    table.apply(ev("d", 0, 2, 20, 2))  # replayed from an older position
    assert table.queues[KEY].inflight == {} and table.queues[KEY].committed == 1


def test_skip_drops_what_retention_removed():
    table = ProgressTable()
    table.apply(ev("d", 0, 1, 10, 1))
    table.apply(ev("s", 5))
    progress = table.queues[KEY]
    assert (progress.committed, progress.next_new, progress.inflight) == (5, 5, {})


def test_a_skip_keeps_the_acknowledgement_at_its_offset():
    table = ProgressTable()
    table.apply(ev("d", 0, 1, 10, 1))
    table.apply(ev("a", 1))
    table.apply(ev("s", 1))
    progress = table.queues[KEY]
    assert (progress.committed, progress.next_new, progress.acked) == (2, 2, set())


def test_a_gap_is_refused():
    table = ProgressTable()
    table.apply(ev("d", 0, 1, 10, 1))
    with pytest.raises(ProgressError, match="gap"):
        table.apply(ev("d", 2, 1, 10, 1))
    assert table.queues[KEY].next_new == 1


def test_room_is_bounded():
    table = ProgressTable()
    table.apply(ev("d", 0, 1, 10, 1))
    assert table.queues[KEY].room() == INFLIGHT_PER_QUEUE_MAX - 1


@pytest.mark.parametrize("event", [["d", "G", "T", 0, 1], ["x", "G", "T", 0, 1], ["a", "G", "T", "q", 1], ["a"], "ad", None])
def test_malformed_events_are_refused_with_a_reason(event):
    with pytest.raises(ProgressError):
        ProgressTable().apply(event)


def test_a_malformed_snapshot_is_refused():
    with pytest.raises(ProgressError):
        ProgressTable().load([["G", "T", 0, 5, 2, [], []]])  # committed beyond next_new


events_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("d"), st.integers(0, 20), st.integers(0, 2**63 - 1), st.integers(0, 10**6), st.integers(1, 5)),
        st.tuples(st.just("a"), st.integers(0, 20)),
        st.tuples(st.just("c"), st.integers(0, 20), st.integers(0, 2**63 - 1), st.integers(0, 10**6)),
        st.tuples(st.just("s"), st.integers(0, 20)),
    ).map(lambda t: [t[0], "G", "T", 0, *t[1:]]),
    max_size=60,
)


@given(events_strategy, st.integers(0, 60))
def test_replaying_from_an_older_snapshot_gives_the_same_state(events, cut):
    """A snapshot may reflect events written after the position it names: replaying them again
    on it must give the state of applying every event once."""
    whole = ProgressTable()
    accepted = []
    for event in events:
        try:
            whole.apply(event)
        except ProgressError:
            continue  # a gap: the gateway never makes one
        accepted.append(event)
    events = accepted
    older = ProgressTable()
    for event in events[: min(cut, len(events))]:
        older.apply(event)
    base = min(cut, len(events)) // 2  # the snapshot names an earlier position than it reflects
    restored = ProgressTable()
    restored.load(json.loads(json.dumps(older.snapshot())))
    for event in events[base:]:
        restored.apply(event)
    assert restored.snapshot() == whole.snapshot()


@given(events_strategy, st.lists(st.integers(0, 10**6), min_size=1, max_size=8))
def test_every_invariant_holds_after_each_event_and_expired_matches_a_full_scan(events, nows):
    """The O(1) checks after each event and the deadline heap against the slow truth: a walk of
    the whole queue (check_all) and a scan of every in-flight deadline."""
    table = ProgressTable()
    for index, event in enumerate(events):
        try:
            table.apply(event)
        except ProgressError:
            continue
        progress = table.queues.get(KEY)
        if progress is None:
            continue
        progress.check_all()
        now = nows[index % len(nows)]
        assert progress.expired(now) == sorted(o for o, each in progress.inflight.items() if each.deadline_ms <= now)
        progress.check_all()


def test_the_deadline_heap_stays_bounded_while_a_long_delivery_holds_its_top():
    """One delivery with the earliest deadline is never acknowledged while thousands of later ones
    are: the heap is rebuilt instead of growing with every stale entry behind it."""
    table = ProgressTable()
    table.apply(ev("d", 0, 1, 10, 1))  # held, deadline 10: the top of the heap
    for offset in range(1, 5000):
        table.apply(ev("d", offset, offset, 1000 + offset, 1))
        table.apply(ev("a", offset))
        assert table.queues[KEY].expired(5) == []
    progress = table.queues[KEY]
    progress.check_all()
    assert len(progress.deadlines) <= DEADLINES_SLACK * len(progress.inflight) + DEADLINES_SLACK_MIN
    assert progress.expired(10) == [0]
