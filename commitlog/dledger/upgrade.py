"""Smooth upgrade: a classic commit log continued by DLedger (RocketMQ's dividedCommitlogOffset).

Theory of operation
-------------------
A broker that switches to DLedger keeps its classic commit log and continues in DLedger data files
(``STORE/dledger-<selfId>/data``), whose segments have the commit log's segment size. One offset
space covers both (``DLedgerCommitLog``):

    [commit log min offset, dividedCommitlogOffset)   classic records, read from STORE/commitlog
    [dividedCommitlogOffset, ...)                     DLedger entries; a message's commit log
                                                      offset (PHYSICALOFFSET) is its entry's pos + 48

``open_after_classic`` fixes the divide once: when the DLedger store has data files, it is the
first one's start offset. Otherwise the (recovered) classic log is sealed — a classic blank record
``[int32 remaining][int32 0xCBD43194]`` written at its end unless one is there, synced, the
segment marked full — and the divide is the next segment boundary, where the first DLedger data
file is then created (empty) so that later opens find it. A crash between the two steps is
harmless: the sealed log ends with a blank record, so recovering it again gives the same divide.
No classic segment at all: the divide is -1 and DLedger starts at offset 0.

The switch is an explicit step: ``DLedgerMessageStore.open(..., upgrade_classic=True)`` (``hasvc
node --upgrade-from-classic``) rewrites ``STORE/identity`` to the member's before the seal
(``commitlog.identity``); without it a classic store is refused.

``DividedLog`` answers which part an offset is in and returns the message bytes at an offset
from the right part (DLedger: only committed entries, as ``DLedgerCommitLog.getData``).
"""

from __future__ import annotations

import dataclasses
import enum
import os

from commitlog import record as rec
from commitlog.commit_log import CommitLog, ReadError
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_store import DLedgerMmapFileStore, DLedgerStoreConfig
from commitlog.mapped_file_queue import MappedFileQueue


class LogPart(enum.Enum):
    CLASSIC = "classic"
    DLEDGER = "dledger"


def dledger_directory(store_root: str, self_id: str) -> str:
    """DLedger's default store directory for a member: ``<storeBaseDir>/dledger-<selfId>``."""
    return os.path.join(store_root, f"dledger-{self_id}")


def seal_classic_commit_log(commit_log: CommitLog) -> int:
    """Close a recovered classic commit log with a blank record up to its segment's end (synced);
    return the next segment boundary (dividedCommitlogOffset), or -1 when it has no segment."""
    queue = commit_log.mapped_file_queue
    last = queue.last
    if last is None:
        return -1
    position = last.wrote_position
    remaining = last.file_size - position
    if remaining:
        assert remaining >= rec.BLANK_SIZE, remaining  # a record never comes closer than 8 bytes to the end
        if rec.peek_blank(last.view(), position) != remaining:
            last.ensure_allocated(position + rec.BLANK_SIZE)
            rec.write_blank(last.writable_view(), position, remaining)
        last.advance(remaining)
        queue.commit()
        queue.flush()
    assert last.full and queue.flushed_where == last.file_from_offset + last.file_size, last
    return last.file_from_offset + last.file_size


def open_after_classic(directory: str, config: DLedgerStoreConfig, *, commit_log: CommitLog) -> DividedLog:
    """Open the DLedger store in ``directory`` as the continuation of ``commit_log`` (recovered)."""
    if config.data_file_size != commit_log.segment_size:
        raise ValueError(f"DLedger data files of {config.data_file_size} bytes must be the commit log's "
                         f"segment size {commit_log.segment_size} (RocketMQ sets them equal)")  # fmt: skip
    data_directory = os.path.join(directory, "data")
    existing = MappedFileQueue.segment_files(data_directory)
    if existing:
        store = DLedgerMmapFileStore.open(directory, config)
        divided = store.data_file_list.min_offset
        classic_end = commit_log.mapped_file_queue.max_offset
        if commit_log.mapped_file_queue.mapped_files and classic_end > divided:
            store.abandon()
            raise ValueError(f"the commit log ends at {classic_end}, past the first DLedger data file at {divided}")
        return DividedLog(commit_log, store, divided)
    divided = seal_classic_commit_log(commit_log)
    store = DLedgerMmapFileStore.open(directory, config, data_start_offset=max(divided, 0))
    if divided > 0:
        store.data_file_list.get_last_mapped_file(divided)  # the first DLedger data file fixes the divide
    return DividedLog(commit_log, store, divided)


@dataclasses.dataclass
class DividedLog:
    commit_log: CommitLog
    dledger: DLedgerMmapFileStore
    divided_commitlog_offset: int  # -1: no classic part

    def part_of(self, offset: int) -> LogPart:
        """Which log holds commit log offset ``offset`` (DLedgerCommitLog.getData's test)."""
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        return LogPart.CLASSIC if offset < self.divided_commitlog_offset else LogPart.DLEDGER

    @property
    def max_offset(self) -> int:
        """End of the readable log (DLedgerCommitLog.getMaxOffset): the committed DLedger
        position, else the start of the DLedger part."""
        committed = self.dledger.committed_pos
        if committed > 0:
            return committed
        return max(self.divided_commitlog_offset, 0)

    def message_bytes(self, offset: int) -> bytes:
        """The RocketMQ record whose commit log offset is ``offset``: a classic record, or the
        body of the committed DLedger entry at ``offset - 48``. ReadError when there is none."""
        if self.part_of(offset) is LogPart.CLASSIC:
            record = self.commit_log.get_record(offset)
            return bytes(self.commit_log.read(offset, record.size))
        pos = offset - codec.BODY_OFFSET
        try:
            stored = self.dledger.get_by_pos(pos)
        except (IndexError, ValueError) as error:
            raise ReadError(f"no DLedger message at offset {offset}: {error}") from None
        if pos + stored.size > self.dledger.committed_pos:
            raise ReadError(f"DLedger entry {stored.index} at offset {offset} is not committed")
        return stored.body

    def close(self) -> None:
        self.dledger.close()
