"""Read-only views of a store: ``verify`` and record iteration for ``dump``.

Nothing here writes: segments are opened ``O_RDONLY`` and mapped ``PROT_READ``, no lock is taken,
no recovery runs. It works on a live store (it sees what the page cache holds) and on a folder
that holds nothing but a ``commitlog/`` copied from elsewhere; the segment size comes from the
files themselves.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections.abc import Iterator

from commitlog import dispatch
from commitlog import record as rec
from commitlog.mapped_file import StoreError, nonzero_extent
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.scan import ScanCode, scan_segment


class ReadOnlyLog:
    def __init__(self, store_path: str):
        directory = os.path.join(store_path, "commitlog")
        if not os.path.isdir(store_path):
            raise StoreError(f"{store_path}: no such directory")
        if not os.path.isdir(directory):
            raise StoreError(f"{store_path}: no commitlog/ directory in it")
        self.segment_size = MappedFileQueue.infer_file_size(directory) or 0
        self.segments: list[tuple[int, mmap.mmap]] = []
        expected = None
        for start, path in MappedFileQueue.segment_files(directory):
            if os.path.getsize(path) == 0:
                continue
            if expected is not None and start != expected:
                self.close()
                raise StoreError(f"{path}: expected the segment starting at {expected} next (missing file)")
            if start % self.segment_size:
                self.close()
                raise StoreError(f"{path}: start offset is not a multiple of the segment size {self.segment_size}")
            with open(path, "rb") as file:
                self.segments.append((start, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)))
            expected = start + self.segment_size

    @property
    def min_offset(self) -> int:
        return self.segments[0][0] if self.segments else 0

    def segment_for(self, offset: int) -> tuple[int, mmap.mmap] | None:
        if not self.segments:
            return None
        index = (offset - self.segments[0][0]) // self.segment_size
        if 0 <= index < len(self.segments):
            return self.segments[index]
        return None

    def close(self) -> None:
        for _, mapping in self.segments:
            try:
                mapping.close()
            except BufferError:
                pass  # a view is still alive (an exception's traceback); unmapped when it goes
        self.segments = []

    def __enter__(self) -> ReadOnlyLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@dataclasses.dataclass
class VerifyReport:
    path: str
    segments: int
    segment_size: int
    min_offset: int
    max_offset: int  # end of the valid records
    records: int
    topics: dict[str, int]
    corrupt_offset: int | None
    reason: str | None

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def verify(store_path: str, *, crc: str = "crc32c", topics: bool = True) -> VerifyReport:
    """Walk every record of every segment; stop at the first invalid one."""
    crc_function = rec.crc_function_by_name(crc)
    with ReadOnlyLog(store_path) as log:
        records = 0
        max_offset = log.min_offset
        corrupt_offset = None
        reason = None
        topic_counts: dict[str, int] = {}
        for index, (start, mapping) in enumerate(log.segments):
            result = scan_segment(
                mapping, start=0, end=log.segment_size, file_from_offset=start, crc_function=crc_function
            )
            records += result.count
            if topics:
                _count_topics(mapping, result.position, topic_counts)
            last_segment = index == len(log.segments) - 1
            if result.code is ScanCode.END_OF_SEGMENT:
                max_offset = start + log.segment_size
                continue
            max_offset = start + result.position
            if not result.code.clean:
                corrupt_offset, reason = max_offset, result.reason
            elif not last_segment and any(_torn_tail(m, 0, log.segment_size) for _, m in log.segments[index + 1 :]):
                corrupt_offset, reason = max_offset, "segment ends early but later segments hold data"
            elif last_segment and _torn_tail(mapping, result.position, log.segment_size):
                corrupt_offset, reason = max_offset, "nonzero bytes after the end of the data (torn tail)"
            break
        return VerifyReport(
            path=store_path,
            segments=len(log.segments),
            segment_size=log.segment_size,
            min_offset=log.min_offset,
            max_offset=max_offset,
            records=records,
            topics=topic_counts,
            corrupt_offset=corrupt_offset,
            reason=reason,
        )


def _torn_tail(mapping: mmap.mmap, start: int, end: int) -> bool:
    view = memoryview(mapping)
    try:
        return nonzero_extent(view, start, end) > 0
    finally:
        view.release()


def _count_topics(mapping: mmap.mmap, end: int, counts: dict[str, int]) -> None:
    view = memoryview(mapping)
    try:
        position = 0
        while position < end:
            size, _, topic, *_ = rec.decode_dispatch(view, position, end)
            counts[topic] = counts.get(topic, 0) + 1
            position += size
    finally:
        view.release()


def iter_records(
    store_path: str, *, from_offset: int | None = None, crc: str = "crc32c"
) -> Iterator[tuple[int, rec.Record, bool]]:
    """(offset, record, crc_ok) in log order from ``from_offset`` (a record boundary); stops at
    the end of the data and raises RecordError at an invalid record."""
    crc_function = rec.crc_function_by_name(crc)
    with ReadOnlyLog(store_path) as log:
        offset = log.min_offset if from_offset is None else from_offset
        while True:
            found = log.segment_for(offset)
            if found is None:
                if from_offset is not None and offset == from_offset and offset != log.min_offset:
                    raise rec.RecordError(f"offset {offset} is outside the log")
                return
            start, mapping = found
            position = offset - start
            if rec.peek_blank(mapping, position) is not None:
                offset = start + log.segment_size
                continue
            if position + 8 > len(mapping) or mapping[position : position + 8] == bytes(8):
                if offset == from_offset and offset != log.min_offset:
                    raise rec.RecordError(f"offset {offset} is at or past the end of the data")
                return
            first = offset == from_offset
            view = memoryview(mapping)
            try:
                record = rec.decode_record(view, position, crc_function=None)
                if record.physical_offset != offset:
                    raise rec.RecordError(f"the bytes there name offset {record.physical_offset}")
                crc_ok = rec.crcs_ok(view, position, record, crc_function)
                record = dataclasses.replace(record, body=memoryview(bytes(record.body)))
            except rec.RecordError as error:
                what = "is not a record boundary" if first else "holds an invalid record"
                raise rec.RecordError(f"offset {offset} {what}: {error.reason}") from None
            finally:
                view.release()
            yield offset, record, crc_ok
            offset += record.size


# At most this many duplicated queue offsets are listed (the count is always whole): the first
# says where to look, a thousand would only repeat it.
QUEUE_DUPLICATES_LISTED_MAX = 10


@dataclasses.dataclass(frozen=True, slots=True)
class QueueDifference:
    """The first unit of a consume queue that differs from a rebuild from the commit log."""

    topic: str
    queue_id: int
    index: int  # queue offset of the unit
    stored: tuple[int, int, int] | None  # (commit log offset, size, tags code) on disk; None: no unit there
    rebuilt: tuple[int, int, int] | None  # what a full dispatch of the log builds there; None: no record

    def describe(self) -> str:
        return f"{self.topic}/{self.queue_id} unit {self.index}: stored {_unit_text(self.stored)}, rebuilt {_unit_text(self.rebuilt)}"

    def to_json(self) -> dict:
        return {"topic": self.topic, "queue_id": self.queue_id, "index": self.index,
                "stored": list(self.stored) if self.stored else None, "rebuilt": list(self.rebuilt) if self.rebuilt else None}  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class QueueDuplicate:
    """Two records of the log that carry the same queue offset (the dispatcher indexes the first;
    a consumer never sees the second)."""

    topic: str
    queue_id: int
    queue_offset: int
    first_offset: int  # commit log offset of the record indexed
    duplicate_offset: int  # commit log offset of the later record with the same queue offset

    def describe(self) -> str:
        return (f"{self.topic}/{self.queue_id} queue offset {self.queue_offset} is held by the records at "
                f"{self.first_offset} and {self.duplicate_offset}")  # fmt: skip


@dataclasses.dataclass
class QueueCheck:
    """Every consume queue compared with what a full dispatch of the commit log builds."""

    queues: int = 0  # queues compared
    units: int = 0  # units compared
    behind: int = 0  # units the log implies past a queue's stored end (not dispatched yet: built at the next open)
    differences: list[QueueDifference] = dataclasses.field(default_factory=list)  # the first per queue
    duplicates: int = 0  # records whose queue offset an earlier record of the same queue holds
    duplicates_listed: list[QueueDuplicate] = dataclasses.field(default_factory=list)
    gaps: list[str] = dataclasses.field(default_factory=list)  # a record whose queue offset skips ahead (dispatch stops there)

    @property
    def ok(self) -> bool:
        return not self.differences and not self.duplicates and not self.gaps

    def describe(self) -> str:
        parts = [difference.describe() for difference in self.differences[:1]]
        if len(self.differences) > 1:
            parts.append(f"{len(self.differences) - 1} more queue(s) differ")
        if self.duplicates:
            parts.append(f"{self.duplicates} duplicated queue offset(s), first: {self.duplicates_listed[0].describe()}")
        parts += self.gaps[:1]
        return "; ".join(parts) or "consume queues match the log"

    def to_json(self) -> dict:
        return {"queues": self.queues, "units": self.units, "behind": self.behind,
                "differences": [d.to_json() for d in self.differences], "duplicates": self.duplicates,
                "duplicates_listed": [dataclasses.asdict(d) for d in self.duplicates_listed], "gaps": self.gaps}  # fmt: skip


def _unit_text(unit: tuple[int, int, int] | None) -> str:
    return "none" if unit is None else f"(offset {unit[0]}, size {unit[1]}, tags {unit[2]})"


class _Rebuilt:
    """One queue as a full dispatch builds it (``ConsumeQueue.put_run``'s rules: a unit goes at
    the queue's end; a record whose queue offset the queue already holds is skipped)."""

    __slots__ = ("first", "units")

    def __init__(self, first: int):
        self.first = first  # queue offset of the first record of this queue in the log
        self.units = bytearray()

    @property
    def end(self) -> int:
        return self.first + len(self.units) // 20


def rebuild_consume_queues(store_path: str, check: QueueCheck | None = None) -> dict[tuple[str, int], _Rebuilt]:
    """The units a full dispatch of ``store_path``'s commit log builds, per (topic, queue id);
    duplicated queue offsets and gaps are noted in ``check``. Read-only."""
    check = check if check is not None else QueueCheck()
    queues: dict[tuple[str, int], _Rebuilt] = {}
    broken: set[tuple[str, int]] = set()  # a gap: the dispatcher stops there, so does the rebuild
    with ReadOnlyLog(store_path) as log:
        for base, mapping in log.segments:
            view = memoryview(mapping)
            try:
                position, limit = 0, len(mapping)
                while position < limit:
                    before = position
                    position, stop, _records, runs = dispatch.dispatch_units(view, position, limit, base,
                                                                             dispatch.DISPATCH_RECORDS_PER_CALL)  # fmt: skip
                    if stop == dispatch._STOP_SLOW:
                        _rebuild_runs(runs, queues, broken, check)
                        position, stop, _records, runs = dispatch._dispatch_units_python(view, position, limit, base, records_max=1)
                    _rebuild_runs(runs, queues, broken, check)
                    if stop != dispatch._STOP_LIMIT or position == before:
                        break  # a blank (the segment's end), or the end of the data
            finally:
                view.release()
    return queues


def _rebuild_runs(runs, queues: dict, broken: set, check: QueueCheck) -> None:
    for topic, queue_id, first, count, units, _first_offset, _last_end, _store_ts in runs:
        name = dispatch._topic_name(topic)
        if name is None:
            continue
        key = (name, queue_id)
        if key in broken:
            continue
        queue = queues.get(key)
        if queue is None:
            queue = queues[key] = _Rebuilt(first)
        skip = max(0, queue.end - first)
        for index in range(min(skip, count)):  # already held: the dispatcher skips them
            check.duplicates += 1
            if len(check.duplicates_listed) < QUEUE_DUPLICATES_LISTED_MAX:
                offset = int.from_bytes(units[index * 20 : index * 20 + 8], "big", signed=True)
                held = int.from_bytes(queue.units[(first + index - queue.first) * 20 :][:8], "big", signed=True)
                check.duplicates_listed.append(QueueDuplicate(name, queue_id, first + index, held, offset))
        if skip >= count:
            continue
        if first + skip != queue.end:
            offset = int.from_bytes(units[skip * 20 : skip * 20 + 8], "big", signed=True)
            check.gaps.append(f"{name}/{queue_id}: the record at {offset} has queue offset {first + skip} "
                              f"but the queue holds {queue.end} units (a record is missing)")  # fmt: skip
            broken.add(key)
            continue
        queue.units += units[skip * 20 : count * 20]


def _stored_queue(directory: str) -> tuple[int, bytes]:
    """(queue offset of the first unit held, the units up to the queue's end) of one consume queue
    directory, read as recovery reads it: files in order, the end at the first all-zero unit."""
    from commitlog.consume_queue import BLANK_UNIT, CQ_UNIT_SIZE  # noqa: PLC0415

    files = MappedFileQueue.segment_files(directory)
    if not files:
        return 0, b""
    parts = []
    first = files[0][0] // CQ_UNIT_SIZE
    for _start, path in files:
        with open(path, "rb") as file:
            data = file.read()
        end = len(data) - len(data) % CQ_UNIT_SIZE
        zero = _first_zero_unit(data, end)
        if zero is not None:
            parts.append(data[:zero])
            return _without_blank_head(first, b"".join(parts), BLANK_UNIT)
        parts.append(data[:end])
    return _without_blank_head(first, b"".join(parts), BLANK_UNIT)


def _first_zero_unit(data: bytes, end: int) -> int | None:
    """The position of the first all-zero unit in ``data[:end]`` (a queue's end), or None."""
    zero = bytes(20)
    position = 0
    while (found := data.find(zero, position, end)) >= 0:
        aligned = found + (-found % 20)
        if aligned + 20 <= end and data[aligned : aligned + 20] == zero:
            return aligned
        position = found + 1
    return None


def _without_blank_head(first: int, units: bytes, blank: bytes) -> tuple[int, bytes]:
    skip = 0
    while units[skip * 20 : skip * 20 + 20] == blank:
        skip += 1
    return first + skip, units[skip * 20 :]  # type: ignore[return-value]


def check_consume_queues(store_path: str) -> QueueCheck:
    """Compare every consume queue of ``store_path`` with a rebuild from its commit log (what a
    full re-dispatch builds): the first differing unit of each queue, units the queue has not
    reached yet (``behind``: a store stopped before its dispatcher caught up), and the log's own
    faults (a queue offset held by two records, a gap). Units of records below the log's head
    (retention deleted their segment) are not compared. Read-only, like ``verify``."""
    import struct  # noqa: PLC0415

    unit = struct.Struct(">qiq")
    check = QueueCheck()
    rebuilt = rebuild_consume_queues(store_path, check)
    root = os.path.join(store_path, "consumequeue")
    stored: dict[tuple[str, int], tuple[int, bytes]] = {}
    if os.path.isdir(root):
        for topic in sorted(os.listdir(root)):
            for name in sorted(os.listdir(os.path.join(root, topic))) if os.path.isdir(os.path.join(root, topic)) else ():
                if name.isdigit():
                    stored[(topic, int(name))] = _stored_queue(os.path.join(root, topic, name))
    for key in sorted(rebuilt):  # a queue with no record left in the log (retention) has nothing to compare with
        queue = rebuilt[key]
        stored_first, units = stored.get(key, (queue.first, b""))
        stored_end = stored_first + len(units) // 20
        check.queues += 1
        if stored_first > queue.first and units:  # the queue lost units the log still has
            check.differences.append(QueueDifference(*key, queue.first, None, unit.unpack_from(queue.units, 0)))
            continue
        first = queue.first
        compared_end = max(first, min(stored_end, queue.end))  # units below the log's head are not compared
        mine = units[(first - stored_first) * 20 : (compared_end - stored_first) * 20]
        theirs = bytes(queue.units[: (compared_end - first) * 20])
        check.units += max(0, compared_end - first)
        if mine != theirs:
            index = next(i for i in range(0, len(mine), 20) if mine[i : i + 20] != theirs[i : i + 20])
            check.differences.append(QueueDifference(*key, first + index // 20, unit.unpack_from(mine, index),
                                                     unit.unpack_from(theirs, index)))  # fmt: skip
        elif stored_end > queue.end:
            check.differences.append(QueueDifference(*key, queue.end, unit.unpack_from(units, (queue.end - stored_first) * 20), None))
        elif stored_end < queue.end:
            check.behind += queue.end - max(stored_end, first)
    return check
