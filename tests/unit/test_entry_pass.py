"""A DLedger leader's pass of SENDs planned as one proposal in one call (commitlog/entry_pass.py):
the native ``write_entry_pass`` against its pure-Python twin, and both against the batch path
(``DLedgerMessageStore.plan_batch`` request by request): the same refusals, word for word, the
same answers, the same data and index files."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from commitlog import entry_pass as ep
from commitlog import native
from commitlog import pass_encode as pe
from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.dledger import DLedgerStoreConfig, Entry
from commitlog.dledger import entry_codec as codec
from commitlog.dledger import message_planning
from commitlog.dledger.message_store import DLedgerMessageStore
from hasvc.protocol import client as cp
from commitlog.commit_log import AppendResult
from hasvc.state.dedupe import ProducerTable
from tests.unit.pass_requests import (BODY_SIZE_MAX, Request, batch_of, decode, kinds_of, mixed_passes, passes, producer_batches,
                                      producer_pass, table_state)  # fmt: skip

DATA_FILE_SIZE = 96 * 1024  # a generated request's records (up to ~66 KiB with 32 KiB properties) fit one data file
LEAD_IN_BODY = b"L" * 500  # lead-in entries of ~650 bytes: ~150 a data file
STORE_TIMESTAMP = 1_700_000_000_000


def _config(store_v6: bool) -> StoreConfig:
    host = ("::1", 10911) if store_v6 else ("127.0.0.1", 10911)
    return StoreConfig(commitlog_segment_size=DATA_FILE_SIZE, max_message_size=BODY_SIZE_MAX, store_host=host,
                       disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip


def _shape(keys, store_v6: bool):
    """What ``plan_entry_pass`` hands ``write_entry_pass`` for these keys: topics (b"" for a key
    refused), born host, sysflag."""
    topics, shape = [], (b"\x7f\0\0\1", 0, 0)
    for topic, queue_id in keys:
        try:
            topic_bytes, born_ip, born_port, sysflag, _ = rec._batch_shape(topic, queue_id, pe.BORN_HOST, 0)
        except rec.MessageRejected:
            topics.append(b"")
            continue
        topics.append(topic_bytes)
        shape = (born_ip, born_port, sysflag | (rec.SYSFLAG_STOREHOST_V6 if store_v6 else 0))
    return topics, shape


@pytest.mark.skipif(not native.AVAILABLE, reason="native module not built")
@given(st.one_of(passes, mixed_passes), st.booleans(), st.sampled_from([40_000, 70_000, 1 << 20]), st.integers(0, 3 << 20))
@settings(max_examples=300, deadline=None)
def test_native_and_python_entry_passes_agree(pass_requests, store_v6, file_size, offset):
    """Bodies, offsets, queue ids and offsets, positions (across data files), entry sizes and
    packed answers: the same from both, for the requests the plan keeps (a SEND_IDEMPOTENT's
    messages tagged)."""
    kinds = kinds_of(pass_requests)
    keys, key_of, refused, _counts, _variable, malformed, _ = pe.plan_pass(pass_requests, body_size_max=BODY_SIZE_MAX, record_crc=False,
                                                                           messages_max=cp.SEND_MESSAGES_MAX, decode=decode,
                                                                           kinds=kinds)  # fmt: skip
    topics, (born_ip, born_port, sysflag) = _shape(keys, store_v6)
    excluded = bytes(1 if number in refused or number in malformed or not topics[key_of[number]] else 0
                     for number in range(len(pass_requests)))  # fmt: skip
    store_ip = b"\0" * 15 + b"\1" if store_v6 else b"\x7f\0\0\1"
    arguments = dict(key_of=key_of, excluded=excluded, topics=topics, first_queue_offsets=[3 * k for k in range(len(keys))],
                     store_timestamp=STORE_TIMESTAMP, store_ip=store_ip, store_port=10911, born_ip=born_ip, born_port=born_port,
                     sysflag=sysflag, messages_max=cp.SEND_MESSAGES_MAX, offset=offset, file_size=file_size, kinds=kinds)  # fmt: skip
    made = ep.write_entry_pass(pass_requests, native=True, **arguments)
    twin = ep.write_entry_pass_python(pass_requests, decode=decode, **arguments)
    assert made == twin
    # Framed as stored (entry k of index 7 + k, term 3): the same from both, the same bodies, and
    # the entries those bodies make; None from both when an entry needs a blank record before it.
    framed = ep.write_entry_pass(pass_requests, native=True, first_index=7, term=3, **arguments)
    framed_twin = ep.write_entry_pass_python(pass_requests, decode=decode, first_index=7, term=3, **arguments)
    assert framed == framed_twin
    bodies, _, _, _, positions, sizes = made[:6]
    contiguous = all(positions[k + 1] == positions[k] + sizes[k] for k in range(len(positions) - 1))
    assert (framed is None) == (bool(positions) and (positions[0] != offset or not contiguous))
    if framed is not None:
        assert framed[:7] == made
        assert framed[7] == b"".join(codec.encode_entry(index=7 + k, term=3, pos=pos, body=body)
                                     for k, (pos, body) in enumerate(zip(positions, bodies)))  # fmt: skip
        assert all(body.obj is framed[7] for body in framed[0])


def test_a_malformed_request_kept_raises_rather_than_writes():
    if not native.AVAILABLE:
        pytest.skip("native module not built")
    with pytest.raises(ValueError, match="misshapen or malformed"):
        ep.write_entry_pass([b"garbage"], key_of=[0], excluded=b"\0", topics=[b"T"], first_queue_offsets=[0],
                            store_timestamp=0, store_ip=b"\x7f\0\0\1", store_port=0, born_ip=b"\x7f\0\0\1", born_port=0,
                            sysflag=0, messages_max=1, offset=0, file_size=1 << 20, native=True)  # fmt: skip


def _files(store) -> tuple[bytes, bytes]:
    """The data and index files' written bytes, end to end."""
    entries = store.entries
    return tuple(b"".join(bytes(m.writable_view()[: m.wrote_position]) for m in queue.mapped_files)
                 for queue in (entries.data_file_list, entries.index_file_list))  # fmt: skip


def _append(store, plan, term=1) -> None:
    store.accept_plan(plan)
    store.entries.append([Entry(plan.first_index + i, term, body) for i, body in enumerate(plan.bodies)])


def _answer_pairs(answer: bytes) -> tuple[int, tuple, tuple]:
    count = int.from_bytes(answer[4:8], "big")
    pairs = [(int.from_bytes(answer[8 + 16 * i: 16 + 16 * i], "big", signed=True),
              int.from_bytes(answer[16 + 16 * i: 24 + 16 * i], "big", signed=True)) for i in range(count)]  # fmt: skip
    return int.from_bytes(answer[:4], "big", signed=True), tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def _ways_at_a_fixed_clock(monkeypatch_module) -> tuple[DLedgerStoreConfig, list[str]]:
    """The stores' config and the ways to plan a pass (native when built, pure, request by
    request), with the planners' clocks fixed so the three write the same bytes."""
    monkeypatch_module.setattr(message_planning, "now_ms", lambda: STORE_TIMESTAMP)
    monkeypatch_module.setattr(ep, "now_ms", lambda: STORE_TIMESTAMP)
    dledger = DLedgerStoreConfig(data_file_size=DATA_FILE_SIZE, index_file_size=32 * 1024)
    return dledger, [way for way in ("native", "native framed", "python", "python framed", "batches")
                     if not way.startswith("native") or native.AVAILABLE]  # fmt: skip


@given(passes, st.booleans(), st.integers(0, 170), st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_a_pass_proposes_what_the_batch_path_proposes_and_refuses_alike(tmp_path_factory, monkeypatch_module, pass_requests,
                                                                         store_v6, lead_in, passes_count):  # fmt: skip
    """``plan_entry_pass`` (native and pure), its plans accepted and appended, against
    ``plan_batch`` of each request alone, accepted and appended in turn: the same data and index
    files (across data files), the same answers (queue id, offsets, queue offsets), the same
    refusals (status and reason) and malformed requests, the same queue table."""
    dledger, ways = _ways_at_a_fixed_clock(monkeypatch_module)
    outcomes_of = {}
    for way in ways:
        store = DLedgerMessageStore.open(str(tmp_path_factory.mktemp(way)), _config(store_v6), self_id="n0", dledger=dledger)
        try:
            store.entries.append([Entry(0, 1, b"")])  # the term's no-op
            if lead_in:  # the pass starts anywhere in a data file, queue offsets not at 0
                _append(store, store.plan_batches([rec.MessageBatch("T", [LEAD_IN_BODY], queue_id=i % 2) for i in range(lead_in)]))
            outcomes, plans = [], []
            for _ in range(passes_count):  # passes planned and accepted one after the other, appended together after
                if way == "batches":
                    for item in pass_requests:
                        batch = batch_of(item)
                        if batch is None:
                            outcomes.append("malformed")
                            continue
                        try:
                            plan = store.plan_batch(batch)
                        except rec.MessageRejected as refusal:
                            outcomes.append((refusal.status, refusal.reason))
                            continue
                        store.accept_plan(plan)
                        store.entries.append([Entry(plan.first_index + i, 1, body) for i, body in enumerate(plan.bodies)])
                        outcomes.append((batch.queue_id, plan.offsets, plan.queue_offsets))
                    continue
                planned = ep.plan_entry_pass(store, pass_requests, messages_max=cp.SEND_MESSAGES_MAX, decode=decode,
                                             native=way.startswith("native"), term=1 if way.endswith("framed") else None)  # fmt: skip
                assume(planned is not None)  # None: a queue's records too large for a data file (the last test)
                for number in range(len(pass_requests)):
                    if number in planned.malformed:
                        outcomes.append("malformed")
                    elif number in planned.refusals:
                        outcomes.append((planned.refusals[number].status, planned.refusals[number].reason))
                    else:
                        outcomes.append(_answer_pairs(planned.answers[number]))
                if planned.plan is not None:
                    store.accept_plan(planned.plan)
                    plans.append(planned.plan)
            for plan in plans:  # as the Raft driver appends a Ready's entries: framed ones by one pwrite
                entries = [Entry(plan.first_index + i, 1, body) for i, body in enumerate(plan.bodies)]
                run = store.take_run(entries)
                assert (run is not None) == (plan.run is not None), way
                if run is not None:
                    store.entries.append_framed(run)
                else:
                    store.entries.append(entries)
            outcomes_of[way] = (outcomes, _files(store), dict(store._queue_table))
        finally:
            store.close()
    reference = outcomes_of.pop("batches")
    for way, (outcomes, files, table) in outcomes_of.items():
        assert outcomes == reference[0], way
        assert files[0] == reference[1][0], way
        assert files[1] == reference[1][1], way
        assert table == reference[2], way


def _proposed(plan) -> AppendResult:
    """The result the Raft driver's ``propose_plan`` returns for a plan it proposed."""
    last = plan.offsets[-1] + len(plan.bodies[-1])
    return AppendResult(rec.PutMessageStatus.PUT_OK, wrote_offset=plan.offsets[0], wrote_bytes=last - plan.offsets[0],
                        store_timestamp=plan.store_timestamp, offsets=plan.offsets, queue_offsets=plan.queue_offsets)  # fmt: skip


@given(st.lists(mixed_passes, min_size=1, max_size=3), st.integers(0, 170))
@settings(max_examples=40, deadline=None)
def test_a_pass_with_idempotent_sends_proposes_and_answers_what_the_batch_path_does(tmp_path_factory, monkeypatch_module, pass_list,
                                                                                      lead_in):  # fmt: skip
    """Passes mixing SENDs and SEND_IDEMPOTENTs (retries of earlier passes and of the same pass,
    partial overlaps, gaps, refusals for content; payloads as the client port leaves them, some
    malformed), planned as a DLedger leader's
    ``PutService._put_pass`` plans them (native and pure) against ``plan_batch`` of each request
    in turn as ``_append_idempotent`` puts it: the same data and index files, the same answers,
    the same producer table after."""
    dledger, ways = _ways_at_a_fixed_clock(monkeypatch_module)
    outcomes_of = {}
    for way in ways:
        table = ProducerTable(window=6)
        store = DLedgerMessageStore.open(str(tmp_path_factory.mktemp(way)), _config(False), self_id="n0", dledger=dledger)
        try:
            store.entries.append([Entry(0, 1, b"")])
            if lead_in:
                _append(store, store.plan_batches([rec.MessageBatch("T", [LEAD_IN_BODY], queue_id=i % 2) for i in range(lead_in)]))
            outcomes = []
            for pass_requests in pass_list:
                if way == "batches":
                    def append_one(batch, store=store):
                        try:
                            plan = store.plan_batch(batch)
                        except rec.MessageRejected as refusal:
                            return (refusal.status, refusal.reason)
                        _append(store, plan)
                        return _proposed(plan)
                    outcomes.append(producer_batches(pass_requests, table, append_one))
                    continue
                def append(requests, decide, kinds, store=store, way=way):
                    planned = ep.plan_entry_pass(store, requests, messages_max=cp.SEND_MESSAGES_MAX, decode=decode,
                                                 native=way == "native", decide=decide, kinds=kinds)  # fmt: skip
                    assume(planned is not None)
                    if planned.plan is None:
                        return pe.PassAppend(None, planned.answers, planned.refusals, planned.malformed, planned.left_out)
                    _append(store, planned.plan)
                    return pe.PassAppend(_proposed(planned.plan), planned.answers, planned.refusals, planned.malformed, planned.left_out,
                                        planned.plan.entry_sizes)  # fmt: skip
                outcomes.append(producer_pass(pass_requests, table, append))
            outcomes_of[way] = (outcomes, _files(store), dict(store._queue_table), table_state(table))
        finally:
            store.close()
    reference = outcomes_of.pop("batches")
    for way, (outcomes, files, queues, producers) in outcomes_of.items():
        assert outcomes == reference[0], way
        assert files == reference[1], way
        assert queues == reference[2], way
        assert producers == reference[3], way


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_small_data_files_and_other_crcs_take_the_batch_path(tmp_path):
    """None (the batch path answers) where an entry might not fit a data file (a queue's records
    of the pass together larger than one), or bodies are
    hashed with another CRC than CRC32C; every request refused: no plan, the refusals."""
    small = DLedgerStoreConfig(data_file_size=64 * 1024, index_file_size=32 * 1024)
    request = Request("T", 0, [b"x"], [b""])
    near = b"k\x01" + b"v" * (rec.PROPERTIES_SIZE_MAX - 2)  # two of them together: more than a data file
    with DLedgerMessageStore.open(str(tmp_path / "small"), _config(False), self_id="n0", dledger=small) as store:
        assert ep.plan_entry_pass(store, [request, Request("T", 1, [b"y"], [near])], messages_max=8, decode=decode).plan
        assert ep.plan_entry_pass(store, [request, Request("T", 0, [b"y", b"z"], [near, near])], messages_max=8, decode=decode) is None
    dledger = DLedgerStoreConfig(data_file_size=DATA_FILE_SIZE, index_file_size=32 * 1024)
    config = StoreConfig(commitlog_segment_size=DATA_FILE_SIZE, max_message_size=BODY_SIZE_MAX, crc="crc32",
                         disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip
    with DLedgerMessageStore.open(str(tmp_path / "crc32"), config, self_id="n0", dledger=dledger) as store:
        assert ep.plan_entry_pass(store, [request], messages_max=8, decode=decode) is None
    with DLedgerMessageStore.open(str(tmp_path / "refused"), _config(False), self_id="n0", dledger=dledger) as store:
        planned = ep.plan_entry_pass(store, [Request("bad topic!", 0, [b"x"], [b""]), b"garbage"], messages_max=8, decode=decode)
        assert planned.plan is None and planned.malformed == [1] and list(planned.refusals) == [0]
        assert planned.refusals[0].status is rec.PutMessageStatus.MESSAGE_ILLEGAL


def test_a_framed_plan_is_appended_as_framed_only_when_the_entries_are_exactly_it(tmp_path, monkeypatch):
    """``take_run`` hands the accepted plan's framed entries over only for entries that are them
    (indexes, the term framed, bodies that are its views); anything else frames them again and
    drops the runs those entries cover; ``discard_plans`` drops them all."""
    monkeypatch.setattr(ep, "now_ms", lambda: STORE_TIMESTAMP)
    dledger = DLedgerStoreConfig(data_file_size=DATA_FILE_SIZE, index_file_size=32 * 1024)
    store = DLedgerMessageStore.open(str(tmp_path), _config(False), self_id="n0", dledger=dledger)
    try:
        store.entries.append([Entry(0, 2, b"")])
        sends = [cp.SendRequest("T", i % 2, [b"m" * 100], [b""], 0, 0) for i in range(3)]

        def planned(term):
            plan = ep.plan_entry_pass(store, sends, messages_max=cp.SEND_MESSAGES_MAX, decode=decode, term=term).plan
            store.accept_plan(plan)
            return plan, [Entry(plan.first_index + i, 2, body) for i, body in enumerate(plan.bodies)]

        plan, entries = planned(2)
        assert plan.run is not None and (plan.run.first_index, plan.run.count, plan.run.last_term) == (1, 3, 2)
        assert store.take_run([Entry(e.index, 3, e.body) for e in entries]) is None  # another term than framed
        assert store.take_run(entries) is None  # dropped by the look above: framed again
        store.entries.append(entries)
        plan, entries = planned(2)
        assert store.take_run([Entry(e.index, e.term, bytes(e.body)) for e in entries]) is None  # not its views
        store.entries.append(entries)
        plan, entries = planned(2)
        assert store.take_run(entries) is plan.run
        store.entries.append_framed(plan.run)
        plan, entries = planned(2)
        store.discard_plans()
        assert store.take_run(entries) is None
        assert [entry.index for entry in store.entries.read(1, 10, size_max=1 << 20)] == list(range(1, 10))
    finally:
        store.close()
