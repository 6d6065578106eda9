"""SimLog: the ``EntryLog`` protocol in memory, with crash semantics.

An entry's offset (``first_offset``, what a RESET carries) is its index here: a reset must be
handed the leader's, and ``reset`` checks it was.

``crash()`` keeps what a power loss keeps: entries up to ``flushed_index()`` and the saved hard
state. ``crash(lose_unflushed=False)`` is a process kill, which keeps the page cache (everything
appended) -- DLedger's default durability (acknowledged in memory, flushed every 10 ms) survives
only that kind.
"""

from __future__ import annotations

from collections.abc import Sequence

from hasvc.state.raft.storage import Entry, HardState, LogReset


class SimLog:
    def __init__(self) -> None:
        self.entries: list[Entry] = []  # entries[i] is entry first_index() + i
        self._first = 0  # retention (``compact``) and ``reset`` move it up
        self._term_before_first = -1  # the term of entry _first - 1 (-1: _first is 0)
        self._flushed_index = -1
        self._hard_state = HardState(0, None, -1)
        self.flush_count = 0

    def first_index(self) -> int:
        return self._first

    def last_index(self) -> int:
        return self._first + len(self.entries) - 1

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self._term_before_first

    def term_before_first(self) -> int:
        return self._term_before_first

    def first_offset(self) -> int:
        return self._first

    def term_at(self, index: int) -> int:
        return self.entry_at(index).term

    def entry_at(self, index: int) -> Entry:
        if not self._first <= index <= self.last_index():
            raise IndexError(f"index {index} outside [{self._first}, {self.last_index()}]")
        return self.entries[index - self._first]

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Entry]:
        if lo < self._first:
            raise IndexError(f"index {lo} below the first index {self._first}")
        out: list[Entry] = []
        size = 0
        for entry in self.entries[lo - self._first : max(0, min(hi, self.last_index() + 1) - self._first)]:
            if out and size + len(entry.body) > size_max:
                break
            out.append(entry)
            size += len(entry.body)
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        previous = self.entries[-1] if self.entries else None
        for entry in entries:
            expected = self._first if previous is None else previous.index + 1
            if entry.index != expected:
                raise ValueError(f"append of index {entry.index}, expected {expected}")
            if previous is not None and entry.term < previous.term:
                raise ValueError(f"append of term {entry.term} after term {previous.term}")
            previous = entry
        self.entries.extend(entries)

    def truncate(self, *, after_index: int) -> None:
        if after_index < self._first - 1:
            raise ValueError(f"cannot truncate after {after_index}: the log starts at {self._first}")
        del self.entries[after_index + 1 - self._first :]
        self._flushed_index = min(self._flushed_index, after_index)

    def compact(self, *, keep_from_index: int, committed_index: int) -> int:
        """Retention, as DLedgerMmapFileStore's: drop entries below ``keep_from_index``, the
        committed index and the flushed index (both kept themselves: a power loss must leave
        the log an entry to start from); returns the first index now. Survives a crash (a
        deletion is durable)."""
        limit = min(keep_from_index, committed_index, self._flushed_index)
        if limit > self._first:
            self._term_before_first = self.entries[limit - 1 - self._first].term
            del self.entries[: limit - self._first]
            self._first = limit
        return self._first

    def reset(self, reset: LogReset) -> None:
        """Drop every entry, start empty at ``reset.first_index``; durable at once."""
        if reset.first_offset != reset.first_index:
            raise ValueError(f"reset to index {reset.first_index} at offset {reset.first_offset}: not the leader's")
        self.entries = []
        self._first = reset.first_index
        self._term_before_first = reset.term_before_first
        self._flushed_index = reset.first_index - 1
        self._hard_state = HardState(self._hard_state.term, self._hard_state.voted_for,
                                     max(self._hard_state.committed_index, reset.first_index - 1))  # fmt: skip

    def flush(self) -> int:
        self.flush_count += 1
        self._flushed_index = self.last_index()
        return self._flushed_index

    def flushed_index(self) -> int:
        return self._flushed_index

    def load_hard_state(self) -> HardState:
        return self._hard_state

    def save_hard_state(self, state: HardState) -> None:
        self._hard_state = state

    def crash(self, *, lose_unflushed: bool = True) -> int:
        """Lose what a crash loses; returns how many entries were lost."""
        if not lose_unflushed:
            return 0
        lost = self.last_index() - self._flushed_index
        del self.entries[self._flushed_index + 1 - self._first :]
        return lost
