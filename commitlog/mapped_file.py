"""MappedFile: one fixed-size, preallocated, memory-mapped segment and its three positions.

Theory of operation
-------------------
A segment is a file of exactly ``file_size`` bytes named by the global offset of its first byte
(``file_from_offset``, 20 zero-padded digits). It is created sparse at that size and reserves disk
with ``posix_fallocate`` a step at a time (``preallocate_step_size``, 64 MiB by default; the
warm-up reserves ahead of the writer), and every writer reserves before it writes
(``ensure_allocated``), so that a write through the mapping can never hit a full disk (which
would kill the process with SIGBUS): a full disk shows up as a ``DiskFullError`` naming the file
before anything is written, when a step or the next segment cannot be reserved (nothing is left
behind: a half-made file is removed). A sync that fails (``SyncFailedError``)
leaves ``flushed_position`` where it was: after a failed ``fdatasync``/``msync`` the kernel may
have dropped the dirty pages and a second sync would "succeed" without writing them (PostgreSQL's
fsyncgate), so the owner must never flush the segment again and believe it.

Three positions, all relative to the segment start, describe how far bytes have travelled:

    flushed_position <= committed_position <= wrote_position <= file_size

* ``wrote_position``: bytes appended. Without a write buffer they are in the mapping (the page
  cache) at once; with a transient-store-pool write buffer they are only in that buffer.
* ``committed_position``: bytes copied from the write buffer into the file (``commit``). Without a
  write buffer it equals ``wrote_position``.
* ``flushed_position``: bytes known to be on disk (``flush`` = ``fdatasync``, which on Linux also
  writes pages dirtied through a shared mapping).

Readers see ``read_position`` bytes: ``committed_position`` with a write buffer (the file holds
nothing beyond), ``wrote_position`` without. The positions are checked after every change.
Global offsets (``flushed_where`` and friends) are the queue's business; ``offset_of`` is the one
place that turns a position into an offset.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from typing import Final

from commitlog import native as _native

OS_PAGE_SIZE: Final = 4096
FILE_NAME_DIGITS: Final = 20
# Zeroing a torn tail: ranges at least this long are punched out (fallocate) rather than
# written with zeros; smaller ones are written through the mapping.
PUNCH_HOLE_SIZE_MIN: Final = 1024 * 1024
ZERO_CHUNK_SIZE: Final = 1024 * 1024

_native_populate = _native.populate
CAN_POPULATE = _native_populate is not None  # pages are faulted in ahead only by the C module (``populate``)
_native_sync_range = _native.sync_range

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


class StoreError(Exception):
    """A store that cannot be opened or used as asked; the message names the file."""


class DiskFullError(StoreError):
    """No space left to create or extend a segment."""


class SyncFailedError(StoreError):
    """A sync (``fdatasync``/``msync``) failed: what was written may not be on disk, and a later
    sync cannot tell (the kernel marks the failed pages clean). The message names the file."""


# Errors that mean "no room" (the filesystem, or the user's quota): answered DISK_FULL, retried later.
DISK_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` says the disk (or a quota) has no room: DiskFullError, or an OSError
    with ENOSPC/EDQUOT (from writing a small file, making a directory, a directory fsync)."""
    return isinstance(error, DiskFullError) or (isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS)


class FilesCreated:
    """How many segments this process has created (``MappedFile(create=True)``, any queue): a
    store's disk check measures the disk again once this moves (``commitlog.disk_watch.DiskWatch``),
    since preallocated files change the disk's use only when one is made. Incremented from worker
    threads without a lock: a lost increment delays a measurement to the next file or interval."""

    count = 0


def segment_name(file_from_offset: int) -> str:
    return f"{file_from_offset:0{FILE_NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


def _libc_fallocate():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.fallocate
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    function.restype = ctypes.c_int
    return function


_FALLOCATE = _libc_fallocate()


def _libc_mincore():
    try:
        function = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    function.restype = ctypes.c_int
    return function


_MINCORE = _libc_mincore()


# ``small_pages`` (a store that syncs a few KiB at a time: SYNC_FLUSH, a DLedger member with
# --flush sync). Faults through a mapping read ahead, and the page cache fills what it reads ahead
# with large folios (up to 2 MiB on this kernel); a write through the mapping then dirties its whole
# folio, and the next sync writes all of it back. A lone SYNC_FLUSH put's msync grew from ~120 to
# ~600 us once a segment's writer had run past its first few MiB (commitlog/_scan.c sync_range,
# docs/design/put-path.md "small pages"). MADV_RANDOM on the part of the mapping not yet written (and
# flushed) turns that read-ahead off there, so those pages come one 4 KiB page at a time. The
# price: the warm-up thread faults ~512 times more often (~0.8 ms more a MiB here), which a
# store syncing at 10 ms or 500 ms (ASYNC_FLUSH) does not repay, so it is off there. Behind the
# flushed end the mapping reads ahead again (MADV_NORMAL), SMALL_PAGES_MARGIN back and in steps of
# SMALL_PAGES_NORMAL_STEP, so that a reader of pages the page cache let go still reads ahead.
SMALL_PAGES_MARGIN: Final = 8 * 1024 * 1024
SMALL_PAGES_NORMAL_STEP: Final = 64 * 1024 * 1024


# How much disk a segment reserves ahead of its writer at a time (``posix_fallocate``), unless its
# queue says otherwise (``preallocate_step_size``). A segment is created sparse at its full size and
# reserves its first step at once; the warm-up reserves further steps ahead of the writer, and every
# write checks it lands in reserved bytes first (``ensure_allocated``). Reserving whole 1 GiB
# segments at creation (as before) made a store holding five messages take 1.1 GB of disk.
# 0 reserves the whole segment at creation.
PREALLOCATE_STEP_SIZE: Final = 64 * 1024 * 1024


def preallocate(fd: int, size: int, path: str = "", *, start: int = 0) -> bool:
    """Reserve ``[start, start + size)`` of ``fd`` on disk; raise DiskFullError when there is no
    room. False when the filesystem cannot reserve (no fallocate): writes then allocate as they go."""
    try:
        os.posix_fallocate(fd, start, size)
    except OSError as error:
        if error.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(f"{path or 'a segment'}: no space left to reserve {size} bytes at {start}") from error
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return False
    return True


class MappedFile:
    """One segment. Not thread-safe for concurrent appends (the commit log's put lock serialises
    them); flush and commit may run in another thread, they only read ``wrote_position``."""

    def __init__(self, path: str, *, file_size: int, create: bool, write_buffer: bytearray | None = None,
                 sync_directory: bool = True, small_pages: bool = False,
                 preallocate_step_size: int = PREALLOCATE_STEP_SIZE):  # fmt: skip
        name = os.path.basename(path)
        file_from_offset = parse_segment_name(name)
        if file_from_offset is None:
            raise StoreError(f"{path}: segment names are {FILE_NAME_DIGITS} decimal digits")
        if file_from_offset % file_size:
            raise StoreError(f"{path}: start offset is not a multiple of the segment size {file_size}")
        self.path = path
        self.file_size = file_size
        self.file_from_offset = file_from_offset
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as error:
            if create and error.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(f"{path}: cannot create the segment: {error.strerror}") from error
            raise
        # Reserved on disk below ``allocated_position`` (``ensure_allocated``); with a write buffer
        # (whose commits pwrite anywhere) the whole segment. An opened segment reserves again from 0
        # (a no-op over bytes already reserved) before its first write.
        self.preallocate_step_size = file_size if preallocate_step_size <= 0 or write_buffer is not None else preallocate_step_size
        self.allocated_position = 0
        try:
            if create:
                os.ftruncate(self._fd, file_size)  # sparse at its full size: the mapping covers it
                first = min(self.preallocate_step_size, file_size)
                self.allocated_position = first if preallocate(self._fd, first, path) else file_size
                if sync_directory:
                    fsync_directory(os.path.dirname(path))
            else:
                actual = os.fstat(self._fd).st_size
                if actual != file_size:
                    raise StoreError(f"{path}: {actual} bytes, expected the segment size {file_size}")
            self._mmap = mmap.mmap(self._fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException as error:
            os.close(self._fd)
            if create:
                os.unlink(path)
            if create and isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(f"{path}: cannot create the segment: {error.strerror}") from error
            raise
        if create:
            FilesCreated.count += 1
        self._view = memoryview(self._mmap)
        self.write_buffer = write_buffer
        self._buffer_view = memoryview(write_buffer) if write_buffer is not None else None
        initial = 0 if create else file_size
        self.wrote_position = initial
        self._committed_position = initial  # only meaningful with a write buffer
        self.flushed_position = initial
        self.store_timestamp = 0  # store timestamp of the last record appended (for the checkpoint)
        self.populated_position = initial  # pages below this are resident (warmed) for writing
        self.dropped_position = 0  # pages below this were dropped from the page cache (drop_cached)
        self.small_pages = small_pages
        self.read_ahead_end = file_size  # small_pages: the mapping reads ahead below this, not above
        self._advise_small_pages_from(initial)
        self._check()

    # -- positions ------------------------------------------------------------------------

    def _check(self) -> None:
        # ``committed_position`` written out: this runs after every append (twice a put).
        committed = self._committed_position if self.write_buffer is not None else self.wrote_position
        assert self.flushed_position >= 0, self.flushed_position
        assert self.flushed_position <= committed, (self.flushed_position, committed)
        assert committed <= self.wrote_position, (committed, self.wrote_position)
        assert self.wrote_position <= self.file_size, (self.wrote_position, self.file_size)

    @property
    def committed_position(self) -> int:
        return self._committed_position if self.write_buffer is not None else self.wrote_position

    @property
    def read_position(self) -> int:
        return self.committed_position if self.write_buffer is not None else self.wrote_position

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def full(self) -> bool:
        return self.wrote_position == self.file_size

    def offset_of(self, position: int) -> int:
        return self.file_from_offset + position

    # -- writing --------------------------------------------------------------------------

    def ensure_allocated(self, end: int) -> None:
        """Reserve disk for every byte below ``end`` (a writer calls it before it writes there
        through the mapping, where a full disk would be SIGBUS): from ``allocated_position`` up to
        ``end`` plus a step, within the segment. DiskFullError when there is no room (nothing is
        reserved or written then). Safe beside a concurrent caller (the warm-up thread)."""
        if end <= self.allocated_position:
            return
        start = self.allocated_position
        target = min(self.file_size, end + self.preallocate_step_size)
        if self._fd < 0:
            return
        if not preallocate(self._fd, target - start, self.path, start=start):
            target = self.file_size  # a filesystem without fallocate: writes allocate as they go
        if target > self.allocated_position:
            self.allocated_position = target

    def writable_view(self) -> memoryview:
        """Where appends go: the write buffer when there is one, else the mapping. Write at
        ``wrote_position`` and then call ``advance``."""
        return self._buffer_view if self._buffer_view is not None else self._view

    def advance(self, size: int) -> None:
        assert size > 0 and self.wrote_position + size <= self.file_size, (size, self.wrote_position)
        self.wrote_position += size
        self._check()

    def append(self, data) -> bool:
        """Copy ``data`` in whole at ``wrote_position``; False (nothing written) if it does not fit."""
        size = len(data)
        position = self.wrote_position
        if size > self.file_size - position:  # remaining
            return False
        if size:
            if position + size > self.allocated_position:
                self.ensure_allocated(position + size)
            view = self._buffer_view if self._buffer_view is not None else self._view  # writable_view
            view[position : position + size] = data
            self.advance(size)
        return True

    def write_through(self, data) -> None:
        """Write ``data`` at ``wrote_position`` with ``pwrite`` rather than through the mapping,
        and advance. For replicated frames: a page the kernel allocates for a write that covers it
        whole is never zeroed, where a first touch through the mapping faults the page in zeroed
        and then copies over it (``Broker.warm_ahead`` has what that bought)."""
        size = len(data)
        assert size <= self.file_size - self.wrote_position, (size, self.remaining)
        if self._buffer_view is not None:
            self.append(data)
            return
        position = self.wrote_position
        if position + size > self.allocated_position:
            self.ensure_allocated(position + size)  # a pwrite into a hole would meet ENOSPC, not DiskFullError
        with memoryview(data) as view:
            written = 0
            while written < size:
                written += os.pwrite(self._fd, view[written:], position + written)
        self.advance(size)

    def rewrite(self, position: int, data) -> None:
        """Replace bytes already written at ``position`` (a repair: a consume queue unit rebuilt
        from its record) and make them durable before returning: ``pwrite`` (the mapping shares
        the page cache) and ``fdatasync``. Never moves a position."""
        assert position >= 0, position
        assert position + len(data) <= self.wrote_position, (position, len(data), self.wrote_position)
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], position + written)
        os.fdatasync(self._fd)

    def write_from_pipe(self, pipe_fd: int, size: int) -> None:
        """Move ``size`` bytes waiting in the pipe ``pipe_fd`` to ``wrote_position`` with
        ``os.splice`` (the kernel copies them from the pipe's pages into the page cache: no pass
        through this process), and advance. The pipe must hold at least ``size`` bytes. With a
        write buffer the bytes are read out of the pipe and appended."""
        assert 0 < size <= self.remaining, (size, self.remaining)
        if self._buffer_view is not None:
            data = bytearray()
            while len(data) < size:
                piece = os.read(pipe_fd, size - len(data))
                if not piece:
                    raise EOFError(f"the pipe held {len(data)} of {size} bytes")
                data += piece
            self.append(data)
            return
        position = self.wrote_position
        if position + size > self.allocated_position:
            self.ensure_allocated(position + size)
        moved = 0
        while moved < size:
            count = os.splice(pipe_fd, self._fd, size - moved, offset_dst=position + moved)
            if count == 0:
                raise EOFError(f"the pipe held {moved} of {size} bytes")
            moved += count
        self.advance(size)

    def commit(self, least_pages: int = 0) -> int:
        """Copy the write buffer's new bytes into the file; return ``committed_position``."""
        if self.write_buffer is None:
            return self.committed_position
        wrote = self.wrote_position
        committed = self.committed_position
        if wrote > committed and self._enough_pages(wrote, committed, least_pages):
            os.pwrite(self._fd, self._buffer_view[committed:wrote], committed)
            self._committed_position = wrote
            self._check()
        return self.committed_position

    def release_write_buffer(self) -> bytearray | None:
        """Hand the write buffer back once everything is committed (the segment is full)."""
        if self.write_buffer is None or self.committed_position < self.file_size:
            return None
        buffer, self.write_buffer, self._buffer_view = self.write_buffer, None, None
        return buffer

    def flush(self, least_pages: int = 0) -> int:
        """Make what readers can see durable; return ``flushed_position``. The range from
        ``flushed_position`` is synced (``sync_range``: msync, the datasync of that range), not
        the whole file: ``fdatasync`` also wrote the pages warmed ahead of the writer, as
        zeros, and a page written back so had to be faulted in again when the writer reached
        it. Without the native module: ``fdatasync``."""
        target = self.read_position
        if target > self.flushed_position and self._enough_pages(target, self.flushed_position, least_pages):
            try:
                if _native_sync_range is not None:
                    _native_sync_range(self._view, self.flushed_position, target)
                else:
                    os.fdatasync(self._fd)
            except OSError as error:  # flushed_position stays: see the module (fsyncgate)
                raise SyncFailedError(f"{self.path}: sync of bytes [{self.flushed_position}, {target}) failed: "
                                      f"{error.strerror or error}") from error  # fmt: skip
            self.flushed_position = target
            self._check()
            if self.read_ahead_end < self.file_size:  # small_pages, or read_ahead_off_from
                self._read_ahead_behind(target)
        return self.flushed_position

    def _advise_small_pages_from(self, position: int) -> None:
        """``small_pages``: no read-ahead through the mapping from ``position``, so pages faulted
        in there are single pages (see SMALL_PAGES_MARGIN)."""
        if self.small_pages:
            self.read_ahead_off_from(position)

    def read_ahead_off_from(self, position: int) -> None:
        """No read-ahead through the mapping from ``position`` (page-aligned down) to the end
        (read-ahead comes back behind the flushed end, ``_read_ahead_behind``): ``small_pages``,
        and a writer that writes with ``pwrite`` past the faulted-in pages (``CommitLog``'s
        WRITE_THROUGH_MIN): a read of its bytes through the mapping (a frame to a slave, the
        dispatch) found a folio the warm-up's read-ahead had marked, read ahead the next window
        (zeroing pages the writer then wrote again), marked one there, and so on for good."""
        start = position // OS_PAGE_SIZE * OS_PAGE_SIZE
        if start >= self.read_ahead_end or self._fd < 0:
            return
        self._mmap.madvise(mmap.MADV_RANDOM, start, self.file_size - start)
        self.read_ahead_end = start

    def _read_ahead_behind(self, flushed: int) -> None:
        """``small_pages``: read ahead again through the mapping below ``flushed`` less
        SMALL_PAGES_MARGIN, in steps of SMALL_PAGES_NORMAL_STEP (all of it once the segment is full)."""
        end = self.file_size if flushed >= self.file_size else (flushed - SMALL_PAGES_MARGIN) // OS_PAGE_SIZE * OS_PAGE_SIZE
        if end > self.read_ahead_end and (end == self.file_size or end - self.read_ahead_end >= SMALL_PAGES_NORMAL_STEP):
            self._mmap.madvise(mmap.MADV_NORMAL, self.read_ahead_end, end - self.read_ahead_end)
            self.read_ahead_end = end

    def resident(self, start: int, end: int) -> bool:
        """Whether the page cache holds every page of ``[start, end)`` (``mincore`` over the
        mapping: it looks the file's pages up, it faults nothing in). True where it cannot tell
        (no ``mincore``, the segment closed): the caller then reads as it would anyway."""
        first = start // OS_PAGE_SIZE * OS_PAGE_SIZE
        if _MINCORE is None or end <= first:
            return True
        flags = ctypes.create_string_buffer((end - first + OS_PAGE_SIZE - 1) // OS_PAGE_SIZE)
        try:
            anchor = ctypes.c_char.from_buffer(self._mmap)
        except (ValueError, TypeError):  # closed
            return True
        try:
            if _MINCORE(ctypes.addressof(anchor) + first, end - first, flags) != 0:
                return True
        finally:
            del anchor
        return flags.raw.count(0) == 0  # one byte a page, bit 0 set when resident

    def drop_cached(self, end: int) -> None:
        """Drop the flushed pages below ``end`` from the page cache (``page_cache_keep_size``):
        unmapped from this process (``MADV_DONTNEED``; a shared file mapping keeps its data) and
        then evicted (``POSIX_FADV_DONTNEED``, which evicts only clean, unmapped pages). Reads
        there fault the pages back in from the disk."""
        end = min(end, self.flushed_position) // OS_PAGE_SIZE * OS_PAGE_SIZE
        start = self.dropped_position
        if end <= start or self._fd < 0:
            return
        self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)
        os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)
        self.dropped_position = end

    def _enough_pages(self, ahead: int, behind: int, least_pages: int) -> bool:
        if ahead == self.file_size or least_pages <= 0:
            return True
        return ahead // OS_PAGE_SIZE - behind // OS_PAGE_SIZE >= least_pages

    def truncate(self, position: int) -> None:
        """Drop everything at and after ``position``: zero it on disk (a torn or unacknowledged
        tail must never be read back after a later crash) and move all positions there."""
        assert 0 <= position <= self.file_size, position
        self._zero(position, self.file_size)
        if self._buffer_view is not None:
            self._buffer_view[position:] = bytes(self.file_size - position)
        os.fdatasync(self._fd)
        self.set_positions(position)

    def set_positions(self, position: int) -> None:
        """Move all three positions to ``position`` (recovery found the end of the data there)."""
        self.wrote_position = self._committed_position = self.flushed_position = position
        if position < self.read_ahead_end:
            self._advise_small_pages_from(position)
        self.dropped_position = min(self.dropped_position, position)
        self._check()

    def _zero(self, start: int, end: int) -> None:
        if end - start >= PUNCH_HOLE_SIZE_MIN and _FALLOCATE is not None:
            if _FALLOCATE(self._fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) == 0:
                # Unreserved again from ``start``: the next write reserves before it writes.
                self.allocated_position = min(self.allocated_position, start)
                return
        zeros = bytes(min(ZERO_CHUNK_SIZE, end - start))
        for chunk_start in range(start, end, ZERO_CHUNK_SIZE):
            chunk_end = min(end, chunk_start + ZERO_CHUNK_SIZE)
            chunk_zeros = zeros[: chunk_end - chunk_start]
            if self._view[chunk_start:chunk_end] != chunk_zeros:
                self._view[chunk_start:chunk_end] = chunk_zeros

    def attach_write_buffer(self, write_buffer: bytearray) -> None:
        assert self.write_buffer is None and self.wrote_position == 0
        self.preallocate_step_size = self.file_size  # commits pwrite anywhere in the segment
        self.ensure_allocated(self.file_size)
        self.write_buffer = write_buffer
        self._buffer_view = memoryview(write_buffer)

    def populate(self, end: int) -> None:
        """Fault in the mapping's pages up to ``end`` ahead of the writer (RocketMQ's warm-up of
        mapped files): a first write to a page costs a page fault, ~10x the copy itself here.
        Safe beside a concurrent writer; a no-op without the native module or with a write buffer."""
        end = min(end, self.file_size)
        start = max(self.populated_position, self.wrote_position)
        if _native_populate is None or self.write_buffer is not None or end <= start or self._fd < 0:
            return
        try:  # faulting a page in for writing allocates it: only reserved pages
            self.ensure_allocated(end)
        except DiskFullError:  # the writer's own ensure_allocated reports it (DISK_FULL)
            end = min(end, self.allocated_position)
            if end <= start:
                return
        _native_populate(self._view, start, end)
        self.populated_position = end

    # -- reading --------------------------------------------------------------------------

    def view(self) -> memoryview:
        """The whole mapping, for scans; only ``[0, read_position)`` is meaningful."""
        return self._view

    def find(self, sub: bytes, start: int, end: int) -> int:
        """The position of the first ``sub`` lying whole in ``[start, end)`` (bounded by
        ``read_position``), or -1: the mapping's own search (CPython's fastsearch, ~4x a regex
        that starts with the same literal), no copy."""
        return self._mmap.find(sub, start, min(end, self.read_position))

    def slice(self, position: int, size: int) -> memoryview:
        """Zero-copy view of ``[position, position + size)``, bounded by ``read_position``."""
        end = min(position + size, self.read_position)
        assert 0 <= position <= end, (position, end)
        return self._view[position:end]

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        if self._fd < 0:
            return
        self._view.release()
        try:
            self._mmap.close()
        except BufferError:
            pass  # a reader still holds a slice; the mapping goes when the slice does
        os.close(self._fd)
        self._fd = -1

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return (
            f"MappedFile({os.path.basename(self.path)}, wrote={self.wrote_position}, "
            f"committed={self.committed_position}, flushed={self.flushed_position})"
        )


def nonzero_extent(view: memoryview, start: int, end: int, chunk: int = 1 << 20) -> int:
    """How many bytes of ``view[start:end]`` lie at or before its last nonzero byte."""
    position = end
    while position > start:
        chunk_start = max(start, position - chunk)
        data = bytes(view[chunk_start:position]).rstrip(b"\x00")
        if data:
            return chunk_start + len(data) - start
        position = chunk_start
    return 0



def fsync_directory(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
