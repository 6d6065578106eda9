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
