"""The store's small files: ``checkpoint``, ``abort`` and ``lock`` (RocketMQ's StoreCheckpoint,
abort marker and file lock).

``checkpoint`` is 4096 bytes; five big-endian int64 at fixed offsets (as RocketMQ 5):

    offset size field
    0      8    physic_msg_timestamp   store timestamp of the newest commit log record known flushed
    8      8    logics_msg_timestamp   store timestamp of the newest record whose consume queue unit is flushed
    16     8    index_msg_timestamp    (reserved: hasvc has no index file yet)
    24     8    master_flushed_offset  commit log offset known flushed
    32     8    confirm_phy_offset     (reserved for replication)

hasvc adds, where RocketMQ reads nothing: a CRC32C of those 40 bytes at offset 40 (4 bytes,
big-endian), and a second copy of the 44 bytes at offset 2048. Both copies are written with one
``pwrite`` each and one ``fdatasync``; a reader takes the first copy whose CRC matches. A flipped
bit in one copy is survived; both damaged (or a flushed offset no copy vouches for) leave
``trusted`` false, and recovery then treats every invalid record as damage, never as a torn tail
(it cannot tell them apart without the flushed offset), so nothing is cut without the operator.
A file RocketMQ wrote (CRC field 0, no second copy) is read as before, unchecked.

It is rewritten in place with ``pwrite`` + ``fdatasync``. ``abort`` exists while a store is open:
found at start it means the last run did not close cleanly, and recovery is the thorough kind.
``lock`` is held with ``flock`` for the life of the open store, so a second process is refused.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import struct
from typing import Final

import crc32c as _crc32c

from commitlog.mapped_file import StoreError

CHECKPOINT_FILE_SIZE: Final = 4096
CHECKPOINT = struct.Struct(">qqqqq")
assert CHECKPOINT.size == 40
CHECKPOINT_CRC = struct.Struct(">I")  # CRC32C of the 40 bytes before it
CHECKPOINT_COPY_SIZE: Final = CHECKPOINT.size + CHECKPOINT_CRC.size
CHECKPOINT_COPY_POSITIONS: Final = (0, 2048)  # two copies, in different 512-byte sectors
# Abnormal recovery starts at a segment whose first record is older than the checkpoint by this
# margin (RocketMQ's getMinTimestamp subtracts 3 s).
CHECKPOINT_TIMESTAMP_MARGIN_MS: Final = 3000


@dataclasses.dataclass
class StoreCheckpoint:
    path: str
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0
    # False when no copy of the file checked (both damaged): the values are then zeros and the
    # flushed offset vouches for nothing (recovery cuts nothing by itself).
    trusted: bool = True
    damage: str = ""  # what was wrong with the copies, for the log

    @classmethod
    def open(cls, path: str) -> StoreCheckpoint:
        checkpoint = cls(path)
        if not os.path.exists(path):
            return checkpoint
        with open(path, "rb") as file:
            data = file.read(CHECKPOINT_FILE_SIZE)
        values, problems = _read_copies(data)
        if values is None:
            checkpoint.trusted = False
            checkpoint.damage = f"{path}: {'; '.join(problems)}"
            return checkpoint
        checkpoint.damage = f"{path}: {'; '.join(problems)}" if problems else ""
        (
            checkpoint.physic_msg_timestamp,
            checkpoint.logics_msg_timestamp,
            checkpoint.index_msg_timestamp,
            checkpoint.master_flushed_offset,
            checkpoint.confirm_phy_offset,
        ) = values
        return checkpoint

    @property
    def recovery_flushed_offset(self) -> int:
        """The flushed offset recovery may rely on: ``FLUSHED_OFFSET_UNKNOWN`` (1 << 62, the value
        of ``commitlog.commit_log``) when no copy of the file checked."""
        return self.master_flushed_offset if self.trusted else 1 << 62

    @property
    def min_timestamp(self) -> int:
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - CHECKPOINT_TIMESTAMP_MARGIN_MS)

    def flush(self) -> None:
        data = CHECKPOINT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )
        data += CHECKPOINT_CRC.pack(_crc32c.crc32c(data))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            for position in CHECKPOINT_COPY_POSITIONS:
                os.pwrite(fd, data, position)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self.trusted = True
        self.damage = ""


def _read_copies(data: bytes) -> tuple[tuple[int, ...] | None, list[str]]:
    """The values of the first copy that checks, and what is wrong with any copy."""
    problems = []
    found = None
    second = CHECKPOINT_COPY_POSITIONS[1]
    legacy = not any(data[second : second + CHECKPOINT_COPY_SIZE])  # RocketMQ's, or hasvc's before the copies
    for number, position in enumerate(CHECKPOINT_COPY_POSITIONS, 1):
        copy = data[position : position + CHECKPOINT_COPY_SIZE]
        if legacy and number == 2:
            break
        if len(copy) < CHECKPOINT_COPY_SIZE:
            problems.append(f"copy {number} is cut short ({len(copy)} bytes)")
            continue
        values = CHECKPOINT.unpack_from(copy)
        (crc,) = CHECKPOINT_CRC.unpack_from(copy, CHECKPOINT.size)
        unchecked = legacy and crc == 0  # no CRC was written: read as before
        if not unchecked and crc != _crc32c.crc32c(copy[: CHECKPOINT.size]):
            problems.append(f"copy {number} at byte {position} fails its CRC")
        elif min(values) < 0:
            problems.append(f"copy {number} at byte {position} holds a negative value {values}")
        elif found is None:
            found = values
    return found, problems


class StoreLock:
    """An exclusive ``flock`` on ``STORE/lock``, held while the store is open."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise StoreError(f"{path}: the store is already open in another process") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def remove_abort_file(path: str) -> None:
    """Remove ``abort`` at a clean close (gone already: nothing to do)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def create_abort_file(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
