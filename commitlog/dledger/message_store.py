"""``DLedgerMessageStore``: a DLedger member's message store (RocketMQ's DLedgerCommitLog).

Theory of operation
-------------------
The log is the DLedger entry store (``entries``, a ``DLedgerMmapFileStore`` that the Raft driver
appends to, truncates, flushes and keeps the hard state in): one message is one entry whose body
is the RocketMQ record, and the record's PHYSICALOFFSET is its entry's ``pos + 48`` (the entry
header's size), so a message's offset is where its record bytes lie in the data files.

The leader encodes records before proposing them (``plan_append``): queue offsets from the queue
table, PHYSICALOFFSET from ``entries.plan_positions`` (where the entries will land once the core's
Ready appends them, blank padding at a file's end included), the store timestamp. Nothing changes
until the core accepted the proposal (``accept_plan`` then advances the queue table). Followers
append the leader's bytes as they are; positions agree because every member's data files have the
same size and the same entries.

Only **committed** entries exist for readers: ``set_committed`` (the core's committed index)
moves the readable end, ``dispatch`` builds consume-queue units for committed entries in index
order (a leader's no-op entry, with an empty body, has none), and ``read``/``get_record``/``pull``
refuse anything above it. A committed entry never changes (the Raft log's guarantee; ``truncate``
below the committed index is refused by the core and asserted here), so consume-queue units never
need cutting except after a crash: recovery cuts units naming bytes past the recovered data end.

A new leader takes writes only once ``caught_up()`` (every entry committed and dispatched) and
``resume_queue_offsets()`` continued each queue from its consume queue: entries of an earlier term
that commit under the new leader carry queue offsets that leader assigned, and the new one must
continue after them (RocketMQ: recoverTopicQueueTable on the role change).

What MessageStore has that this store deliberately lacks: ``append*`` (writes go through Raft),
``append_replicated``/``truncate``/epochs (classic HA), ``clean_expired`` (retention of DLedger
data files is not built), and the classic part of a smooth upgrade (``commitlog.dledger.upgrade``
has it; this store does not serve offsets below the divided offset yet).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Sequence

from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.config import StoreConfig
from commitlog.consume_queue import CQ_UNIT, ConsumeQueueStore
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_store import DLedgerMmapFileStore, DLedgerStoreConfig
from commitlog.dledger.upgrade import dledger_directory
from commitlog.mapped_file import StoreError
from commitlog.store import RecordPlace, StoreStatistics

HEADER_SIZE = codec.BODY_OFFSET  # 48: PHYSICALOFFSET = pos + 48
assert HEADER_SIZE == 48


@dataclasses.dataclass(frozen=True)
class AppendPlan:
    """Entry bodies for indexes ``first_index``.., and what each message will be once stored."""

    first_index: int
    bodies: tuple[bytes, ...]
    offsets: tuple[int, ...]  # PHYSICALOFFSET of each record (pos + 48)
    queue_offsets: tuple[int, ...]
    store_timestamp: int
    table: dict[tuple[str, int], int]  # queue table entries after the plan


class DLedgerMessageStore:
    def __init__(self, path: str, config: StoreConfig, entries: DLedgerMmapFileStore):
        self.path = path
        self.config = config
        self.entries = entries
        self.crc_function = config.crc_function
        self.consume_queues = ConsumeQueueStore(os.path.join(path, "consumequeue"),
                                                units_per_file=config.consume_queue_units_per_file)  # fmt: skip
        self.store_ip, self.store_port, self.store_v6 = rec.encode_host(config.store_host)
        self.queue_table: dict[tuple[str, int], int] = {}
        self.dispatched_index = -1
        self.dispatch_error: str | None = None
        self.dispatch_skipped = 0
        self.last_store_timestamp = 0
        self.last_exit_ok = True

    # -- lifetime -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, config: StoreConfig | None = None, *, self_id: str,
             dledger: DLedgerStoreConfig | None = None, **entry_types) -> DLedgerMessageStore:  # fmt: skip
        """Open (or create) a member's store under ``path``: DLedger files in ``dledger-<self_id>``
        (data files the size of ``commitlog_segment_size``, as RocketMQ sets them), consume queues
        in ``consumequeue``; recovery of both. ``entry_types``: ``entry_class``/``hard_state_class``
        for the entry store (the Raft core's own types: ``commitlog`` cannot import them)."""
        config = (config or StoreConfig()).validate()
        if dledger is None:
            dledger = DLedgerStoreConfig(data_file_size=config.commitlog_segment_size)
        os.makedirs(path, exist_ok=True)
        if os.path.isdir(os.path.join(path, "commitlog")) and os.listdir(os.path.join(path, "commitlog")):
            raise StoreError(f"{path}/commitlog holds a classic commit log: serving it beside DLedger (smooth "
                             "upgrade) is not built into the node yet")  # fmt: skip
        abort = os.path.join(path, "abort")
        last_exit_ok = not os.path.exists(abort)
        entries = DLedgerMmapFileStore.open(dledger_directory(path, self_id), dledger, **entry_types)
        store = cls(path, config, entries)
        store.last_exit_ok = last_exit_ok
        try:
            store._recover()
        except BaseException:
            entries.close()
            raise
        with open(abort, "wb"):
            pass
        return store

    def _recover(self) -> None:
        self.consume_queues.load()
        self.consume_queues.recover()
        self.consume_queues.truncate_dirty(self._data_end())
        end = self.consume_queues.max_physic_offset
        self.dispatched_index = self._index_ending_at_or_before(end)
        committed = max(self.entries.committed_index, self.dispatched_index)
        self.entries.update_committed_index(committed)
        self.queue_table = self.consume_queues.queue_offset_table()

    def _data_end(self) -> int:
        last = self.entries.last_index()
        if last < self.entries.first_index():
            return 0
        pos, size = self.entries.entry_span(last)
        return pos + size

    def _index_ending_at_or_before(self, end: int) -> int:
        """The last entry whose bytes end at or before data offset ``end`` (-1 / first-1 if none)."""
        lo, hi = self.entries.first_index(), self.entries.last_index()
        found = lo - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            pos, size = self.entries.entry_span(mid)
            if pos + size <= end:
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
        return found

    def close(self, *, clean: bool = True) -> None:
        if clean:
            self.entries.flush()
            self.entries.persist_checkpoint()
            self.consume_queues.flush()
        self.consume_queues.close()
        self.entries.close()
        if clean:
            try:
                os.unlink(os.path.join(self.path, "abort"))
            except FileNotFoundError:
                pass

    # -- the leader's writes ---------------------------------------------------------------

    def plan_append(self, messages: Sequence[rec.Message], *, now_ms: int) -> AppendPlan:
        """Entry bodies for ``messages`` as the next entries; nothing changes (see the module).
        Raises ``rec.MessageRejected`` for a message the classic store would refuse too."""
        prepared = [rec.prepare_message(m, crc_function=self.crc_function, body_size_max=self.config.max_message_size)
                    for m in messages]  # fmt: skip
        for message in prepared:
            rec.with_store_host(message, store_v6=self.store_v6)
        if sum(HEADER_SIZE + message.size for message in prepared) + codec.MIN_BLANK_SIZE > self.entries.config.data_file_size:
            raise rec.MessageRejected(rec.PutMessageStatus.MESSAGE_ILLEGAL,
                                      f"messages of {sum(m.size for m in prepared)} bytes do not fit a data file")  # fmt: skip
        positions = self.entries.plan_positions([HEADER_SIZE + message.size for message in prepared])
        store_timestamp = max(now_ms, self.last_store_timestamp)
        table: dict[tuple[str, int], int] = {}
        bodies, offsets, queue_offsets = [], [], []
        for message, pos in zip(prepared, positions):
            key = (message.message.topic, message.message.queue_id)
            transactional = message.sysflag & rec.SYSFLAG_TRANSACTION_MASK in (
                rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_TRANSACTION_ROLLBACK)  # fmt: skip
            queue_offset = 0 if transactional else table.get(key, self.queue_table.get(key, 0))
            if not transactional:
                table[key] = queue_offset + 1
            buffer = bytearray(message.size)
            rec.write_record(buffer, 0, message, queue_offset=queue_offset, physical_offset=pos + HEADER_SIZE,
                             store_timestamp=store_timestamp, store_ip=self.store_ip, store_port=self.store_port)  # fmt: skip
            bodies.append(bytes(buffer))
            offsets.append(pos + HEADER_SIZE)
            queue_offsets.append(queue_offset)
        return AppendPlan(self.entries.last_index() + 1, tuple(bodies), tuple(offsets), tuple(queue_offsets),
                          store_timestamp, table)  # fmt: skip

    def accept_plan(self, plan: AppendPlan) -> None:
        """The core accepted the proposal of ``plan.bodies``: advance the queue table."""
        self.queue_table.update(plan.table)
        self.last_store_timestamp = plan.store_timestamp

    # -- commit and dispatch ---------------------------------------------------------------

    @property
    def committed_index(self) -> int:
        return self.entries.committed_index

    def set_committed(self, index: int) -> None:
        """The core's committed index (it never goes back)."""
        self.entries.update_committed_index(index)

    def dispatch(self, max_bytes: int | None = None) -> int:
        """Consume-queue units for committed entries not yet dispatched, in index order; returns
        how many entries were read. An entry whose record cannot be parsed stops dispatch and is
        named in ``dispatch_error``."""
        if self.dispatch_error is not None:
            return 0
        budget = max_bytes or self.config.dispatch_batch_size_max
        count = 0
        while self.dispatched_index < self.committed_index and budget > 0:
            entry = self.entries.get(self.dispatched_index + 1)
            if entry.body:
                try:
                    self._dispatch_record(entry.pos, entry.body)
                except rec.RecordError as error:
                    self.dispatch_error = f"entry {entry.index} at {entry.pos}: {error}"
                    return count
            self.dispatched_index = entry.index
            budget -= entry.size
            count += 1
        return count

    def _dispatch_record(self, pos: int, body: bytes) -> None:
        size, physical, topic, queue_id, queue_offset, sysflag, store_ts, tags = rec.decode_dispatch(memoryview(body), 0, len(body))
        if physical != pos + HEADER_SIZE or size != len(body):
            raise rec.RecordError(f"PHYSICALOFFSET {physical}, size {size}: the entry says {pos + HEADER_SIZE}, {len(body)}")
        if sysflag & rec.SYSFLAG_TRANSACTION_MASK in (rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_TRANSACTION_ROLLBACK):
            return
        queue = self.consume_queues.find_or_create(topic, queue_id)
        queue.put_run(queue_offset, CQ_UNIT.pack(physical, size, tags), physical + size, store_ts)

    def caught_up(self) -> bool:
        """Every entry is committed and dispatched: a new leader may resume queue offsets."""
        return self.entries.last_index() == self.committed_index == self.dispatched_index

    def resume_queue_offsets(self) -> None:
        assert self.caught_up(), "resume queue offsets only once every entry is dispatched"
        if self.dispatch_error is not None:
            raise StoreError(f"cannot take writes: {self.dispatch_error}")
        self.queue_table = self.consume_queues.queue_offset_table()

    # -- offsets ---------------------------------------------------------------------------

    @property
    def dispatch_end_offset(self) -> int:
        return self.committed_end_offset()

    @property
    def reput_from_offset(self) -> int:
        """The offset dispatch has reached (the classic store's name)."""
        return self._end_of(self.dispatched_index)

    def committed_end_offset(self) -> int:
        """The offset just past the last committed entry: the readable end."""
        return self._end_of(self.committed_index)

    def _end_of(self, index: int) -> int:
        if index < self.entries.first_index():
            return 0
        pos, size = self.entries.entry_span(index)
        return pos + size

    def offset_of_index(self, index: int) -> int:
        return self.entries.pos_at(index) + HEADER_SIZE

    @property
    def max_offset(self) -> int:
        return self._data_end()

    @property
    def min_offset(self) -> int:
        first = self.entries.first_index()
        return self.entries.pos_at(first) if first <= self.entries.last_index() else 0

    # -- reading ---------------------------------------------------------------------------

    def _committed_body(self, offset: int) -> tuple[int, bytes]:
        try:
            entry = self.entries.get_by_pos(offset - HEADER_SIZE)
        except ValueError as error:
            raise ReadError(f"no message at offset {offset}: {error}") from None
        if entry.index > self.committed_index:
            raise ReadError(f"offset {offset} is entry {entry.index}, not committed yet (committed {self.committed_index})")
        if not entry.body:
            raise ReadError(f"offset {offset} is entry {entry.index}, a leader's no-op entry without a message")
        return entry.index, entry.body

    def read(self, offset: int, size_max: int) -> memoryview:
        """The record at ``offset`` (a committed message's PHYSICALOFFSET), whole, if it fits."""
        _index, body = self._committed_body(offset)
        return memoryview(body)[:size_max]

    def get_record(self, offset: int, *, check_crc: bool = False) -> rec.Record:
        _index, body = self._committed_body(offset)
        return rec.decode_record(body, crc_function=self.crc_function if check_crc else None)

    def pull(self, topic: str, queue_id: int, queue_offset: int, count_max: int) -> list[rec.Record]:
        queue = self.consume_queues.find(topic, queue_id)
        if queue is None:
            return []
        return [self.get_record(offset) for offset, _size, _tags in queue.read(queue_offset, count_max)]

    def iter_committed(self, from_index: int | None = None) -> Iterator[tuple[int, int, bytes]]:
        """(index, PHYSICALOFFSET, record) of every committed message entry from ``from_index``."""
        index = max(self.entries.first_index(), from_index if from_index is not None else 0)
        while index <= self.committed_index:
            entry = self.entries.get(index)
            if entry.body:
                yield entry.index, entry.pos + HEADER_SIZE, entry.body
            index += 1

    def find_at_record_ends(self, span_bytes: int, pattern: re.Pattern) -> Iterator[tuple[re.Match, RecordPlace]]:
        """Matches of ``pattern`` in the committed records of the last ``span_bytes`` of the log
        (the producer table's rebuild), each with the place of its record."""
        start = max(0, self.committed_end_offset() - span_bytes)
        first = self._index_ending_at_or_before(start) + 1
        for _index, offset, body in self.iter_committed(first):
            for match in pattern.finditer(body):
                size, _physical, _topic, queue_id, queue_offset, *_ = rec.decode_dispatch(memoryview(body), 0, len(body))
                yield match, RecordPlace(offset, size, queue_id, queue_offset)

    # -- background work (the classic store's names, for StoreTasks) ----------------------

    def flush_commitlog(self, least_pages: int = 0) -> int:
        return self.entries.flush()

    def flush_consume_queues(self, least_pages: int = 0) -> None:
        self.consume_queues.flush(least_pages)

    def write_checkpoint(self) -> None:
        self.entries.persist_checkpoint()

    def disk_full(self) -> bool:
        return False

    def statistics(self) -> StoreStatistics:
        flushed = self.entries.flushed_index()
        return StoreStatistics(min_offset=self.min_offset, max_offset=self.max_offset,
                               flushed_offset=self._end_of(flushed), committed_offset=self.committed_end_offset(),
                               dispatched_offset=self.reput_from_offset,
                               segments=len(self.entries.data_file_list.mapped_files),
                               consume_queues=len(self.consume_queues.queues), disk_used_ratio=0.0)  # fmt: skip
