"""SimLog: the ``EntryLog`` protocol in memory, with crash semantics.

Entries lie one after the other from offset 0 (``pos``, as in a store but for blank records); a
RESET carries the leader's offset of its first entry (``first_offset``), where the follower's log
then restarts, so that the leader's runs find their ``pos`` fields where they will be written.

``crash()`` keeps what a power loss keeps: entries up to ``flushed_index()`` and the saved hard
state. ``crash(lose_unflushed=False)`` is a process kill, which keeps the page cache (everything
appended) -- DLedger's default durability (acknowledged in memory, flushed every 10 ms) survives
only that kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from commitlog.dledger.entry_codec import BODY_OFFSET
from commitlog.dledger.entry_run import check_run, encode_run
from hasvc.state.raft.storage import Entry, EntryRun, HardState, LogReset

# SimLog lays its entries out as one endless data file from offset 0 (positions as a store's
# would be but for blank records): a run's pos fields are checked against them.
_POS_LIMIT = 1 << 62


class SimLog:
    data_file_size = 0  # one endless data file: a driver's HELLO says no size (0), and checks none

    def __init__(self) -> None:
        self.entries: list[Entry] = []  # entries[i] is entry first_index() + i
        self._positions: list[int] = []  # the pos of entries[i]
        self._end_pos = 0  # where the next entry goes
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

    def ends(self) -> tuple[int, int, int]:
        return self.first_index(), self.last_index(), self.last_term()

    def term_before_first(self) -> int:
        return self._term_before_first

    def first_offset(self) -> int:
        return self._positions[0] if self.entries else self._end_pos

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
        for entry in entries:
            self._positions.append(self._end_pos)
            self._end_pos += BODY_OFFSET + len(entry.body)
        self.entries.extend(entries)

    def run_length(self, lo: int, hi: int, *, size_max: int) -> tuple[int, int]:
        count = size = 0
        for entry in self.entries[lo - self._first : max(0, min(hi, self.last_index() + 1) - self._first)]:
            if count and size + len(entry.body) > size_max:
                break
            count += 1
            size += len(entry.body)
        return count, size

    def read_runs(self, first: int, count: int, last_term: int) -> list[EntryRun] | None:
        last = first + count - 1
        if count < 1 or first < self._first or last > self.last_index() or self.term_at(last) != last_term:
            return None
        entries = self.entries[first - self._first : last + 1 - self._first]
        return [EntryRun(first, count, last_term, encode_run(entries, first_pos=self._positions[first - self._first]))]

    def pos_of(self, index: int) -> int:
        """Where entry ``index`` lies, or (the next index) will lie."""
        if index == self.last_index() + 1:
            return self._end_pos
        return self._positions[index - self._first] if self._first <= index <= self.last_index() else -1

    def run_of(self, entries: Sequence[Entry]) -> EntryRun:
        """``entries`` as a leader whose log agrees with this one up to them would push them (tests)."""
        first_pos = max(self.pos_of(entries[0].index), self._end_pos if entries[0].index > self.last_index() else 0)
        return EntryRun(entries[0].index, len(entries), entries[-1].term, encode_run(entries, first_pos=first_pos))

    def check_run(self, run: EntryRun, *, prev_term: int) -> str | None:
        if run.first_index != self.last_index() + 1:
            return f"run starts at entry {run.first_index}, the log ends at {self.last_index()}"
        return check_run(run, prev_term=prev_term, first_pos=self._end_pos, pos_limit=_POS_LIMIT)

    def append_run(self, run: EntryRun) -> None:
        self.append(run.entries(Entry))

    def truncate(self, *, after_index: int) -> None:
        if after_index < self._first - 1:
            raise ValueError(f"cannot truncate after {after_index}: the log starts at {self._first}")
        self._cut(after_index)
        self._flushed_index = min(self._flushed_index, after_index)

    def _cut(self, after_index: int) -> None:
        keep = after_index + 1 - self._first
        if keep < len(self.entries):
            self._end_pos = self._positions[keep]
        del self.entries[keep:]
        del self._positions[keep:]

    def compact(self, *, keep_from_index: int, committed_index: int) -> int:
        """Retention, as DLedgerMmapFileStore's: drop entries below ``keep_from_index``, the
        committed index and the flushed index (both kept themselves: a power loss must leave
        the log an entry to start from); returns the first index now. Survives a crash (a
        deletion is durable)."""
        limit = min(keep_from_index, committed_index, self._flushed_index)
        if limit > self._first:
            self._term_before_first = self.entries[limit - 1 - self._first].term
            del self.entries[: limit - self._first]
            del self._positions[: limit - self._first]
            self._first = limit
        return self._first

    def reset(self, reset: LogReset) -> None:
        """Drop every entry, start empty at ``reset.first_index``; durable at once."""
        if reset.first_offset < 0:
            raise ValueError(f"reset to index {reset.first_index} at offset {reset.first_offset}")
        self.entries = []
        self._positions = []
        self._end_pos = reset.first_offset
        self._first = reset.first_index
        self._term_before_first = reset.term_before_first
        self._flushed_index = reset.first_index - 1
        self._hard_state = dataclasses.replace(
            self._hard_state, committed_index=max(self._hard_state.committed_index, reset.first_index - 1))

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

    def lose_from(self, index: int) -> None:
        """Storage damage found at a restart: entries from ``index`` on are gone (flushed or not,
        committed or not), and recovery saves the catch-up mark -- the end the log had -- in the
        hard state before it cuts (``DLedgerMmapFileStore`` with recovery_repair_from_peers)."""
        if not self._first <= index <= self.last_index():
            raise ValueError(f"lose_from({index}) outside [{self._first}, {self.last_index()}]")
        saved = self._hard_state
        mark = max((self.last_term(), self.last_index()), (saved.catch_up_term, saved.catch_up_index))
        self._hard_state = HardState(saved.term, saved.voted_for, min(saved.committed_index, index - 1), *mark)
        self._cut(index - 1)
        self._flushed_index = min(self._flushed_index, index - 1)

    def crash(self, *, lose_unflushed: bool = True) -> int:
        """Lose what a crash loses; returns how many entries were lost."""
        if not lose_unflushed:
            return 0
        lost = self.last_index() - self._flushed_index
        self._cut(self._flushed_index)
        return lost
