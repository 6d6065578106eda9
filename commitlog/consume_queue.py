"""Consume queues: per (topic, queue id), the list of that queue's records in the commit log.

Theory of operation
-------------------
A consume queue is a log of 20-byte units, one per message of the queue, in queue order:

    offset size field
    0      8    commit log offset of the record
    8      4    record size
    12     8    tags code (Java String.hashCode of the TAGS property; 0 without tags)

Unit ``k`` of the queue is at byte ``k * 20`` of the queue's log, so reading message ``k`` is a
seek. Files hold ``units_per_file`` units (RocketMQ: 300 000 = 6 000 000 bytes) and live under
``consumequeue/<topic>/<queue id>/<20-digit start byte>``.

Units are never written by producers: the dispatcher (``MessageStore.dispatch``) reads the
commit log and calls ``put`` — on a master and on a slave alike, so a slave's queues are built from
the replicated bytes. ``put`` is idempotent: a unit for a record at or below the queue's high mark,
or for a queue offset already written, is skipped, so re-dispatching after a crash is safe.
A queue whose first file starts in the middle (its earlier records are gone) fills the gap with
blank units ``(0, 2**31-1, 0)`` as RocketMQ's ``fillPreBlank`` does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
from collections.abc import Callable
from typing import Any, Final

from commitlog.commit_log import ReadError
from commitlog.mapped_file_queue import MappedFileQueue

CQ_UNIT = struct.Struct(">qiq")
CQ_UNIT_SIZE: Final = 20
assert CQ_UNIT.size == CQ_UNIT_SIZE
BLANK_UNIT_SIZE: Final = 2**31 - 1
BLANK_UNIT = CQ_UNIT.pack(0, BLANK_UNIT_SIZE, 0)
UNITS_PER_FILE_DEFAULT: Final = 300_000
# Recovery re-reads at most this many of a queue's newest files (RocketMQ: 3).
RECOVER_FILES_MAX: Final = 3


@dataclasses.dataclass(frozen=True, slots=True)
class DispatchRequest:
    topic: str
    queue_id: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sysflag: int


class ConsumeQueue:
    def __init__(self, directory: str, topic: str, queue_id: int, *, units_per_file: int):
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.file_size = units_per_file * CQ_UNIT_SIZE
        self.mapped_file_queue = MappedFileQueue(directory, file_size=self.file_size, sync_directory_on_create=False)
        self.max_physic_offset = 0  # end (offset + size) of the newest record indexed
        # Set by recovery when it cut units that are not a torn tail (a unit that breaks the
        # order with more units after it): the queue is rebuilt from its log from its new end.
        self.cut_in_recovery = False
        self.min_logic_offset = 0  # byte position of the first real unit
        self.last_store_timestamp = 0

    def load(self) -> None:
        self.mapped_file_queue.load()

    # -- positions ------------------------------------------------------------------------

    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_UNIT_SIZE

    @property
    def max_offset_in_queue(self) -> int:
        """The next queue offset to be written (= number of units, blanks included)."""
        return self.mapped_file_queue.max_offset // CQ_UNIT_SIZE

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> None:
        """Find the last valid unit (offset >= 0, size > 0, offsets increasing) and cut after it."""
        files = self.mapped_file_queue.mapped_files
        if not files:
            return
        start = max(0, len(files) - RECOVER_FILES_MAX)
        end_offset = files[start].file_from_offset
        previous_end = 0
        for mapped_file in files[start:]:
            view = mapped_file.view()
            position = 0
            for offset, size, _tags in CQ_UNIT.iter_unpack(view):
                if size == BLANK_UNIT_SIZE and offset == 0:
                    position += CQ_UNIT_SIZE
                    continue
                if offset < 0 or size <= 0 or offset < previous_end:
                    break
                previous_end = offset + size
                position += CQ_UNIT_SIZE
            # A unit after the break: damage in the middle, not a torn tail (whose next slot is zero).
            following = position + CQ_UNIT_SIZE
            if following < self.file_size and any(view[following : following + CQ_UNIT_SIZE]):
                self.cut_in_recovery = True
            end_offset = mapped_file.offset_of(position)
            if position < self.file_size:
                break
        self.mapped_file_queue.truncate_dirty_files(end_offset)
        self.max_physic_offset = previous_end
        self._correct_min_logic_offset()

    def _correct_min_logic_offset(self) -> None:
        first = self.mapped_file_queue.first
        if first is None:
            self.min_logic_offset = 0
            return
        view = first.view()
        for index in range(first.read_position // CQ_UNIT_SIZE):
            offset, size, _ = CQ_UNIT.unpack_from(view, index * CQ_UNIT_SIZE)
            if size != BLANK_UNIT_SIZE:
                self.min_logic_offset = first.offset_of(index * CQ_UNIT_SIZE)
                return
        self.min_logic_offset = first.offset_of(first.read_position)

    def truncate_dirty_logic_files(self, physical_offset: int) -> None:
        """Drop units of records at or beyond ``physical_offset`` (the commit log was cut there)."""
        queue = self.mapped_file_queue
        cut = None
        for mapped_file in reversed(queue.mapped_files):
            view = mapped_file.view()
            units = mapped_file.read_position // CQ_UNIT_SIZE
            index = units
            while index > 0:
                offset, size, _ = CQ_UNIT.unpack_from(view, (index - 1) * CQ_UNIT_SIZE)
                if size == BLANK_UNIT_SIZE or offset + size <= physical_offset:
                    break
                index -= 1
            cut = mapped_file.offset_of(index * CQ_UNIT_SIZE)
            if index > 0:
                break
        if cut is not None and cut < queue.max_wrote_offset:
            queue.truncate_dirty_files(cut)
        self._recompute_max_physic_offset()

    def _recompute_max_physic_offset(self) -> None:
        last = self.mapped_file_queue.last
        self.max_physic_offset = 0
        if last is None or last.read_position == 0:
            return
        offset, size, _ = CQ_UNIT.unpack_from(last.view(), last.read_position - CQ_UNIT_SIZE)
        if size != BLANK_UNIT_SIZE:
            self.max_physic_offset = offset + size

    def last_unit(self) -> tuple[int, int, int] | None:
        last = self.mapped_file_queue.last
        if last is None or last.read_position == 0:
            return None
        return CQ_UNIT.unpack_from(last.view(), last.read_position - CQ_UNIT_SIZE)

    def drop_last_unit(self) -> None:
        queue = self.mapped_file_queue
        queue.truncate_dirty_files(queue.max_wrote_offset - CQ_UNIT_SIZE)
        self._recompute_max_physic_offset()

    # -- writing --------------------------------------------------------------------------

    def put(self, request: DispatchRequest) -> bool:
        """Write the unit for ``request``; False when it was already there (idempotent replay)."""
        unit = CQ_UNIT.pack(request.commit_log_offset, request.size, request.tags_code)
        end = request.commit_log_offset + request.size
        return self.put_run(request.queue_offset, unit, end, request.store_timestamp) == 1

    def put_run(self, first_queue_offset: int, units: bytes, last_end: int, store_timestamp: int) -> int:
        """Write packed units for consecutive queue offsets from ``first_queue_offset``; return how
        many were new. Leading units already indexed (queue offset already written, or record at
        or below the queue's high mark) are skipped — replay after a crash is idempotent. A gap
        between the queue's end and the first new unit is an error (a record was skipped)."""
        count = len(units) // CQ_UNIT_SIZE
        if count == 0 or last_end <= self.max_physic_offset:
            return 0
        queue = self.mapped_file_queue
        if not queue.mapped_files and first_queue_offset:
            mapped_file = queue.get_last_mapped_file(first_queue_offset * CQ_UNIT_SIZE)
            self._fill_pre_blank(mapped_file, first_queue_offset * CQ_UNIT_SIZE - mapped_file.file_from_offset)
            self.min_logic_offset = first_queue_offset * CQ_UNIT_SIZE
        current = queue.max_wrote_offset // CQ_UNIT_SIZE
        skip = max(0, current - first_queue_offset)
        while skip < count:
            offset, size, _ = CQ_UNIT.unpack_from(units, skip * CQ_UNIT_SIZE)
            if offset + size > self.max_physic_offset:
                break
            skip += 1
        if skip == count:
            return 0
        if first_queue_offset + skip != current:
            raise ValueError(
                f"consume queue {self.topic}/{self.queue_id}: unit for queue offset {first_queue_offset + skip} "
                f"but the queue holds {current} units"
            )
        self._append_units(memoryview(units)[skip * CQ_UNIT_SIZE :])
        self.max_physic_offset = last_end
        self.last_store_timestamp = max(self.last_store_timestamp, store_timestamp)
        return count - skip

    def _append_units(self, view: memoryview) -> None:
        queue = self.mapped_file_queue
        files = queue.mapped_files
        if files and files[-1].append(view):  # the units fit the last file whole (a put's one unit)
            return
        while view:
            mapped_file = queue.get_last_mapped_file(queue.max_wrote_offset)
            size = min(len(view), mapped_file.remaining)
            assert mapped_file.append(view[:size])
            view = view[size:]

    @staticmethod
    def _fill_pre_blank(mapped_file, until_position: int) -> None:
        for _ in range(0, until_position, CQ_UNIT_SIZE):
            mapped_file.append(BLANK_UNIT)

    # -- reading --------------------------------------------------------------------------

    def get(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(commit log offset, size, tags code) of message ``queue_offset``, None if absent."""
        if queue_offset < self.min_offset_in_queue or queue_offset >= self.max_offset_in_queue:
            return None
        byte_offset = queue_offset * CQ_UNIT_SIZE
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(byte_offset)
        if mapped_file is None:
            return None
        return CQ_UNIT.unpack_from(mapped_file.view(), byte_offset - mapped_file.file_from_offset)

    def read(self, queue_offset: int, count_max: int) -> list[tuple[int, int, int]]:
        units = []
        for index in range(queue_offset, min(queue_offset + count_max, self.max_offset_in_queue)):
            unit = self.get(index)
            if unit is None or unit[1] == BLANK_UNIT_SIZE:
                continue
            units.append(unit)
        return units

    def units_at(self, first_queue_offset: int, count: int) -> bytes:
        """The packed units stored for ``count`` queue offsets from ``first_queue_offset`` (fewer
        where the queue ends or its head was deleted: only units it holds)."""
        first = max(first_queue_offset, self.min_offset_in_queue)
        last = min(first_queue_offset + count, self.max_offset_in_queue)
        if first != first_queue_offset:
            return b""  # the head is gone: nothing to compare
        parts = []
        byte_offset, end = first * CQ_UNIT_SIZE, last * CQ_UNIT_SIZE
        while byte_offset < end:
            mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(byte_offset)
            if mapped_file is None:
                break
            position = byte_offset - mapped_file.file_from_offset
            size = min(end - byte_offset, mapped_file.file_size - position)
            parts.append(bytes(mapped_file.view()[position : position + size]))
            byte_offset += size
        return b"".join(parts)

    def rewrite_unit(self, queue_offset: int, unit: bytes) -> None:
        """Overwrite the stored unit of ``queue_offset`` (the scrubber's repair from its record)."""
        assert len(unit) == CQ_UNIT_SIZE
        assert self.min_offset_in_queue <= queue_offset < self.max_offset_in_queue, queue_offset
        byte_offset = queue_offset * CQ_UNIT_SIZE
        mapped_file = self.mapped_file_queue.find_mapped_file_by_offset(byte_offset)
        mapped_file.rewrite(byte_offset - mapped_file.file_from_offset, unit)

    def all_units(self) -> list[tuple[int, int, int]]:
        return self.read(self.min_offset_in_queue, self.max_offset_in_queue - self.min_offset_in_queue)

    # -- maintenance ----------------------------------------------------------------------

    def flush(self, least_pages: int = 0) -> int:
        return self.mapped_file_queue.flush(least_pages)

    def delete_expired(self, commit_log_min_offset: int) -> int:
        """Delete files whose every unit points below ``commit_log_min_offset``; keep the last."""
        files = self.mapped_file_queue.mapped_files
        count = 0
        for mapped_file in files[:-1]:
            offset, size, _ = CQ_UNIT.unpack_from(mapped_file.view(), self.file_size - CQ_UNIT_SIZE)
            if offset + size > commit_log_min_offset:
                break
            count += 1
        self.mapped_file_queue.delete_first_files(count)
        if count:
            self._correct_min_logic_offset()
        return count

    def close(self) -> None:
        self.mapped_file_queue.close()


class ConsumeQueueStore:
    """All consume queues of a store, under ``consumequeue/``."""

    def __init__(self, root: str, *, units_per_file: int = UNITS_PER_FILE_DEFAULT):
        self.root = root
        self.units_per_file = units_per_file
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load(self) -> None:
        if not os.path.isdir(self.root):
            return
        for topic in sorted(os.listdir(self.root)):
            topic_dir = os.path.join(self.root, topic)
            for queue_name in sorted(os.listdir(topic_dir)):
                if not queue_name.isdigit():
                    continue
                queue = self._new(topic, int(queue_name))
                queue.load()
                self.queues[(topic, int(queue_name))] = queue

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(
            os.path.join(self.root, topic, str(queue_id)), topic, queue_id, units_per_file=self.units_per_file
        )

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self.queues.get((topic, queue_id))
        if queue is None:
            queue = self.queues[(topic, queue_id)] = self._new(topic, queue_id)
        return queue

    def recover(self) -> None:
        for queue in self.queues.values():
            queue.recover()

    def drop_torn_units(self, record_at: Callable[[int], Any], *, min_offset: int, last_exit_ok: bool) -> None:
        """Recovery, both message stores: a queue's last unit whose record is not what it says (its
        size, topic, queue and queue offset: a torn write, or damage) is dropped, newest first. ``record_at(offset)`` reads the record a unit names
        (ReadError: none there); a unit below ``min_offset`` names a record retention deleted
        (expired, not torn). After a clean stop a dropped unit marks its queue cut in recovery."""
        for (topic, queue_id), queue in self.queues.items():
            while (unit := queue.last_unit()) is not None:
                offset, size, _ = unit
                if offset < min_offset:
                    break
                try:
                    record = record_at(offset)
                    # the queue offset too: a unit whose offset a flipped bit moved to another record
                    # of the same queue and size passed, and dispatch then met the next record's
                    # queue offset far past the queue's end (a DLedger corrupt drill's round)
                    if (record.size == size and record.topic == topic and record.queue_id == queue_id
                            and record.queue_offset == queue.max_offset_in_queue - 1):  # fmt: skip
                        break
                except ReadError:
                    pass
                queue.drop_last_unit()
                queue.cut_in_recovery = queue.cut_in_recovery or last_exit_ok  # a clean stop tore nothing

    @property
    def max_physic_offset(self) -> int:
        return max((queue.max_physic_offset for queue in self.queues.values()), default=0)

    def truncate_dirty(self, physical_offset: int) -> None:
        for queue in self.queues.values():
            queue.truncate_dirty_logic_files(physical_offset)

    def put(self, request: DispatchRequest) -> bool:
        return self.find_or_create(request.topic, request.queue_id).put(request)

    def flush(self, least_pages: int = 0) -> int:
        """Flush every queue; return the store timestamp of the newest unit now on disk."""
        newest = 0
        for queue in list(self.queues.values()):
            queue.flush(least_pages)
            newest = max(newest, queue.last_store_timestamp)
        return newest

    def queue_offset_table(self) -> dict[tuple[str, int], int]:
        return {key: queue.max_offset_in_queue for key, queue in self.queues.items()}

    def delete_expired(self, commit_log_min_offset: int) -> int:
        return sum(queue.delete_expired(commit_log_min_offset) for queue in self.queues.values())

    def destroy(self) -> None:
        for queue in self.queues.values():
            queue.close()
        self.queues.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
