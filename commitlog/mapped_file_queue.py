"""MappedFileQueue: the ordered segments of one log, found by offset, rolled, truncated, retired.

Theory of operation
-------------------
Segments are equal-sized and contiguous: segment ``i`` starts at ``first + i * file_size``. That
makes ``find_mapped_file_by_offset`` an index computation (O(1)), and it is why loading refuses a
directory whose names or sizes break the pattern (naming the file), instead of guessing.

``flushed_where`` and ``committed_where`` are global offsets (segment start + position); they only
grow, except when ``truncate_dirty_files`` cuts the log back. ``max_offset`` is the end of what
readers may see; ``min_offset`` the start of the oldest segment still kept.

The list of segments is replaced, never mutated in place, so a flush thread iterating a snapshot
never sees it change under it; appends, rolls and truncation are serialised by the owner's lock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from commitlog.mapped_file import (
    CAN_POPULATE,
    PREALLOCATE_STEP_SIZE,
    DiskFullError,
    MappedFile,
    StoreError,
    SyncFailedError,
    fsync_directory,
    is_disk_full,
    parse_segment_name,
    segment_name,
)

WriteBufferSource = Callable[[], bytearray | None]

# The next segment is created (``warm_ahead``) once the last one has this fraction of its size
# left. RocketMQ's AllocateMappedFileService keeps the next segment ready at all times; creating it
# at half full does the same without a spare segment beside every idle log. Creating a 1 GiB
# segment (fallocate, directory fsync) took 0.4 s on this VM under writeback: created on demand,
# in line with a slave's receive, it stalled replication for that long.
SPARE_AT_REMAINING = 0.5
# page_cache_keep_size: the page cache is dropped in steps of at least this many bytes. Each step
# is an madvise and an fadvise, and fadvise DONTNEED drains every CPU's page lists (an IPI each):
# under SYNC_FLUSH a flush follows every group commit, a few KiB apart.
DROP_CACHED_STEP_MIN = 4 * 1024 * 1024
# page_cache_keep_size: where a drop ends is rounded down to this (a PMD: the largest folio the page
# cache gives a file here). fadvise DONTNEED evicts only the folios a range covers whole, and each
# drop starts where the last ended, so a large folio straddling an unaligned end was never evicted:
# a DLedger member at 64 x 32 kept ~570 MiB of its log cached with 256 MiB asked (2 MiB folios
# left behind every step), its page cache grew into memory the host had taken back.
DROP_CACHED_ALIGN = 2 * 1024 * 1024


class MappedFileQueue:
    def __init__(self, directory: str, *, file_size: int, write_buffer_source: WriteBufferSource | None = None,
                 sync_directory_on_create: bool = True, small_pages: bool = False,
                 preallocate_step_size: int = PREALLOCATE_STEP_SIZE):  # fmt: skip
        """``sync_directory_on_create`` off: a new segment's directory entry is made durable by the
        next ``flush`` instead of at creation. Consume queues use it: they are created by the
        dispatch, in line with the event loop, and a directory fsync there waited behind the
        writeback of everything the log had written (0.5 s of a slave's 3.7 s catch-up).
        ``small_pages``: each segment's mapping reads ahead only behind its flushed end
        (``MappedFile``'s ``small_pages``, for stores that sync a few KiB at a time)."""
        if file_size <= 0:
            raise ValueError(f"segment size must be positive, got {file_size}")
        self.directory = directory
        self._sync_directory_on_create = sync_directory_on_create
        self._small_pages = small_pages
        self._preallocate_step_size = preallocate_step_size  # MappedFile's: disk reserved ahead of the writer at a time
        self._directory_unsynced = False
        self.file_size = file_size
        self._write_buffer_source = write_buffer_source
        self.mapped_files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0
        self._dropped_where = 0  # page_cache_keep_size: the page cache was dropped below about here
        # The next segment, created and warmed ahead of need (AllocateMappedFileService).
        self._spare: MappedFile | None = None
        self._spare_lock = threading.Lock()

    # -- loading --------------------------------------------------------------------------

    @staticmethod
    def segment_files(directory: str) -> list[tuple[int, str]]:
        """(start offset, path) of every segment in ``directory``, sorted; other names are errors."""
        if not os.path.isdir(directory):
            return []
        found = []
        for name in os.listdir(directory):
            start = parse_segment_name(name)
            if start is None:
                raise StoreError(f"{os.path.join(directory, name)}: not a segment (names are 20 decimal digits)")
            found.append((start, os.path.join(directory, name)))
        return sorted(found)

    @staticmethod
    def infer_file_size(directory: str) -> int | None:
        """The segment size of an existing log, from its files (all must be equal)."""
        files = MappedFileQueue.segment_files(directory)
        sizes = {os.path.getsize(path) for _, path in files if os.path.getsize(path) > 0}
        if not sizes:
            return None
        if len(sizes) > 1:
            raise StoreError(f"{directory}: segments of different sizes {sorted(sizes)}")
        return sizes.pop()

    def load(self) -> None:
        """Open every segment; positions start at the segment end until recovery moves them."""
        assert not self.mapped_files
        files = self.segment_files(self.directory)
        if files and os.path.getsize(files[-1][1]) == 0:
            os.unlink(files[-1][1])  # a last segment created but never sized (RocketMQ's doLoad)
            files.pop()
        expected = files[0][0] if files else 0
        loaded = []
        try:
            for start, path in files:
                if start != expected:
                    raise StoreError(f"{path}: expected the segment starting at {expected} next (missing or misnamed file)")
                loaded.append(MappedFile(path, file_size=self.file_size, create=False, small_pages=self._small_pages,
                                         preallocate_step_size=self._preallocate_step_size))  # fmt: skip
                expected = start + self.file_size
        except BaseException:
            for mapped_file in loaded:
                mapped_file.close()
            raise
        self.mapped_files = loaded
        if loaded:
            self.flushed_where = self.committed_where = self.max_offset

    # -- lookup ---------------------------------------------------------------------------

    @property
    def first(self) -> MappedFile | None:
        return self.mapped_files[0] if self.mapped_files else None

    @property
    def last(self) -> MappedFile | None:
        return self.mapped_files[-1] if self.mapped_files else None

    @property
    def min_offset(self) -> int:
        files = self.mapped_files
        return files[0].file_from_offset if files else 0

    # The two ends below are read several times a put (replication, dispatch, the slave's
    # checks): written out rather than through ``last`` and ``offset_of``, three Python calls
    # fewer each time (``file_from_offset + position`` is ``offset_of``).

    @property
    def max_offset(self) -> int:
        """End of what readers see."""
        files = self.mapped_files
        if not files:
            return 0
        last = files[-1]  # without a write buffer what readers see ends where the writer is
        return last.file_from_offset + (last.wrote_position if last.write_buffer is None else last.read_position)

    @property
    def max_wrote_offset(self) -> int:
        files = self.mapped_files
        return files[-1].file_from_offset + files[-1].wrote_position if files else 0

    def find_mapped_file_by_offset(self, offset: int) -> MappedFile | None:
        files = self.mapped_files
        if not files:
            return None
        index = (offset - files[0].file_from_offset) // self.file_size
        if 0 <= index < len(files):
            mapped_file = files[index]
            assert mapped_file.file_from_offset <= offset < mapped_file.file_from_offset + self.file_size
            return mapped_file
        return None

    def get_last_mapped_file(self, start_offset: int = 0, *, create: bool = True) -> MappedFile | None:
        """The segment to append to: the last one unless it is full; creates one if allowed."""
        last = self.mapped_files[-1] if self.mapped_files else None
        if last is not None and last.wrote_position < last.file_size:  # not full
            return last
        if not create:
            return None
        if last is None:
            create_offset = start_offset - start_offset % self.file_size
        else:
            create_offset = last.file_from_offset + self.file_size
        return self._create(create_offset)

    def _create(self, file_from_offset: int) -> MappedFile:
        write_buffer = self._write_buffer_source() if self._write_buffer_source else None
        with self._spare_lock:
            spare, self._spare = self._spare, None
            if spare is not None and spare.file_from_offset == file_from_offset:
                mapped_file = spare
                if write_buffer is not None:
                    mapped_file.attach_write_buffer(write_buffer)
            else:
                if spare is not None:
                    spare.destroy()
                mapped_file = self._new_file(file_from_offset, write_buffer)
        if not self.mapped_files:
            self.flushed_where = self.committed_where = file_from_offset
        self.mapped_files = [*self.mapped_files, mapped_file]
        return mapped_file

    def _new_file(self, file_from_offset: int, write_buffer: bytearray | None) -> MappedFile:
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            if is_disk_full(error):
                raise DiskFullError(f"{self.directory}: cannot create the directory: {error.strerror}") from error
            raise
        path = os.path.join(self.directory, segment_name(file_from_offset))
        mapped_file = MappedFile(path, file_size=self.file_size, create=True, write_buffer=write_buffer,
                                 sync_directory=self._sync_directory_on_create, small_pages=self._small_pages,
                                 preallocate_step_size=self._preallocate_step_size)  # fmt: skip
        self._directory_unsynced = self._directory_unsynced or not self._sync_directory_on_create
        return mapped_file

    def make_room(self, end_offset: int, *, start_offset: int = 0) -> None:
        """Create now, as the spare, the segment that writing up to ``end_offset`` needs next (an
        empty queue's first starts at ``start_offset``'s segment), so that the write itself cannot
        meet a full disk half-way: a write of several parts (a DLedger member's entries, then their
        index units) either finds its files or fails here with DiskFullError, nothing written.
        Covers one new segment: a write needing two more (segments smaller than one write, never
        the defaults) may still meet a full disk at its second. Reserves the disk the write needs
        in the last segment (all of its rest when the write goes past it: a blank record fills
        it) and in the next (``MappedFile.ensure_allocated``)."""
        last = self.last
        if last is None:
            next_offset = start_offset - start_offset % self.file_size
        elif last.wrote_position < last.file_size and end_offset <= last.file_from_offset + self.file_size:
            last.ensure_allocated(end_offset - last.file_from_offset)
            return
        else:
            next_offset = last.file_from_offset + self.file_size
            last.ensure_allocated(self.file_size)
        if end_offset <= next_offset:
            return
        with self._spare_lock:
            if self._spare is None or self._spare.file_from_offset != next_offset:
                if self._spare is not None:
                    self._spare.destroy()
                    self._spare = None
                self._spare = self._new_file(next_offset, None)
            self._spare.ensure_allocated(min(end_offset - next_offset, self.file_size))

    def warm_ahead(self, size: int) -> None:
        """Fault in ``size`` bytes ahead of the writer; once the last segment is half full
        (SPARE_AT_REMAINING), create the next one, and near the end warm its start. Runs beside
        appends (another thread or task)."""
        last = self.last
        if last is None:
            return
        ahead = last.wrote_position + size
        last.populate(ahead)
        if last.remaining > self.file_size * SPARE_AT_REMAINING:
            return
        next_offset = last.file_from_offset + self.file_size
        with self._spare_lock:
            if self.last is not last or (self._spare is not None and self._spare.file_from_offset == next_offset):
                spare = self._spare
            else:
                if self._spare is not None:
                    self._spare.destroy()
                    self._spare = None  # not left behind, destroyed, when the next cannot be made
                spare = self._spare = self._new_file(next_offset, None)
        if spare is not None and ahead > self.file_size:
            spare.populate(ahead - self.file_size)

    def needs_warming(self, size: int) -> bool:
        """Whether ``warm_ahead(size)`` has work: less than half of ``size`` faulted in ahead of
        the writer, or the next segment due and not there."""
        last = self.mapped_files[-1] if self.mapped_files else None
        if last is None:
            return False
        if size and CAN_POPULATE and last.populated_position < min(last.wrote_position + size // 2, self.file_size):
            return True  # (without the C module nothing faults pages in: only the next segment is work)
        if last.remaining > self.file_size * SPARE_AT_REMAINING:
            return False
        spare = self._spare
        if spare is None or spare.file_from_offset != last.file_from_offset + self.file_size:
            return True
        return size > 0 and last.remaining < size and spare.populated_position < size - last.remaining

    # -- commit and flush -----------------------------------------------------------------

    def commit(self, least_pages: int = 0) -> int:
        """Commit write buffers up to the last segment; return ``committed_where``."""
        for mapped_file in self._files_from(self.committed_where):
            position = mapped_file.commit(least_pages)
            self.committed_where = max(self.committed_where, mapped_file.offset_of(position))
            if position < mapped_file.file_size:
                break
        return self.committed_where

    def flush(self, least_pages: int = 0, *, keep_cached: int = 0) -> int:
        """Flush segments from ``flushed_where`` on; return the new ``flushed_where``. With
        ``keep_cached``, then drop the flushed pages more than that many bytes behind it from
        the page cache (``MappedFile.drop_cached``)."""
        if self._directory_unsynced:
            try:
                fsync_directory(self.directory)
            except OSError as error:
                raise SyncFailedError(f"{self.directory}: directory sync failed: {error.strerror or error}") from error
            self._directory_unsynced = False
        for mapped_file in self._files_from(self.flushed_where):
            position = mapped_file.flush(least_pages)
            self.flushed_where = max(self.flushed_where, mapped_file.offset_of(position))
            if position < mapped_file.file_size:
                break
        below = (self.flushed_where - keep_cached) // DROP_CACHED_ALIGN * DROP_CACHED_ALIGN
        if keep_cached > 0 and below - self._dropped_where >= DROP_CACHED_STEP_MIN:
            for mapped_file in self._files_from(self._dropped_where):
                if mapped_file.file_from_offset >= below:
                    break
                mapped_file.drop_cached(below - mapped_file.file_from_offset)
                self._dropped_where = mapped_file.offset_of(mapped_file.dropped_position)
        return self.flushed_where

    def _files_from(self, offset: int) -> list[MappedFile]:
        files = self.mapped_files
        if not files:
            return []
        index = max(0, (offset - files[0].file_from_offset) // self.file_size)
        return files[index:]

    @property
    def store_timestamp(self) -> int:
        last = self.last
        return last.store_timestamp if last else 0

    # -- truncation and retention ---------------------------------------------------------

    def truncate_dirty_files(self, offset: int) -> None:
        """Cut the log at ``offset``: the segment holding it is truncated, later ones deleted."""
        self._drop_spare()
        kept = []
        for mapped_file in self.mapped_files:
            if mapped_file.file_from_offset + self.file_size <= offset:
                kept.append(mapped_file)
            elif mapped_file.file_from_offset <= offset:
                mapped_file.truncate(offset - mapped_file.file_from_offset)
                kept.append(mapped_file)
            else:
                mapped_file.destroy()
        self.mapped_files = kept
        self.flushed_where = min(self.flushed_where, offset)
        self.committed_where = min(self.committed_where, offset)
        self._dropped_where = min(self._dropped_where, offset)

    def delete_first_files(self, count: int) -> list[str]:
        """Retire the ``count`` oldest segments (never the last one); return their paths."""
        count = min(count, len(self.mapped_files) - 1)
        if count <= 0:
            return []
        retired, self.mapped_files = self.mapped_files[:count], self.mapped_files[count:]
        for mapped_file in retired:
            mapped_file.destroy()
        return [mapped_file.path for mapped_file in retired]

    def reset_to(self, offset: int) -> None:
        """Empty the log and start it again at ``offset`` (a slave joining mid-log)."""
        self._drop_spare()
        for mapped_file in self.mapped_files:
            mapped_file.destroy()
        self.mapped_files = []
        self.flushed_where = self.committed_where = self._dropped_where = offset

    def close(self) -> None:
        for mapped_file in self.mapped_files:
            mapped_file.close()
        self._drop_spare()

    def _drop_spare(self) -> None:
        with self._spare_lock:
            if self._spare is not None:
                self._spare.destroy()
                self._spare = None

    def destroy(self) -> None:
        self._drop_spare()
        for mapped_file in self.mapped_files:
            mapped_file.destroy()
        self.mapped_files = []
        self.flushed_where = self.committed_where = self._dropped_where = 0
