"""SimLog: the ``EntryLog`` protocol in memory, with crash semantics.

``crash()`` keeps what a power loss keeps: entries up to ``flushed_index()`` and the saved hard
state. ``crash(lose_unflushed=False)`` is a process kill, which keeps the page cache (everything
appended) -- DLedger's default durability (acknowledged in memory, flushed every 10 ms) survives
only that kind.
"""

from __future__ import annotations

from collections.abc import Sequence

from hasvc.state.raft.storage import Entry, HardState


class SimLog:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._flushed_index = -1
        self._hard_state = HardState(0, None, -1)
        self.flush_count = 0

    def first_index(self) -> int:
        return 0

    def last_index(self) -> int:
        return len(self.entries) - 1

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else -1

    def term_at(self, index: int) -> int:
        if not 0 <= index < len(self.entries):
            raise IndexError(f"index {index} outside [0, {len(self.entries) - 1}]")
        return self.entries[index].term

    def entry_at(self, index: int) -> Entry:
        if not 0 <= index < len(self.entries):
            raise IndexError(f"index {index} outside [0, {len(self.entries) - 1}]")
        return self.entries[index]

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Entry]:
        assert lo >= 0, lo
        out: list[Entry] = []
        size = 0
        for entry in self.entries[lo : min(hi, len(self.entries))]:
            if out and size + len(entry.body) > size_max:
                break
            out.append(entry)
            size += len(entry.body)
        return out

    def append(self, entries: Sequence[Entry]) -> None:
        previous = self.entries[-1] if self.entries else None
        for entry in entries:
            expected = 0 if previous is None else previous.index + 1
            if entry.index != expected:
                raise ValueError(f"append of index {entry.index}, expected {expected}")
            if previous is not None and entry.term < previous.term:
                raise ValueError(f"append of term {entry.term} after term {previous.term}")
            previous = entry
        self.entries.extend(entries)

    def truncate(self, *, after_index: int) -> None:
        del self.entries[after_index + 1 :]
        self._flushed_index = min(self._flushed_index, after_index)

    def flush(self) -> int:
        self.flush_count += 1
        self._flushed_index = len(self.entries) - 1
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
        lost = len(self.entries) - 1 - self._flushed_index
        del self.entries[self._flushed_index + 1 :]
        return lost
