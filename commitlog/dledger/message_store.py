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

import dataclasses
import os
import shutil
from typing import Any

from commitlog import identity as store_identity
from commitlog.checkpoint import StoreCheckpoint, StoreLock, create_abort_file, remove_abort_file
from commitlog.commit_log import CommitLog, now_ms
from commitlog.config import StoreConfig
from commitlog.consume_queue import ConsumeQueueStore
from commitlog.damage import DamagedRange
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_store import DLedgerMmapFileStore, DLedgerStoreConfig
from commitlog.dledger.message_dispatch import MessageDispatch
from commitlog.dledger.message_planning import MessagePlanner
from commitlog.dledger.message_reader import MessageReader
from commitlog.dledger.upgrade import DividedLog, LogPart, dledger_directory, open_after_classic
from commitlog.mapped_file import StoreError, fsync_directory
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog import read_check
from commitlog.store import DiskWatch, MessageStore, StoreStatistics, disk_used_ratio

BODY_OFFSET = codec.BODY_OFFSET  # PHYSICALOFFSET = entry pos + 48 (DLedgerCommitLog's BODY_OFFSET)
DISCARDED_SUFFIX = ".discarded"  # consume queues a reset renamed away, deleted after (and at the next open)


@dataclasses.dataclass(frozen=True)
class _LogFiles:
    """What StoreTasks reads of ``store.commit_log``: the files the writer appends to."""

    mapped_file_queue: MappedFileQueue


class DLedgerMessageStore(MessagePlanner, MessageReader, MessageDispatch):
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
        self._runs: list = []  # the accepted plans' framed entries (AppendPlan.run), not yet appended: take_run
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

    # -- the leader's writes (planning: message_planning) ---------------------------------

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

    # -- flush, checkpoint, retention ----------------------------------------------------

    # The classic store's step (commitlog.store_steps), on the same attributes.
    flush_consume_queues = MessageStore.flush_consume_queues

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
