import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog.epoch import EpochEntry, EpochFile, find_consistent_point, truncate_suffix_by_offset
from commitlog.mapped_file import StoreError

MAX = 2**63 - 1


def history(*pairs):
    return [EpochEntry(e, s) for e, s in pairs]


# The four cases of RocketMQ's EpochFileCacheTest (notes section 7.1).
def test_golden_case_diverged_last_epoch_gives_the_end_of_the_shared_one():
    local = history((1, 100), (2, 300), (3, 500))
    other = history((1, 100), (2, 300), (3, 450))
    assert find_consistent_point(local, 700, other, 700) == 450


def test_golden_case_same_epochs_gives_the_shorter_end():
    local = history((1, 100), (2, 300), (3, 500))
    other = history((1, 100), (2, 300), (3, 500))
    assert find_consistent_point(local, 700, other, 600) == 600


def test_golden_case_nothing_shared_gives_minus_one():
    local = history((1, 100), (2, 300), (3, 500))
    other = history((1, 200), (2, 500))
    assert find_consistent_point(local, 700, other, 700) == -1


def test_golden_case_local_newer_epoch_falls_back_to_the_shared_one():
    local = history((1, 100), (2, 300), (3, 500), (4, 800))
    other = history((1, 100), (2, 300), (3, 500))
    assert find_consistent_point(local, 900, other, 700) == 700


@st.composite
def forked_histories(draw):
    """A shared history, then each side's own later epochs (as after a failover)."""
    shared_count = draw(st.integers(1, 5))
    starts = sorted(draw(st.lists(st.integers(0, 10_000), min_size=shared_count, max_size=shared_count)))
    shared = [EpochEntry(i + 1, s) for i, s in enumerate(starts)]
    fork = draw(st.integers(starts[-1], 12_000))
    a_extra = draw(st.lists(st.integers(fork, 20_000), max_size=3, unique=True))
    b_extra = draw(st.lists(st.integers(fork, 20_000), max_size=3, unique=True))
    a = shared + [EpochEntry(shared_count + 1 + i, s) for i, s in enumerate(sorted(a_extra))]
    b = shared + [EpochEntry(shared_count + 10 + i, s) for i, s in enumerate(sorted(b_extra))]
    a_end = max([fork, *(e.start_offset for e in a)]) + draw(st.integers(0, 500))
    b_end = max([fork, *(e.start_offset for e in b)]) + draw(st.integers(0, 500))
    return shared, fork, a, a_end, b, b_end


@given(forked_histories())
def test_forked_histories_agree_up_to_the_fork(case):
    shared, fork, a, a_end, b, b_end = case
    point = find_consistent_point(a, a_end, b, b_end)
    assert point == find_consistent_point(b, b_end, a, a_end)
    assert 0 <= point <= min(a_end, b_end)
    last_shared = len(shared) - 1  # the newest entry both have: each side's own epochs differ
    a_shared_end = a[last_shared + 1].start_offset if len(a) > len(shared) else a_end
    b_shared_end = b[last_shared + 1].start_offset if len(b) > len(shared) else b_end
    assert point == min(a_shared_end, b_shared_end)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=6), st.integers(0, 1000))
def test_a_history_agrees_with_itself_to_its_end(starts, extra):
    entries = [EpochEntry(i + 1, s) for i, s in enumerate(sorted(starts))]
    end = entries[-1].start_offset + extra
    assert find_consistent_point(entries, end, entries, end) == end


def test_epoch_file_round_trips_and_survives_a_damaged_main_file(tmp_path):
    epoch_file = EpochFile.open(str(tmp_path))
    assert epoch_file.entries == [] and epoch_file.last_epoch == 0
    epoch_file.append(1, 0)
    epoch_file.append(2, 4096)
    assert EpochFile.open(str(tmp_path)).entries == history((1, 0), (2, 4096))
    raw = (tmp_path / "epoch").read_text()
    assert raw.splitlines()[:1] == ["2"] and raw.endswith("1-0\n2-4096\n")
    (tmp_path / "epoch").write_text(raw.replace("4096", "4097"))  # checksum no longer matches
    assert EpochFile.open(str(tmp_path)).entries == history((1, 0), (2, 4096))  # the whole history, from .bak
    (tmp_path / "epoch.bak").write_text("garbage")
    with pytest.raises(StoreError, match="checksum mismatch"):
        EpochFile.open(str(tmp_path))


def test_epochs_must_grow_and_truncation_drops_later_entries(tmp_path):
    epoch_file = EpochFile.open(str(tmp_path))
    epoch_file.append(3, 100)
    with pytest.raises(ValueError, match="must grow"):
        epoch_file.append(3, 200)
    with pytest.raises(ValueError, match="must grow"):
        epoch_file.append(4, 50)
    entries = history((1, 0), (2, 100), (3, 300))
    assert truncate_suffix_by_offset(entries, 300) == history((1, 0), (2, 100))
    assert truncate_suffix_by_offset(entries, 301) == entries


def test_drill_file_check_catches_an_epoch_inside_a_record_and_an_overclaiming_checkpoint(tmp_path):
    from commitlog.record import Message
    from commitlog.store import MessageStore
    from hasvc.tools.drill import files_agree_with_log

    with MessageStore.open(str(tmp_path)) as store:
        first = store.append([Message("T", b"x" * 100)])
        store.append([Message("T", b"y" * 100)])
        end = store.commit_log.max_offset
    status = {"max_offset": end, "min_offset": 0, "epochs": [[1, 0], [2, first.next_offset]]}
    assert files_agree_with_log(str(tmp_path), status)
    assert not files_agree_with_log(str(tmp_path), {**status, "epochs": [[1, 0], [2, first.next_offset + 1]]})
    assert not files_agree_with_log(str(tmp_path), {**status, "max_offset": first.next_offset})  # checkpoint claims more


def test_a_damaged_copy_is_written_anew_when_a_store_opens(tmp_path):
    """One copy damaged while the other reads: heal() writes both again, so that a later damage
    to the other is still survived (a drill found a damaged copy left as it was, then the main
    file damaged too: no history left)."""
    epoch_file = EpochFile.open(str(tmp_path))
    epoch_file.append(1, 0)
    epoch_file.append(2, 4096)
    (tmp_path / "epoch.bak").write_text("garbage")
    reopened = EpochFile.open(str(tmp_path))
    assert reopened.entries == history((1, 0), (2, 4096)) and "epoch.bak" in reopened.damaged
    assert "epoch.bak" in reopened.heal() and reopened.heal() == ""
    (tmp_path / "epoch").write_text("garbage")  # now the main file: the rewritten copy holds the history
    assert EpochFile.open(str(tmp_path)).entries == history((1, 0), (2, 4096))
