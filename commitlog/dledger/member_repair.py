"""Repair a stopped DLedger member's store that refuses to open: rewrite its damaged entries with a
live member's copy, or accept the loss (``hasvc store repair DIR --member ID --from|--accept-loss``).

Theory of operation
-------------------
A member refuses to open (``entry_recovery``) when its recovery finds damage -- an entry that
does not check, a term going down, an end below the checkpoint's flushedIndex, a cut deleting more
than ``recovery_cut_segments_max`` data files -- and it has no other copy to be repaired from by
itself (a group of one, or ``recovery_repair_from_peers=false``).

``repair_member_from`` plans recovery as the member would (read only, ``EntryLogLoader.plan``),
takes the entry where the log would end -- entry ``last + 1`` at the scan's end, or the last
entry scanned when its term is the damaged part -- fetches the entry at that data offset from a
live member through ``fetch(offset, size_max) -> bytes`` (the caller's transport: the client
protocol's READ serves a member's committed data bytes, headers included; the members' data
files are byte-identical) and checks it: a whole entry (magic, sizes, bodyCrc, reserved fields
0) with this index and pos, whose term and size this store's own header or index unit still
say (Raft's log matching: the same index and term are the same entry; a single damage changes
one of the two, not both). It is written over the damaged bytes and fsynced, and the plan runs
again, until recovery finds no damage (at most ``REPAIR_ENTRIES_MAX`` entries). The index units
need no write: recovery rebuilds those that disagree with their entries. Nothing is written
unless the copy checks; the store's lock is held throughout (no node may have it open).

``accept_member_loss`` opens the member's entry store once with ``recovery_accept_lost_entries``
(DLedger's own recovery: the log ends at its last good entry, what follows is cut, no catch-up
mark) and closes it: the next start opens a clean store.

No trio, no hasvc: the caller passes the fetch function.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from commitlog.checkpoint import StoreLock
from commitlog.damage import DamagedRange
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_repair import EntryCopyRefused, check_entry_copy
from commitlog.dledger.entry_recovery import EntryLogLoader, RecoveryPlan
from commitlog.dledger.entry_store import DATA_DIRECTORY, INDEX_DIRECTORY, DLedgerMmapFileStore, DLedgerStoreConfig
from commitlog.dledger.state_files import EntryStateFiles
from commitlog.dledger.upgrade import dledger_directory
from commitlog.mapped_file import StoreError
from commitlog.mapped_file_queue import MappedFileQueue

Fetch = Callable[[int, int], bytes]  # (data offset, size_max) -> the peer's bytes from there (b"": none)

# Entries rewritten in one repair: each costs a recovery plan (a scan of the newest data files).
# A longer damaged run is a lost tail, which the leader's catch-up (recovery_repair_from_peers)
# restores far more cheaply than this one-entry-at-a-time loop.
REPAIR_ENTRIES_MAX = 4096


class MemberRepairError(StoreError):
    """The repair could not be done; nothing of the entry named was written."""


@dataclasses.dataclass(frozen=True, slots=True)
class MemberRepairReport:
    repaired: tuple[DamagedRange, ...]  # each entry rewritten: its data file, [pos, pos + size), its index
    bytes_written: int


@dataclasses.dataclass(frozen=True, slots=True)
class MemberLossReport:
    damaged: tuple[DamagedRange, ...]  # what recovery found and cut (empty: nothing was damaged)
    last_index: int  # the log's last entry now
    lost_entries: int  # entries at or below the checkpoint's flushedIndex that are gone


def _config_for(directory: str, **settings) -> DLedgerStoreConfig:
    """The entry store's config for the files in ``directory`` (their sizes, as found)."""
    data_size = MappedFileQueue.infer_file_size(os.path.join(directory, DATA_DIRECTORY))
    if data_size is None:
        raise MemberRepairError(f"{directory}/{DATA_DIRECTORY}: no data files here")
    index_size = MappedFileQueue.infer_file_size(os.path.join(directory, INDEX_DIRECTORY))
    defaults = DLedgerStoreConfig()
    return DLedgerStoreConfig(data_file_size=data_size, index_file_size=index_size or defaults.index_file_size, **settings)


def _plan(directory: str, config: DLedgerStoreConfig) -> tuple[RecoveryPlan, EntryLogLoader]:
    """Recovery's plan for the member's files, read only (their queues are left open)."""
    data = MappedFileQueue(os.path.join(directory, DATA_DIRECTORY), file_size=config.data_file_size)
    index = MappedFileQueue(os.path.join(directory, INDEX_DIRECTORY), file_size=config.index_file_size)
    data.load()
    index.load()
    state_files = EntryStateFiles(directory, data_file_size=config.data_file_size)
    committed_hint, flushed, resetting = state_files.load()
    if resetting:
        data.close()
        index.close()
        raise MemberRepairError(f"{directory}: a reset from the leader was under way: start the member, it finishes it")
    begin = state_files.begin
    loader = EntryLogLoader(data, index, config, state_files, data_start_offset=begin[2] if begin is not None else 0)
    try:
        return loader.plan(committed_hint, flushed, resetting), loader
    except BaseException:
        data.close()
        index.close()
        raise


def damaged_entries(plan: RecoveryPlan) -> list[tuple[int, int]]:
    """(index, pos) of the entries this plan's damage may lie in, in the order to try them; empty
    when recovery finds no damage. A term that goes down between two whole entries is either the
    first's raised or the second's lowered (the term is under no CRC): both are tried, and the
    one whose copy differs from this store's bytes is the damaged one."""
    if plan.damage is None:
        return []
    scan = plan.scan
    if scan.damaged:
        return [(scan.last_index, scan.last_pos), (scan.last_index + 1, scan.end_offset)]
    return [(scan.last_index + 1, scan.end_offset)]


def fetch_entry(fetch: Fetch, pos: int) -> bytes:
    """The peer's entry at data offset ``pos``, its header's size long; MemberRepairError when the
    peer holds none there."""
    data = bytearray(fetch(pos, codec.BODY_OFFSET))
    size = int.from_bytes(data[4:8], "big", signed=True) if len(data) >= 8 else -1
    if not codec.BODY_OFFSET <= size <= codec.ENTRY_SIZE_MAX:
        raise MemberRepairError(f"the peer holds no entry at offset {pos} ({len(data)} bytes read, size word {size})")
    while len(data) < size:
        more = fetch(pos + len(data), size - len(data))
        if not more:
            raise MemberRepairError(f"the peer's entry at offset {pos} ends at {pos + len(data)}, its header says {size} bytes")
        data += more
    return bytes(data[:size])


def check_copy(loader: EntryLogLoader, index: int, pos: int, data: bytes) -> None:
    """MemberRepairError unless ``data`` is entry ``index`` at ``pos``, whole, and the entry this
    store held there (its own header or index unit says the same term and size)."""
    try:
        check_entry_copy(loader.data_file_list, loader.index_file_list, index, pos, data, within="file", holder="this store")
    except EntryCopyRefused as error:
        raise MemberRepairError(error.reason) from None


def _write(path: str, position: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        if os.pwrite(fd, data, position) != len(data):
            raise MemberRepairError(f"{path}: short write of {len(data)} bytes at position {position}")
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_member_from(store_root: str, member: str, fetch: Fetch) -> MemberRepairReport:
    """Rewrite each entry that makes member ``member``'s recovery refuse with a live member's copy
    (see the module); MemberRepairError naming the entry when a copy does not check."""
    directory = dledger_directory(store_root, member)
    lock = StoreLock(os.path.join(store_root, "lock"))
    try:
        config = _config_for(directory, recovery_repair_from_peers=True)
        repaired: list[DamagedRange] = []
        written = 0
        previous = None
        for _ in range(REPAIR_ENTRIES_MAX + 1):
            plan, loader = _plan(directory, config)
            try:
                candidates = damaged_entries(plan)
                if not candidates:
                    return MemberRepairReport(tuple(repaired), written)
                found = _rewrite_one(loader, directory, plan, candidates, fetch, last_round=len(repaired) == REPAIR_ENTRIES_MAX)
                if found.from_offset == previous:
                    raise MemberRepairError(f"{found.describe()}: still damaged after it was rewritten")
                repaired.append(found)
                written += found.to_offset - found.from_offset
                previous = found.from_offset
            finally:
                loader.data_file_list.close()
                loader.index_file_list.close()
        raise AssertionError("unreachable")
    finally:
        lock.release()


def _rewrite_one(loader: EntryLogLoader, directory: str, plan: RecoveryPlan, candidates: list[tuple[int, int]],
                 fetch: Fetch, *, last_round: bool) -> DamagedRange:  # fmt: skip
    """Write the first candidate whose fetched copy checks and differs from this store's bytes
    (the last one's copy is written whatever its bytes: it must check); what was written."""
    for number, (index, pos) in enumerate(candidates):
        where = f"{plan.scan.stop_path or directory}: entry {index} at offset {pos} ({plan.scan.reason})"
        if last_round:
            raise MemberRepairError(f"{where}: more than {REPAIR_ENTRIES_MAX} damaged entries: start the member "
                                    "with recovery_repair_from_peers=true, the leader catches it up")  # fmt: skip
        try:
            data = fetch_entry(fetch, pos)
            check_copy(loader, index, pos, data)
        except MemberRepairError as error:
            if number + 1 < len(candidates):
                continue
            raise MemberRepairError(f"{where}: {error}") from None
        mapped_file = loader.data_file_list.find_mapped_file_by_offset(pos)
        position = pos - mapped_file.file_from_offset
        if number + 1 < len(candidates) and bytes(mapped_file.view()[position : position + len(data)]) == data:
            continue  # this copy is whole here: the damage is in the next candidate
        _write(mapped_file.path, position, data)
        return DamagedRange(mapped_file.path, pos, pos + len(data), plan.scan.reason, index)
    raise AssertionError("unreachable")


def accept_member_loss(store_root: str, member: str) -> MemberLossReport:
    """Open member ``member``'s entry store once accepting the loss (DLedger's recovery: the log
    ends at its last good entry, no catch-up mark), and close it."""
    directory = dledger_directory(store_root, member)
    lock = StoreLock(os.path.join(store_root, "lock"))
    try:
        config = _config_for(directory, recovery_accept_lost_entries=True)
        store = DLedgerMmapFileStore.open(directory, config, data_start_offset=_begin(directory, config))
        try:
            return MemberLossReport(tuple(store.damaged), store.last_index(), store.recovery.lost_entries)
        finally:
            store.close()
    finally:
        lock.release()


def _begin(directory: str, config: DLedgerStoreConfig) -> int:
    """Where the log's first data file starts by its files (0 when there are none)."""
    files = MappedFileQueue.segment_files(os.path.join(directory, DATA_DIRECTORY))
    return files[0][0] - files[0][0] % config.data_file_size if files else 0


__all__ = ["REPAIR_ENTRIES_MAX", "MemberLossReport", "MemberRepairError", "MemberRepairReport", "accept_member_loss",
           "check_copy", "damaged_entries", "fetch_entry", "repair_member_from"]
