"""BrokerConfig: everything a broker process is told, in one frozen dataclass.

Defaults follow RocketMQ (notes §6.1) unless the field's reason says why not. Options come from
the command line and from a TOML file (``--config FILE``, a ``[broker]`` table with these field
names, and the store's own settings by their StoreConfig names: ``store_overrides``); the command
line wins. Each field is a ``setting(default, reason, ...)`` (commitlog/setting.py): the settings
table (hasvc/settings.py, ``hasvc config list``, docs/configuration.md) reads its reason, unit,
range and processes there, and ``validate()`` checks each value against it (``check_settings``)
and the rules between settings (``SETTING_RULES``), then what no single setting says.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import os
import tomllib
from typing import Any, ClassVar

from commitlog.config import FlushDiskType, StoreConfig
from commitlog.setting import Rule, check_settings, setting
from hasvc.busy_poll import BUSY_POLL_US_MAX


class BrokerRole(enum.Enum):
    SYNC_MASTER = "SYNC_MASTER"
    ASYNC_MASTER = "ASYNC_MASTER"
    SLAVE = "SLAVE"


Address = tuple[str, int]

SMALL_WRITE_PAGES_CHOICES = ("auto", "on", "off")


def parse_address(text: str) -> Address:
    host, separator, port = text.rpartition(":")
    if not separator or not port.isdigit():
        raise ValueError(f"address {text!r} is not HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    port_number = int(port)
    if not 0 <= port_number <= 65535:
        raise ValueError(f"port {port_number} out of range")
    return host, port_number


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


CLASSIC = ("master", "slave", "broker")  # classic brokers: a pair's (hasvc master, hasvc slave) and controller mode's (hasvc broker)


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    store: str = setting(reason="The store's directory (--store): commit log, consume queues, checkpoint, abort and lock files. "
                                "Created on the first start.", shown_default="required")  # fmt: skip
    role: BrokerRole = setting(BrokerRole.ASYNC_MASTER, "RocketMQ's brokerRole: SYNC_MASTER answers a put once a slave has it, "
                               "ASYNC_MASTER at once (--role sync|async); a slave is SLAVE. A controller-mode broker (hasvc broker "
                               "--controllers) takes SYNC_MASTER unless given: how it acknowledges once the controllers make "
                               "it master (ASYNC_MASTER: a failover may lose what the new master had not received).",
                               processes=("master", "broker"))  # fmt: skip
    listen: Address = setting(("127.0.0.1", 10911), "The client port (--listen), RocketMQ's listenPort; port 0 picks a free one "
                              "(READY says which).")  # fmt: skip
    ha_listen: Address | None = setting(None, "The HA port a master serves its slaves on, RocketMQ's haListenPort (a slave "
                                        "serves it once promoted).", processes=CLASSIC, shown_default="listen port + 1")  # fmt: skip
    master_ha: Address | None = setting(None, "A slave's master's HA address (--master-ha).", processes=("slave",))
    flush: FlushDiskType = setting(FlushDiskType.ASYNC_FLUSH, "RocketMQ's flushDiskType (--flush sync|async): SYNC_FLUSH "
                                   "answers a put once it is fsynced (group commit), ASYNC_FLUSH flushes every 500 ms.")  # fmt: skip
    commitlog_segment_size: int = setting(1024 * 1024 * 1024, "RocketMQ's mappedFileSizeCommitLog: the size of each commit "
                                          "log segment. In DLedger mode also the size of the Raft data files (DLedger's "
                                          "mappedFileSizeForEntryData), which decides every entry's pos: every member of "
                                          "a group must have the same, and a member refuses a peer with another at its "
                                          "HELLO.")  # fmt: skip
    consume_queue_units_per_file: int = setting(300_000, "RocketMQ's mappedFileSizeConsumeQueue / 20: the 20-byte units of one "
                                                "consume queue file.", unit="units")  # fmt: skip
    max_message_size: int = setting(4 * 1024 * 1024, "RocketMQ's maxMessageSize, a body limit; a batch's bodies share it "
                                    "(MESSAGE_ILLEGAL beyond).")  # fmt: skip
    # The store's (StoreConfig's, through store_config()): disk, retention, checks, recovery.
    disk_max_used_space_ratio: float = setting(0.85, "Above this share of the disk in use, puts are refused DISK_FULL "
                                               "(DLedger's 0.85; RocketMQ's diskSpaceWarningLevelRatio is 0.90).")  # fmt: skip
    disk_clean_ratio: float = setting(0.75, "RocketMQ's diskMaxUsedSpaceRatio: above this share of the disk in use, "
                                      "retention deletes the oldest segments whatever their age.")  # fmt: skip
    file_reserved_time_hours: float = setting(72.0, "RocketMQ's fileReservedTime: segments older than this are deleted by "
                                              "retention.")  # fmt: skip
    dledger_clean_interval_seconds: float = setting(10.0, "How often a DLedger member's retention pass runs: RocketMQ's "
                                                    "CleanCommitLogService runs every 10 s (the classic broker's period is "
                                                    "fixed, StoreTasks' CLEAN_INTERVAL_SECONDS).", processes=("node",), above=0)  # fmt: skip
    raft_send_stalled_timeout_seconds: float = setting(
        30.0, "A DLedger member's connection to a peer whose socket has not taken 1 MiB of a write (the rest of a "
        "write goes in pieces of RAFT_SEND_STALL_PIECE_SIZE: a drained queue of pushes may be many MiB) within this "
        "long is closed and dialled again: the peer accepted and does not read, and would hold its sender and that "
        "write for good. Longer than any election timeout (7 s by default: a member that reads nothing for that long "
        "starts an election itself, so no peer that still follows is cut) and than 1 MiB (a push, "
        "push_batch_size_max) on a slow link (35 KB/s), as ha_send_stalled_timeout_seconds.",
        processes=("node",), above=0)  # fmt: skip
    raft_follower_batch_scheduling: bool = setting(
        True, "A DLedger follower's threads run SCHED_BATCH, a leader's and a candidate's SCHED_OTHER (Linux; switched at "
        "each role change): where members share cores, the follower a push wakes no longer preempts its leader before "
        "the leader has written its push to the other follower (64 writers, three members on two cores: ~1 preemption "
        "a pass without it, 0.2-0.4 with it, and 1-11 % more acked/s in 8 of 8 alternating pairs, median +3 %). False: "
        "the members keep the policy they were started with.",
        processes=("node",))  # fmt: skip
    scrub_bytes_per_second: int = setting(
        16 * 1024 * 1024, "The broker re-checks its whole log and consume queues in the background at this rate (0: off): "
        "16 MiB/s re-reads 1 GiB in ~64 s, costs well under 1 % of a core for the CRC walk, and keeps its disk reads a "
        "small share of a disk's bandwidth. Damage found is logged, listed in STATUS damaged and repaired from a peer's copy "
        "(a DLedger member scrubs every entry of its data files the same way).")  # fmt: skip
    append_record_crc: bool = setting(
        True, "RocketMQ's enabledAppendPropCRC (false there): each record's properties end with a 20-byte tail holding "
        "the CRC of every byte before it, so a flipped bit in the header, which the body CRC does not cover, is found "
        "wherever records are checked. It costs one CRC over the record instead of over the body. Classic stores only "
        "(a DLedger entry's CRC covers its record).", processes=CLASSIC)  # fmt: skip
    # A DLedger member's recovery (commitlog/dledger/entry_store.py DLedgerStoreConfig has the reasons):
    # recovery_cut_segments_max also bounds the classic log's cut (StoreConfig); damage below what the
    # member knew durable is cut and repaired from the group's leader (recovery_repair_from_peers, a
    # group of more than one), or refused (false), or accepted without a catch-up mark
    # (recovery_accept_lost_entries, DLedger's own behaviour).
    recovery_cut_segments_max: int = setting(
        1, "Recovery refuses (rather than cuts) when the first invalid record would make it delete more than this many "
        "later segments holding data: a torn tail spans at most the newest segment and its predecessor; more is damage "
        "in the middle of the log (DLedger's recovery has this rule).", unit="segments")  # fmt: skip
    recovery_accept_lost_entries: bool = setting(
        False, "A DLedger member whose recovery finds damage below what it knew durable accepts the loss with no "
        "catch-up mark and no repair (DLedger's own behaviour; a group of one needs it to start on a damaged store).",
        processes=("node",))  # fmt: skip
    recovery_repair_from_peers: bool = setting(
        True, "A DLedger member of a group of more than one cuts such damage to its last good entry and repairs it from "
        "the leader, with the catch-up mark; false: refused.", processes=("node",))  # fmt: skip
    page_cache_keep_size: int = setting(
        0, "Flushed log pages more than this many bytes behind the flushed end are dropped from the page cache (0 keeps "
        "them all, as RocketMQ and Kafka do). A write into a page the cache never held costs ~4x the CPU of one into a "
        "page it freed lately: a pair under 64 x 32 load fell from ~230k to ~125k acked/s within 30 s, and held "
        "200-250k with 256 MiB kept. Reads further back come from the disk.")  # fmt: skip
    preallocate_step_size: int = setting(
        64 * 1024 * 1024, "Disk each segment (commit log, DLedger data and index files) reserves ahead of its writer at "
        "a time (posix_fallocate): a segment is sparse until reserved, so a store holding a few messages takes tens of "
        "MiB, not a whole 1 GiB segment; the warm-up reserves ahead, so the put path does not. 0 reserves whole "
        "segments at creation (RocketMQ's behaviour).")  # fmt: skip
    # StoreConfig.small_write_pages (commitlog/mapped_file.py SMALL_PAGES_MARGIN), resolved by small_write_pages_for().
    small_write_pages: str = setting(
        "auto", "The log's segments fault single pages, not read-ahead folios, ahead of the writer: for a store that "
        "syncs each put, whose syncs otherwise write back a whole large folio for a few KiB written into it. auto: on "
        "for --flush sync (a classic broker's or a DLedger member's); on/off force it.",
        choices=SMALL_WRITE_PAGES_CHOICES)  # fmt: skip
    check_crc_on_read: bool = setting(
        True, "Every record a PULL or READ serves is walked and its body CRC checked first (batched); a damaged one is "
        "not handed out. Off serves bytes unchecked (the client library still checks what it decodes).")  # fmt: skip
    # Replication (MessageStoreConfig): haSendHeartbeatInterval, haHousekeepingInterval,
    # haMaxGapNotInSync, slaveTimeout, inSyncReplicas, syncFromLastFile.
    ha_send_heartbeat_interval_ms: int = setting(5000, "RocketMQ's haSendHeartbeatInterval: a slave reports its offset at "
                                                 "least this often.", processes=CLASSIC, above=0)  # fmt: skip
    ha_housekeeping_interval_ms: int = setting(20_000, "RocketMQ's haHousekeepingInterval: a replication connection silent "
                                               "this long is closed.", processes=CLASSIC, above=0)  # fmt: skip
    ha_transfer_batch_size: int = setting(
        2 * 1024 * 1024, "RocketMQ's haTransferBatchSize is 32 KiB. Each frame costs a fixed ~20 us of Python here, so "
        "catch-up at 32 KiB frames would be capped near 1.5 GB/s in theory and far less on a slow VM. 2 MiB: what one "
        "pass of puts appends from a client's 1 MiB read (its records a little larger than the requests) goes to a "
        "caught-up slave as one frame, where at 1 MiB it went as two (64 writers x 32 messages: 445k -> 479k acked/s, "
        "the slave's CPU a request 35.7 -> 30.7 us). Must not exceed the slave's ha_frame_size_max.",
        processes=CLASSIC, above=0)  # fmt: skip
    ha_send_stalled_timeout_seconds: float = setting(
        30.0, "A slave connection whose socket has not taken the rest of a frame (at most ha_transfer_batch_size) "
        "within this long is closed: the slave reports but does not read (its reports alone keep "
        "ha_housekeeping_interval_ms from closing it). Until then the master holds one frame for it and the kernel's "
        "buffer the rest. 30 s as client_muted_timeout_seconds: 2 MiB in it needs 70 KB/s.",
        processes=CLASSIC, above=0)  # fmt: skip
    ha_frame_size_max: int = setting(4 * 1024 * 1024, "The largest replication frame a slave reads (the slave's read "
                                     "buffer in RocketMQ: 4 MiB).", processes=CLASSIC)  # fmt: skip
    ha_transfer_readahead_size: int = setting(
        256 * 1024 * 1024, "No RocketMQ name: when a frame for a slave is not wholly in the page cache, a worker thread "
        "asks the kernel to read this far ahead (fadvise WILLNEED) and reads the frame before sendfile, so the event loop "
        "never waits for the disk. 2 GiB catch-ups from a dropped cache: the loop's time in block I/O 1.5-2.1 s -> 0, "
        "median 626 -> 749 MB/s, and a producer writing to the master meanwhile 3,128 -> 4,721 puts/s. 0: the frame "
        "only.", processes=CLASSIC, minimum=0)  # fmt: skip
    ha_max_gap_not_in_sync: int = setting(256 * 1024 * 1024, "RocketMQ's haMaxGapNotInSync: a slave further behind than "
                                          "this is not in sync (min_in_sync_replicas counts the others).",
                                          unit="bytes", processes=CLASSIC)  # fmt: skip
    slave_timeout_ms: int = setting(3000, "RocketMQ's slaveTimeout: a SYNC_MASTER put (a DLedger put: its quorum) not "
                                    "acknowledged within this is answered FLUSH_SLAVE_TIMEOUT.", above=0)  # fmt: skip
    in_sync_replicas: int = setting(1, "Slaves that must acknowledge a SYNC_MASTER put (RocketMQ 4.x: one slave). A "
                                    "controller-mode broker waits for its SyncStateSet instead.", unit="slaves", minimum=0,
                                    processes=("master", "slave", "node"))  # fmt: skip
    min_in_sync_replicas: int = setting(0, "RocketMQ's minInSyncReplicas: with fewer slaves in sync, puts are refused "
                                        "IN_SYNC_REPLICAS_NOT_ENOUGH, nothing stored (0: off). A controller-mode broker's setting of this name is "
                                        "controller mode's (the SyncStateSet's size, the master counted).", unit="slaves",
                                        minimum=0, processes=("master", "slave", "node"))  # fmt: skip
    sync_from_last_file: bool = setting(False, "RocketMQ's syncFromLastFile: an empty slave starts from the master's last "
                                        "segment instead of its oldest (off: an empty slave copies the master's whole "
                                        "retained log).", processes=CLASSIC)  # fmt: skip
    flush_before_ack: bool = setting(False, "A slave fsyncs received bytes before acknowledging them: a SYNC_MASTER put is "
                                     "then on two disks before PUT_OK.", processes=CLASSIC)  # fmt: skip
    repair_wait_seconds: float = setting(
        60.0, "A master whose store recovery found damage waits this long on its HA port for a slave to repair it from "
        "before it refuses to start: a slave's reconnect back-off (ha_reconnect_backoff_max_ms, 5 s) several times "
        "over. 0: refuse at once.", processes=("master", "broker"), minimum=0)  # fmt: skip
    ha_reconnect_backoff_min_ms: int = setting(1000, "A slave's first wait before it reconnects to its master; doubled up "
                                               "to ha_reconnect_backoff_max_ms.", processes=CLASSIC)  # fmt: skip
    ha_reconnect_backoff_max_ms: int = setting(5000, "RocketMQ's HAClient waits 5 s before reconnecting.",
                                               processes=CLASSIC)  # fmt: skip
    slave_id: str = setting("", "A slave's name in its master's STATUS (empty: its address).", processes=CLASSIC)
    # Client connections: RocketMQ's remoting frameMaxLength is 16 MiB.
    frame_size_max: int = setting(16 * 1024 * 1024, "The largest client request frame: RocketMQ's remoting frameMaxLength.", above=0)
    requests_in_flight_max: int = setting(4096, "Requests one client connection may have unanswered; beyond, the "
                                          "connection is not read until answers go out.", unit="requests", above=0)  # fmt: skip
    connections_max: int = setting(10_000, "Client connections past the preface; beyond, a new client is refused (one log "
                                   "line). Connections in their preface have their own limit.", unit="connections", above=0)  # fmt: skip
    client_answer_bytes_max: int = setting(
        16 * 1024 * 1024, "Answers queued on one client connection and not yet taken by the kernel (its peer reads them "
        "too slowly, or not at all): above, the connection is no longer read until they drain to half (Netty's "
        "write-buffer watermarks, Kafka's muted channels). Four of the largest READ or PULL answers (4 MiB each): a "
        "consumer's pipelined reads are never held back by it.", above=0)  # fmt: skip
    client_answer_bytes_total_max: int = setting(
        256 * 1024 * 1024, "The same on every client connection together (Kafka's queued.max.request.bytes): beyond, READ "
        "and PULL are refused with SERVICE_NOT_AVAILABLE (retry) instead of read. 16 connections muted at once; with the "
        "store's own memory well under 512 MiB of RSS.", above=0)  # fmt: skip
    client_muted_timeout_seconds: float = setting(
        30.0, "A connection muted this long on end is closed: its peer is not reading (draining 8 MiB in this time takes "
        "280 KB/s; a reading client, even on a slow link, does better).", above=0)  # fmt: skip
    # Idempotent sends (hasvc/state/dedupe.py): sequences remembered per producer, producers remembered,
    # and how much of the log's end a broker becoming master reads to rebuild the table (a retry
    # reaches the new master within the client's failover timeout, so the end of the log holds it).
    producer_sequence_window: int = setting(4096, "Idempotent sends: sequences remembered per producer, so that a retry is "
                                            "recognised (Kafka keeps 5 batches per producer).", unit="sequences", above=0)  # fmt: skip
    producers_max: int = setting(65_536, "Idempotent sends: producers remembered (the least recently seen forgotten "
                                 "first).", unit="producers", above=0)  # fmt: skip
    producer_table_rebuild_bytes: int = setting(
        16 * 1024 * 1024, "How much of the log's end a broker becoming master reads to rebuild its producer table: a retry "
        "reaches the new master within the client's failover timeout, so the end of the log holds it.")  # fmt: skip
    # Security and observability.
    secret: bytes | None = setting(None, "The cluster secret, the HMAC key every connection's preface proves (better "
                                   "--secret-file or HASVC_SECRET than in a file of settings).", repr=False)  # fmt: skip
    insecure: bool = setting(False, "Listen off loopback without a secret (anyone who reaches a port then speaks to "
                             "it).")  # fmt: skip
    tls_cert: str | None = setting(None, "PEM certificate (chain): every port of the process serves TLS (with tls_key); "
                                   "checked at start.", unit="file")  # fmt: skip
    tls_key: str | None = setting(None, "PEM private key of tls_cert.", unit="file")
    tls_ca: str | None = setting(None, "A CA: a slave verifies its master's certificate with it, and DLedger members each "
                                 "other's (mutual TLS on the Raft port).", unit="file")  # fmt: skip
    metrics_listen: Address | None = setting(None, "Serve Prometheus metrics on HOST:PORT (--metrics-listen): STATUS's "
                                             "numbers, and a DLedger member's per-peer gauges.")  # fmt: skip
    busy_poll_us: int = setting(
        0, "No RocketMQ name (Linux's net.core.busy_poll): the event loop polls this long for ready sockets before it "
        "sleeps. Waking a halted CPU is most of a lone put's latency on a VM: one writer's p50 ~270 -> ~150 us at 200 us. "
        "It spends CPU: with the cores saturated throughput fell by up to half, so use it where cores are spare. 0: "
        "off.", minimum=0, maximum=BUSY_POLL_US_MAX)  # fmt: skip
    # The store's settings BrokerConfig has no field for (StoreConfig's, by name: flush intervals,
    # warm-up, dispatch and retention steps), as given with --set or in TOML; store_config() applies them.
    store_overrides: tuple[tuple[str, Any], ...] = setting((), internal="StoreConfig's own settings, each in the table")

    # Rules between settings, stated once: validate() checks them, the table lists them.
    SETTING_RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(("ha_transfer_batch_size", "ha_frame_size_max"), lambda batch, frame: batch <= frame,
             "must not exceed {1}: a slave refuses a frame larger than it reads"),
        Rule(("tls_cert", "tls_key"), lambda cert, key: (cert is None) == (key is None), "goes with {1}: give both or neither"),
    )

    # Durations are seconds inside; the ``_ms`` fields keep RocketMQ's names at the TOML/CLI edge.
    @property
    def ha_send_heartbeat_interval_seconds(self) -> float:
        return self.ha_send_heartbeat_interval_ms / 1000

    @property
    def ha_housekeeping_interval_seconds(self) -> float:
        return self.ha_housekeeping_interval_ms / 1000

    @property
    def slave_timeout_seconds(self) -> float:
        return self.slave_timeout_ms / 1000

    @property
    def ha_reconnect_backoff_min_seconds(self) -> float:
        return self.ha_reconnect_backoff_min_ms / 1000

    @property
    def ha_reconnect_backoff_max_seconds(self) -> float:
        return self.ha_reconnect_backoff_max_ms / 1000

    @property
    def effective_ha_listen(self) -> Address:
        if self.ha_listen is not None:
            return self.ha_listen
        host, port = self.listen
        return host, (port + 1 if port else 0)

    @property
    def is_master(self) -> bool:
        return self.role is not BrokerRole.SLAVE

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            commitlog_segment_size=self.commitlog_segment_size,
            consume_queue_units_per_file=self.consume_queue_units_per_file,
            max_message_size=self.max_message_size,
            disk_max_used_space_ratio=self.disk_max_used_space_ratio,
            disk_clean_ratio=self.disk_clean_ratio,
            file_reserved_time_hours=self.file_reserved_time_hours,
            flush_disk_type=self.flush,
            page_cache_keep_size=self.page_cache_keep_size,
            preallocate_step_size=self.preallocate_step_size,
            scrub_bytes_per_second=self.scrub_bytes_per_second,
            append_record_crc=self.append_record_crc,
            small_write_pages=self.small_write_pages_for(self.flush is FlushDiskType.SYNC_FLUSH),
            recovery_cut_segments_max=self.recovery_cut_segments_max,
            check_crc_on_read=self.check_crc_on_read,
            store_host=self.listen if _is_ip(self.listen[0]) else ("127.0.0.1", self.listen[1]),
            **dict(self.store_overrides),
        )

    def small_write_pages_for(self, syncs_each_put: bool) -> bool:
        """StoreConfig.small_write_pages for a store that does (or does not) sync each put."""
        return self.small_write_pages == "on" or (self.small_write_pages == "auto" and syncs_each_put)

    def validate(self) -> BrokerConfig:
        """Each setting's type, range and rules (check_settings: SettingError naming it), the store's
        (StoreConfig's own), then what no single setting says."""
        check_settings(self, self.SETTING_RULES)
        unknown = [name for name, _ in self.store_overrides if name not in store_setting_names()]
        if unknown:
            raise ValueError(f"{unknown[0]} is not a setting of the store")
        self.store_config().validate()
        if self.role is BrokerRole.SLAVE and self.master_ha is None:
            raise ValueError("a slave needs --master-ha HOST:PORT")
        exposed = [a for a in (self.listen, self.effective_ha_listen, self.metrics_listen) if a and not is_loopback(a[0])]
        if exposed and self.secret is None and not self.insecure:
            raise ValueError(
                f"refusing to listen on {format_address(exposed[0])} without a secret: give --secret-file "
                "(or HASVC_SECRET), or --insecure to accept unauthenticated peers"
            )
        return self

    def describe(self) -> dict[str, Any]:
        """The effective configuration, printable (the secret is shown as set or not)."""
        shown = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "secret":
                value = "set" if value else None
            elif isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
                value = format_address(value)
            shown[field.name] = value
        del shown["store_overrides"]
        shown.update(self.store_overrides)
        shown["ha_listen"] = format_address(self.effective_ha_listen)
        return shown


def store_setting_names() -> frozenset[str]:
    """StoreConfig's settings of its own: given by name (--set, TOML) as BrokerConfig.store_overrides."""
    broker = {field.name for field in dataclasses.fields(BrokerConfig)}
    return frozenset(field.name for field in dataclasses.fields(StoreConfig)
                     if "internal" not in field.metadata and field.name not in broker)  # fmt: skip


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


_ADDRESS_FIELDS = {"listen", "ha_listen", "master_ha", "metrics_listen"}


def load_toml(path: str) -> dict[str, Any]:
    """Options from a TOML file's ``[broker]`` table (or its top level), converted to field types."""
    return load_toml_with_origins(path)[0]


def load_toml_with_origins(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``load_toml``'s options, and where each came from ('FILE key [broker].NAME'); ValueError,
    one line naming the file, for a file that is not TOML, a table other than [broker], an unknown
    name (with the nearest) or a value that cannot be converted (an address, a role)."""
    import difflib

    with open(path, "rb") as file:
        try:
            data = tomllib.load(file)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: not valid TOML: {error}") from None
    prefix = "[broker]." if "broker" in data else ""
    table = data.get("broker", data)
    tables = sorted(name for name in data if name != "broker" and (prefix or isinstance(data[name], dict)))
    if tables or not isinstance(table, dict):
        name = tables[0] if tables else "broker"
        close = difflib.get_close_matches(name, ["broker"], n=1)
        hint = " (did you mean [broker]?)" if close and name != "broker" else "; settings go in a [broker] table"
        raise ValueError(f"{path}: unknown table or key [{name}] outside [broker]{hint}" if prefix or tables
                         else f"{path}: [broker] must be a table{hint}")  # fmt: skip
    known = settable_names()
    unknown = sorted(set(table) - known)
    if unknown:
        from hasvc import settings

        elsewhere = settings.by_name().get(unknown[0])
        if elsewhere is not None:  # a Raft setting, a proxy's: not a broker's [broker] table
            raise ValueError(f"{path}: {unknown[0]} (key {prefix}{unknown[0]}) is not a broker setting: give it with "
                             f"--set to hasvc {' or hasvc '.join(elsewhere.processes)}")  # fmt: skip
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else " ('hasvc config list' shows every setting)"
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}{hint}")
    values, origins = {}, {}
    for name, value in table.items():
        origins[name] = f"{path} key {prefix}{name}"
        try:
            values[name] = convert(name, value)
        except (KeyError, ValueError, TypeError, AttributeError) as error:
            raise ValueError(f"{name}={value!r} (from {origins[name]}): {str(error).strip(chr(39))}") from None
    return values, origins


def settable_names() -> frozenset[str]:
    """The names a broker process takes (--set, TOML): BrokerConfig's fields and the store's own."""
    broker = {field.name for field in dataclasses.fields(BrokerConfig) if "internal" not in field.metadata}
    return frozenset(broker) | store_setting_names()


def convert(name: str, value: Any) -> Any:
    """A value given by name (TOML, --set after its type) as the field holds it: an address from
    HOST:PORT, a role or flush from its word; ValueError saying what was expected otherwise."""
    if value is None:
        return None
    if name in _ADDRESS_FIELDS:
        if not isinstance(value, str):
            raise ValueError('expected "HOST:PORT" text')
        return parse_address(value)
    if name in ("role", "flush") and not isinstance(value, str):
        raise ValueError("expected sync or async")
    if name == "role":
        roles = {"sync": "SYNC_MASTER", "async": "ASYNC_MASTER", **{role: role for role in BrokerRole.__members__}}
        if value.lower() not in roles and value.upper() not in roles:
            raise ValueError("expected sync or async")
        return BrokerRole(roles.get(value.lower(), roles.get(value.upper())))
    if name == "flush":
        flushes = {"sync": "SYNC_FLUSH", "async": "ASYNC_FLUSH", "sync_flush": "SYNC_FLUSH", "async_flush": "ASYNC_FLUSH"}
        if value.lower() not in flushes:
            raise ValueError("expected sync or async")
        return FlushDiskType(flushes[value.lower()])
    if name == "secret":
        return value.encode() if isinstance(value, str) else value
    return value


def read_secret(secret_file: str | None) -> bytes | None:
    """The cluster secret, the HMAC key of the preface (docs/PROTOCOL.md §1): the file's bytes,
    else HASVC_SECRET's (as the environment holds them), else None; in both cases with leading
    and trailing ASCII whitespace (space, \\t, \\n, \\v, \\f, \\r) removed, nothing decoded.
    Nothing left (an empty file, a HASVC_SECRET of blanks) exits the command with a message:
    an empty key would look like a secret and prove nothing. An unset or empty HASVC_SECRET
    means no secret."""
    if secret_file:
        with open(secret_file, "rb") as file:
            secret = file.read().strip()
        if not secret:
            raise SystemExit(f"hasvc: the secret file {secret_file} is empty (or only whitespace); refusing to start")
        return secret
    value = os.environb.get(b"HASVC_SECRET")
    if not value:
        return None
    if not value.strip():
        raise SystemExit("hasvc: HASVC_SECRET is only whitespace; refusing to start")
    return value.strip()
