"""DLedger mode's storage: the Raft log on disk in DLedger's format (openmessaging/dledger 0.3.1.2).

``entry_codec``: the 48-byte entry header, the 32-byte index unit, the blank record.
``entry_store``: ``DLedgerMmapFileStore``, data and index files over ``MappedFileQueue``,
checkpoint and currterm, recovery; it satisfies the EntryLog contract (ENTRYLOG.md) structurally.
``state_files``: the properties files, replaced durably.
Synchronous; imports neither trio nor hasvc.
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
