"""The producer table behind idempotent sends (hasvc/state/dedupe.py), against a model."""

from hypothesis import given
from hypothesis import strategies as st

from hasvc.state.dedupe import ProducerTable, Stored, Verdict


def stored(offset: int) -> Stored:
    return Stored(offset, 100, 0, offset // 100)


def test_new_then_retry_then_partial_overlap():
    table = ProducerTable(window=8)
    assert table.lookup("p", 0, 3).verdict is Verdict.NEW
    table.remember("p", 0, [stored(0), stored(100), stored(200)])
    again = table.lookup("p", 0, 3)
    assert again.verdict is Verdict.DUPLICATE and [s.offset for s in again.stored] == [0, 100, 200]
    assert table.lookup("p", 1, 1).stored == (stored(100),)
    partial = table.lookup("p", 2, 2)
    assert partial.verdict is Verdict.REFUSED and "in part" in partial.reason
    assert table.lookup("p", 3, 5).verdict is Verdict.NEW
    assert table.lookup("q", 0, 3).verdict is Verdict.NEW  # another producer


def test_sequences_older_than_the_window_are_refused_not_guessed():
    table = ProducerTable(window=4)
    for sequence in range(10):
        table.remember("p", sequence, [stored(sequence * 100)])
    assert table.lookup("p", 9, 1).verdict is Verdict.DUPLICATE
    assert table.lookup("p", 6, 1).verdict is Verdict.DUPLICATE
    old = table.lookup("p", 5, 1)
    assert old.verdict is Verdict.REFUSED and "older than the 4 sequences remembered (highest 9)" in old.reason
    assert table.lookup("p", 10, 1).verdict is Verdict.NEW


def test_the_least_recently_used_producer_is_forgotten_first():
    table = ProducerTable(producers_max=2)
    table.remember("a", 0, [stored(0)])
    table.remember("b", 0, [stored(100)])
    table.lookup("a", 0, 1)  # a is used again
    table.remember("c", 0, [stored(200)])
    assert len(table) == 2
    assert table.lookup("a", 0, 1).verdict is Verdict.DUPLICATE
    assert table.lookup("b", 0, 1).verdict is Verdict.NEW  # forgotten: a retry of b's would be stored again


sends = st.lists(st.tuples(st.sampled_from("pqr"), st.integers(1, 4), st.booleans()), max_size=60)


@given(sends, st.integers(1, 16))
def test_against_a_model_a_retry_is_never_taken_for_a_new_message(operations, window):
    """Producers send batches with growing sequences and sometimes retry their latest batch; the
    table must answer DUPLICATE with the original offsets while the batch is in the window and
    never NEW for a batch it stored."""
    table = ProducerTable(window=window)
    next_sequence = {"p": 0, "q": 0, "r": 0}
    last_batch: dict[str, tuple[int, int, tuple]] = {}
    offset = 0
    for producer, count, retry in operations:
        if retry and producer in last_batch:
            first, n, where = last_batch[producer]
            lookup = table.lookup(producer, first, n)
            assert lookup.verdict is not Verdict.NEW
            if n <= window:
                assert lookup.verdict is Verdict.DUPLICATE and lookup.stored == where
            continue
        first = next_sequence[producer]
        next_sequence[producer] += count
        assert table.lookup(producer, first, count).verdict is Verdict.NEW
        where = tuple(stored(offset + 100 * i) for i in range(count))
        offset += 100 * count
        table.remember(producer, first, where)
        last_batch[producer] = (first, count, where)
