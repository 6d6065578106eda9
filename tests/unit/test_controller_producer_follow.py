"""A controller-mode slave's producer-table follower passes over records without producer
sequences by searching for the tag's literal start, a slice at a time (``tagged_between``);
only a span that holds it is parsed. Missing a tag there would leave a sequence out of the
table a promoted slave answers retried sends from (stored twice), so the search must find the
literal wherever it lies: across a slice's cut, in any segment, at the span's edges."""

from __future__ import annotations

import pytest

from commitlog import record as rec
from commitlog.store import MessageStore
from hasvc.broker.producer_follow import PRODUCER_TAG_LITERAL, tagged_between
from hasvc.broker.put_service import producer_sequences
from tests.sizes import SEGMENT_SIZE

LITERAL = b"NEEDLE\x01"


def _append(store: MessageStore, body: bytes, properties: dict | None = None) -> int:
    result = store.append([rec.Message("T", body, queue_id=0, properties=properties or {"TAGS": "t"})])
    assert result.status is rec.PutMessageStatus.PUT_OK, result
    return result.offsets[0]


def test_find_bytes_finds_only_what_lies_whole_in_the_range_in_any_segment(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        for _ in range(200):  # a few segments of bodies without it
            _append(store, bytes(1000))
        start = store.commit_log.max_offset
        assert start > 2 * SEGMENT_SIZE
        offset = _append(store, b"x" * 100 + LITERAL + b"y" * 100)
        at = store.find_bytes(LITERAL, 0, store.commit_log.max_offset)
        assert offset < at < store.commit_log.max_offset and store.read(at, len(LITERAL)) == LITERAL
        assert store.find_bytes(LITERAL, at, at + len(LITERAL)) == at
        assert store.find_bytes(LITERAL, at, at + len(LITERAL) - 1) == -1  # its last byte outside
        assert store.find_bytes(LITERAL, at + 1, store.commit_log.max_offset) == -1  # its first byte outside
        assert store.find_bytes(LITERAL, 0, at + len(LITERAL) + 10**9) == at  # bounded by the log's end


@pytest.mark.parametrize("slice_bytes", [len(LITERAL), len(LITERAL) + 1, 13, 64, SEGMENT_SIZE])
async def test_a_literal_is_found_wherever_the_slices_cut_it(tmp_path, small_config, slice_bytes):
    with MessageStore.open(str(tmp_path), small_config) as store:
        start = store.commit_log.max_offset
        for pad in range(40):  # the literal at every place relative to the cuts (and to the span's start)
            _append(store, b"z" * pad + LITERAL + b"z" * 3)
        end = store.commit_log.max_offset
        places = []
        offset = start
        while (at := store.find_bytes(LITERAL, offset, end)) >= 0:
            places.append(at)
            offset = at + 1
        assert len(places) == 40
        for at in places:
            for before in (*range(14), 30):  # every cut near it, for the narrow slices
                for after in (0, 1, 30):
                    found = await tagged_between(store, LITERAL, max(start, at - before), at + len(LITERAL) + after,
                                                 slice_bytes=slice_bytes)  # fmt: skip
                    assert found, (at, before, after, slice_bytes)
            assert not await tagged_between(store, LITERAL, at + 1, at + len(LITERAL), slice_bytes=slice_bytes)


async def test_a_span_is_tagged_exactly_when_producer_sequences_finds_a_sequence_in_it(tmp_path, small_config):
    with MessageStore.open(str(tmp_path), small_config) as store:
        bounds = [store.commit_log.max_offset]
        for index in range(120):  # several segments; every seventh record carries a producer sequence
            properties = {"TAGS": "t"}
            if index % 7 == 3:
                properties.update({"HASVC_PRODUCER_ID": "p-1", "HASVC_PRODUCER_SEQ": str(index)})
            _append(store, bytes(900), properties)
            bounds.append(store.commit_log.max_offset)
        for first in range(0, 120, 5):
            for last in (first + 1, first + 4, first + 11):
                start, end = bounds[first], bounds[min(last, 120)]
                sequences = producer_sequences(store, start_offset=start, end_offset=end)
                assert await tagged_between(store, PRODUCER_TAG_LITERAL, start, end, slice_bytes=4096) == bool(sequences), (first, last)
