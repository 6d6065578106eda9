"""DLedgerMessageStore: the message store of a DLedger member (RocketMQ's DLedgerCommitLog).

Theory of operation
-------------------
The log is the member's DLedger entries (``DLedgerMmapFileStore``, ``self.entries``): one RocketMQ
record per entry, the record's commit-log offset (PHYSICALOFFSET) being its entry's ``pos + 48``.
Below ``divided_offset`` (smooth upgrade) lies the old classic commit log, sealed and read-only.
The consume queues (``path/consumequeue``, the classic store's format and code) index **committed**
entries only, so nothing uncommitted is ever readable: ``read``/``get_record``/``pull`` refuse
offsets at or past ``committed_end_offset()``.

Writing is the Raft driver's (DLedger's leader path, split the etcd-raft way)::

    plan = store.plan_append(messages)   # leader: bodies for indexes last+1.., queue offsets, PHYSICALOFFSET
    core.propose(plan.bodies, now)       # the pure core accepts (or refuses: then forget the plan)
    store.accept_plan(plan)              # queue table advanced; the next plan starts after this one
    ... driver appends the core's entries through store.entries, flushes, learns the commit ...
    store.set_committed(index)           # entries.update_committed_index
    store.dispatch()                     # consume-queue units for committed entries (no-ops skipped)

A plan is computed against the log's end plus the plans accepted but not yet appended, so a leader
may have several proposals in flight; the core must append each accepted plan's bodies at
``plan.first_index`` and nothing else in between (its term-start no-op is appended before the
leader plans: ``caught_up``). A member that stops leading calls ``discard_plans``.

A RESET from the leader (``reset_log``: this member needs entries retention deleted everywhere)
drops the consume queues (renamed away atomically, then deleted) and then every entry file
(``DLedgerMmapFileStore.reset``, atomic for recovery); the log restarts empty at the leader's first
index and offset, and the queues restart with the first message dispatched after it, at its
queue offset (as the leader's queues start at its minimum offset after retention). A crash
between the two steps leaves the old log without queues: recovery dispatches them again.

Recovery (``open``): the classic part, when DLedger has no data yet, is recovered and dispatched by
opening it as a classic ``MessageStore`` once (then sealed by ``open_after_classic``). The DLedger
store recovers itself (the committed index is its checkpoint's hint). Consume-queue units pointing
past the recovered entries' end are cut, and a torn last unit dropped. Dispatch resumes after the
entry of the newest unit; those entries were committed when dispatched (a committed entry never
changes and truncation never goes below it), so the committed index is raised to cover them. After a
crash dispatch goes back to the first entry of the data file where the entries' recovery scan began
(units already there are skipped by ``ConsumeQueue.put_run``), as ``MessageStore`` does.

MessageStore's names this store has, so the broker's ``ClientPort`` and ``StoreTasks`` work
unchanged: ``config``, ``path``, ``checkpoint``, ``consume_queues``, ``reput_from_offset``,
``dispatch_error``, ``dispatch_end_offset`` (a property, as MessageStore's: StoreTasks compares
it), ``sync_flush`` (False: durability is the quorum's), ``commit_log`` (only
``commit_log.mapped_file_queue``, the DLedger data files, for StoreTasks' warm-up test),
``warm_commitlog``, ``flush_commitlog``, ``flush_consume_queues``, ``write_checkpoint``,
``dispatch``, ``clean_expired`` (with the driver's ``keep_from_index``), ``read``,
``get_record``, ``pull``, ``statistics``, ``find_at_record_ends`` (DLedger part only),
``resume_queue_offsets``, ``disk_full``, ``close``.
Deliberately lacking: ``append``/``append_batch``/``append_prepared`` (writes go through Raft:
``plan_append``), ``append_replicated``/``truncate``/``last_record_end``/``open_epoch``/``epochs``
(classic replication; a follower's log is cut by the Raft driver through ``entries.truncate``).
Synchronous and not thread-safe, as MessageStore.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
import shutil
import struct
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

from commitlog import identity as store_identity
from commitlog import native
from commitlog import record as rec
from commitlog.checkpoint import StoreCheckpoint, StoreLock, create_abort_file, remove_abort_file
from commitlog.commit_log import CommitLog, ReadError, now_ms
from commitlog.config import StoreConfig
from commitlog.consume_queue import ConsumeQueueStore
from commitlog.damage import DamagedRange
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_store import DLedgerMmapFileStore, DLedgerStoreConfig
from commitlog.dledger.upgrade import DividedLog, LogPart, dledger_directory, open_after_classic
from commitlog.mapped_file import DiskFullError, StoreError, fsync_directory
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog import read_check
from commitlog.store import (
    DiskWatch,
    _STOP_BLANK,
    _STOP_LIMIT,
    _STOP_MALFORMED,
    _STOP_SLOW,
    MessageStore,
    RecordPlace,
    StoreStatistics,
    _dispatch_units_python,
    _topic_name,
    disk_used_ratio,
    dispatch_entries,
    dispatch_units,
)

BODY_OFFSET = codec.BODY_OFFSET  # PHYSICALOFFSET = entry pos + 48 (DLedgerCommitLog's BODY_OFFSET)
_PHYSICAL_OFFSET = struct.Struct(">q")  # a record's PHYSICALOFFSET field (rec.PHYSICAL_OFFSET_POSITION)
_SIZE_WORD = struct.Struct(">i")  # a record's TOTALSIZE
DISCARDED_SUFFIX = ".discarded"  # consume queues a reset renamed away, deleted after (and at the next open)


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

    @property
    def placements(self) -> list[tuple[int, int, int]]:
        """(commit-log offset, queue id, queue offset) of each message."""
        return list(zip(self.offsets, self.queue_ids, self.queue_offsets))


@dataclasses.dataclass(frozen=True)
class _LogFiles:
    """What StoreTasks reads of ``store.commit_log``: the files the writer appends to."""

    mapped_file_queue: MappedFileQueue


class DLedgerMessageStore:
    """Consume queues and reads over a DLedger entry log (see the module docstring)."""

    def __init__(self, path: str, config: StoreConfig | None, *, self_id: str, dledger: DLedgerStoreConfig | None,
                 group: str | None = None, upgrade_classic: bool = False):  # fmt: skip
        self.path = path
        self.config = (config or StoreConfig()).validate()
        self.self_id = self_id
        # STORE/identity: this member of this group (None: not checked); a classic store only with upgrade_classic.
        self.opener = store_identity.dledger_member(self_id, group, upgrade=upgrade_classic)
        self.identity: store_identity.StoreIdentity | None = None
        self.dledger_config = dledger or DLedgerStoreConfig(data_file_size=self.config.commitlog_segment_size,
                                                            page_cache_keep_size=self.config.page_cache_keep_size,
                                                            preallocate_step_size=self.config.preallocate_step_size,
                                                            small_write_pages=self.config.small_write_pages)  # fmt: skip
        self.crc_function = self.config.crc_function
        self.classic: CommitLog | None = None  # the sealed classic part (None: no classic segments)
        self.divided_log: DividedLog | None = None
        self.entries: DLedgerMmapFileStore | None = None
        self.divided_offset = -1
        self.consume_queues = ConsumeQueueStore(os.path.join(path, "consumequeue"),
                                                units_per_file=self.config.consume_queue_units_per_file)  # fmt: skip
        self.checkpoint: StoreCheckpoint | None = None
        self.last_exit_ok = True
        self.dispatched_index = -1  # every committed entry <= it has its consume-queue unit
        self.queues_rebuilt: tuple[tuple[str, int], ...] = ()  # (topic, queue id) recovery found cut by damage
        self.dispatch_error: str | None = None
        self.dispatch_skipped = 0  # records whose topic cannot name a consume queue
        self.read_damaged: list[DamagedRange] = []  # damage reads found (recovery's is the entry store's)
        self._queue_table: dict[tuple[str, int], int] = {}
        self._pending: list[tuple[int, int, int]] = []  # (index, pos, entry size) accepted, not yet appended
        self._last_store_timestamp = 0
        self._lock: StoreLock | None = None
        self.disk = DiskWatch(path, ratio_max=self.config.disk_max_used_space_ratio,
                              interval_seconds=self.config.disk_check_interval_seconds)  # fmt: skip
        self.dispatch_blocked: str | None = None  # no room for a consume-queue file: dispatch runs again later
        self._opened = False

    # -- lifetime -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, config: StoreConfig | None = None, *, self_id: str,
             dledger: DLedgerStoreConfig | None = None, group: str | None = None,
             upgrade_classic: bool = False) -> DLedgerMessageStore:  # fmt: skip
        """Open the store root ``path`` as member ``self_id`` of ``group``: the classic part (if
        ``path/commitlog`` has segments), the DLedger files in ``dledger_directory(path,
        self_id)``, the consume queues; recover. ``STORE/identity`` must name this member (and
        group, when given); a classic store is refused unless ``upgrade_classic`` (the smooth
        upgrade's explicit step: its marker becomes this member's)."""
        store = cls(path, config, self_id=self_id, dledger=dledger, group=group, upgrade_classic=upgrade_classic)
        store._open()
        return store

    def _open(self) -> None:
        store_identity.check(self.path, self.opener)  # before anything is created or written
        os.makedirs(self.path, exist_ok=True)
        self._check_disk_size()
        directory = dledger_directory(self.path, self.self_id)
        classic_directory = os.path.join(self.path, "commitlog")
        has_classic = bool(MappedFileQueue.segment_files(classic_directory))
        if has_classic and not MappedFileQueue.segment_files(os.path.join(directory, "data")):
            # recover and dispatch the classic part once (the identity was checked above)
            MessageStore.open(self.path, self.config, check_identity=False).close()
        self._lock = StoreLock(os.path.join(self.path, "lock"))
        try:
            self.identity = store_identity.claim(self.path, self.opener)  # an upgrade's marker: before the seal
            shutil.rmtree(self.consume_queues.root + DISCARDED_SUFFIX, ignore_errors=True)  # a reset's leftover
            abort_path = os.path.join(self.path, "abort")
            self.last_exit_ok = not os.path.exists(abort_path)
            self.checkpoint = StoreCheckpoint.open(os.path.join(self.path, "checkpoint"))
            if has_classic:
                self._open_classic(classic_directory, directory)
            else:
                self.entries = DLedgerMmapFileStore.open(directory, self.dledger_config)
                self.divided_log = DividedLog(CommitLog(classic_directory, segment_size=self.config.commitlog_segment_size),
                                              self.entries, -1)  # fmt: skip
            self.consume_queues.load()
            self._recover()
            create_abort_file(abort_path)
        except BaseException:
            self._release(clean=False)
            raise
        self._opened = True

    def _check_disk_size(self) -> None:
        """StoreError, before anything is written, when the disk could never hold one data file
        and one index file (preallocated whole): the first append would fail, every term."""
        stat = os.statvfs(self.path)
        capacity = (stat.f_blocks - stat.f_bfree + stat.f_bavail) * stat.f_frsize  # used + available to us
        needed = self.dledger_config.data_file_size + self.dledger_config.index_file_size
        if capacity < needed:
            raise StoreError(f"{self.path}: the disk holds {capacity} bytes, less than one data file "
                             f"({self.dledger_config.data_file_size} bytes, commitlog_segment_size) and one index file "
                             f"({self.dledger_config.index_file_size} bytes) need: use a larger disk or smaller "
                             f"segments")  # fmt: skip

    def _open_classic(self, classic_directory: str, directory: str) -> None:
        self.classic = CommitLog(classic_directory, segment_size=self.config.commitlog_segment_size,
                                 store_host=self.config.store_host)  # fmt: skip
        self.classic.load()
        # Recovered and dispatched by MessageStore before it was sealed: a normal-exit scan.
        self.classic.recover(abnormal=False, dispatch_from=1 << 62, checkpoint_min_timestamp=0, crc_function=None,
                             cut_segments_max=self.config.recovery_cut_segments_max)  # fmt: skip
        self.divided_log = open_after_classic(directory, self.dledger_config, commit_log=self.classic)
        self.entries = self.divided_log.dledger
        self.divided_offset = self.divided_log.divided_commitlog_offset

    def _recover(self) -> None:
        queues = self.consume_queues
        queues.recover()
        queues.truncate_dirty(self._entries_end())
        queues.drop_torn_units(lambda offset: self._record_at(offset, committed_only=False), min_offset=self.min_offset,
                               last_exit_ok=self.last_exit_ok)  # fmt: skip
        entries = self.entries
        self.dispatched_index = self._newest_dispatched_index()
        entries.update_committed_index(self.dispatched_index)  # dispatched => was committed
        if not self.last_exit_ok and entries.recovery is not None and entries.last_index() >= entries.first_index():
            self.dispatched_index = min(
                self.dispatched_index, self._first_index_at_or_after(entries.recovery.start_offset) - 1
            )
        # Queues cut by damage in the middle (units follow the cut) are dispatched again from their
        # new ends, as the classic store does: a gap would stop the dispatch.
        rebuilt = [queue for queue in queues.queues.values() if queue.cut_in_recovery]
        for queue in rebuilt:
            unit = queue.last_unit()
            if unit is None or unit[0] < self._dledger_start() or entries.last_index() < entries.first_index():
                end = entries.first_index() - 1
            else:
                end = entries.get_by_pos(unit[0] - BODY_OFFSET).index
            self.dispatched_index = min(self.dispatched_index, end)
        self.queues_rebuilt = tuple(sorted((queue.topic, queue.queue_id) for queue in rebuilt))
        while self.dispatch():
            pass
        self._queue_table = queues.queue_offset_table()

    def _newest_dispatched_index(self) -> int:
        """The entry of the newest consume-queue unit in the DLedger part; first - 1 if none."""
        entries = self.entries
        newest = max((unit[0] for queue in self.consume_queues.queues.values()
                      if (unit := queue.last_unit()) is not None), default=-1)  # fmt: skip
        if newest < self._dledger_start() or entries.last_index() < entries.first_index():
            return entries.first_index() - 1
        return entries.get_by_pos(newest - BODY_OFFSET).index

    def close(self, *, clean: bool = True) -> None:
        """Flush the entries, dispatch, flush the queues, write both checkpoints, remove ``abort``
        (only if every committed entry is dispatched). ``clean=False``: let go of the files as a
        killed process would (nothing flushed, ``abort`` kept)."""
        if not self._opened:
            return
        self._opened = False
        if not clean:
            self._release(clean=False)
            return
        try:
            self.entries.flush()
            while self.dispatch():
                pass
            self.flush_consume_queues(0)
            self.write_checkpoint()
            if self.dispatch_error is None and self.dispatched_index >= self.entries.committed_index:
                remove_abort_file(os.path.join(self.path, "abort"))
        finally:
            self._release(clean=True)

    def _release(self, *, clean: bool) -> None:
        if self.entries is not None:
            self.entries.close() if clean else self.entries.abandon()
        if self.classic is not None:
            self.classic.mapped_file_queue.close()
        self.consume_queues.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> DLedgerMessageStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the leader's writes --------------------------------------------------------------

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
            queue_offsets += [0] * count if _transactional(each.sysflag) else range(first, first + count)
            start += count
        return AppendPlan(first_index, tuple(bodies), tuple(offsets), tuple(queue_ids), tuple(queue_offsets),
                          store_timestamp, queue_next, positions, entry_sizes)  # fmt: skip

    def _plan_positions(self, record_sizes: list[int]) -> tuple[int, list[int], list[int]]:
        """(first index, entry positions, entry sizes) for records of these sizes after the pending plans;
        MessageRejected when one cannot fit a data file (with the blank record DLedger needs).
        Planned from where the newest pending entry ends: a pass of puts accepts a plan a request
        before any is appended, so planning the pending entries again made a pass quadratic."""
        entry_sizes = [BODY_OFFSET + size for size in record_sizes]  # codec.entry_size, without a call per entry
        fit_max = self.dledger_config.data_file_size - codec.MIN_BLANK_SIZE
        if max(entry_sizes) > fit_max:
            raise rec.MessageRejected(rec.PutMessageStatus.MESSAGE_ILLEGAL,
                                      f"an entry of {max(entry_sizes)} bytes does not fit a DLedger data file of "
                                      f"{self.dledger_config.data_file_size} bytes")  # fmt: skip
        self._drop_appended_plans()
        pending = self._pending
        if not pending:
            return self.entries.last_index() + 1, self.entries.plan_positions(entry_sizes), entry_sizes
        index, pos, size = pending[-1]
        return index + 1, self.entries.plan_positions(entry_sizes, start=pos + size), entry_sizes

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
        if _transactional(sysflag):
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

    def discard_plans(self) -> None:
        """No longer leading: forget accepted-but-unappended plans and the queue table's advance."""
        self._pending.clear()
        self._queue_table = self.consume_queues.queue_offset_table()

    def reset_log(self, reset: Any) -> None:
        """A RESET (``reset.first_index``, ``term_before_first``, ``first_offset``): drop the
        consume queues and every entry; the log restarts empty at ``first_index``, dispatched and
        committed up to ``first_index - 1``. Durable when it returns; see the module for a crash
        between the steps. ValueError (nothing changed) as ``DLedgerMmapFileStore.reset``."""
        entries = self.entries
        if entries.committed_index >= reset.first_index:
            raise ValueError(f"a reset to {reset.first_index} would drop committed entries "
                             f"(committed {entries.committed_index})")  # fmt: skip
        self._pending.clear()
        entries.persist_checkpoint()  # the committed index: a crash before the entries' reset redispatches it all
        self.consume_queues.close()
        root = self.consume_queues.root
        if os.path.isdir(root):
            discarded = root + DISCARDED_SUFFIX
            shutil.rmtree(discarded, ignore_errors=True)
            os.replace(root, discarded)  # atomic: the queues are there whole or gone
            fsync_directory(os.path.dirname(root))
            shutil.rmtree(discarded, ignore_errors=True)
        self.consume_queues = ConsumeQueueStore(root, units_per_file=self.config.consume_queue_units_per_file)
        entries.reset(reset)
        self.dispatched_index = reset.first_index - 1
        self.dispatch_error = None
        self._queue_table = {}

    def set_committed(self, index: int) -> None:
        """The core's committed index (never goes back; capped at the log's end by the entries)."""
        self.entries.update_committed_index(index)

    # -- dispatch -------------------------------------------------------------------------

    @property
    def sync_flush(self) -> bool:
        """False: a DLedger write is durable through the quorum; the driver flushes entries."""
        return False

    @property
    def reput_from_offset(self) -> int:
        """Commit-log offset up to which committed entries are dispatched (MessageStore's name)."""
        return self._end_offset_of(self.dispatched_index)

    @property
    def dispatch_end_offset(self) -> int:
        """Dispatch goes up to the committed end (a property, as MessageStore's)."""
        return self.committed_end_offset()

    def dispatch(self, max_bytes: int | None = None) -> int:
        """Consume-queue units for committed entries after ``dispatched_index``, about
        ``max_bytes`` (default ``dispatch_batch_size_max``) of entries; return how many entries were
        dispatched (no-ops, empty bodies, included: non-zero means progress). A body that is not
        one record at its offset stops dispatch and is reported in ``dispatch_error``."""
        if self.dispatch_error is not None:
            return 0
        budget = max_bytes or self.config.dispatch_batch_size_max
        entries = self.entries
        count = 0
        while self.dispatched_index < entries.committed_index and budget > 0:
            first = self.dispatched_index + 1
            last = min(entries.committed_index, first + DISPATCH_ENTRIES_MAX - 1)
            fitting, _, pos, end = entries.run_extent(first, last + 1, size_max=budget)  # the walk keeps to the budget
            try:
                walked, size = self._dispatch_run(first, first + fitting - 1, pos, end)
            except DiskFullError as error:  # a consume queue's next file: again later (put_run skips what it has)
                self.dispatch_blocked = str(error)
                break
            self.dispatch_blocked = None
            count += walked
            budget -= size
            if self.dispatch_error is not None:
                break
        return count

    def _dispatch_run(self, first: int, last: int, pos: int, end: int) -> tuple[int, int]:
        """Dispatch entries ``first..last`` (committed) that lie in ``first``'s data file with one
        walk (``dispatch_entries``: headers skipped, one record per entry, no-ops passed over);
        return (entries dispatched, their bytes); ``pos`` is where ``first`` lies and ``end`` where
        ``last`` ends (``run_extent``). An entry the native walk leaves to Python
        (TAGS not UTF-8) goes through ``_dispatch_entry``; a malformed one sets ``dispatch_error``."""
        entries = self.entries
        mapped_file = entries.data_file_list.find_mapped_file_by_offset(pos)
        base = mapped_file.file_from_offset
        start, limit = pos - base, min(end - base, mapped_file.wrote_position)
        runs = _Runs(self)
        try:
            position, stop, walked, found = dispatch_entries(mapped_file.view(), start, limit, base, last - first + 1,
                                                             BODY_OFFSET)  # fmt: skip
            for run in found:
                runs.add(*run)
            if stop == _STOP_SLOW:  # this one entry through the twin
                index = first + walked
                _, size = entries.entry_span(index)
                error = self._dispatch_entry(index, base + position, size, runs)
                if error is None:
                    walked, position = walked + 1, position + size
                else:
                    self.dispatch_error = error
            elif stop == _STOP_MALFORMED or (stop == _STOP_LIMIT and walked == 0):
                index = first + walked
                self.dispatch_error = f"entry {index}: its body at offset {base + position + BODY_OFFSET} is not one record (malformed)"
        finally:
            runs.write()  # the units of every entry before a bad one too
        self.dispatched_index = first + walked - 1
        return walked, position - start

    def _dispatch_entry(self, index: int, pos: int, size: int, runs: _Runs) -> str | None:
        mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(pos)
        base = mapped_file.file_from_offset
        start, limit = pos + BODY_OFFSET - base, pos + size - base
        view = mapped_file.view()
        position, stop, records, found = dispatch_units(view, start, limit, base, 1)
        if stop == _STOP_SLOW:
            position, stop, records, found = _dispatch_units_python(view, start, limit, base, records_max=1)
        if stop in (_STOP_MALFORMED, _STOP_BLANK) or records != 1 or position != limit:
            return f"entry {index}: its body at offset {pos + BODY_OFFSET} is not one record (malformed)"
        for run in found:
            runs.add(*run)
        return None

    def caught_up(self) -> bool:
        """Every entry committed and dispatched (DLedgerRoleChangeHandler's test before a leader
        takes writes: ledgerEnd == committedIndex and no dispatch behind)."""
        entries = self.entries
        return (entries.last_index() == entries.committed_index and self.dispatched_index >= entries.committed_index
                and self.dispatch_error is None)  # fmt: skip

    def resume_queue_offsets(self) -> None:
        """A new leader, once caught up: continue each queue from its consume queue (entries it
        followed were dispatched, not planned here). StoreError when not caught up."""
        while self.dispatch():
            pass
        if not self.caught_up():
            raise StoreError(f"cannot take writes: log ends at {self.entries.last_index()}, committed "
                             f"{self.entries.committed_index}, dispatched {self.dispatched_index}, "
                             f"dispatch error {self.dispatch_error}")  # fmt: skip
        self._pending.clear()
        self._queue_table = self.consume_queues.queue_offset_table()

    def flush_consume_queues(self, least_pages: int = 0) -> None:
        newest = self.consume_queues.flush(least_pages)
        if newest:
            self.checkpoint.logics_msg_timestamp = newest

    def write_checkpoint(self) -> None:
        """The store checkpoint and the entries' checkpoint (endIndex, committedIndex, flushedIndex)."""
        self.checkpoint.flush()
        self.entries.persist_checkpoint()

    def flush_commitlog(self, least_pages: int = 0) -> int:
        """Flush the entries (``least_pages`` is ignored: DLedger flushes all); return the
        commit-log offset up to which they are durable."""
        return self._end_offset_of(self.entries.flush())

    def warm_commitlog(self, ahead: int | None = None) -> None:
        self.entries.warm_ahead(self.config.warm_ahead_size if ahead is None else ahead)

    @property
    def commit_log(self) -> _LogFiles:
        """Only ``mapped_file_queue`` (the DLedger data files), what StoreTasks looks at."""
        return _LogFiles(self.entries.data_file_list)

    def clean_expired(self, *, keep_from_index: int, now_ms_value: int | None = None,
                      over_ratio: bool | None = None) -> list[str]:  # fmt: skip
        """Retention (DLedger's CleanSpaceService): delete the oldest whole data files whose every
        entry is older than ``file_reserved_time_hours`` (the file's mtime) or, while the disk is
        above ``disk_clean_ratio`` (``over_ratio``; measured when None), regardless of age; at most
        ``delete_segments_per_pass_max`` a pass. Never an entry at or above ``keep_from_index``
        (the driver's replication floor: what some member may still need), the committed index,
        the flushed index or the dispatched index + 1; never the file being written. Sealed
        classic segments (a smooth upgrade's part below ``divided_offset``) go first, all but the
        newest. Consume-queue files pointing only below the new minimum offset follow."""
        now = now_ms() if now_ms_value is None else now_ms_value
        reserved_ms = self.config.file_reserved_time_hours * 3600 * 1000
        if over_ratio is None:
            over_ratio = disk_used_ratio(self.path) > self.config.disk_clean_ratio
        budget = self.config.delete_segments_per_pass_max
        deleted = self._clean_classic(now, reserved_ms, over_ratio, budget)
        entries = self.entries
        keep = min(keep_from_index, self.dispatched_index + 1)
        count = 0
        for mapped_file, _next_first in entries.deletable_head_files(keep_from_index=keep,
                                                                     count_max=budget - len(deleted)):  # fmt: skip
            if now - entries.data_file_modified_ms(mapped_file) < reserved_ms and not over_ratio:
                break
            count += 1
        deleted += entries.delete_head_files(count=count, keep_from_index=keep)
        if deleted:
            self.consume_queues.delete_expired(self.min_offset)
        return deleted

    def _clean_classic(self, now: int, reserved_ms: float, over_ratio: bool, budget: int) -> list[str]:
        """The sealed classic segments older than the reserved time (all but the newest)."""
        if self.classic is None:
            return []
        queue = self.classic.mapped_file_queue
        count = 0
        for mapped_file in queue.mapped_files[:-1][:budget]:
            if now - os.path.getmtime(mapped_file.path) * 1000 < reserved_ms and not over_ratio:
                break
            count += 1
        return queue.delete_first_files(count)

    # MessageStore's disk check (DiskWatch), on the same attribute.
    disk_full = MessageStore.disk_full

    # -- offsets ----------------------------------------------------------------------------

    def _dledger_start(self) -> int:
        """Commit-log offset where the DLedger part starts."""
        entries = self.entries
        if entries.last_index() >= entries.first_index():
            return entries.pos_at(entries.first_index())
        if entries.data_file_list.mapped_files:
            return entries.data_file_list.min_offset
        if entries.first_index() > 0:  # empty after a reset: where its next entry will lie
            return entries.data_start_offset
        return max(self.divided_offset, 0)

    def _end_offset_of(self, index: int) -> int:
        """End of entry ``index`` in the commit-log offset space (the DLedger start below the first)."""
        if index < self.entries.first_index():
            return self._dledger_start()
        pos, size = self.entries.entry_span(index)
        return pos + size

    def _entries_end(self) -> int:
        return self._end_offset_of(self.entries.last_index())

    def _first_index_at_or_after(self, pos: int) -> int:
        entries = self.entries
        indexes = range(entries.first_index(), entries.last_index() + 1)
        return entries.first_index() + bisect.bisect_left(indexes, pos, key=entries.pos_at)

    def committed_end_offset(self) -> int:
        """Commit-log offset just past the last committed entry: the readable end."""
        return self._end_offset_of(self.entries.committed_index)

    def offset_of_index(self, index: int) -> int:
        """PHYSICALOFFSET of the message in entry ``index`` (its pos + 48)."""
        return self.entries.pos_at(index) + BODY_OFFSET

    @property
    def min_offset(self) -> int:
        """The oldest readable offset: the classic part's, until retention deletes the DLedger
        part's head (the newest sealed classic segment stays on disk, no longer reachable)."""
        if self.classic is not None and self.entries.first_index() == 0:
            return self.classic.min_offset
        return self._dledger_start()

    # -- reading ----------------------------------------------------------------------------

    def _record_at(self, offset: int, *, committed_only: bool = True, crc_function=None) -> rec.Record:
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            return self.classic.get_record(offset, crc_function=crc_function)
        try:
            stored = self.entries.get_by_pos(offset - BODY_OFFSET)
        except (ValueError, IndexError, StoreError) as error:
            raise ReadError(f"no message at offset {offset}: {error}") from None
        if committed_only and stored.index > self.entries.committed_index:
            raise ReadError(f"entry {stored.index} at offset {offset} is not committed")
        try:
            record = rec.decode_record(stored.body, 0, crc_function=crc_function, limit=len(stored.body))
        except rec.RecordError as error:
            raise ReadError(f"entry {stored.index} at offset {offset}: {error.reason}") from None
        if record.physical_offset != offset:
            raise ReadError(f"entry {stored.index}: its record names offset {record.physical_offset}, not {offset}")
        return record

    def get_record(self, offset: int, *, check_crc: bool = False) -> rec.Record:
        """The committed message whose commit-log offset is ``offset``; ReadError otherwise (with
        ``check_crc``, ``DamagedRecordError`` for a body that fails its CRC, added to ``damaged``)."""
        if check_crc:  # the record's own checks first (the entry's CRC, below, names no record)
            head = self.read(offset, _SIZE_WORD.size)
            size = _SIZE_WORD.unpack(head)[0] if len(head) == _SIZE_WORD.size else 0
            checked = read_check.noted(read_check.read_records(self._segment_of, [(offset, max(size, 8))],
                                                               crc_function=self.crc_function), self.read_damaged)  # fmt: skip
            if checked.damage is not None:
                raise read_check.DamagedRecordError(checked.damage)
        return self._record_at(offset)

    def read_records(self, spans: Sequence[tuple], *, copy: bool = False) -> read_check.CheckedRead:
        """MessageStore.read_records: one walk per record here (entry headers lie between them)."""
        checked = read_check.read_records(self._segment_of, spans, crc_function=self.crc_function, check=self.config.check_crc_on_read,
                                          copy=copy)  # fmt: skip
        return read_check.noted(checked, self.read_damaged)

    def read_checked(self, offset: int, size_max: int) -> read_check.CheckedRead:
        """MessageStore.read_checked: in the DLedger part each entry's record is walked alone."""
        if not self.config.check_crc_on_read:
            return read_check.CheckedRead([self.read(offset, size_max)])
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            mapped_file = self.classic.transfer_span(offset, 0)[0]
            segment_end, header = mapped_file.file_from_offset + mapped_file.file_size, 0
        else:
            self.read(offset, 0)  # ReadError outside the committed log, as read
            mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(offset)
            segment_end = min(mapped_file.file_from_offset + mapped_file.file_size, self.committed_end_offset())
            header = BODY_OFFSET
        checked = read_check.read_range(self.read, self._file_path, offset, size_max, crc_function=self.crc_function,
                                        segment_end=segment_end, entry_header_size=header)  # fmt: skip
        return read_check.noted(checked, self.read_damaged)

    def _segment_of(self, offset: int) -> read_check.Segment:
        """The readable bytes of the file holding ``offset``: a classic segment's, or a data file's
        up to the committed end."""
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            mapped_file = self.classic.transfer_span(offset, 0)[0]
            return mapped_file.view()[: mapped_file.read_position], mapped_file.file_from_offset, mapped_file.path
        start, end = self._dledger_start(), self.committed_end_offset()
        if not start <= offset < end:
            raise ReadError(f"offset {offset} outside the committed DLedger log [{start}, {end})")
        mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(offset)
        limit = min(mapped_file.wrote_position, end - mapped_file.file_from_offset)
        return mapped_file.view()[:limit], mapped_file.file_from_offset, mapped_file.path

    def _file_path(self, offset: int) -> str:
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            return self.classic.mapped_file_queue.find_mapped_file_by_offset(offset).path
        return self.entries.data_file_list.find_mapped_file_by_offset(offset).path

    def read(self, offset: int, size_max: int) -> memoryview:
        """Zero-copy bytes from ``offset``: up to ``size_max``, never past a file's end nor, in the
        DLedger part, past the committed end (DLedgerCommitLog.getData)."""
        if self.divided_log.part_of(offset) is LogPart.CLASSIC:
            return self.classic.read(offset, size_max)
        start, end = self._dledger_start(), self.committed_end_offset()
        if not start <= offset < end:
            raise ReadError(f"offset {offset} outside the committed DLedger log [{start}, {end})")
        mapped_file = self.entries.data_file_list.find_mapped_file_by_offset(offset)
        position = offset - mapped_file.file_from_offset
        size = min(size_max, mapped_file.wrote_position - position, end - offset)
        return mapped_file.slice(position, size)

    def pull(self, topic: str, queue_id: int, queue_offset: int, count_max: int) -> list[rec.Record]:
        queue = self.consume_queues.find(topic, queue_id)
        if queue is None:
            return []
        units = queue.read(queue_offset, count_max)
        if not self.config.check_crc_on_read:
            return [self.get_record(offset) for offset, _size, _tags in units]
        checked = self.read_records(units)
        if checked.damage is not None and not checked.views:
            raise read_check.DamagedRecordError(checked.damage)
        return [rec.decode_record(view, crc_function=None) for view in checked.views]

    def find_at_record_ends(self, span_bytes: int, pattern: re.Pattern) -> Iterator[tuple[re.Match, RecordPlace]]:
        """Matches of ``pattern`` ending exactly where a record ends (its properties), in the
        committed entries of the last ``span_bytes`` of the DLedger part (the classic part is not
        searched), with where that record is (MessageStore.find_at_record_ends)."""
        entries = self.entries
        end = self.committed_end_offset()
        index = self._first_index_at_or_after(end - span_bytes)
        while index <= entries.committed_index:
            pos, size = entries.entry_span(index)
            index += 1
            if size <= BODY_OFFSET:
                continue
            mapped_file = entries.data_file_list.find_mapped_file_by_offset(pos)
            base = mapped_file.file_from_offset
            view = mapped_file.view()
            start, limit = pos + BODY_OFFSET - base, pos + size - base
            for match in pattern.finditer(view, start, limit):
                if match.end() != limit:
                    continue
                _, _, _, queue_id, queue_offset, sysflag, _, _ = rec.decode_dispatch(view, start, limit)
                if not _transactional(sysflag):
                    yield match, RecordPlace(pos + BODY_OFFSET, size - BODY_OFFSET, queue_id, queue_offset)

    # -- damage found while serving, and its repair from a healthy member -------------------

    def record_damage(self, damage: DamagedRange) -> bool:
        """Note damage the scrub found (STATUS ``damaged``); True when it was not known yet."""
        return read_check.add_damage(self.read_damaged, damage)

    def damaged_entry(self, damage: DamagedRange) -> tuple[int, int] | None:
        """(index, pos) of the committed entry ``damage`` lies in (the scrub names its entry; a
        read names the record's offset, pos + 48), None when it is not one entry of the log."""
        entries = self.entries
        if self.divided_log.part_of(damage.from_offset) is LogPart.CLASSIC:
            return None
        if damage.index >= 0:
            return damage.index, damage.from_offset
        if entries.last_index() < entries.first_index():
            return None
        for pos in (damage.from_offset - BODY_OFFSET, damage.from_offset):
            try:
                index = self._first_index_at_or_after(pos)
                if entries.first_index() <= index <= entries.committed_index and entries.pos_at(index) == pos:
                    return index, pos
            except StoreError:  # a damaged index unit on the way: the scrub will name the entry
                return None
        return None

    def repair_entry(self, index: int, pos: int, data) -> tuple[str, ...]:
        """Write ``data``, committed entry ``index`` at ``pos`` as a healthy member holds it,
        over this member's damaged copy (``DLedgerMmapFileStore.rewrite_entry``), once the
        message in it checks as a read checks it; then forget the damage noted there. StoreError
        naming why the copy is refused (nothing written). Returns what was rewritten."""
        if len(data) > BODY_OFFSET:
            body = memoryview(data)[BODY_OFFSET:]
            checked = read_check.read_records(lambda _offset: (body, pos + BODY_OFFSET, "the copy fetched"),
                                              [(pos + BODY_OFFSET, len(body))], crc_function=self.crc_function)  # fmt: skip
            if checked.damage is not None:
                raise StoreError(f"entry {index} at offset {pos}: the message in the copy fetched: {checked.damage.reason}")
        rewritten = self.entries.rewrite_entry(index, pos, data)
        end = pos + len(data)
        self.read_damaged[:] = [d for d in self.read_damaged if not (pos <= d.from_offset < end)]
        return rewritten

    @property
    def damaged(self) -> list[DamagedRange]:
        """Damage the entry store's recovery found and cut (repaired from the Raft leader, or
        accepted), then what reads found since (STATUS ``damaged``)."""
        return (self.entries.damaged if self.entries is not None else []) + self.read_damaged

    def statistics(self) -> StoreStatistics:
        classic_segments = len(self.classic.mapped_file_queue.mapped_files) if self.classic is not None else 0
        return StoreStatistics(
            min_offset=self.min_offset,
            max_offset=self.committed_end_offset(),
            flushed_offset=self._end_offset_of(self.entries.flushed_index()),
            committed_offset=self.committed_end_offset(),
            dispatched_offset=self.reput_from_offset,
            segments=classic_segments + len(self.entries.data_file_list.mapped_files),
            consume_queues=len(self.consume_queues.queues),
            disk_used_ratio=disk_used_ratio(self.path),
        )


def _transactional(sysflag: int) -> bool:
    return sysflag & rec.SYSFLAG_TRANSACTION_MASK in (
        rec.SYSFLAG_TRANSACTION_PREPARED,
        rec.SYSFLAG_TRANSACTION_ROLLBACK,
    )


DISPATCH_ENTRIES_MAX = 1024  # entries dispatched per pass of index reading (their units written together)


class _Runs:
    """Consume-queue units of consecutive entries, joined per queue while their queue offsets
    follow each other, written with one ``put_run`` per queue and pass instead of one per entry."""

    def __init__(self, store: DLedgerMessageStore) -> None:
        self._store = store
        self._open: dict[tuple[bytes, int], list] = {}  # (topic, queue) -> [first, units, next, last_end, ts]

    def add(self, topic: bytes, queue_id: int, first_queue_offset: int, count: int, units: bytes, _first: int,
            last_end: int, store_ts: int) -> None:  # fmt: skip
        key = (topic, queue_id)
        run = self._open.get(key)
        if run is not None and run[2] == first_queue_offset:
            run[1].append(units)
            run[2] += count
            run[3] = last_end
            run[4] = max(run[4], store_ts)
            return
        if run is not None:
            self._put(key, run)
        self._open[key] = [first_queue_offset, [units], first_queue_offset + count, last_end, store_ts]

    def write(self) -> None:
        for key, run in self._open.items():
            self._put(key, run)
        self._open.clear()

    def _put(self, key: tuple[bytes, int], run: list) -> None:
        store = self._store
        name = _topic_name(key[0])
        if name is None:
            store.dispatch_skipped += (run[2] - run[0])
            return
        store.consume_queues.find_or_create(name, key[1]).put_run(run[0], b"".join(run[1]), run[3], run[4])
