"""Repair a damaged classic store: rewrite its damaged ranges with a healthy copy's bytes, or cut.

Theory of operation
-------------------
A classic master and its slaves hold byte-identical logs, so a range that recovery found damaged
(``commitlog.damage.DamagedRange``, from the invalid record to the next valid one) can be fetched
whole from a peer that has it. ``repair_from`` takes the store's lock (no broker may have it
open), finds the damage as recovery does — but over every segment, not only the ones a restart
re-checks —, fetches each range through ``fetch(offset, size_max) -> bytes`` (the caller's
transport: ``hasvc store repair --from`` reads raw log bytes with the client protocol's READ),
checks that the fetched bytes are whole, valid records (size, magic, fields, PHYSICALOFFSET, body
CRC) that fill the range exactly, writes them over the range in place and fsyncs the segment.
Rounds repeat until the log checks clean (a bounded number: each fixes up to
``DAMAGED_RANGES_MAX`` ranges). Nothing is written unless the fetched bytes check.

A range that runs to its segment's end (no valid record follows the damage there) may come back
shorter from a peer whose log ends inside that segment: its whole records are taken, provided they
reach at least as far as this store's own bytes did (nothing this store held is given up).

``accept_loss`` is the old recovery: cut the log at the first invalid record, zero what follows,
delete later segments, and say how many bytes and records went.

No trio, no hasvc: the caller passes the fetch function.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from commitlog import record as rec
from commitlog.checkpoint import StoreCheckpoint, StoreLock
from commitlog.commit_log import CommitLog
from commitlog.log_recovery import RecoveryReport
from commitlog.damage import DamagedRange
from commitlog.mapped_file import StoreError, fsync_directory, nonzero_extent
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.scan import ScanCode, scan_segment

# Bytes asked of the peer in one read: below the client protocol's READ limit (4 MiB a response).
FETCH_SIZE_MAX = 1024 * 1024
# Repair rounds (each fixes up to DAMAGED_RANGES_MAX ranges) before giving up on a log that keeps
# showing new damage.
REPAIR_ROUNDS_MAX = 64

Fetch = Callable[[int, int], bytes]


class RepairError(StoreError):
    """A repair that could not be done; nothing of the range named was written."""


@dataclasses.dataclass(frozen=True, slots=True)
class RepairReport:
    repaired: tuple[DamagedRange, ...]
    bytes_written: int
    records_written: int


@dataclasses.dataclass(frozen=True, slots=True)
class LossReport:
    cut_offset: int  # -1: nothing was damaged, nothing cut
    dropped_bytes: int  # nonzero bytes from the cut on (the segment that held it and later ones)
    dropped_records: int  # valid records after the first damaged range (the damaged ones not counted)
    damaged: tuple[DamagedRange, ...]


class _OpenLog:
    """The store's commit log with its lock held, for one repair round."""

    def __init__(self, directory: str):
        self.directory = directory
        commitlog = os.path.join(directory, "commitlog")
        segment_size = MappedFileQueue.infer_file_size(commitlog)
        if segment_size is None:
            raise RepairError(f"{commitlog}: no commit log segments here")
        self.lock = StoreLock(os.path.join(directory, "lock"))
        self.checkpoint = StoreCheckpoint.open(os.path.join(directory, "checkpoint"))
        self.abnormal = os.path.exists(os.path.join(directory, "abort"))
        self.log = CommitLog(commitlog, segment_size=segment_size)
        try:
            self.log.load()
        except BaseException:
            self.close()
            raise

    def recover(self, crc_function, *, accept_loss: bool = False, cut_segments_max: int = 1) -> RecoveryReport:
        """Recovery from the oldest segment (``dispatch_from=-1``): damage anywhere is found."""
        return self.log.recover(
            abnormal=self.abnormal, dispatch_from=-1, checkpoint_min_timestamp=0, crc_function=crc_function,
            cut_segments_max=cut_segments_max, flushed_offset=self.checkpoint.recovery_flushed_offset,
            accept_loss=accept_loss,
        )  # fmt: skip

    def close(self) -> None:
        self.log.close()
        self.lock.release()


def check_fetched(
    data: bytes, damage: DamagedRange, *, segment_end: int, own_end: int, crc_function
) -> tuple[int, int]:
    """How many bytes of ``data`` (fetched from ``damage.from_offset``) go over the range, and how
    many records they hold; RepairError when they are not whole valid records that fill it.

    ``segment_end``: where the range's segment ends; ``own_end``: where this store's own bytes in
    that segment end (a shorter fetch must still reach it)."""
    start, end = damage.from_offset, damage.to_offset
    wanted = end - start
    if len(data) > wanted:
        data = data[:wanted]
    result = scan_segment(data, start=0, end=len(data), file_from_offset=start, crc_function=crc_function)
    if len(data) == wanted:
        if result.code is ScanCode.END_OF_SEGMENT and end == segment_end:
            return wanted, result.count
        if result.code is ScanCode.END_OF_DATA and result.position == wanted:
            return wanted, result.count
        raise RepairError(
            f"the peer's bytes for [{start}, {end}) are not whole valid records filling the range: "
            f"{result.reason} at offset {start + result.position}"
        )
    # Short: the peer's log ends inside the range's segment (only a range that runs to the end).
    usable = result.position
    if end != segment_end or result.code not in (ScanCode.END_OF_DATA, ScanCode.FIELDS_DO_NOT_ADD_UP,
                                                ScanCode.SIZE_OUT_OF_BOUNDS, ScanCode.TRUNCATED):  # fmt: skip
        raise RepairError(
            f"the peer holds only {len(data)} bytes of [{start}, {end})"
            + (f" ({result.reason} at offset {start + result.position})" if not result.code.clean else "")
        )
    if start + usable < own_end:
        raise RepairError(
            f"the peer's whole records from {start} end at {start + usable}, before this store's own bytes "
            f"(to {own_end}): it does not hold what was here"
        )
    return usable, result.count


def _fetch_range(fetch: Fetch, start: int, end: int) -> bytes:
    """The bytes [start, end) from the peer, in reads of FETCH_SIZE_MAX; fewer when its log ends."""
    pieces = []
    offset = start
    while offset < end:
        data = fetch(offset, min(FETCH_SIZE_MAX, end - offset))
        if not data:
            break
        pieces.append(data[: end - offset])
        offset += len(pieces[-1])
    return b"".join(pieces)


def _write_range(path: str, position: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        written = os.pwrite(fd, data, position)
        if written != len(data):
            raise RepairError(f"{path}: wrote {written} of {len(data)} bytes at position {position}")
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_from(directory: str, fetch: Fetch, *, crc: str = "crc32c") -> RepairReport:
    """Rewrite every damaged range of the store's log with the peer's bytes (see the module's
    docstring); RepairError, naming the range, when the peer's bytes do not check."""
    crc_function = rec.CRC_FUNCTIONS[crc]
    repaired: list[DamagedRange] = []
    bytes_written = records_written = 0
    previous = None
    for _ in range(REPAIR_ROUNDS_MAX):
        opened = _OpenLog(directory)
        try:
            damaged = opened.recover(crc_function).damaged
            if not damaged:
                return RepairReport(tuple(repaired), bytes_written, records_written)
            if damaged[0] == previous:
                raise RepairError(f"{damaged[0].describe()}: still damaged after it was rewritten")
            previous = damaged[0]
            segment_size = opened.log.segment_size
            for damage in damaged:
                queue = opened.log.mapped_file_queue
                mapped_file = queue.find_mapped_file_by_offset(damage.from_offset)
                if mapped_file is None and damage.from_offset == queue.max_offset:
                    mapped_file = queue.get_last_mapped_file(damage.from_offset)  # a missing last segment, made anew
                base = mapped_file.file_from_offset
                position = damage.from_offset - base
                own_end = base + position + nonzero_extent(mapped_file.view(), position, segment_size)
                data = _fetch_range(fetch, damage.from_offset, damage.to_offset)
                try:
                    size, count = check_fetched(data, damage, segment_end=base + segment_size,
                                                own_end=min(own_end, damage.to_offset), crc_function=crc_function)  # fmt: skip
                except RepairError as error:
                    raise RepairError(f"{damage.file} [{damage.from_offset}, {damage.to_offset}): {error}") from None
                _write_range(mapped_file.path, position, data[:size])
                repaired.append(damage)
                bytes_written += size
                records_written += count
        finally:
            opened.close()
    raise RepairError(f"{directory}: still damaged after {REPAIR_ROUNDS_MAX} repair rounds")


LOSS_MARKER = "loss-accepted"  # STORE/loss-accepted: "cut_offset=N" after accept_loss cut the log


def write_loss_marker(directory: str, cut: int) -> None:
    """Say on disk that this store gave up its bytes from ``cut`` on: it must not serve as a
    master again (a slave may hold more of the same epoch, and a master that kept the epoch and
    wrote on would fork it) until the operator says so (removes the file), or it has followed a
    master as a slave. Written whole (tmp, fsync, rename, directory fsync)."""
    path = os.path.join(directory, LOSS_MARKER)
    with open(path + ".tmp", "w") as file:
        file.write(f"cut_offset={cut}\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(path + ".tmp", path)
    fsync_directory(directory)


def read_loss_marker(directory: str) -> int | None:
    """The offset ``accept_loss`` cut at, when the store carries the mark; None otherwise."""
    try:
        with open(os.path.join(directory, LOSS_MARKER)) as file:
            text = file.read().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text.partition("=")[2])
    except ValueError:
        return -1  # a damaged mark still says a loss was accepted


def accept_loss(directory: str, *, crc: str = "crc32c") -> LossReport:
    """Cut the log at its first damaged range (the old recovery), zeroing what follows and deleting
    later segments; the checkpoint's flushed offset comes down to the cut."""
    crc_function = rec.CRC_FUNCTIONS[crc]
    opened = _OpenLog(directory)
    try:
        found = opened.recover(crc_function)
        if not found.damaged:
            return LossReport(-1, 0, 0, ())
    finally:
        opened.close()
    opened = _OpenLog(directory)
    try:
        cut = found.damaged[0].from_offset
        files = opened.log.mapped_file_queue.mapped_files
        size = opened.log.segment_size
        dropped = sum(nonzero_extent(f.view(), max(0, cut - f.file_from_offset), size)
                      for f in files if f.file_from_offset + size > cut)  # fmt: skip
        write_loss_marker(directory, cut)  # first: a cut that stops half-way still leaves the mark
        report = opened.recover(crc_function, accept_loss=True)
        assert report.end_offset == cut, (report.end_offset, cut)
        if opened.checkpoint.master_flushed_offset > cut:
            opened.checkpoint.master_flushed_offset = cut
            opened.checkpoint.flush()
    finally:
        opened.close()
    return LossReport(cut, dropped, found.records_past_damage, found.damaged)


__all__ = ["LOSS_MARKER", "read_loss_marker", "write_loss_marker", "FETCH_SIZE_MAX", "LossReport", "RepairError", "RepairReport", "accept_loss", "check_fetched", "repair_from"]
