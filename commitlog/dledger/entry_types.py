"""The Raft log's value types, defined once: ``Entry``, ``HardState`` (the EntryLog contract's,
re-exported by ``hasvc.state.raft.storage``) and ``StoredEntry`` (an entry with where it lies).

``commitlog`` cannot import ``hasvc``; ``hasvc`` imports these, so the entries and hard states
the store builds are the very types the Raft core compares and makes.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple


class Entry(NamedTuple):
    """One log entry. A named tuple, not a frozen dataclass: a leader makes one per proposed
    message, and ``hasvc.state.raft.storage.new_entries`` builds them without a Python call each
    (a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: ~0.45 us
    an entry, 7 % of a leader's main thread at 64 producers x 32-message batches)."""

    index: int  # >= 0, consecutive
    term: int  # >= 0, never decreasing along the log
    body: bytes  # opaque payload (in DLedgerCommitLog, one RocketMQ message record); b"" is a leader's no-op


@dataclasses.dataclass(frozen=True, slots=True)
class HardState:
    term: int  # current term (DLedger: currTerm)
    voted_for: str | None  # member id voted for in `term` (DLedger: voteLeader)
    committed_index: int  # -1 when nothing committed (a hint; the core re-derives it)
    # The catch-up mark (``hasvc.state.raft.node``: "Lost entries"; state_files: catchUpTerm/
    # catchUpIndex): a member whose recovery cut entries it may have acknowledged records the
    # (term, index) its log ended at before; until its flushed log reaches it again it votes as
    # if its log still ended there and stands for no election. -1: none.
    catch_up_term: int = -1
    catch_up_index: int = -1


@dataclasses.dataclass(frozen=True, slots=True)
class StoredEntry:
    """An entry as it lies on disk: ``pos`` is its data-file offset (DLedgerCommitLog's
    PHYSICALOFFSET of the message in it is ``pos + 48``), ``size`` header plus body."""

    index: int
    term: int
    pos: int
    size: int
    body: bytes
