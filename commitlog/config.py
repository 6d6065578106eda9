"""StoreConfig: every limit and interval of the store, with RocketMQ's defaults.

Names put the unit or qualifier last. Where a default differs from RocketMQ the comment says why.
"""

from __future__ import annotations

import dataclasses
import enum

from commitlog import record as rec
from commitlog.consume_queue import UNITS_PER_FILE_DEFAULT


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    # Segment sizes: mappedFileSizeCommitLog (1 GiB), mappedFileSizeConsumeQueue (300 000 units).
    commitlog_segment_size: int = 1024 * 1024 * 1024
    consume_queue_units_per_file: int = UNITS_PER_FILE_DEFAULT
    # Messages: maxMessageSize is a body limit (4 MiB); a batch's bodies share the same limit.
    max_message_size: int = rec.BODY_SIZE_MAX_DEFAULT
    # Body checksum: CRC32C for stores we write (hardware-accelerated); "crc32" reads RocketMQ's.
    crc: str = "crc32c"
    check_crc_on_recover: bool = True
    # RocketMQ's enabledAppendPropCRC (default false there): each record's properties end with a
    # 20-byte tail holding the CRC (the ``crc`` function) of every byte before it, so that a flipped
    # bit in the header (queue id, offsets, sysflag, timestamps, hosts, topic, properties), which
    # the body CRC does not cover, is found wherever records are checked. On here: it costs one
    # CRC over the record instead of over the body, at write and at every check (docs/FORMAT.md).
    append_record_crc: bool = True
    # Every record a read hands out (PULL, READ, MessageStore.pull) is walked and its body CRC
    # checked first, batched (commitlog/read_check.py); off hands out bytes unchecked. On: its cost
    # on the read path is in docs/design/read-check.md.
    check_crc_on_read: bool = True
    # Recovery refuses (rather than cuts) when the first invalid record would make it delete more
    # than this many later segments holding data: a torn tail spans at most the newest segment and
    # its predecessor; more is damage in the middle of the log (DLedger's recovery has this rule).
    recovery_cut_segments_max: int = 1
    store_host: rec.Host = ("127.0.0.1", 10911)
    # Flushing (flushDiskType, flushIntervalCommitLog, flushCommitLogLeastPages, ...Thorough...).
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commitlog_ms: int = 500
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5000
    # Group commit waiters allowed at once (beyond: OS_PAGE_CACHE_BUSY). RocketMQ has no bound;
    # every queue here has one. 10 000 matches DLedger's maxPendingRequestsNum.
    group_commit_waiters_max: int = 10_000
    # Transient store pool (transientStorePoolEnable, transientStorePoolSize, commit intervals).
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    commit_interval_commitlog_ms: int = 200
    commit_commitlog_least_pages: int = 4
    commit_commitlog_thorough_interval_ms: int = 200
    # Consume queues (flushIntervalConsumeQueue, flushConsumeQueueLeastPages, thorough).
    flush_interval_consume_queue_ms: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 60_000
    # Warm-up: the driver keeps this many bytes ahead of the writer faulted in, and creates the
    # next segment before it is needed (RocketMQ: warmMapedFileEnable + AllocateMappedFileService).
    # A first write to a page costs a page fault that is ~10x the copy on this machine.
    warm_ahead_size: int = 16 * 1024 * 1024
    # Disk each segment (commit log, DLedger data and index files) reserves ahead of its writer at
    # a time (posix_fallocate, commitlog/mapped_file.py PREALLOCATE_STEP_SIZE): a segment is sparse
    # until reserved, so a store holding a few messages takes tens of MiB, not a whole 1 GiB
    # segment; the warm-up reserves ahead, so the put path does not. 0 reserves whole segments
    # at creation (RocketMQ's behaviour).
    preallocate_step_size: int = 64 * 1024 * 1024
    warm_interval_ms: int = 2
    # Page cache: once flushed, commit log pages more than this many bytes behind the flushed
    # end are dropped from the page cache (madvise + fadvise DONTNEED); 0 keeps them all, as
    # RocketMQ and Kafka do. On this VM a write into a page the page cache has never held costs
    # ~4x the CPU of one into a page it freed lately (docs/design/put-path.md): a pair under 64 x 32
    # load fell from ~230k to ~125k acked/s within 30 s, and held 200-250k with 256 MiB kept.
    # Reads further back than this come from the disk.
    page_cache_keep_size: int = 0
    # The log's segments fault single pages, not read-ahead folios, ahead of the writer
    # (commitlog/mapped_file.py SMALL_PAGES_MARGIN): for a store that syncs each put (SYNC_FLUSH),
    # whose syncs otherwise write back a whole large folio for a few KiB written into it.
    small_write_pages: bool = False
    # Dispatch reads at most this many commit log bytes per step.
    dispatch_batch_size_max: int = 4 * 1024 * 1024
    # Scrub (commitlog/scrub.py): the broker re-checks its whole log and consume queues in the
    # background at this many bytes a second (0: never). 16 MiB/s re-reads 1 GiB in ~64 s, costs
    # well under 1 % of a core for the CRC walk here, and keeps its disk reads a small share of a
    # disk's bandwidth; each step checks at most scrub_step_bytes (one worker-thread call).
    scrub_bytes_per_second: int = 16 * 1024 * 1024
    scrub_step_bytes: int = 1024 * 1024
    # Disk: refuse appends above this used ratio (DLedger's 0.85; RocketMQ's diskSpaceWarningLevelRatio
    # is 0.90); retention deletes old segments above disk_clean_ratio (diskMaxUsedSpaceRatio 75 %).
    disk_max_used_space_ratio: float = 0.85
    disk_clean_ratio: float = 0.75
    disk_check_interval_ms: int = 1000
    # Retention: fileReservedTime 72 h; at most this many segments deleted per pass.
    file_reserved_time_hours: float = 72.0
    delete_segments_per_pass_max: int = 10

    # Durations are seconds inside; the ``_ms`` fields keep RocketMQ's names at the config edge.
    @property
    def flush_interval_commitlog_seconds(self) -> float:
        return self.flush_interval_commitlog_ms / 1000

    @property
    def flush_commitlog_thorough_interval_seconds(self) -> float:
        return self.flush_commitlog_thorough_interval_ms / 1000

    @property
    def sync_flush_timeout_seconds(self) -> float:
        return self.sync_flush_timeout_ms / 1000

    @property
    def commit_interval_commitlog_seconds(self) -> float:
        return self.commit_interval_commitlog_ms / 1000

    @property
    def flush_consume_queue_thorough_interval_seconds(self) -> float:
        return self.flush_consume_queue_thorough_interval_ms / 1000

    @property
    def warm_interval_seconds(self) -> float:
        return self.warm_interval_ms / 1000

    @property
    def disk_check_interval_seconds(self) -> float:
        return self.disk_check_interval_ms / 1000

    def validate(self) -> StoreConfig:
        if self.page_cache_keep_size < 0:
            raise ValueError(f"page_cache_keep_size must be >= 0, got {self.page_cache_keep_size}")
        if self.preallocate_step_size < 0:
            raise ValueError(f"preallocate_step_size must be >= 0 (0: whole segments), got {self.preallocate_step_size}")
        if self.commitlog_segment_size < 4096:
            raise ValueError(f"commitlog_segment_size must be at least 4096, got {self.commitlog_segment_size}")
        if self.commitlog_segment_size >= 2**31 * 16:
            raise ValueError("commitlog_segment_size too large")
        if self.consume_queue_units_per_file <= 0:
            raise ValueError("consume_queue_units_per_file must be positive")
        if self.max_message_size <= 0:
            raise ValueError("max_message_size must be positive")
        rec.crc_function_by_name(self.crc)
        if self.scrub_bytes_per_second < 0:
            raise ValueError(f"scrub_bytes_per_second must be >= 0 (0: no scrub), got {self.scrub_bytes_per_second}")
        if self.scrub_step_bytes <= 0:
            raise ValueError(f"scrub_step_bytes must be > 0, got {self.scrub_step_bytes}")
        if not 0 < self.disk_max_used_space_ratio <= 1:
            raise ValueError(f"disk_max_used_space_ratio must be in (0, 1], got {self.disk_max_used_space_ratio}")
        if not 0 < self.disk_clean_ratio <= 1:
            raise ValueError(f"disk_clean_ratio must be in (0, 1], got {self.disk_clean_ratio}")
        for name in (
            "flush_interval_commitlog_ms",
            "sync_flush_timeout_ms",
            "commit_interval_commitlog_ms",
            "flush_interval_consume_queue_ms",
            "group_commit_waiters_max",
            "transient_store_pool_size",
            "dispatch_batch_size_max",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        return self

    @property
    def crc_function(self) -> rec.CrcFunction:
        return rec.crc_function_by_name(self.crc)
