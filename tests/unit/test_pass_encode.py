"""A pass of SENDs in one call (commitlog/pass_encode.py): the native functions against their
pure-Python twins, and both against the batch path (``record.prepare_batch``/``write_batch``,
``MessageStore.append_batch``): the same refusals, word for word, and the same bytes."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import commit_log as commit_log_module
from commitlog import native
from commitlog import pass_encode as pe
from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.store import MessageStore
from hasvc.protocol import client as cp
from hasvc.state.dedupe import ProducerTable
from hasvc.broker.put_service import tag_properties
from tests.unit.pass_requests import (BODY_SIZE_MAX, PLANNING, Request, batch_of, batch_refusal, decode, kinds_of,
                                      mixed_passes, passes, producer_batches, producer_pass, table_state)  # fmt: skip


def _as_written(pass_requests, number, kinds):
    """Request ``number`` as the batch path writes it: decoded as the client port decodes its
    frame's kind (None when malformed), a SEND_IDEMPOTENT's properties tagged by the broker's
    ``tag_properties``."""
    item = pass_requests[number]
    idempotent = kinds is not None and kinds[number] == cp.SEND_IDEMPOTENT
    request = decode(item, idempotent=idempotent) if pe._is_payload(item) else item
    if request is None or not idempotent:
        return request
    return cp.SendRequest(request.topic, request.queue_id, request.bodies,
                          [tag_properties(p, request.producer_id, request.first_sequence + i) for i, p in enumerate(request.properties)],
                          request.flag, request.born_timestamp, request.producer_id, request.first_sequence)  # fmt: skip


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(st.one_of(passes, mixed_passes), st.booleans(), st.booleans())
@settings(max_examples=300)
def test_native_and_python_pass_plans_agree_and_refuse_what_the_batch_path_refuses(pass_requests, record_crc, with_kinds):
    """The plans agree (SEND_IDEMPOTENTs read, checked and tagged, each payload malformed where the
    client protocol's decoder refuses it, their producer ids, sequences and messages returned);
    a request is refused where the batch path refuses it, tagged."""
    kinds = kinds_of(pass_requests) if with_kinds else None
    plan = pe.plan_pass(pass_requests, record_crc=record_crc, native=True, kinds=kinds, **PLANNING)
    assert plan == pe.plan_pass_python(pass_requests, record_crc=record_crc, kinds=kinds, **PLANNING)
    keys, key_of, refused, _counts, _variable, malformed, idempotent = plan
    decoded = [_as_written(pass_requests, number, kinds) for number in range(len(pass_requests))]
    assert malformed == [number for number, request in enumerate(decoded) if request is None]
    judged = [number for number, request in enumerate(decoded) if request is not None and kinds and kinds[number] == cp.SEND_IDEMPOTENT]
    assert idempotent[:4] == (judged, [decoded[n].producer_id for n in judged], [decoded[n].first_sequence for n in judged],
                              [len(decoded[n].bodies) for n in judged])  # fmt: skip
    assert [keys[index] if index >= 0 else None for index in key_of] == [
        None if request is None else (request.topic, request.queue_id) for request in decoded]
    for number, request in enumerate(decoded):
        if request is None:
            continue
        refusal = batch_refusal(request, record_crc=record_crc)
        try:  # a refused topic or queue id is the caller's check, once per key
            rec._batch_shape(request.topic, request.queue_id, pe.BORN_HOST, 0)
        except rec.MessageRejected:
            assert refusal is not None
            continue
        assert (number in refused) == (refusal is not None), (request, refusal)


def _written(pass_requests, *, record_crc, store_v6, use_native, kinds=None):
    keys, key_of, refused, counts, _variable, malformed, _ = pe.plan_pass(pass_requests, record_crc=record_crc, native=use_native,
                                                                         kinds=kinds, **PLANNING)  # fmt: skip
    excluded = bytearray(len(pass_requests))
    topics = []
    for index, (topic, queue_id) in enumerate(keys):
        try:
            topics.append(rec._batch_shape(topic, queue_id, pe.BORN_HOST, 0)[0])
        except rec.MessageRejected:
            topics.append(b"")
            excluded[:] = bytes(1 if key_of[n] == index or excluded[n] else 0 for n in range(len(pass_requests)))
    for number in refused + malformed:
        excluded[number] = 1
    buffer = bytearray(2 * 1024 * 1024)  # 12 requests of 4 messages with properties near 32 KiB
    outcome = pe.write_pass(
        buffer, 100, physical_base=1 << 40, store_timestamp=1_700_000_000_123, store_ip=bytes(16) if store_v6 else b"\x7f\0\0\1",
        store_port=10911, born_ip=b"\x7f\0\0\1", born_port=0, sysflag=rec.SYSFLAG_STOREHOST_V6 if store_v6 else 0,
        record_crc=record_crc, requests=pass_requests, key_of=key_of, excluded=bytes(excluded), topics=topics,
        first_queue_offsets=[7 * index for index in range(len(keys))], messages_max=cp.SEND_MESSAGES_MAX, decode=decode,
        native=use_native, kinds=kinds,
    )  # fmt: skip
    return buffer, outcome, excluded, key_of, keys


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(st.one_of(passes, mixed_passes), st.booleans(), st.booleans())
@settings(max_examples=300)
def test_native_and_python_passes_write_the_batch_paths_bytes(pass_requests, record_crc, store_v6):
    """Every request kept (a SEND_IDEMPOTENT's messages tagged as the broker tags them) written as
    ``record.write_batch`` writes it alone, by both: the same bytes, offsets and answers."""
    kinds = kinds_of(pass_requests)
    fast, fast_outcome, excluded, key_of, keys = _written(pass_requests, record_crc=record_crc, store_v6=store_v6, use_native=True,
                                                          kinds=kinds)  # fmt: skip
    slow, slow_outcome, _, _, _ = _written(pass_requests, record_crc=record_crc, store_v6=store_v6, use_native=False, kinds=kinds)
    assert fast == slow
    assert fast_outcome == slow_outcome
    written, offsets, queue_offsets, answers = fast_outcome
    # The reference: each request kept written by record.write_batch as a batch of its own, in order.
    reference = bytearray(len(fast))
    position = 100
    next_queue = [7 * index for index in range(len(keys))]
    for number, request in enumerate(pass_requests):
        if excluded[number]:
            assert answers[number] is None
            continue
        request = _as_written(pass_requests, number, kinds)
        batch = rec.MessageBatch(request.topic, request.bodies, queue_id=request.queue_id, properties=list(request.properties),
                                 flag=request.flag, born_timestamp=request.born_timestamp)  # fmt: skip
        prepared = rec.prepare_batch(batch, body_size_max=BODY_SIZE_MAX, store_v6=store_v6, record_crc=record_crc)
        first = next_queue[key_of[number]]
        next_queue[key_of[number]] += len(request.bodies)
        start = position
        position += rec.write_batch(reference, position, prepared, queue_offset_first=first, physical_base=1 << 40,
                                    store_timestamp=1_700_000_000_123, store_ip=bytes(16) if store_v6 else b"\x7f\0\0\1",
                                    store_port=10911, native=False)  # fmt: skip
        starts = [(1 << 40) + start + sum(prepared.sizes[:i]) for i in range(len(request.bodies))]
        pairs = b"".join(offset.to_bytes(8, "big") + queue.to_bytes(8, "big")
                         for offset, queue in zip(starts, range(first, first + len(starts))))  # fmt: skip
        assert answers[number] == request.queue_id.to_bytes(4, "big") + len(starts).to_bytes(4, "big") + pairs
    assert fast == reference
    assert written == position - 100
    assert len(offsets) == len(queue_offsets) == sum(len(_as_written(pass_requests, n, kinds).bodies)
                                                     for n in range(len(pass_requests)) if not excluded[n])  # fmt: skip


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
def test_a_malformed_request_kept_raises_rather_than_writes():
    request = Request("T", 0, [b"a", b"b"], [b""])
    with pytest.raises(ValueError, match="misshapen or malformed"):
        pe.write_pass(bytearray(4096), 0, physical_base=0, store_timestamp=0, store_ip=b"\x7f\0\0\1", store_port=1,
                      born_ip=b"\x7f\0\0\1", born_port=0, sysflag=0, record_crc=False, requests=[request], key_of=[0],
                      excluded=b"\0", topics=[b"T"], first_queue_offsets=[0], messages_max=1, native=True)  # fmt: skip
    with pytest.raises(ValueError, match="does not fit"):
        pe.write_pass(bytearray(100), 0, physical_base=0, store_timestamp=0, store_ip=b"\x7f\0\0\1", store_port=1,
                      born_ip=b"\x7f\0\0\1", born_port=0, sysflag=0, record_crc=False,
                      requests=[Request("T", 0, [b"x" * 200], [b""])], key_of=[0], excluded=b"\0", topics=[b"T"],
                      first_queue_offsets=[0], messages_max=1, native=True)  # fmt: skip


def _store_bytes(store) -> bytes:
    mapped = store.commit_log.mapped_file_queue.mapped_files[-1]
    return bytes(mapped.writable_view()[: mapped.wrote_position])


# The ways to put a pass: native (when built), pure, and the batch path request by request.
WAYS = [way for way in ("native", "python", "batches") if way != "native" or native.AVAILABLE]


def _config(record_crc: bool) -> StoreConfig:
    return StoreConfig(commitlog_segment_size=4 * 1024 * 1024, max_message_size=BODY_SIZE_MAX, append_record_crc=record_crc,
                       disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip


@given(passes, st.booleans())
@settings(max_examples=40, deadline=None)
def test_append_pass_stores_what_the_batch_path_stores_and_refuses_alike(tmp_path_factory, pass_requests, record_crc):
    """The pass (native and pure) against ``MessageStore.append_batch`` request by request: the same
    log bytes, the same offsets and queue offsets, the same refusals (status and reason)."""
    config = _config(record_crc)
    logs = []
    for way in WAYS:
        with MessageStore.open(str(tmp_path_factory.mktemp(way)), config) as store, _fixed_clock():
            store.append_batch(rec.MessageBatch("T", [b"before"], queue_id=1))  # queue offsets and offsets not at 0
            if way == "batches":
                outcomes = []
                for item in pass_requests:
                    batch = batch_of(item)
                    if batch is None:
                        outcomes.append("malformed")
                        continue
                    result = store.append_batch(batch)
                    if result.status is rec.PutMessageStatus.PUT_OK:
                        outcomes.append(("stored", result.offsets, result.queue_offsets))
                    else:
                        outcomes.append((result.status, result.reason))
            else:
                done = pe.append_pass(store, pass_requests, messages_max=cp.SEND_MESSAGES_MAX, decode=decode,
                                      native=way == "native")  # fmt: skip
                assert done is not None
                outcomes = []
                for number in range(len(pass_requests)):
                    if number in done.malformed:
                        outcomes.append("malformed")
                        continue
                    if number in done.refusals:
                        outcomes.append((done.refusals[number].status, done.refusals[number].reason))
                        continue
                    answer = done.answers[number]
                    count = int.from_bytes(answer[4:8], "big")
                    pairs = [(int.from_bytes(answer[8 + 16 * i: 16 + 16 * i], "big"), int.from_bytes(answer[16 + 16 * i: 24 + 16 * i], "big"))
                             for i in range(count)]  # fmt: skip
                    outcomes.append(("stored", tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)))
            logs.append((way, _store_bytes(store), outcomes, dict(store.commit_log.topic_queue_table)))
    reference = logs[-1]
    for way, data, outcomes, table in logs[:-1]:
        assert outcomes == reference[2], way
        assert data == reference[1], way
        assert table == reference[3], way


@given(st.lists(mixed_passes, min_size=1, max_size=3), st.booleans())
@settings(max_examples=60, deadline=None)
def test_a_pass_with_idempotent_sends_stores_and_answers_what_the_batch_path_does(tmp_path_factory, pass_list, record_crc):
    """Passes mixing SENDs and SEND_IDEMPOTENTs (retries of earlier passes and of the same pass,
    partial overlaps, gaps, refusals for content; payloads as the client port leaves them, some
    malformed: a producer id empty, too long, with a separator or not UTF-8, a negative or cut
    sequence, answered with the client protocol's error), put as ``PutService._put_pass`` puts them
    (native and pure) against the batch path's one request after the other
    (``_append_idempotent``): the same log bytes, the same answers (a retry's original offsets,
    the producer table's refusals word for word), the same producer table after."""
    config = _config(record_crc)
    logs = []
    for way in WAYS:
        table = ProducerTable(window=6)  # small: sequences older than it are refused
        with MessageStore.open(str(tmp_path_factory.mktemp(way)), config) as store, _fixed_clock():
            store.append_batch(rec.MessageBatch("T", [b"before"], queue_id=1))
            outcomes = []
            for pass_requests in pass_list:
                if way == "batches":
                    def append_one(batch, store=store):
                        result = store.append_batch(batch)
                        return result if result.status is rec.PutMessageStatus.PUT_OK else (result.status, result.reason)
                    outcomes.append(producer_batches(pass_requests, table, append_one))
                else:
                    def append(requests, decide, kinds, store=store, way=way):
                        return pe.append_pass(store, requests, messages_max=cp.SEND_MESSAGES_MAX, decode=decode,
                                              native=way == "native", decide=decide, kinds=kinds)  # fmt: skip
                    outcomes.append(producer_pass(pass_requests, table, append))
            logs.append((way, _store_bytes(store), outcomes, dict(store.commit_log.topic_queue_table), table_state(table)))
    reference = logs[-1]
    for way, data, outcomes, queues, producers in logs[:-1]:
        assert outcomes == reference[2], way
        assert data == reference[1], way
        assert queues == reference[3], way
        assert producers == reference[4], way


class _fixed_clock:
    """Every append of the test at one store timestamp, so that logs written apart compare byte for byte."""

    def __enter__(self):
        self.saved = commit_log_module.now_ms
        commit_log_module.now_ms = lambda: 1_700_000_000_000
        return self

    def __exit__(self, *exc):
        commit_log_module.now_ms = self.saved
