"""A DLedger leader's pass of SENDs planned as one proposal in one call: native when built.

Theory of operation
-------------------
The classic master appends a pass of plain SENDs in two native calls (``commitlog/pass_encode.py``).
A DLedger leader does not append: it *proposes* entries, one RocketMQ record each, whose place in
the data files (``pos``) fixes each record's PHYSICALOFFSET (``pos + 48``) before the Raft core
takes them (``commitlog/dledger/message_planning.py``). Planned batch by batch, a pass cost
Python per message and per request: the decode, the grouping by queue, the merged batches, the
result cut per request, each answer built field by field. Here a pass is two calls, each one
loop over every message:

1. ``pass_encode.plan_pass`` (the same as the classic master's, without the record CRC tail: a
   DLedger entry's body CRC covers the whole record): each request's queue key, the malformed
   and the refused ones, the messages per key;
2. ``write_entry_pass`` (``commitlog/_scan.c``, twin ``write_entry_pass_python``): every request
   kept, in the order read, as the records the batch path's ``plan_batch`` of that request alone
   would make (the same bytes: tests/unit/test_entry_pass.py), each placed where
   ``entry_placement.plan_positions`` places its entry from the plan's start, with the queue
   offsets following on per key, and per request its answer's offsets packed (as
   ``pass_encode.write_pass`` packs them).

``plan_entry_pass`` returns the ``AppendPlan`` the Raft driver proposes as it proposes any plan
(``propose_plan``: the room check, the core's verdict, ``accept_plan``). Given the leader's term,
``write_entry_pass`` also frames the entries as stored (headers with that term and the indexes
from the plan's first, CRC32), end to end in one buffer whose views are the bodies
(``AppendPlan.run``): once the core took them, the driver appends that run by one ``pwrite``
(``take_run``, ``append_framed``) instead of the store framing them again (``append``:
``write_entries``; in one process a pass of 64 entries' append went 66 -> 32 us, its planning
59 -> 69). A pass that crosses a data file's end is planned unframed. Nothing is decided here: who leads, the
term, the indexes, the quorum and every refusal's meaning stay the caller's; refusals read word
for word as the batch path's (``pass_encode.refusal_of``).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

from commitlog import native as _native
from commitlog import pass_encode
from commitlog import record as rec
from commitlog.commit_log import now_ms
from commitlog.dledger import entry_codec as codec
from commitlog.dledger import entry_placement as placement
from commitlog.dledger.entry_run import EntryRun
from commitlog.dledger.message_planning import BODY_OFFSET, AppendPlan

_WRITE_NATIVE = _native.write_entry_pass
_PHYSICAL_OFFSET = struct.Struct(">q")  # a record's PHYSICALOFFSET field (rec.PHYSICAL_OFFSET_POSITION)

def write_entry_pass_python(requests, *, key_of: list[int], excluded: bytes, topics: list[bytes], first_queue_offsets: list[int],
                            store_timestamp: int, store_ip: bytes, store_port: int, born_ip: bytes, born_port: int, sysflag: int,
                            messages_max: int, offset: int, file_size: int, decode: Callable | None = None,
                            kinds=None, first_index: int = -1, term: int = -1) -> tuple | None:  # fmt: skip
    """(bodies, offsets, queue_ids, queue_offsets, positions, entry_sizes, answers): each request
    not ``excluded`` (one byte a request, nonzero to leave it out) written as ``record.write_batch``
    writes a batch of it (no record CRC tail) and cut into records, as ``plan_batch`` does; the
    records placed as entries from data offset ``offset`` in data files of ``file_size`` bytes,
    each one's PHYSICALOFFSET its entry's pos + 48; ``topics`` the encoded topic of each key;
    ``answers`` per request its answer's offsets packed as ``pass_encode.write_pass`` packs them
    (None when excluded). A SEND_IDEMPOTENT's messages are tagged (``kinds`` as
    ``pass_encode.plan_pass``'s). With ``first_index`` >= 0 (and the leader's ``term``): the
    entries framed as stored (``entry_codec.encode_entry``, entry k of index first_index + k),
    end to end in one ``bytes``, added as an eighth item, each body a memoryview of its entry
    there; None when an entry needs a blank record before it (a run lies in one data file)."""
    assert not sysflag & rec.SYSFLAG_TRANSACTION_MASK, sysflag
    next_queue_offsets = list(first_queue_offsets)
    records: list[bytes] = []
    queue_ids: list[int] = []
    queue_offsets: list[int] = []
    kept: list = []  # per request: None, or (queue id, its first record's number, its records)
    for number in range(len(requests)):
        if excluded[number]:
            kept.append(None)
            continue
        request = pass_encode.request_of(requests, number, kinds, decode)
        index = key_of[number]
        topic = topics[index]
        properties = list(request.properties)
        fixed = rec._fixed_record_size(len(topic), sysflag, len(topic) > rec.TOPIC_SIZE_MAX_V1)
        sizes = [fixed + len(body) + len(p) for body, p in zip(request.bodies, properties, strict=True)]
        batch = rec.MessageBatch(request.topic, request.bodies, queue_id=request.queue_id, properties=properties,
                                 flag=request.flag, born_timestamp=request.born_timestamp)  # fmt: skip
        prepared = rec.PreparedBatch(batch, topic, properties, sysflag, born_ip, born_port, sizes, sum(sizes), False)
        first = next_queue_offsets[index]
        next_queue_offsets[index] = first + len(sizes)
        buffer = bytearray(prepared.total)
        rec.write_batch(buffer, 0, prepared, queue_offset_first=first, physical_base=0, store_timestamp=store_timestamp,
                        store_ip=store_ip, store_port=store_port, native=False)  # fmt: skip
        kept.append((request.queue_id, len(records), len(sizes)))
        start = 0
        for size in sizes:
            records.append(buffer[start : start + size])
            start += size
        queue_ids += [request.queue_id] * len(sizes)
        queue_offsets += range(first, first + len(sizes))
    entry_sizes = [BODY_OFFSET + len(record) for record in records]
    positions = placement.plan_positions(entry_sizes, offset=offset, file_size=file_size)
    offsets = [pos + BODY_OFFSET for pos in positions]
    bodies = []
    for record, physical in zip(records, offsets):
        _PHYSICAL_OFFSET.pack_into(record, rec.PHYSICAL_OFFSET_POSITION, physical)  # under no CRC (BODYCRC covers the body)
        bodies.append(bytes(record))
    data = None
    if first_index >= 0:
        if positions and positions != list(itertools.accumulate(entry_sizes[:-1], initial=offset)):
            return None  # a blank record before an entry
        data = b"".join(codec.encode_entry(index=first_index + k, term=term, pos=pos, body=body)
                        for k, (pos, body) in enumerate(zip(positions, bodies)))  # fmt: skip
        view, start = memoryview(data), 0
        bodies = []
        for size in entry_sizes:
            bodies.append(view[start + BODY_OFFSET : start + size])
            start += size
    answers: list = []
    for each in kept:
        if each is None:
            answers.append(None)
            continue
        queue_id, first_record, count = each
        pairs = [pass_encode._ANSWER_PAIR.pack(offsets[k], queue_offsets[k]) for k in range(first_record, first_record + count)]
        answers.append(pass_encode._ANSWER_HEAD.pack(queue_id, count) + b"".join(pairs))
    if data is not None:
        return tuple(bodies), tuple(offsets), tuple(queue_ids), tuple(queue_offsets), positions, entry_sizes, answers, data
    return tuple(bodies), tuple(offsets), tuple(queue_ids), tuple(queue_offsets), positions, entry_sizes, answers


def write_entry_pass(requests, *, key_of: list[int], excluded: bytes, topics: list[bytes], first_queue_offsets: list[int],
                     store_timestamp: int, store_ip: bytes, store_port: int, born_ip: bytes, born_port: int, sysflag: int,
                     messages_max: int, offset: int, file_size: int, decode: Callable | None = None,
                     native: bool | None = None, kinds=None, first_index: int = -1, term: int = -1) -> tuple | None:  # fmt: skip
    """``write_entry_pass_python``, in one native call when the module is built."""
    if _WRITE_NATIVE is not None and native is not False:
        return _WRITE_NATIVE(requests, key_of, excluded, topics, first_queue_offsets, store_timestamp, store_ip, store_port,
                             born_ip, born_port, sysflag, messages_max, offset, file_size, kinds, first_index, term)  # fmt: skip
    return write_entry_pass_python(
        requests, key_of=key_of, excluded=excluded, topics=topics, first_queue_offsets=first_queue_offsets,
        store_timestamp=store_timestamp, store_ip=store_ip, store_port=store_port, born_ip=born_ip, born_port=born_port,
        sysflag=sysflag, messages_max=messages_max, offset=offset, file_size=file_size, decode=decode, kinds=kinds,
        first_index=first_index, term=term,
    )  # fmt: skip


class EntryPass:
    """What ``plan_entry_pass`` planned: ``plan`` the proposal of every request kept (None when
    every request was refused or malformed), ``answers``, ``refusals`` and ``malformed`` as
    ``pass_encode.PassAppend``'s."""

    __slots__ = ("plan", "answers", "refusals", "malformed", "left_out")

    def __init__(self, plan: AppendPlan | None, answers: list, refusals: dict[int, rec.MessageRejected], malformed: list[int],
                 left_out: frozenset = frozenset()) -> None:  # fmt: skip
        self.plan = plan
        self.answers = answers
        self.refusals = refusals
        self.malformed = malformed
        self.left_out = left_out


def plan_entry_pass(store, requests, *, messages_max: int, decode: Callable, native: bool | None = None,
                    decide: Callable | None = None, kinds=None, term: int | None = None) -> EntryPass | None:  # fmt: skip
    """Plan a pass of SENDs (as ``pass_encode.append_pass`` takes them) on ``store``, a leader's
    ``DLedgerMessageStore``, as one proposal of the requests kept, in their order; mutates
    nothing (the driver proposes the plan and the store accepts it). None when the pass must take
    the batch path, which answers those cases itself: bodies hashed with another CRC than CRC32C,
    or a queue's records of the pass together too large for a data file (then one entry might
    not fit one: the batch path refuses the request holding it alone). ``term`` (the leader's, which
    the core will give the entries): the plan carries its entries framed as stored too (``run``, an
    ``EntryRun`` the store appends by one ``pwrite`` once the core took them), unless they cross a
    data file's end."""
    config = store.config
    if store.crc_function is not rec.CRC_FUNCTIONS["crc32c"]:
        return None
    body_size_max = config.max_message_size
    file_size = store.dledger_config.data_file_size
    fit_max = file_size - codec.MIN_BLANK_SIZE  # an entry leaves room for a blank record (_plan_positions)
    store_ip, store_port, store_v6 = rec.encode_host(config.store_host)
    keys, key_of, refused, counts, variable, malformed, idempotent = pass_encode.plan_pass(
        requests, body_size_max=body_size_max, record_crc=False, messages_max=messages_max, decode=decode, native=native,
        kinds=kinds,
    )  # fmt: skip
    shape = pass_encode.shape_pass(requests, keys, key_of, refused, malformed, counts, body_size_max=body_size_max,
                                   store_v6=store_v6, record_crc=False, decode=decode, kinds=kinds)  # fmt: skip
    left_out = pass_encode.leave_out(shape, key_of, counts, variable, malformed, decide, idempotent)
    bad_keys = shape.bad_keys
    kept = 0
    for index in range(len(keys)):
        if index in bad_keys:
            continue
        kept += counts[index]
        # No entry larger than all of its key's records together: when that may not fit a data file
        # (small files), the batch path refuses the one request that holds the entry, alone.
        if BODY_OFFSET + shape.key_sizes[index] * counts[index] + variable[index] > fit_max:
            return None
    if kept == 0:
        return EntryPass(None, [None] * len(requests), shape.refusals, malformed, left_out)
    first_index, offset = store.plan_start()
    table = store._queue_table  # read, not changed: accept_plan advances it
    first_queue_offsets = [table.get(key, 0) for key in keys]
    queue_next = {key: first_queue_offsets[index] + counts[index]
                  for index, key in enumerate(keys) if index not in bad_keys and counts[index]}  # fmt: skip
    store_timestamp = max(now_ms(), store._last_store_timestamp)
    arguments = dict(key_of=key_of, excluded=shape.excluded, topics=shape.topics, first_queue_offsets=first_queue_offsets,
                     store_timestamp=store_timestamp, store_ip=store_ip, store_port=store_port, born_ip=shape.born_ip,
                     born_port=shape.born_port, sysflag=shape.sysflag, messages_max=messages_max, offset=offset,
                     file_size=file_size, decode=decode, native=native, kinds=kinds)  # fmt: skip
    written = write_entry_pass(requests, **arguments, first_index=first_index, term=term) if term is not None else None
    if written is None:
        written = write_entry_pass(requests, **arguments)
    bodies, offsets, queue_ids, queue_offsets, positions, entry_sizes, answers, *framed = written
    run = EntryRun(first_index, len(bodies), term, framed[0]) if framed else None
    plan = AppendPlan(first_index, bodies, offsets, queue_ids, queue_offsets, store_timestamp, queue_next, positions, entry_sizes,
                      run)  # fmt: skip
    return EntryPass(plan, answers, shape.refusals, malformed, left_out)


NATIVE = pass_encode.NATIVE and _WRITE_NATIVE is not None  # whether plan_entry_pass runs natively
