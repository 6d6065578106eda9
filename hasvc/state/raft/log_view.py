"""The core's view of its log: the stored ``EntryLog`` plus changes the driver has not applied yet.

Theory of operation
-------------------
The core never writes to the store. Resets, appends and truncations go into ``reset`` (the whole
stored part dropped, the log restarting empty at an index), ``unstable`` (entries) and
``truncate_after`` (a cut of the stored part) and leave through ``drain()`` in the next ``Ready``;
the driver applies them (reset, truncate, then append) before it calls into the core again, and
``check_applied()`` asserts it did (pair assertion on first and last index and last term). Reads
see the stored part below the cut (none after a reset), then the unstable entries.
"""

from __future__ import annotations

from hasvc.state.raft.storage import Entry, EntryLog, LogReset


class LogView:
    def __init__(self, log: EntryLog) -> None:
        self.log = log
        self._unstable: list[Entry] = []
        self._truncate_after: int | None = None
        self._reset: LogReset | None = None
        self._expected_end: tuple[int, int, int] = (log.first_index(), log.last_index(), log.last_term())

    def _stored_last(self) -> int:
        if self._reset is not None:
            return self._reset.first_index - 1
        last = self.log.last_index()
        return last if self._truncate_after is None else min(last, self._truncate_after)

    def first_index(self) -> int:
        return self.log.first_index() if self._reset is None else self._reset.first_index

    def term_before_first(self) -> int:
        return self.log.term_before_first() if self._reset is None else self._reset.term_before_first

    def first_offset(self) -> int:
        return self.log.first_offset() if self._reset is None else self._reset.first_offset

    def stored_last_index(self) -> int:
        """The last index of the part the store holds already (what a flush report can cover)."""
        return self._stored_last()

    def last_index(self) -> int:
        return self._unstable[-1].index if self._unstable else self._stored_last()

    def last_term(self) -> int:
        if self._unstable:
            return self._unstable[-1].term
        last = self._stored_last()
        return self.term_before_first() if last < self.first_index() else self.log.term_at(last)

    def term_at(self, index: int) -> int:
        """The term at `index`; IndexError outside [first_index(), last_index()]."""
        if self._unstable and index >= self._unstable[0].index:
            if index > self._unstable[-1].index:
                raise IndexError(index)
            return self._unstable[index - self._unstable[0].index].term
        if index > self._stored_last() or index < self.first_index():
            raise IndexError(index)
        return self.log.term_at(index)

    def term_or_missing(self, index: int) -> int:
        """term_at(index), or -1 when the log has no entry there (and for index -1)."""
        if index < self.first_index() or index > self.last_index():
            return -1
        return self.term_at(index)

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Entry]:
        """Entries lo <= index < hi (at least one when lo <= last_index()), bodies up to size_max bytes."""
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return []
        stored_hi = min(hi, self._stored_last() + 1)
        out: list[Entry] = []
        if lo < stored_hi:
            out = self.log.read(lo, stored_hi, size_max=size_max)
            if len(out) < stored_hi - lo:
                return out
        size = sum(len(e.body) for e in out)
        for entry in self._unstable:
            if entry.index < lo or entry.index >= hi:
                continue
            if out and size + len(entry.body) > size_max:
                break
            out.append(entry)
            size += len(entry.body)
        return out

    def append(self, entries: list[Entry]) -> None:
        assert entries, "append of nothing"
        assert entries[0].index == self.last_index() + 1, (entries[0].index, self.last_index())
        previous_term = self.last_term()
        for entry in entries:
            assert entry.term >= previous_term, ("log terms must not decrease", entry, previous_term)
            previous_term = entry.term
        assert all(b.index == a.index + 1 for a, b in zip(entries, entries[1:])), "entries not consecutive"
        self._unstable.extend(entries)

    def reset(self, reset: LogReset) -> None:
        """Drop every entry; the log restarts empty at reset.first_index (no earlier cut or append
        of this batch matters any more)."""
        self._unstable.clear()
        self._truncate_after = None
        self._reset = reset

    def truncate(self, *, after_index: int) -> None:
        """Drop every entry above after_index."""
        if self._unstable and after_index >= self._unstable[0].index - 1:
            del self._unstable[after_index + 1 - self._unstable[0].index :]
            return
        self._unstable.clear()
        if after_index < self._stored_last():
            self._truncate_after = after_index

    def drain(self) -> tuple[LogReset | None, int | None, tuple[Entry, ...]]:
        """The reset, truncation and entries the driver must apply now (in that order);
        afterwards the store is the view."""
        reset, truncate_after, entries = self._reset, self._truncate_after, tuple(self._unstable)
        self._expected_end = (self.first_index(), self.last_index(), self.last_term())
        self._reset = None
        self._truncate_after = None
        self._unstable = []
        return reset, truncate_after, entries

    def check_applied(self) -> None:
        """Pair assertion: the driver applied the last drained changes before calling in again."""
        if not self._unstable and self._truncate_after is None and self._reset is None:
            stored = (self.log.first_index(), self.log.last_index(), self.log.last_term())
            # Retention may move the stored first index up between two calls (never below it).
            assert stored[1:] == self._expected_end[1:] and stored[0] >= self._expected_end[0], (
                "the driver did not apply the last Ready", stored, self._expected_end)
