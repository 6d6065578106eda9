"""The core's view of its log: the stored ``EntryLog`` plus changes the driver has not applied yet.

Theory of operation
-------------------
The core never writes to the store. Resets, appends and truncations go into ``reset`` (the whole
stored part dropped, the log restarting empty at an index), ``unstable`` (a leader's proposed
entries), ``runs`` (a follower's runs of stored bytes from its leader, checked by the store) and
``truncate_after`` (a cut of the stored part) and leave through ``drain()`` in the next ``Ready``;
the driver applies them (reset, truncate, then append) before it calls into the core again, and
``check_applied()`` asserts it did (pair assertion on first and last index and last term). Reads
see the stored part below the cut (none after a reset), then the unstable entries.

The stored part's first and last index and last term are read from the store once per event
(``check_applied``, which every event of the core calls first) and kept, not asked again at every
read: during an event the store does not change (the core never writes it; the driver applies a
``Ready`` between events), and between events only retention moves its first index. ``drain()``
sets them to what the store holds once the driver applied the Ready (reads outside an event, as
``RaftNode.status``, see that), and the next ``check_applied`` compares them with the store.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from hasvc.state.raft.storage import Entry, EntryLog, EntryRun, LogReset, new_entries


class LogView:
    def __init__(self, log: EntryLog) -> None:
        self.log = log
        self._unstable: list[Entry] = []
        self._unstable_ends: list[int] = []  # body sizes of _unstable[:i + 1], summed
        self._runs: list[EntryRun] = []  # a follower's appended runs (never beside _unstable)
        self._truncate_after: int | None = None
        self._reset: LogReset | None = None
        # The store's first index, last index and last term, as of the start of this event (see the module).
        self._stored_first, self._stored_end, self._stored_end_term = log.ends()
        self._expected_end: tuple[int, int, int] = (self._stored_first, self._stored_end, self._stored_end_term)

    def _stored_last(self) -> int:
        if self._reset is not None:
            return self._reset.first_index - 1
        last = self._stored_end
        return last if self._truncate_after is None else min(last, self._truncate_after)

    def first_index(self) -> int:
        return self._stored_first if self._reset is None else self._reset.first_index

    def term_before_first(self) -> int:
        return self.log.term_before_first() if self._reset is None else self._reset.term_before_first

    def first_offset(self) -> int:
        return self.log.first_offset() if self._reset is None else self._reset.first_offset

    def stored_last_index(self) -> int:
        """The last index of the part the store holds already (what a flush report can cover)."""
        return self._stored_last()

    def last_index(self) -> int:
        if self._runs:
            return self._runs[-1].last_index
        if self._unstable:
            return self._unstable[-1].index
        if self._reset is None and self._truncate_after is None:  # _stored_last() written out: the commonest read
            return self._stored_end
        return self._stored_last()

    def last_term(self) -> int:
        if self._runs:
            return self._runs[-1].last_term
        if self._unstable:
            return self._unstable[-1].term
        if self._reset is None and self._truncate_after is None:
            return self._stored_end_term
        last = self._stored_last()
        return self.term_before_first() if last < self.first_index() else self.log.term_at(last)

    def term_at(self, index: int) -> int:
        """The term at `index`; IndexError outside [first_index(), last_index()]."""
        if self._runs and index >= self._runs[0].first_index:
            for run in self._runs:
                if index == run.last_index:
                    return run.last_term
                if run.first_index <= index < run.last_index:
                    return run.split_after(index)[0]  # a walk of its headers (rare: runs are drained at once)
            raise IndexError(index)
        if self._unstable and index >= self._unstable[0].index:
            if index > self._unstable[-1].index:
                raise IndexError(index)
            return self._unstable[index - self._unstable[0].index].term
        # The stored part: none after a reset, else [first, last] below the cut (_stored_last() written out).
        if self._reset is not None or index < self._stored_first or index > self._stored_end:
            raise IndexError(index)
        if self._truncate_after is not None:
            if index > self._truncate_after:
                raise IndexError(index)
        elif index == self._stored_end:
            return self._stored_end_term
        return self.log.term_at(index)

    def term_or_missing(self, index: int) -> int:
        """term_at(index), or -1 when the log has no entry there (and for index -1)."""
        try:
            return self.term_at(index)
        except IndexError:
            return -1

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Entry]:
        """Entries lo <= index < hi (at least one when lo <= last_index()), bodies up to size_max bytes."""
        self._runs_to_entries()
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

    def count_within(self, lo: int, hi: int, *, size_max: int) -> int:
        """How many entries from lo (below hi) one APPEND push carries: their bodies fit in size_max
        (at least one when lo <= last_index()), as ``read`` counts. The stored part is the
        store's ``run_length``; the unstable part a bisection of its running sizes."""
        assert not self._runs, "a leader pushes; runs are a follower's"
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return 0
        stored_hi = min(hi, self._stored_last() + 1)
        count = size = 0
        if lo < stored_hi:
            count, size = self.log.run_length(lo, stored_hi, size_max=size_max)
            if lo + count < stored_hi or stored_hi == hi:
                return count
        first_unstable = self._unstable[0].index
        start = lo + count - first_unstable  # position in _unstable of the next entry to count
        base = self._unstable_ends[start - 1] if start else 0
        end = bisect.bisect_right(self._unstable_ends, base + size_max - size, start, hi - first_unstable)
        return max(count + end - start, 1)

    def append(self, entries: list[Entry]) -> None:
        assert entries, "append of nothing"
        self._runs_to_entries()
        index = self.last_index() + 1
        previous_term = self.last_term()
        total = self._unstable_ends[-1] if self._unstable_ends else 0
        ends = []
        for entry in entries:  # one loop, no call per entry (generators cost a call per step)
            assert entry.index == index, ("entries not consecutive", entry.index, index)
            assert entry.term >= previous_term, ("log terms must not decrease", entry, previous_term)
            previous_term = entry.term
            index += 1
            total += len(entry.body)
            ends.append(total)
        self._unstable.extend(entries)
        self._unstable_ends.extend(ends)

    def append_proposal(self, first_index: int, term: int, bodies: Sequence[bytes]) -> None:
        """``append`` of a leader's proposal -- entries ``first_index``... of ``term`` -- made and
        summed without a Python call or loop step per entry (``new_entries``, ``accumulate``):
        the entries are consecutive by construction, so only the first one's place is checked."""
        assert bodies, "append of nothing"
        self._runs_to_entries()
        assert first_index == self.last_index() + 1, ("entries not consecutive", first_index, self.last_index())
        assert term >= self.last_term(), ("log terms must not decrease", term, self.last_term())
        total = self._unstable_ends[-1] if self._unstable_ends else 0
        self._unstable.extend(new_entries(first_index, term, bodies))
        ends = itertools.accumulate(map(len, bodies), initial=total)
        next(ends)  # the initial value: the previous end (or 0)
        self._unstable_ends.extend(ends)

    def append_run(self, run: EntryRun) -> None:
        """A follower's run of stored entries, checked by ``check_run`` (the next index on)."""
        assert run.count >= 1 and run.data is not None, run
        assert run.first_index == self.last_index() + 1, (run.first_index, self.last_index())
        assert run.last_term >= self.last_term(), ("log terms must not decrease", run.last_term, self.last_term())
        assert not self._unstable, "runs and proposed entries in one Ready"
        self._runs.append(run)

    def check_run(self, run: EntryRun, *, prev_term: int) -> str | None:
        """The store's verdict on a run that would follow the last entry (None: it may be appended)."""
        assert not self._unstable and not self._runs and self._truncate_after is None, "check_run with changes pending"
        return self.log.check_run(run, prev_term=prev_term)

    def _runs_to_entries(self) -> None:
        """Turn pending runs into entries (a walk of their bytes): for the rare mix with reads,
        truncations or proposals in one event."""
        if self._runs:
            runs, self._runs = self._runs, []
            for run in runs:
                self.append(run.entries(Entry))

    def reset(self, reset: LogReset) -> None:
        """Drop every entry; the log restarts empty at reset.first_index (no earlier cut or append
        of this batch matters any more)."""
        self._unstable.clear()
        self._unstable_ends.clear()
        self._runs.clear()
        self._truncate_after = None
        self._reset = reset

    def truncate(self, *, after_index: int) -> None:
        """Drop every entry above after_index."""
        self._runs_to_entries()
        if self._unstable and after_index >= self._unstable[0].index - 1:
            del self._unstable[after_index + 1 - self._unstable[0].index :]
            del self._unstable_ends[len(self._unstable) :]
            return
        self._unstable.clear()
        self._unstable_ends.clear()
        if after_index < self._stored_last():
            self._truncate_after = after_index

    def drain(self) -> tuple[LogReset | None, int | None, tuple[Entry, ...], tuple[EntryRun, ...]]:
        """The reset, truncation, entries and runs the driver must apply now (in that order);
        afterwards the store is the view."""
        reset, truncate_after = self._reset, self._truncate_after
        if not self._unstable and not self._runs and truncate_after is None and reset is None:
            # Nothing to apply (most Readies of a leader answering acknowledgements): the ends stay.
            self._expected_end = (self._stored_first, self._stored_end, self._stored_end_term)
            return None, None, (), ()
        entries, runs = tuple(self._unstable), tuple(self._runs)
        self._expected_end = (self.first_index(), self.last_index(), self.last_term())
        self._stored_first, self._stored_end, self._stored_end_term = self._expected_end  # once applied
        self._reset = None
        self._truncate_after = None
        self._unstable = []
        self._unstable_ends = []
        self._runs = []
        return reset, truncate_after, entries, runs

    def check_applied(self) -> None:
        """Pair assertion: the driver applied the last drained changes before calling in again.
        Every event of the core calls it first: it reads the store's ends for the event."""
        stored = self.log.ends()
        if not self._unstable and not self._runs and self._truncate_after is None and self._reset is None:
            # Retention may move the stored first index up between two calls (never below it).
            assert stored[1:] == self._expected_end[1:] and stored[0] >= self._expected_end[0], (
                "the driver did not apply the last Ready", stored, self._expected_end)
        self._stored_first, self._stored_end, self._stored_end_term = stored
