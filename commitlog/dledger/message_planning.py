"""A leader's writes to a DLedger member's message store: plans of entries for messages.

Theory of operation
-------------------
A plan (``plan_append``, ``plan_batch``, ``plan_batches``) turns messages into entry bodies, one
RocketMQ record each, at the next indexes: where each entry will lie (``pos``, by the entry
store's ``plan_positions``: ``entry_placement``) fixes each record's PHYSICALOFFSET (``pos + 48``)
before the Raft core appends it, and the consume-queue offsets come from the queue table. Making
a plan mutates nothing; ``accept_plan`` (the core took the proposal) advances the queue table and
keeps the plan's entries pending, so the next plan starts after them; the pending entries are
checked against the log once appended (an entry's pos is the sum of all sizes before it).
``discard_plans`` forgets them when the member stops leading.

``MessagePlanner`` is a part of ``DLedgerMessageStore`` (its base class): the put path.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any

from commitlog import native
from commitlog import record as rec
from commitlog.commit_log import now_ms
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.message_reader import transactional
from commitlog.mapped_file import StoreError

BODY_OFFSET = codec.BODY_OFFSET  # PHYSICALOFFSET = entry pos + 48 (DLedgerCommitLog's BODY_OFFSET)
_PHYSICAL_OFFSET = struct.Struct(">q")  # a record's PHYSICALOFFSET field (rec.PHYSICAL_OFFSET_POSITION)


def _cut_records_python(buffer: bytearray, sizes: list[int], offsets: list[int], field: int) -> list[bytes]:
    """Records written end to end in ``buffer`` (``sizes[i]`` bytes each) cut apart as bytes, the
    8-byte field at ``field`` of record i set to ``offsets[i]`` first: the native ``cut_records``'
    twin (which makes no Python call per record: ~0.4 us a record of a leader's 32-message batch)."""
    if len(offsets) != len(sizes):
        raise ValueError("one offset per size")
    bodies, start = [], 0
    for index, (size, offset) in enumerate(zip(sizes, offsets)):
        if size < field + 8 or size > len(buffer) - start:
            raise ValueError(f"record {index} of {size} bytes at {start}: no field at {field} or past the buffer's "
                             f"{len(buffer)}")  # fmt: skip
        _PHYSICAL_OFFSET.pack_into(buffer, start + field, offset)
        bodies.append(bytes(buffer[start : start + size]))
        start += size
    return bodies


_cut_records = native.cut_records or _cut_records_python


@dataclasses.dataclass(frozen=True)
class AppendPlan:
    """What a leader proposes: ``bodies[i]`` is entry ``first_index + i``, one RocketMQ record
    whose commit-log offset is ``offsets[i]`` (= its planned pos + 48), queue ``queue_ids[i]`` at
    ``queue_offsets[i]`` (0 for transaction prepare/rollback records, which take none)."""

    first_index: int
    bodies: tuple[bytes, ...]
    offsets: tuple[int, ...]
    queue_ids: tuple[int, ...]
    queue_offsets: tuple[int, ...]
    store_timestamp: int
    queue_next: dict[tuple[str, int], int]  # the queue table once accepted (changed keys only)
    positions: list[int]  # each entry's planned pos (offsets[i] - BODY_OFFSET)
    entry_sizes: list[int]  # each entry's size, header included (codec.entry_size of bodies[i])
    # The entries framed as stored, when planned so (``entry_pass.plan_entry_pass`` with the term):
    # an ``EntryRun`` whose bodies are ``bodies`` (views of it), which the store appends by one
    # pwrite once the core took the entries (``take_run``); None: the store frames them itself.
    run: Any = None

    @property
    def placements(self) -> list[tuple[int, int, int]]:
        """(commit-log offset, queue id, queue offset) of each message."""
        return list(zip(self.offsets, self.queue_ids, self.queue_offsets))


class MessagePlanner:
    """The leader's plans of ``DLedgerMessageStore`` (see the module)."""

    entries: Any  # DLedgerMmapFileStore
    consume_queues: Any  # ConsumeQueueStore
    config: Any  # StoreConfig
    dledger_config: Any  # DLedgerStoreConfig
    crc_function: Any
    _pending: list  # (index, pos, size) of accepted entries not yet appended
    _queue_table: dict
    _last_store_timestamp: int

    def plan_append(self, messages: Sequence[rec.Message]) -> AppendPlan:
        """Entry bodies for ``messages`` (one record each) at the next indexes; mutates nothing.
        Raises ``rec.MessageRejected`` for a bad or oversize message (nothing planned)."""
        body_size_max = self.config.max_message_size
        # No record CRC tail (StoreConfig.append_record_crc is the classic log's): the entry's body
        # CRC covers the whole record, and PHYSICALOFFSET is set after encoding (cut_records).
        prepared = [rec.prepare_message(message, crc_function=self.crc_function, body_size_max=body_size_max)
                    for message in messages]  # fmt: skip
        if not prepared:
            raise rec.MessageRejected(rec.PutMessageStatus.MESSAGE_ILLEGAL, "empty batch")
        store_ip, store_port, store_v6 = rec.encode_host(self.config.store_host)
        sizes = [rec.with_store_host(message, store_v6=store_v6) for message in prepared]
        first_index, positions, entry_sizes = self._plan_positions(sizes)
        store_timestamp = max(now_ms(), self._last_store_timestamp)
        queue_next: dict[tuple[str, int], int] = {}
        bodies, queue_offsets = [], []
        for message, size, pos in zip(prepared, sizes, positions):
            queue_offset = self._take_queue_offset(queue_next, message.message.topic, message.message.queue_id,
                                                   message.sysflag)  # fmt: skip
            body = bytearray(size)
            rec.write_record(body, 0, message, queue_offset=queue_offset, physical_offset=pos + BODY_OFFSET,
                             store_timestamp=store_timestamp, store_ip=store_ip, store_port=store_port)  # fmt: skip
            bodies.append(bytes(body))
            queue_offsets.append(queue_offset)
        return AppendPlan(first_index, tuple(bodies), tuple([pos + BODY_OFFSET for pos in positions]),
                          tuple([m.message.queue_id for m in prepared]), tuple(queue_offsets), store_timestamp,
                          queue_next, positions, entry_sizes)  # fmt: skip

    def plan_batch(self, batch: rec.MessageBatch) -> AppendPlan:
        """As ``plan_append`` for a batch sharing topic and queue: one entry per message."""
        return self.plan_batches((batch,))

    def plan_batches(self, batches: Sequence[rec.MessageBatch]) -> AppendPlan:
        """``plan_batch`` for several batches at once, in their order (topics and queues may
        differ): one plan, so one proposal, for a leader's pass of puts over several queues
        (each proposal costs the leader tens of us of Raft bookkeeping: it made 4 a pass at 64
        producers on 4 queues). Its entries are the ones a ``plan_batch`` per batch, accepted one
        after the other, would plan, byte for byte.
        ``rec.MessageRejected`` when any batch is refused (nothing planned)."""
        store_ip, store_port, store_v6 = rec.encode_host(self.config.store_host)
        body_size_max = self.config.max_message_size
        prepared = [rec.prepare_batch(batch, body_size_max=body_size_max, store_v6=store_v6) for batch in batches]
        if len(prepared) == 1:
            sizes = prepared[0].sizes
        else:
            sizes = list(chain.from_iterable([each.sizes for each in prepared]))
        first_index, positions, entry_sizes = self._plan_positions(sizes)
        store_timestamp = max(now_ms(), self._last_store_timestamp)
        queue_next: dict[tuple[str, int], int] = {}
        offsets = [pos + BODY_OFFSET for pos in positions]
        bodies: list[bytes] = []
        queue_ids: list[int] = []
        queue_offsets: list[int] = []
        start = 0
        for batch, each in zip(batches, prepared):
            count = each.count
            first = self._take_queue_offset(queue_next, batch.topic, batch.queue_id, each.sysflag, count)
            # The whole batch written at once, as the classic log writes it (records end to end),
            # then each record's PHYSICALOFFSET set to where its entry puts it and the records cut
            # apart: the bytes of one write_batch per message (the tests compare them with that,
            # byte for byte) without a Python call per message. PHYSICALOFFSET is under no CRC
            # (BODYCRC covers the body).
            buffer = bytearray(each.total)
            rec.write_batch(buffer, 0, each, queue_offset_first=first, physical_base=0, store_timestamp=store_timestamp,
                            store_ip=store_ip, store_port=store_port, crc_function=self.crc_function)  # fmt: skip
            bodies += _cut_records(buffer, each.sizes, offsets[start : start + count], rec.PHYSICAL_OFFSET_POSITION)
            queue_ids += [batch.queue_id] * count
            queue_offsets += [0] * count if transactional(each.sysflag) else range(first, first + count)
            start += count
        return AppendPlan(first_index, tuple(bodies), tuple(offsets), tuple(queue_ids), tuple(queue_offsets),
                          store_timestamp, queue_next, positions, entry_sizes)  # fmt: skip

    def _plan_positions(self, record_sizes: list[int]) -> tuple[int, list[int], list[int]]:
        """(first index, entry positions, entry sizes) for records of these sizes after the pending plans;
        MessageRejected when one cannot fit a data file (with the blank record DLedger needs)."""
        entry_sizes = [BODY_OFFSET + size for size in record_sizes]  # codec.entry_size, without a call per entry
        fit_max = self.dledger_config.data_file_size - codec.MIN_BLANK_SIZE
        if max(entry_sizes) > fit_max:
            raise rec.MessageRejected(rec.PutMessageStatus.MESSAGE_ILLEGAL,
                                      f"an entry of {max(entry_sizes)} bytes does not fit a DLedger data file of "
                                      f"{self.dledger_config.data_file_size} bytes")  # fmt: skip
        first_index, offset = self.plan_start()
        return first_index, self.entries.plan_positions(entry_sizes, start=offset), entry_sizes

    def plan_start(self) -> tuple[int, int]:
        """(index, data offset) where the next plan's entries start: after the accepted plans not
        yet appended (checked first: ``_drop_appended_plans``), else at the log's end. Planned
        from where the newest pending entry ends: a pass of puts accepts a plan a request
        before any is appended, so planning the pending entries again made a pass quadratic."""
        self._drop_appended_plans()
        pending = self._pending
        if not pending:
            return self.entries.last_index() + 1, self.entries.plan_offset()
        index, pos, size = pending[-1]
        return index + 1, pos + size

    def _drop_appended_plans(self) -> None:
        """Drop the accepted plans' entries that are appended now, after checking that the newest
        of them lies where and is as large as planned (an entry's pos is the sum of all sizes
        before it, so one misplaced or mis-sized entry moves every later one); StoreError when
        not (an accepted plan was not appended as planned)."""
        entries = self.entries
        last = entries.last_index()
        # Pending entries have consecutive indexes (accept_plan extends them so): no search needed.
        appended = min(max(last - self._pending[0][0] + 1, 0), len(self._pending)) if self._pending else 0
        if appended:  # the newest appended one: positions are cumulative, so it lies as planned only if all do
            index, pos, size = self._pending[appended - 1]
            if index >= entries.first_index() and entries.entry_span(index) != (pos, size):
                raise StoreError(f"entry {index} lies at {entries.entry_span(index)}, planned at {(pos, size)}: "
                                 "an accepted plan was not appended as planned (call discard_plans)")  # fmt: skip
            del self._pending[:appended]
        if self._pending and self._pending[0][0] != last + 1:
            raise StoreError(f"accepted entries from {self._pending[0][0]} but the log ends at {last}: "
                             "an accepted plan was not appended (call discard_plans)")  # fmt: skip

    def _take_queue_offset(self, queue_next: dict, topic: str, queue_id: int, sysflag: int, count: int = 1) -> int:
        if transactional(sysflag):
            return 0
        key = (topic, queue_id)
        first = queue_next.get(key, self._queue_table.get(key, 0))
        queue_next[key] = first + count
        return first

    def accept_plan(self, plan: AppendPlan) -> None:
        """The core accepted ``plan``'s proposal: advance the queue table; the next plan starts
        after it. Plans are accepted in the order they were made, each planned after the last."""
        # The next index after the pending entries (planned consecutively from the log's end, which
        # _plan_positions checked when it planned this one; nothing is appended in between).
        expected = self._pending[-1][0] + 1 if self._pending else self.entries.last_index() + 1
        if plan.first_index != expected:
            raise ValueError(f"plan starts at entry {plan.first_index}, the next is {expected} (planned out of order?)")
        for key, next_offset in plan.queue_next.items():
            assert next_offset >= self._queue_table.get(key, 0), (key, next_offset)
        self._queue_table.update(plan.queue_next)
        self._pending.extend(
            zip(range(plan.first_index, plan.first_index + len(plan.bodies)), plan.positions, plan.entry_sizes)
        )
        self._last_store_timestamp = max(self._last_store_timestamp, plan.store_timestamp)
        if plan.run is not None:
            self._runs.append(plan.run)

    def take_run(self, entries: Sequence[Any]):
        """The framed entries (``AppendPlan.run``) of the accepted plan that ``entries`` -- a
        Ready's, about to be appended -- are exactly, to append by ``append_run`` instead of
        framing them again: the same indexes, their term the run's, their bodies its views.
        None otherwise (the entries framed by ``append``), and the runs they cover dropped."""
        runs = self._runs
        if not runs or not entries:
            return None
        first, last = entries[0], entries[-1]
        while runs and runs[0].last_index < first.index:  # appended otherwise (a Ready of several proposals)
            del runs[0]
        if runs:
            run = runs[0]
            if (run.first_index == first.index and run.last_index == last.index and first.term == last.term == run.last_term
                    and getattr(first.body, "obj", None) is run.data and getattr(last.body, "obj", None) is run.data):  # fmt: skip
                del runs[0]
                return run
        while runs and runs[0].first_index <= last.index:
            del runs[0]
        return None

    def discard_plans(self) -> None:
        """No longer leading: forget accepted-but-unappended plans and the queue table's advance."""
        self._pending.clear()
        self._runs.clear()
        self._queue_table = self.consume_queues.queue_offset_table()
