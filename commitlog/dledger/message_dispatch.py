"""The dispatch of a DLedger member's message store: consume-queue units for committed entries,
one walk of a data file's entries at a time (DLedgerCommitLog's dispatch of committed entries).

``MessageDispatch`` is a part of ``DLedgerMessageStore`` (its base class): it advances the store's
``dispatched_index`` and writes its consume queues; a body that is not one record stops it and is
reported in ``dispatch_error``.
"""

from __future__ import annotations

from typing import Any

from commitlog.dledger import entry_codec as codec
from commitlog.mapped_file import DiskFullError, StoreError
from commitlog.dispatch import (
    _STOP_BLANK,
    _STOP_LIMIT,
    _STOP_MALFORMED,
    _STOP_SLOW,
    _dispatch_units_python,
    _topic_name,
    dispatch_entries,
    dispatch_units,
)

BODY_OFFSET = codec.BODY_OFFSET
DISPATCH_ENTRIES_MAX = 1024  # entries dispatched per pass of index reading (their units written together)


class MessageDispatch:
    """The dispatch of ``DLedgerMessageStore`` (see the module)."""

    entries: Any  # DLedgerMmapFileStore
    consume_queues: Any  # ConsumeQueueStore
    config: Any  # StoreConfig
    dispatched_index: int
    dispatch_error: str | None
    dispatch_blocked: str | None
    dispatch_skipped: int
    _pending: list
    _queue_table: dict

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


class _Runs:
    """Consume-queue units of consecutive entries, joined per queue while their queue offsets
    follow each other, written with one ``put_run`` per queue and pass instead of one per entry."""

    def __init__(self, store: MessageDispatch) -> None:
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
