"""Incremental from-disk checks for the long drills (``--fault corrupt``): a round's cost bounded.

A drill's checks used to read and digest every store whole each round, so round N cost N times
round 1 and a long run never ended. What a round can change below the end it last verified is
little: the bytes appended since, the file the round damaged (and whatever repaired it), and
any file a buggy recovery or repair rewrote. These helpers make that difference cheap to find:

- ``PrefixDigests``: for each file, the SHA-256 of the part that was verified (its first
  ``length`` bytes) and the file's signature (inode, size, mtime, ctime) when it was recorded.
  ``changed(forced)`` re-reads the recorded part of every file whose signature moved (one a
  repair rewrote, one deleted), of the newest file of each directory (the one being appended to)
  and of every ``forced`` file (the one the drill damaged: its signature is not trusted), and
  names the files whose recorded part no longer has the recorded digest. A drill that finds one
  re-runs its full check. A round reads those files only: the active segment, the damaged file.
- ``QueueRebuild``: the consume queues a full dispatch of the log builds, carried from round to
  round (each queue's end, its gaps), fed only the records appended since; the units they add are
  compared with the stored queue files at those queue offsets. With ``PrefixDigests`` guarding the
  stored queues' compared part, that is ``check_consume_queues`` over the whole log.
- ``FileDigests``: ``queue_file_digests`` with each older file's digest kept while its signature
  holds (the newest of each queue is always read again).

Why it is equivalent: a check over an append-only log is the conjunction of the same check over
its parts; the part verified last round is proven unchanged (same bytes, by digest) before its
result is reused, and everything else is checked now. The signature is the only thing trusted
without reading, and only for files no process is appending to: Linux moves mtime/ctime on
write(2) and truncate, but a write through a shared mapping to a page already dirty does not move
them, so the newest file of each directory (the one being appended through a mapping) is always
re-read. A write to an older file through a page left dirty in a live mapping would still be
missed mid-drill; the drill's last round, which checks everything from disk with no reuse,
finds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import time

from commitlog.inspect import QueueCheck, QueueDifference, ReadOnlyLog, _rebuild_runs, _Rebuilt
from commitlog.mapped_file_queue import MappedFileQueue

READ_CHUNK_SIZE = 1 << 20  # bytes hashed per read: a bounded buffer, a segment is 4 MiB or more
QUEUE_UNIT = struct.Struct(">qiq")  # a consume queue unit: commit log offset, size, tags code


def file_signature(path: str) -> tuple[int, int, int, int] | None:
    """(inode, size, mtime ns, ctime ns) of ``path``; None when it does not exist."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


def prefix_digest(path: str, length: int) -> str | None:
    """SHA-256 of the first ``length`` bytes of ``path``; None when it is missing or shorter."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            remaining = length
            while remaining:
                data = file.read(min(remaining, READ_CHUNK_SIZE))
                if not data:
                    return None
                digest.update(data)
                remaining -= len(data)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


class PrefixDigests:
    """The verified part of each file: ``record`` it after a check, ask ``changed`` before the next."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[tuple | None, int, str | None]] = {}  # path -> (signature, length, digest)

    def record(self, path: str, length: int) -> None:
        """``path``'s first ``length`` bytes were verified: their digest, unless that part was
        recorded before with the file unchanged since (the file's older files cost nothing)."""
        signature = file_signature(path)
        held = self.files.get(path)
        if held is not None and held[0] == signature and held[1] == length:
            return
        self.files[path] = (signature, length, prefix_digest(path, length))

    def changed(self, forced: tuple[str, ...] | list[str] = ()) -> list[str]:
        """The recorded files whose recorded part differs now (re-read: those whose signature
        moved, every ``forced`` one, and the newest of each directory, which a process may still
        be writing through a mapping that does not move its times)."""
        found = []
        newest = newest_by_directory(self.files)
        for path, (signature, length, digest) in sorted(self.files.items()):
            if path not in forced and path not in newest and file_signature(path) == signature:
                continue
            if prefix_digest(path, length) != digest:
                found.append(path)
        return found

    def forget(self) -> None:
        self.files.clear()


def newest_by_directory(paths) -> set[str]:
    """The last path (by name: files are named by their start offset) of each directory."""
    newest: dict[str, str] = {}
    for path in paths:
        directory, name = os.path.split(path)
        held = newest.get(directory)
        if held is None or (len(name), name) > (len(os.path.basename(held)), os.path.basename(held)):
            newest[directory] = path
    return set(newest.values())


class FileDigests:
    """``queue_file_digests`` (SHA-256 of every consume queue file) re-reading the newest file of
    each queue (the one being written, through a mapping whose writes need not move the file's
    times), the ``forced`` ones, and the others only when their signature moved."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[tuple | None, str]] = {}

    def digests(self, store: str, *, forced: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
        found = {}
        root = os.path.join(store, "consumequeue")
        for directory, _, names in os.walk(root):
            newest = newest_by_directory(os.path.join(directory, name) for name in names)
            for name in names:
                path = os.path.join(directory, name)
                signature = file_signature(path)
                held = self.held.get(path)
                if held is None or held[0] != signature or path in forced or path in newest:
                    with open(path, "rb") as file:
                        held = self.held[path] = (signature, hashlib.sha256(file.read()).hexdigest())
                found[os.path.relpath(path, root)] = held[1]
        return found


class QueueRebuild:
    """``rebuild_consume_queues`` carried across rounds: ``advance(store, start, end)`` dispatches
    the records in [start, end) (``start`` a record boundary: the end the last call reached) onto
    the queues built so far, and compares the units added with ``store``'s queue files; what it
    finds accumulates in ``check`` (a ``QueueCheck``, as ``check_consume_queues`` reports)."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], _Rebuilt] = {}
        self.broken: set[tuple[str, int]] = set()
        self.check = QueueCheck()

    def advance(self, store: str, start: int, end: int) -> QueueCheck:
        from commitlog import dispatch as message_store  # noqa: PLC0415 (the dispatcher both stores use)

        check = QueueCheck()
        before = {key: queue.end for key, queue in self.queues.items()}
        with ReadOnlyLog(store) as log:
            for base, mapping in log.segments:
                if base + len(mapping) <= start or base >= end:
                    continue
                view = memoryview(mapping)
                try:
                    position, limit = max(0, start - base), min(len(mapping), end - base)
                    while position < limit:
                        at = position
                        position, stop, _records, runs = message_store.dispatch_units(view, position, limit, base,
                                                                                      message_store.DISPATCH_RECORDS_PER_CALL)  # fmt: skip
                        if stop == message_store._STOP_SLOW:
                            _rebuild_runs(runs, self.queues, self.broken, check)
                            position, stop, _records, runs = message_store._dispatch_units_python(view, position, limit, base, records_max=1)
                        _rebuild_runs(runs, self.queues, self.broken, check)
                        if stop != message_store._STOP_LIMIT or position == at:
                            break
                finally:
                    view.release()
        for key in sorted(self.queues):
            queue = self.queues[key]
            first = before.get(key, queue.first)
            check.queues += 1
            directory = os.path.join(store, "consumequeue", key[0], str(key[1]))
            stored = read_units(directory, first, queue.end - first + 1)  # and the unit after the end: none
            theirs = bytes(queue.units[(first - queue.first) * 20 :])
            mine = stored[: len(theirs)]
            check.units += len(theirs) // 20
            if mine != theirs:
                index = next(i for i in range(0, len(theirs), 20) if mine[i : i + 20] != theirs[i : i + 20])
                check.differences.append(QueueDifference(*key, first + index // 20, QUEUE_UNIT.unpack_from(mine, index)
                                                         if len(mine) >= index + 20 else None, QUEUE_UNIT.unpack_from(theirs, index)))  # fmt: skip
            elif any(stored[len(theirs) :]):
                check.differences.append(QueueDifference(*key, queue.end, QUEUE_UNIT.unpack_from(stored, len(theirs)), None))
            queue.first, queue.units = queue.end, bytearray()  # compared: only the end is kept
        self.check.differences += check.differences
        self.check.gaps += check.gaps
        self.check.duplicates += check.duplicates
        return check

    def queue_ends(self, store: str) -> dict[str, int]:
        """Per stored queue file: how many of its bytes the compared units cover (for ``PrefixDigests``)."""
        covered = {}
        for (topic, queue_id), queue in self.queues.items():
            directory = os.path.join(store, "consumequeue", topic, str(queue_id))
            for start, path in MappedFileQueue.segment_files(directory):
                covered[path] = max(0, min(os.path.getsize(path), queue.end * 20 - start))
        return covered


def read_units(directory: str, first: int, count: int) -> bytes:
    """``count`` consume queue units from queue offset ``first`` as the files hold them (shorter
    where the files end)."""
    parts = []
    wanted_from, wanted_to = first * 20, (first + count) * 20
    for start, path in MappedFileQueue.segment_files(directory):
        size = os.path.getsize(path)
        if start + size <= wanted_from or start >= wanted_to:
            continue
        with open(path, "rb") as file:
            file.seek(max(0, wanted_from - start))
            parts.append(file.read(min(start + size, wanted_to) - max(start, wanted_from)))
    return b"".join(parts)


class RoundTimeout(RuntimeError):
    """A round ran past its bound: the message says what it was waiting for."""


class RoundClock:
    """One round's phases, timed (printed with the round), and its deadline: a wait that is still
    waiting past it fails the round with ``RoundTimeout`` naming what it waited for."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self.started = time.monotonic()
        self.deadline = self.started + timeout_seconds
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - started

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def expired(self, waiting_for: str) -> RoundTimeout:
        return RoundTimeout(f"the round took over {self.timeout_seconds:.0f} s: still waiting for {waiting_for}")

    def check(self, waiting_for: str) -> None:
        if time.monotonic() > self.deadline:
            raise self.expired(waiting_for)

    def summary(self) -> str:
        total = time.monotonic() - self.started
        return f"{total:.1f} s: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in self.phases.items())
