"""StoreConfig: every limit and interval of the store, with RocketMQ's defaults.

Names put the unit or qualifier last. Where a default differs from RocketMQ the comment says why.
"""

from __future__ import annotations

import dataclasses
import enum

from commitlog import record as rec
from commitlog.consume_queue import UNITS_PER_FILE_DEFAULT
from commitlog.setting import check_settings, setting


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


# The processes that open a store with these settings (hasvc/settings.py PROCESSES): every
# broker, or a classic one only (a DLedger member's entries have their own flush and checks).
_ALL = ("master", "slave", "node", "broker")
_CLASSIC = ("master", "slave", "broker")
_POOL = "the transient store pool is committed only by commitlog/services.py's threaded driver, which no broker runs"


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """The store's settings. Those a broker has a field of its own for (BrokerConfig's of the same
    name, set with --set or TOML) are copied from it by ``BrokerConfig.store_config()``; the others
    are set by name (``--set``, TOML) wherever a store is opened, or are ``internal`` (not a setting
    of their own: set from another one, or read by no broker). ``check_settings()`` checks each
    range here, once, for every user of the store."""

    # Segment sizes: mappedFileSizeCommitLog (1 GiB), mappedFileSizeConsumeQueue (300 000 units).
    commitlog_segment_size: int = setting(1024 * 1024 * 1024, "BrokerConfig.commitlog_segment_size",
                                          minimum=4096, maximum=2**35 - 1)  # fmt: skip
    consume_queue_units_per_file: int = setting(UNITS_PER_FILE_DEFAULT, "BrokerConfig.consume_queue_units_per_file", above=0)
    # Messages: maxMessageSize is a body limit (4 MiB); a batch's bodies share the same limit.
    max_message_size: int = setting(rec.BODY_SIZE_MAX_DEFAULT, "BrokerConfig.max_message_size", above=0)
    crc: str = setting("crc32c", "The body checksum of the records a store writes: crc32c (hardware-accelerated) for "
                       "stores we write; crc32 reads and writes RocketMQ's. Every member of a pair or group must have "
                       "the same.", choices=tuple(sorted(rec.CRC_FUNCTIONS)), processes=_ALL)  # fmt: skip
    check_crc_on_recover: bool = setting(True, "Recovery checks each record's body CRC while it walks the log after a "
                                         "crash (RocketMQ's checkCRCOnRecover); off finds only torn headers.",
                                         processes=_CLASSIC)  # fmt: skip
    # RocketMQ's enabledAppendPropCRC (default false there): each record's properties end with a
    # 20-byte tail holding the CRC of every byte before it (docs/FORMAT.md).
    append_record_crc: bool = setting(True, "BrokerConfig.append_record_crc")
    check_crc_on_read: bool = setting(True, "BrokerConfig.check_crc_on_read")
    recovery_cut_segments_max: int = setting(1, "BrokerConfig.recovery_cut_segments_max", minimum=0)
    store_host: rec.Host = setting(("127.0.0.1", 10911), internal="set from the broker's listen address")
    # Flushing (flushDiskType, flushIntervalCommitLog, flushCommitLogLeastPages, ...Thorough...).
    flush_disk_type: FlushDiskType = setting(FlushDiskType.ASYNC_FLUSH, internal="set from the broker's flush")
    flush_interval_commitlog_ms: int = setting(500, "RocketMQ's flushIntervalCommitLog: an ASYNC_FLUSH broker flushes its "
                                               "log this often.", processes=_CLASSIC, above=0)  # fmt: skip
    flush_commitlog_least_pages: int = setting(4, "RocketMQ's flushCommitLogLeastPages: an ASYNC_FLUSH flush waits for this "
                                               "many dirty 4 KiB pages (0: flushes whatever is dirty).", unit="pages",
                                               processes=_CLASSIC, minimum=0)  # fmt: skip
    flush_commitlog_thorough_interval_ms: int = setting(10_000, "RocketMQ's flushCommitLogThoroughInterval: at least this "
                                                        "often a flush takes every dirty page, however few.",
                                                        processes=_CLASSIC, above=0)  # fmt: skip
    sync_flush_timeout_ms: int = setting(5000, "RocketMQ's syncFlushTimeout: a SYNC_FLUSH put not on disk within this is "
                                         "answered FLUSH_DISK_TIMEOUT.", processes=_CLASSIC, above=0)  # fmt: skip
    group_commit_waiters_max: int = setting(10_000, "Puts waiting for a flush or a slave's ack at once (beyond: "
                                            "OS_PAGE_CACHE_BUSY). RocketMQ has no bound; every queue here has one. "
                                            "10 000 matches DLedger's maxPendingRequestsNum.", unit="puts",
                                            processes=_CLASSIC, above=0)  # fmt: skip
    # Transient store pool (transientStorePoolEnable, transientStorePoolSize, commit intervals).
    transient_store_pool_enable: bool = setting(False, internal=_POOL)
    transient_store_pool_size: int = setting(5, internal=_POOL, above=0)
    commit_interval_commitlog_ms: int = setting(200, internal=_POOL, above=0)
    commit_commitlog_least_pages: int = setting(4, internal=_POOL, minimum=0)
    commit_commitlog_thorough_interval_ms: int = setting(200, internal=_POOL, above=0)
    # Consume queues (flushIntervalConsumeQueue, flushConsumeQueueLeastPages, thorough): a broker
    # flushes them on its housekeeping period (hasvc/broker/store_tasks.py).
    flush_interval_consume_queue_ms: int = setting(1000, internal="read by commitlog/services.py only: a broker flushes "
                                                   "consume queues on its housekeeping period", above=0)  # fmt: skip
    flush_consume_queue_least_pages: int = setting(2, "RocketMQ's flushConsumeQueueLeastPages: a consume-queue flush waits "
                                                   "for this many dirty 4 KiB pages (0: flushes whatever is dirty).",
                                                   unit="pages", processes=_CLASSIC, minimum=0)  # fmt: skip
    flush_consume_queue_thorough_interval_ms: int = setting(60_000, internal="read by commitlog/services.py only", above=0)
    warm_ahead_size: int = setting(
        16 * 1024 * 1024, "The log's writer keeps this many bytes ahead of it faulted in, and the next segment is created "
        "before it is needed (RocketMQ's warmMapedFileEnable and AllocateMappedFileService): a first write to a page "
        "costs a page fault ~10x the copy (0: no warm-up).", processes=_ALL, minimum=0)  # fmt: skip
    preallocate_step_size: int = setting(64 * 1024 * 1024, "BrokerConfig.preallocate_step_size", minimum=0)
    warm_interval_ms: int = setting(2, internal="read by commitlog/services.py only (a broker's is WARM_INTERVAL_SECONDS)",
                                    above=0)  # fmt: skip
    page_cache_keep_size: int = setting(0, "BrokerConfig.page_cache_keep_size", minimum=0)
    # commitlog/mapped_file.py SMALL_PAGES_MARGIN
    small_write_pages: bool = setting(False, internal="set from the broker's small_write_pages (auto|on|off)")
    dispatch_batch_size_max: int = setting(4 * 1024 * 1024, "The dispatcher (consume queues) reads at most this many log "
                                           "bytes a step: one step's time off the event loop stays short.",
                                           processes=_ALL, above=0)  # fmt: skip
    # Scrub (commitlog/scrub.py): see BrokerConfig.scrub_bytes_per_second.
    scrub_bytes_per_second: int = setting(16 * 1024 * 1024, "BrokerConfig.scrub_bytes_per_second", minimum=0)
    scrub_step_bytes: int = setting(1024 * 1024, "The background scrub checks at most this many bytes a step (one "
                                    "worker-thread call): a step never holds the store's maintenance lock long.",
                                    processes=_CLASSIC, above=0)  # fmt: skip
    disk_max_used_space_ratio: float = setting(0.85, "BrokerConfig.disk_max_used_space_ratio", above=0, maximum=1)
    disk_clean_ratio: float = setting(0.75, "BrokerConfig.disk_clean_ratio", above=0, maximum=1)
    disk_check_interval_ms: int = setting(1000, "How often the share of the disk in use is measured for "
                                          "disk_max_used_space_ratio (a put between two checks is not refused).",
                                          processes=_ALL, above=0)  # fmt: skip
    # Retention: fileReservedTime 72 h; at most this many segments deleted per pass.
    file_reserved_time_hours: float = setting(72.0, "BrokerConfig.file_reserved_time_hours", minimum=0)
    delete_segments_per_pass_max: int = setting(10, "RocketMQ's deleteFilesBatchMax: one retention pass deletes at most "
                                                "this many segments, so that it never holds the disk long.",
                                                unit="segments", processes=_ALL, above=0)  # fmt: skip

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
        check_settings(self)
        return self

    @property
    def crc_function(self) -> rec.CrcFunction:
        return rec.crc_function_by_name(self.crc)
