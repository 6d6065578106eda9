"""Reads check records on the way out (commitlog/read_check.py): a flipped byte in a stored record
is never handed out by ``pull``/``get_record``/``read_records``/``read_checked``; the damage is
named (offset, file, reason) and kept once in ``store.damaged``; the native and Python walks agree."""

import os

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import native
from commitlog import read_check
from commitlog import record as rec
from commitlog import scan
from commitlog.commit_log import ReadError
from commitlog.damage import DamagedRange
from commitlog.read_check import DamagedRecordError
from commitlog.store import MessageStore
from tests.unit.test_dledger_message_store import lead, message, noop, open_store
from tests.unit.test_record import _log_of, messages
from tests.unit.test_record_crc import _log_of as _sealed_log_of

WALKS = [False, True] if native.AVAILABLE else [False]


@pytest.fixture(params=WALKS, ids=lambda n: "native" if n else "python")
def walk(request, monkeypatch):
    """Every test runs on the Python walk and, when built, the native one."""
    monkeypatch.setattr(scan, "_USE_NATIVE", request.param)
    return request.param


def flip(path: str, position: int) -> None:
    """One bit of the file at ``position`` flipped, as a bad disk would (an open store's mapping
    sees it: the file and the mapping share the page cache)."""
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0x10]))


def filled(tmp_path, config, count=120):
    """A store with ``count`` records, queue 0 and queue 1 alternating; their offsets and sizes."""
    store = MessageStore.open(str(tmp_path), config)
    places = []
    for i in range(count):
        result = store.append([rec.Message("T", bytes([i % 251]) * 200, queue_id=i % 2)])
        places.append((result.offsets[0], result.wrote_bytes))
    store.dispatch()
    return store, places


def segment_of(store, offset) -> str:
    return store.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset).path


def flip_body(store, offset) -> None:
    """A body byte of the record at ``offset`` (its body starts well after 100 bytes of header)."""
    mapped_file = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset)
    flip(mapped_file.path, offset - mapped_file.file_from_offset + 120)


def test_pull_hands_out_the_records_before_a_damaged_one_then_refuses_at_it(tmp_path, small_config, walk):
    store, places = filled(tmp_path, small_config)
    try:
        damaged_offset, damaged_size = places[2 * 30]  # queue 0, queue offset 30
        flip_body(store, damaged_offset)
        pulled = store.pull("T", 0, 0, 100)
        assert [r.queue_offset for r in pulled] == list(range(30))
        with pytest.raises(DamagedRecordError, match=f"record at offset {damaged_offset} is damaged .body CRC mismatch") as error:
            store.pull("T", 0, 30, 100)
        expected = DamagedRange(segment_of(store, damaged_offset), damaged_offset, damaged_offset + damaged_size, "body CRC mismatch")
        assert error.value.damage == expected
        assert store.damaged == [expected]  # found by two reads, kept once
        assert [r.queue_offset for r in store.pull("T", 0, 31, 5)] == [31, 32, 33, 34, 35]
        assert len(store.pull("T", 1, 0, 100)) == 60  # the other queue's records are untouched
    finally:
        store.close()


def test_get_record_with_check_crc_raises_the_damage(tmp_path, small_config):
    store, places = filled(tmp_path, small_config)
    try:
        offset, size = places[7]
        flip_body(store, offset)
        assert store.get_record(offset).physical_offset == offset  # unchecked, as asked
        with pytest.raises(DamagedRecordError, match=f"offset {offset}") as error:
            store.get_record(offset, check_crc=True)
        assert (error.value.damage.from_offset, error.value.damage.to_offset) == (offset, offset + size)
        assert len(store.damaged) == 1
    finally:
        store.close()


def test_with_check_crc_on_read_off_a_damaged_record_is_handed_out(tmp_path, small_config):
    """What the setting turns off (and what every read did before the check)."""
    import dataclasses

    store, places = filled(tmp_path, dataclasses.replace(small_config, check_crc_on_read=False))
    try:
        offset, _ = places[0]
        flip_body(store, offset)
        record = store.pull("T", 0, 0, 1)[0]
        assert crc32c.crc32c(record.body) & rec.CRC_MASK != record.body_crc
        assert store.read_checked(offset, 4096).damage is None and store.damaged == []
    finally:
        store.close()


def test_read_records_walks_a_run_of_adjacent_records_and_stops_at_the_damage(tmp_path, small_config, walk):
    store, places = filled(tmp_path, small_config, count=40)
    try:
        flip_body(store, places[25][0])
        checked = store.read_records(places[10:35])
        assert [bytes(view) for view in checked.views] == [bytes(store.read(o, s)) for o, s in places[10:25]]
        assert store.read_records(places[10:35], copy=True).views == [bytes(store.read(o, s)) for o, s in places[10:25]]
        assert checked.damage.from_offset == places[25][0] and checked.new
        assert not store.read_records(places[20:30]).new  # the same damage again: not new
        assert store.read_records(places[:25]).damage is None
    finally:
        store.close()


@pytest.mark.parametrize("check", [True, False])
def test_read_records_follows_spans_across_segments(tmp_path, small_config, walk, check):
    import dataclasses

    store, places = filled(tmp_path, dataclasses.replace(small_config, check_crc_on_read=check), count=600)
    try:
        segments = {segment_of(store, offset) for offset, _ in places}
        assert len(segments) >= 3
        checked = store.read_records([(offset, size, 0) for offset, size in places])
        assert checked.damage is None and [bytes(v) for v in checked.views] == [bytes(store.read(o, s)) for o, s in places]
        assert store.read_records([(offset, size, 0) for offset, size in places], copy=True).views == [bytes(v) for v in checked.views]
        assert [r.queue_offset for r in store.pull("T", 1, 0, 1000)] == list(range(300))
        with pytest.raises(ReadError, match="runs past the readable log"):
            store.read_records([places[-1][:1] + (places[-1][1] + 1,)])
    finally:
        store.close()


def test_read_checked_serves_up_to_the_damage_and_refuses_at_it(tmp_path, small_config, walk):
    store, places = filled(tmp_path, small_config, count=40)
    try:
        damaged_offset = places[12][0]
        flip_body(store, damaged_offset)
        served = store.read_checked(places[3][0], 1 << 20)
        assert len(served.views[0]) == damaged_offset - places[3][0]
        assert served.damage.from_offset == damaged_offset
        refused = store.read_checked(damaged_offset, 1 << 20)
        assert len(refused.views[0]) == 0 and refused.damage == served.damage
        # a range cut by its size limit in the middle of a good record is not damage
        cut = store.read_checked(places[0][0], places[2][0] + 50)
        assert len(cut.views[0]) == places[2][0] + 50 and cut.damage is None
        # bytes from an offset that is no record start are served unchecked (the client checks what it decodes)
        assert store.read_checked(places[11][0] + 1, 1 << 20).damage is None
        # past the damage
        assert store.read_checked(places[13][0], 1 << 20).damage is None
        with pytest.raises(ReadError):
            store.read_checked(store.commit_log.max_offset, 100)
    finally:
        store.close()


def test_a_damaged_size_word_is_damage_not_a_cut_record(tmp_path, small_config, walk):
    store, places = filled(tmp_path, small_config, count=40)
    try:
        offset, size = places[5]
        mapped_file = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset)
        flip(mapped_file.path, offset - mapped_file.file_from_offset + 2)  # TOTALSIZE grows by 4096
        checked = store.read_checked(places[4][0], 1 << 20)
        assert checked.damage.from_offset == offset
        assert checked.damage.reason == "field lengths do not add up to the size word (half-written record)"
        assert len(checked.views[0]) == size  # the record before it
        with pytest.raises(DamagedRecordError, match=f"offset {offset}"):
            store.pull("T", 1, 2, 10)
    finally:
        store.close()


def test_a_slave_log_ending_inside_a_record_is_not_damage(walk):
    """A slave's log may end in the middle of a record (frames are cut by size): READ up to its end."""
    buffer, end = _log_of([rec.Message("T", b"x" * 150)] * 6, size=8192)
    cut_at = end - 77
    view = memoryview(bytes(buffer[:cut_at]))
    checked = read_check.read_range(lambda o, n: view[o : o + n], lambda o: "segment", 0, 1 << 20,
                                    crc_function=crc32c.crc32c, segment_end=8192)  # fmt: skip
    assert checked.damage is None and len(checked.views[0]) == cut_at


def test_dledger_pull_read_and_get_record_refuse_a_damaged_entry_record(tmp_path, walk):
    store = open_store(tmp_path)
    try:
        first = lead(store, [message(i, size=100) for i in range(6)])
        noop(store, 1)  # an entry without a record: READ's walk steps over it
        second = lead(store, [message(i, size=100) for i in range(6, 12)])
        offsets = list(first.offsets) + list(second.offsets)
        damaged = offsets[8]
        path = store.entries.data_file_list.find_mapped_file_by_offset(damaged).path
        base = store.entries.data_file_list.find_mapped_file_by_offset(damaged).file_from_offset
        flip(path, damaged - base + 150)
        assert [r.queue_offset for r in store.pull("T", 0, 0, 100)] == list(range(8))
        with pytest.raises(DamagedRecordError, match=f"record at offset {damaged} is damaged"):
            store.pull("T", 0, 8, 100)
        with pytest.raises(DamagedRecordError):
            store.get_record(damaged, check_crc=True)
        assert [d.from_offset for d in store.damaged] == [damaged] and store.damaged[0].file == path
        # READ: entries' records walked one by one, headers stepped over
        first_in_file = next(o for o in offsets if store.entries.data_file_list.find_mapped_file_by_offset(o).path == path)
        assert first_in_file == offsets[0]  # the walk passes the no-op entry
        served = store.read_checked(first_in_file, 1 << 20)
        assert served.damage is not None and len(served.views[0]) == damaged - first_in_file
        assert store.read_checked(offsets[9], 1 << 20).damage is None
        refused = store.read_checked(damaged, 1 << 20)
        assert refused.damage.from_offset == damaged and len(refused.views[0]) == 0
    finally:
        store.close()


def test_add_damage_keeps_one_range_per_spot():
    found = []
    assert read_check.add_damage(found, DamagedRange("f", 100, 200, "body CRC mismatch"))
    assert not read_check.add_damage(found, DamagedRange("f", 150, 150, "found again"))  # inside it
    assert not read_check.add_damage(found, DamagedRange("f", 0, 101, "overlaps"))
    assert read_check.add_damage(found, DamagedRange("f", 200, 300, "next record"))
    assert read_check.add_damage(found, DamagedRange("g", 100, 200, "another file"))
    assert len(found) == 3


def _segment(buffer):
    view = memoryview(bytes(buffer))
    return lambda offset: (view, 0, "segment")


def _reader(buffer):
    view = memoryview(bytes(buffer))
    return lambda offset, size: view[offset : offset + size]


@given(st.lists(messages, min_size=1, max_size=10), st.lists(st.tuples(st.integers(0, 8191), st.integers(0, 255)), max_size=2),
       st.integers(0, 8192), st.integers(1, 9000))  # fmt: skip
def test_checked_reads_agree_native_and_python_and_never_hand_out_a_bad_record(messages_list, flips, start_at, size_max):
    """Over sealed records (the record CRC tail, the store's default): a flipped bit anywhere in
    a record, header included, is caught. (A record without the tail has only its body under a
    CRC: a header flip there can pass the walk, the old format's limit.)"""
    buffer, _, end = _sealed_log_of(messages_list)
    starts = []
    position = 0
    while position < end:
        starts.append(position)
        position += rec.decode_record(buffer, position).size
    spans = [(s, rec.decode_record(buffer, s).size) for s in starts]
    for position, value in flips:
        buffer[position] = value
    read = _reader(buffer)
    start = max((s for s in starts if s <= start_at), default=0) if start_at % 2 else start_at  # a record start, or anywhere
    answers = []
    for use_native in WALKS:
        try:
            ranged = read_check.read_range(read, lambda o: "segment", start, size_max, crc_function=crc32c.crc32c,
                                           segment_end=len(buffer), native=use_native)  # fmt: skip
        except ReadError:
            ranged = None
        recorded = read_check.read_records(_segment(buffer), spans, crc_function=crc32c.crc32c, native=use_native)
        answers.append(([bytes(v) for v in ranged.views] if ranged else None, ranged and ranged.damage,
                        [bytes(v) for v in recorded.views], recorded.damage))  # fmt: skip
        for view in recorded.views:  # every record handed out is whole and checks
            record = rec.decode_record(view, crc_function=crc32c.crc32c)
            assert record.size == len(view)
        if ranged is not None and read_check.is_record_start(read(start, 64), start):
            served = ranged.views[0]
            position = 0
            while position < len(served) and rec.peek_blank(served, position) is None:
                try:
                    record = rec.decode_record(served, position, crc_function=None)
                except rec.RecordError:
                    break  # a record the size limit cut, or the zero tail
                assert crc32c.crc32c(record.body) & rec.CRC_MASK == record.body_crc  # whole ones check
                position += record.size
    assert all(answer == answers[0] for answer in answers)


@given(st.binary(max_size=600), st.integers(0, 600), st.integers(0, 700))
def test_checked_reads_on_garbage_raise_read_error_only(data, offset, size_max):
    read = _reader(data)
    try:
        read_check.read_range(read, lambda o: "f", offset, size_max, crc_function=crc32c.crc32c, segment_end=len(data))
        read_check.read_range(read, lambda o: "f", offset, size_max, crc_function=crc32c.crc32c, segment_end=len(data),
                              entry_header_size=48)  # fmt: skip
    except ReadError:
        pass
    for use_native in WALKS:
        try:
            read_check.read_records(_segment(data), [(offset, size_max)], crc_function=crc32c.crc32c, native=use_native)
        except ReadError:
            pass


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(st.lists(messages, min_size=1, max_size=8), st.lists(st.tuples(st.integers(0, 8191), st.integers(0, 255)), max_size=2),
       st.lists(st.tuples(st.integers(-10, 9000), st.integers(-5, 2000)), max_size=3), st.integers(0, 3), st.sampled_from([0, 1, 2]))  # fmt: skip
def test_native_and_python_check_spans_agree(messages_list, flips, bogus, start, level):
    buffer, end = _log_of(messages_list, base=4096)
    spans = []
    position = 0
    while position < end:
        size = rec.decode_record(buffer, position).size
        spans.append((4096 + position, size, 0))
        position += size
    for position, value in flips:
        buffer[position] = value
    spans[1:1] = bogus  # units that name no record, or bytes outside the buffer
    view = memoryview(bytes(buffer))
    python = read_check._check_spans_python(view, spans, start, 4096, crc32c.crc32c if level == 2 else None, walk=level > 0)
    assert native.check_spans(view, spans, start, 4096, level) == tuple(int(v) for v in python)
    *python, copies = read_check._check_spans_python(view, spans, start, 4096, crc32c.crc32c if level == 2 else None,
                                                     walk=level > 0, copy=True)  # fmt: skip
    assert native.check_spans(view, spans, start, 4096, level, True) == (*(int(v) for v in python), copies)
    assert copies == [bytes(view[o - 4096 : o - 4096 + s]) for o, s, *_ in spans[start : python[0]]]


def test_the_damage_path_names_the_segment_file(tmp_path, small_config):
    store, places = filled(tmp_path, small_config)
    try:
        offset = places[-1][0]
        flip_body(store, offset)
        damage = store.read_records([places[-1]]).damage
        assert os.path.basename(damage.file) == f"{offset // small_config.commitlog_segment_size * small_config.commitlog_segment_size:020d}"
        assert damage.to_json() == {"file": damage.file, "from": offset, "to": offset + places[-1][1], "reason": "body CRC mismatch"}
    finally:
        store.close()
