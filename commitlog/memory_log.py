"""``MemoryLog``: the ``LogStorage`` protocol in memory, with crash semantics, for simulations.

The bytes from ``min_offset`` on live in one bytearray; ``flush`` makes everything written
durable. ``crash()`` keeps what a power loss keeps: the flushed prefix and, given an rng, a
random-length piece of what was written after it (the page cache wrote some of it back before the
power went) -- the torn tail a recovery then has to cut. A process kill keeps everything written
(``crash(lose_unflushed=False)``).

Like ``CommitLog``: an empty log takes replicated bytes only at a segment boundary, then only at
its end (``ReplicationOffsetError``); reads stop at a segment's end and at the log's end
(``ReadError`` outside it). Unlike it, ``truncate`` does not check that a record starts there:
this log does not parse records.
"""

from __future__ import annotations

import random

from commitlog.commit_log import ReadError, ReplicationOffsetError


class MemoryLog:
    def __init__(self, *, segment_size: int) -> None:
        assert segment_size > 0
        self.segment_size = segment_size
        self.min_offset = 0
        self._data = bytearray()
        self.flushed_offset = 0
        self.flush_count = 0
        # Counts the mutations that remove bytes (truncate, a crash that loses some): between two
        # equal values the log only grew, which lets a checker compare only what is new.
        self.generation = 0

    def check_invariants(self) -> None:
        assert self.min_offset <= self.flushed_offset <= self.max_wrote_offset, (
            self.min_offset, self.flushed_offset, self.max_wrote_offset)  # fmt: skip

    @property
    def max_offset(self) -> int:
        return self.min_offset + len(self._data)

    @property
    def max_wrote_offset(self) -> int:
        return self.min_offset + len(self._data)

    def read(self, offset: int, size_max: int) -> memoryview:
        if offset < self.min_offset or offset >= self.max_offset:
            raise ReadError(f"offset {offset} outside the log [{self.min_offset}, {self.max_offset})")
        segment_end = offset - offset % self.segment_size + self.segment_size
        end = min(offset + size_max, segment_end, self.max_offset)
        start = offset - self.min_offset
        return memoryview(bytes(self._data[start : start + end - offset]))  # a copy: truncation cannot change it

    def append_replicated(self, offset: int, data) -> None:
        if not self._data and offset != self.max_wrote_offset:  # empty: it starts where the master says
            if offset % self.segment_size:
                raise ReplicationOffsetError(f"an empty log can only start at a segment boundary, master sent {offset}")
            self.min_offset = self.flushed_offset = offset
        elif offset != self.max_wrote_offset:
            raise ReplicationOffsetError(
                f"master sent bytes for offset {offset} but the local log ends at {self.max_wrote_offset}"
            )
        self._data += data
        self.check_invariants()

    def truncate(self, offset: int) -> None:
        if offset < self.min_offset or offset > self.max_wrote_offset:
            raise ReadError(f"cannot truncate at {offset}: log is [{self.min_offset}, {self.max_wrote_offset}]")
        if offset < self.max_wrote_offset:
            self.generation += 1
        del self._data[offset - self.min_offset :]
        self.flushed_offset = min(self.flushed_offset, offset)
        self.check_invariants()

    def flush(self, least_pages: int = 0) -> int:
        self.flushed_offset = self.max_wrote_offset
        self.flush_count += 1
        return self.flushed_offset

    def crash(self, rng: random.Random | None = None, *, lose_unflushed: bool = True) -> int:
        """What survives a crash (see the module); the log's new end."""
        if lose_unflushed:
            unflushed = self.max_wrote_offset - self.flushed_offset
            kept = rng.randrange(unflushed + 1) if rng is not None and unflushed else 0
            if kept < unflushed:
                self.generation += 1
            del self._data[self.flushed_offset + kept - self.min_offset :]
        self.check_invariants()
        return self.max_wrote_offset
