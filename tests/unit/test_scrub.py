"""The scrubber: re-checks a classic store's log and consume queues a chunk at a time, reports log
damage with its place, rewrites consume queue units that no longer match their records."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.consume_queue import CQ_UNIT_SIZE
from commitlog.scrub import Scrubber
from commitlog.store import MessageStore

SEGMENT_SIZE = 64 * 1024


def _store(path, count=300, queues=3, body=200):
    store = MessageStore.open(str(path), StoreConfig(commitlog_segment_size=SEGMENT_SIZE))
    for number in range(count):
        store.append([rec.Message(topic="T", body=b"%05d" % number + b"b" * body, queue_id=number % queues)])
    store.dispatch()
    return store


def _walk(scrubber, bytes_max):
    steps = []
    while True:
        step = scrubber.step(bytes_max)
        steps.append(step)
        if step.pass_completed:
            return steps


def _flip(path, position, bit=0x10):
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ bit]))


@pytest.mark.parametrize("bytes_max", [1, 777, 4096, 1 << 20])
def test_a_clean_store_scrubs_clean_over_every_segment(tmp_path, bytes_max):
    store = _store(tmp_path)
    try:
        scrubber = Scrubber(store, crc_function=store.crc_function)
        steps = _walk(scrubber, bytes_max)
        assert not any(step.damaged or step.units_repaired for step in steps)
        assert scrubber.statistics.passes == 1
        assert scrubber.statistics.checked_bytes == store.commit_log.max_offset - store.commit_log.min_offset
        assert len(store.commit_log.mapped_file_queue.mapped_files) > 1  # the walk crossed blank-ended segments
    finally:
        store.close()


def test_a_flipped_body_byte_is_reported_with_its_segment_and_offset(tmp_path):
    store = _store(tmp_path)
    try:
        record = store.pull("T", 1, 50, 1)[0]
        offset = record.physical_offset
        segment = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset)
        body_at = offset - segment.file_from_offset + record.size - 40  # inside the body
        segment.view()[body_at] ^= 0x01
        scrubber = Scrubber(store, crc_function=store.crc_function)
        damaged = [d for step in _walk(scrubber, 4096) for d in step.damaged]
        assert len(damaged) == 1
        assert damaged[0].file == segment.path
        assert damaged[0].from_offset == offset
        assert damaged[0].to_offset == offset + record.size
        assert damaged[0].reason == "body CRC mismatch"
        assert scrubber.statistics.damaged_found == 1
        assert scrubber.statistics.passes == 1  # the rest of the segment skipped, the walk went on
    finally:
        store.close()


def _queue_and_file(path):
    store = _store(path)
    queue = store.consume_queues.find("T", 2)
    before = queue.units_at(0, queue.max_offset_in_queue)
    unit_file = queue.mapped_file_queue.mapped_files[0].path
    store.close()
    return before, unit_file


def test_a_consume_queue_cut_in_the_middle_by_damage_is_rebuilt_at_open(tmp_path):
    """A flipped bit that breaks the units' order (here a commit log offset made larger): recovery
    cuts the queue there, as for a torn tail, and, since units follow the cut, dispatches that
    queue again from its new end instead of leaving a gap (which used to stop the open)."""
    before, unit_file = _queue_and_file(tmp_path)
    _flip(unit_file, 37 * CQ_UNIT_SIZE + 5)
    store = MessageStore.open(str(tmp_path), StoreConfig(commitlog_segment_size=SEGMENT_SIZE))
    try:
        queue = store.consume_queues.find("T", 2)
        assert store.queues_rebuilt == (("T", 2),)
        assert queue.units_at(0, queue.max_offset_in_queue) == before
    finally:
        store.close()


def test_a_flipped_consume_queue_byte_is_rewritten_from_its_record(tmp_path):
    """A flipped bit recovery cannot see (a tags code): the scrubber finds and rewrites it."""
    before, unit_file = _queue_and_file(tmp_path)
    _flip(unit_file, 37 * CQ_UNIT_SIZE + 19)
    store = MessageStore.open(str(tmp_path), StoreConfig(commitlog_segment_size=SEGMENT_SIZE))
    try:
        queue = store.consume_queues.find("T", 2)
        assert store.queues_rebuilt == ()
        assert queue.units_at(0, queue.max_offset_in_queue) != before
        scrubber = Scrubber(store, crc_function=store.crc_function)
        repaired = [unit for step in _walk(scrubber, 4096) for unit in step.units_repaired]
        assert repaired == [("T", 2, 37)]
        assert queue.units_at(0, queue.max_offset_in_queue) == before
        assert bytes(store.pull("T", 2, 37, 1)[0].body).startswith(b"%05d" % (37 * 3 + 2))
    finally:
        store.close()
    with open(unit_file, "rb") as file:  # durable: on disk, not only in the mapping
        assert file.read(len(before)) == before


@settings(max_examples=25, deadline=None)
@given(position=st.integers(min_value=0), bit=st.integers(min_value=0, max_value=7), bytes_max=st.sampled_from([512, 8192]))
def test_any_flipped_log_bit_is_found_or_harmless_and_never_raises(tmp_path_factory, position, bit, bytes_max):
    path = tmp_path_factory.mktemp("scrub")
    store = _store(path, count=120)
    try:
        files = store.commit_log.mapped_file_queue.mapped_files
        total = store.commit_log.max_offset
        offset = position % total
        segment = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset)
        segment.view()[offset - segment.file_from_offset] ^= 1 << bit
        scrubber = Scrubber(store, crc_function=store.crc_function)
        steps = _walk(scrubber, bytes_max)
        damaged = [d for step in steps for d in step.damaged]
        for found in damaged:
            assert found.file in {f.path for f in files}
            assert found.from_offset <= offset or found.from_offset >= segment.file_from_offset
        assert scrubber.statistics.passes == 1
    finally:
        store.close()
