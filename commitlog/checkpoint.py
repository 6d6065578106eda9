"""The store's small files: ``checkpoint``, ``abort`` and ``lock`` (RocketMQ's StoreCheckpoint,
abort marker and file lock).

``checkpoint`` is 4096 bytes; five big-endian int64 at fixed offsets (as RocketMQ 5):

    offset size field
    0      8    physic_msg_timestamp   store timestamp of the newest commit log record known flushed
    8      8    logics_msg_timestamp   store timestamp of the newest record whose consume queue unit is flushed
    16     8    index_msg_timestamp    (reserved: hasvc has no index file yet)
    24     8    master_flushed_offset  commit log offset known flushed
    32     8    confirm_phy_offset     (reserved for replication)

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

from commitlog.mapped_file import StoreError

CHECKPOINT_FILE_SIZE: Final = 4096
CHECKPOINT = struct.Struct(">qqqqq")
assert CHECKPOINT.size == 40
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

    @classmethod
    def open(cls, path: str) -> StoreCheckpoint:
        checkpoint = cls(path)
        if os.path.exists(path):
            with open(path, "rb") as file:
                data = file.read(CHECKPOINT.size)
            if len(data) == CHECKPOINT.size:
                values = CHECKPOINT.unpack(data)
                if min(values) < 0:
                    raise StoreError(f"{path}: negative value in the checkpoint {values}")
                (
                    checkpoint.physic_msg_timestamp,
                    checkpoint.logics_msg_timestamp,
                    checkpoint.index_msg_timestamp,
                    checkpoint.master_flushed_offset,
                    checkpoint.confirm_phy_offset,
                ) = values
        return checkpoint

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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
            os.pwrite(fd, data, 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)


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
