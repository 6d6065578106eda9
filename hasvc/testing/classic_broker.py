"""One simulated classic broker of ``ClassicCluster``: its disk (a ``FaultyLog`` and the epoch
table, both surviving a crash), the damage recovery finds on it, and the state its cores keep
while it runs (``Broker.start``); ``SafetyViolation``, what the checker raises. ``_read`` and
``_holds`` compare a log's bytes (the checker's and the operator's repair's reads)."""

from __future__ import annotations

import dataclasses

from commitlog.epoch import EpochEntry
from commitlog.memory_log import MemoryLog
from hasvc.config import BrokerRole
from hasvc.state import follower, handshake
from hasvc.state.replication import ReplicaSet
from hasvc.state.role import RoleState
from hasvc.state.transfer import TransferCursor

SEGMENT_SIZE = 4096  # small segments: frames cross boundaries often


class SafetyViolation(AssertionError):
    """The simulated cluster broke a property the cores promise."""


class FaultyLog(MemoryLog):
    """``MemoryLog`` with the disk's faults: bytes changed in place (a flipped bit, a repair
    writing a range back) and bytes lost below the flushed offset. Each bumps ``generation`` so
    that the checker compares the log again in full."""

    def flip(self, offset: int, bit: int) -> None:
        self._data[offset - self.min_offset] ^= 1 << bit
        self.generation += 1

    def write_back(self, offset: int, data: bytes) -> None:
        """A repair: ``data`` over ``[offset, offset + len(data))``, which may run past the end
        (flushed bytes that were lost come back); flushed, as the repair fsyncs."""
        start = offset - self.min_offset
        assert 0 <= start <= len(self._data), (offset, self.min_offset, self.max_offset)
        self._data[start : start + len(data)] = data
        self.generation += 1
        self.flush()

    def lose_flushed(self, offset: int) -> None:
        """Everything from ``offset`` on is gone, flushed or not (a disk that lied about an fsync,
        a lost segment file)."""
        self.truncate(offset)


@dataclasses.dataclass(frozen=True)
class Damage:
    """What recovery finds on a stopped broker's disk: ``[start, end)`` holds other bytes than
    ``truth`` (a flipped bit: the record that holds it), or is gone (lost writes: from where the
    log now ends to the checkpoint's flushed offset). ``claimed_end``: where the log ended before."""

    start: int
    end: int
    reason: str
    truth: bytes
    claimed_end: int


@dataclasses.dataclass
class Session:
    number: int
    established: bool = False
    reports: follower.Reports | None = None


@dataclasses.dataclass
class Pending:
    put_id: int
    offset: int
    end: int
    deadline: float
    epoch: int
    generations: tuple[int, ...]  # every log's generation when it was stored (see acknowledged)


class Broker:
    """One broker's state: disk (log, epochs) survives a crash; the rest is rebuilt on start."""

    def __init__(self, name: str, role: BrokerRole, master: str | None) -> None:
        self.name = name
        self.log = FaultyLog(segment_size=SEGMENT_SIZE)
        self.epochs: list[EpochEntry] = []
        self.up = False
        self.clean_stop = False  # the last stop was clean (no abort file): a master keeps its epoch
        self.damage: Damage | None = None  # found by recovery: the store refuses to start
        self.disk_full_until = -1.0  # appends fail with ENOSPC before this time
        self.fail_next_write = False  # the next append fails with EIO
        self.fail_next_fsync = False  # the next fsync fails with EIO
        self.start(role, master)

    def start(self, role: BrokerRole, master: str | None) -> None:
        self.up = True
        self.master = master
        self.role = RoleState(role, (master, 0) if master else None)
        self.replicas = ReplicaSet()  # master: the slaves by session number
        self.cursors: dict[int, TransferCursor] = {}
        self.session_of: dict[str, int] = {}  # master: slave name -> its current session
        self.pending: list[Pending] = []
        self.session: Session | None = None  # slave: its session with the master
        self.hello_at = -1.0
        self.flush_at = 0.0
        self.io_failed = ""  # why a write or an fsync failed: nothing acknowledged until a restart

    def view(self) -> handshake.LogView:
        return handshake.LogView(tuple(self.epochs), self.log.min_offset, self.log.max_offset, SEGMENT_SIZE)

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1].epoch if self.epochs else 0


def _read(log: MemoryLog, start: int, end: int) -> bytes:
    if start < log.min_offset or end > log.max_offset:
        return b"<outside>"
    out = bytearray()
    while start < end:
        piece = bytes(log.read(start, end - start))
        out += piece
        start += len(piece)
    return bytes(out)


def _holds(log: MemoryLog, offset: int, data: bytes) -> bool:
    return _read(log, offset, offset + len(data)) == data
