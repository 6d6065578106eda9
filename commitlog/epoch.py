"""Epochs: which master wrote which part of the log (RocketMQ 5's EpochFileCache).

Theory of operation
-------------------
Every time a broker becomes master it opens a new epoch, one more than any it knows, starting at
its log's end. The history is a list of ``(epoch, start offset)`` with both strictly increasing;
entry ``i`` covers ``[start_i, start_{i+1})`` and the last one runs to the end of the log.

Two brokers that share an entry (same epoch **and** same start offset) agree on the log up to the
end of that entry on both sides: the same master wrote those bytes to both. ``find_consistent_point``
walks the local history from the newest entry back and returns, for the first entry the other side
has with the same start, ``min(local end, other end)`` of that entry — where a returning slave must
cut its log before replicating again. No shared entry: -1, the logs are unrelated.

On disk (``STORE/epoch``), RocketMQ's CheckpointFile text format::

    <count>\\n<crc>\\n<epoch>-<start offset>\\n...

where ``crc`` is ``zlib.crc32`` of the entry lines, masked ``& 0x7FFFFFFF``. It is replaced
atomically (write a temporary file, fsync, rename, fsync the directory), and the same content is
written to ``epoch.bak`` first, which is read when the main file is damaged. (RocketMQ keeps the
previous version there; a history one epoch short would put the newest epoch's bytes in the one
before it, and a first file would have no copy at all. A crash between the two writes leaves
``epoch`` at the last history that was completely written.)
"""

from __future__ import annotations

import dataclasses
import os
import zlib

from commitlog.mapped_file import StoreError

EPOCH_FILE_NAME = "epoch"
EPOCH_ENTRIES_MAX = 1000  # as RocketMQ's handshake buffer


@dataclasses.dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


def validate(entries: list[EpochEntry]) -> None:
    for before, after in zip(entries, entries[1:]):
        if not (after.epoch > before.epoch and after.start_offset >= before.start_offset):
            raise ValueError(f"epoch history must grow: {before} then {after}")


def end_of(entries: list[EpochEntry], index: int, log_end: int) -> int:
    """Where entry ``index`` ends: the next entry's start, or the end of the log for the last."""
    return entries[index + 1].start_offset if index + 1 < len(entries) else log_end


def find_consistent_point(local: list[EpochEntry], local_end: int, other: list[EpochEntry], other_end: int) -> int:
    """The offset up to which both logs are the same master's bytes; -1 when none (RocketMQ's
    ``EpochFileCache.findConsistentPoint``)."""
    by_epoch = {entry.epoch: index for index, entry in enumerate(other)}
    for index in range(len(local) - 1, -1, -1):
        entry = local[index]
        match = by_epoch.get(entry.epoch)
        if match is not None and other[match].start_offset == entry.start_offset:
            return min(end_of(local, index, local_end), end_of(other, match, other_end))
    return -1


def truncate_suffix_by_offset(entries: list[EpochEntry], offset: int) -> list[EpochEntry]:
    """Drop entries that start at or after ``offset`` (the log was cut there)."""
    return [entry for entry in entries if entry.start_offset < offset]


class EpochFile:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, EPOCH_FILE_NAME)
        self.entries: list[EpochEntry] = []
        self.damaged = ""  # what did not read at open (the file or its copy): ``heal`` rewrites both

    @classmethod
    def open(cls, directory: str) -> EpochFile:
        epoch_file = cls(directory)
        if os.path.exists(epoch_file.path) or os.path.exists(epoch_file.path + ".bak"):
            epoch_file.entries = epoch_file._read()
        return epoch_file

    def _read(self) -> list[EpochEntry]:
        """The history from ``epoch``, or from its copy when ``epoch`` is damaged; ``damaged``
        says which of the two did not read (``heal`` writes both anew)."""
        errors = []
        found = None
        for path in (self.path, self.path + ".bak"):
            try:
                with open(path, encoding="utf-8") as file:
                    entries = _parse(file.read(), path)
            except (OSError, ValueError) as error:
                errors.append(f"{path}: {error}")
                continue
            if found is None:
                found = entries
        self.damaged = "; ".join(errors)
        if found is None:
            raise StoreError("cannot read the epoch file: " + "; ".join(errors))
        return found

    def heal(self) -> str:
        """Write both copies anew when one did not read at open (a store opened for writing calls
        it); what was wrong, or "" when nothing was."""
        damaged, self.damaged = self.damaged, ""
        if damaged:
            self.replace(self.entries)
        return damaged

    @property
    def last(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def append(self, epoch: int, start_offset: int) -> None:
        entries = [*self.entries, EpochEntry(epoch, start_offset)]
        validate(entries)
        self.replace(entries)

    def replace(self, entries: list[EpochEntry]) -> None:
        validate(entries)
        if len(entries) > EPOCH_ENTRIES_MAX:
            raise ValueError(f"more than {EPOCH_ENTRIES_MAX} epochs")
        lines = "".join(f"{e.epoch}-{e.start_offset}\n" for e in entries)
        text = f"{len(entries)}\n{zlib.crc32(lines.encode()) & 0x7FFFFFFF}\n{lines}"
        for target in (self.path + ".bak", self.path):  # the copy first: see the module
            temporary = target + ".tmp"
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        directory = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.entries = list(entries)


def _parse(text: str, path: str) -> list[EpochEntry]:
    lines = text.split("\n")
    if len(lines) < 2 or not lines[0].isdigit():
        raise ValueError("no entry count")
    count = int(lines[0])
    body = "".join(line + "\n" for line in lines[2 : 2 + count])
    crc = int(lines[1])
    if crc and zlib.crc32(body.encode()) & 0x7FFFFFFF != crc:
        raise ValueError("checksum mismatch")
    entries = []
    for line in lines[2 : 2 + count]:
        epoch, separator, start = line.partition("-")
        if not separator or not epoch.isdigit() or not start.isdigit():
            raise ValueError(f"bad entry {line!r}")
        entries.append(EpochEntry(int(epoch), int(start)))
    validate(entries)
    return entries
