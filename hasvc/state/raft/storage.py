"""What the Raft core needs from a log store: ``Entry``, ``HardState`` and the ``EntryLog`` protocol.

``Entry`` and ``HardState`` are defined in ``commitlog.dledger.entry_types`` (``commitlog`` cannot
import ``hasvc``; the store builds these very types) and re-exported here; the store satisfies
``EntryLog`` structurally. Indexes are DLedger's: the first entry
of a fresh log has index 0, an empty log has ``last_index() == -1`` and ``last_term() == -1``; terms
start at 0 and the first election makes term 1.

Crash semantics: entries above ``flushed_index()`` may be lost on a crash, entries at or below it
never are; a saved hard state is never lost.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Protocol

from commitlog.dledger.entry_run import EntryRun
from commitlog.dledger.entry_types import Entry, HardState  # defined once, in the store

__all__ = ["Entry", "EntryLog", "EntryRun", "HardState", "new_entries"]


_new_entry = functools.partial(tuple.__new__, Entry)


def new_entries(first_index: int, term: int, bodies: Sequence[bytes]) -> list[Entry]:
    """``[Entry(first_index + i, term, body) for i, body in enumerate(bodies)]`` without a Python
    call per entry (``bodies`` are kept, not copied)."""
    return list(map(_new_entry, zip(range(first_index, first_index + len(bodies)), itertools.repeat(term), bodies)))


@dataclasses.dataclass(frozen=True, slots=True)
class LogReset:
    """Discard every entry; the log restarts empty at ``first_index`` (a RESET from the leader)."""

    first_index: int  # >= 1: the leader's first index
    term_before_first: int  # term of entry first_index - 1 (the empty log's last term)
    first_offset: int  # where entry first_index will lie in the store (the leader's; opaque to the core)


class EntryLog(Protocol):
    def first_index(self) -> int:
        """ledgerBeginIndex: 0 unless a prefix was deleted."""

    def last_index(self) -> int:
        """ledgerEndIndex, first_index() - 1 when empty."""

    def last_term(self) -> int:
        """Term of last_index(); when empty, term_before_first()."""

    def ends(self) -> tuple[int, int, int]:
        """(first_index(), last_index(), last_term()) in one call (read at every event of the core)."""

    def term_before_first(self) -> int:
        """Term of entry first_index() - 1, which retention or a reset deleted: -1 when
        first_index() is 0 or the store does not know it (then the member cannot RESET others)."""

    def first_offset(self) -> int:
        """Where entry first_index() lies (or will lie) in the store: opaque to the core, which
        only hands it to a follower it resets (DLedger: the entry's pos in the data files)."""

    def term_at(self, index: int) -> int:
        """Raises IndexError outside [first_index(), last_index()]."""

    def read(self, lo: int, hi: int, *, size_max: int) -> list[Entry]:
        """Entries with lo <= index < hi, stopping before the total body size would pass size_max
        (always at least one entry when lo <= last_index())."""

    def append(self, entries: Sequence[Entry]) -> None:
        """entries[0].index == last_index() + 1, consecutive, terms non-decreasing; not yet durable."""

    def run_length(self, lo: int, hi: int, *, size_max: int) -> tuple[int, int]:
        """(count, body bytes) of the entries from lo (below hi) whose bodies fit in size_max (at
        least one when lo <= last_index()): one APPEND push."""

    def read_runs(self, first: int, count: int, last_term: int) -> list[EntryRun] | None:
        """Entries first..first + count - 1 as stored (``EntryRun``s with bytes, one per data file),
        or None unless the log holds them and the last has last_term. The driver's, at send time."""

    def check_run(self, run: EntryRun, *, prev_term: int) -> str | None:
        """Why ``run`` (bytes from a leader) cannot follow the last entry, of prev_term; None if it can."""

    def append_run(self, run: EntryRun) -> None:
        """Append a run check_run accepted (run.first_index == last_index() + 1); not yet durable."""

    def truncate(self, *, after_index: int) -> None:
        """Drop every entry with index > after_index (never below committed: the caller asserts)."""

    def reset(self, reset: LogReset) -> None:
        """Drop every entry and start empty at reset.first_index (durable when it returns);
        committed and flushed index become first_index - 1."""

    def flush(self) -> int:
        """Make all appended entries durable; returns flushed_index()."""

    def flushed_index(self) -> int:
        """Highest index that survives a crash (-1 if none)."""

    def load_hard_state(self) -> HardState:
        """The last saved hard state (HardState(0, None, -1) for a fresh store)."""

    def save_hard_state(self, state: HardState) -> None:
        """Durable when it returns (fsync)."""
