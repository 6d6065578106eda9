"""DLedger mode's storage: the Raft log on disk in DLedger's format (openmessaging/dledger 0.3.1.2).

``entry_codec``  the 48-byte entry header, the 32-byte index unit, the blank record (byte tables).
``entry_types``  ``Entry``, ``HardState`` (the Raft core's, defined once here), ``StoredEntry``.
``entry_store``  ``DLedgerMmapFileStore``: the store as a facade over one module per concern, below. It
                 satisfies the EntryLog contract (``hasvc.state.raft.storage``) structurally.
``entry_placement``  where entries land (pos, blank records): pure planning.
``entry_reader``, ``entry_writer``, ``entry_retention``, ``entry_repair``  reads; appends and flush;
                 truncate, reset and retention; the scrub's reads and an entry's repair.
``entry_recovery``  ``EntryLogLoader``: opening a store, recovery as a plan, then its application.
``entry_run``    ``EntryRun``: entries as stored, what a leader pushes; the one-walk check of a pushed run
                 (native ``check_entries`` and its Python twin) and its index units.
``scan``         the recovery scan of data files, pure (shared by recovery and ``inspect``).
``inspect``      read-only ``verify`` and ``iter_entries`` of a store directory.
``upgrade``      smooth upgrade: a classic commit log continued by DLedger (dividedCommitlogOffset).
``state_files``  the properties files (checkpoint, currterm), replaced durably; ``EntryStateFiles``.
``message_store``  ``DLedgerMessageStore``: a DLedger member's message store (DLedgerCommitLog): one record
                 per entry at pos + 48, consume queues over committed entries, the classic part below the divide.
``message_inspect``  read-only ``verify_member`` and ``iter_messages`` over both parts (``hasvc store``).
Synchronous; imports neither trio nor hasvc. docs/FORMAT.md, "DLedger store", has the formats.
"""

from commitlog.dledger.entry_store import (
    DLedgerMmapFileStore,
    DLedgerStoreConfig,
    Entry,
    HardState,
    RecoveryReport,
    StoredEntry,
)

__all__ = ["DLedgerMmapFileStore", "DLedgerStoreConfig", "Entry", "HardState", "RecoveryReport", "StoredEntry"]
