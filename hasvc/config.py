"""BrokerConfig: everything a broker process is told, in one frozen dataclass.

Defaults follow RocketMQ (notes §6.1) unless the comment says why not. Options come from the
command line and from a TOML file (``--config FILE``, a ``[broker]`` table with these field
names); the command line wins. ``validate()`` refuses impossible combinations.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import os
import tomllib
from typing import Any

from commitlog.config import FlushDiskType, StoreConfig
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


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    store: str
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    listen: Address = ("127.0.0.1", 10911)
    ha_listen: Address | None = None  # default: listen port + 1 (RocketMQ's haListenPort)
    master_ha: Address | None = None  # slaves: the master's HA address
    flush: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    commitlog_segment_size: int = 1024 * 1024 * 1024
    consume_queue_units_per_file: int = 300_000
    max_message_size: int = 4 * 1024 * 1024
    # Disk and retention (StoreConfig has the reasons for these defaults).
    disk_max_used_space_ratio: float = 0.85
    disk_clean_ratio: float = 0.75
    file_reserved_time_hours: float = 72.0
    # RocketMQ's CleanCommitLogService runs every 10 s; DLedger mode's retention pass does too
    # (the classic broker's period is StoreTasks' CLEAN_INTERVAL_SECONDS).
    dledger_clean_interval_seconds: float = 10.0
    scrub_bytes_per_second: int = 16 * 1024 * 1024  # StoreConfig.scrub_bytes_per_second: the background re-check of log and queues (0: off)
    append_record_crc: bool = True  # StoreConfig.append_record_crc: the record CRC tail (a classic store's; a DLedger entry's CRC covers its record)
    # A DLedger member's recovery (commitlog/dledger/entry_store.py DLedgerStoreConfig has the reasons):
    # recovery_cut_segments_max also bounds the classic log's cut (StoreConfig); damage below what the
    # member knew durable is cut and repaired from the group's leader (recovery_repair_from_peers, a
    # group of more than one), or refused (false), or accepted without a catch-up mark
    # (recovery_accept_lost_entries, DLedger's own behaviour).
    recovery_cut_segments_max: int = 1
    recovery_accept_lost_entries: bool = False
    recovery_repair_from_peers: bool = True
    page_cache_keep_size: int = 0  # StoreConfig.page_cache_keep_size (and a DLedger member's entry files): 0 keeps the page cache whole
    # StoreConfig.preallocate_step_size: disk a segment reserves ahead of its writer (0: whole segments at creation).
    preallocate_step_size: int = 64 * 1024 * 1024
    # StoreConfig.small_write_pages (commitlog/mapped_file.py SMALL_PAGES_MARGIN): "auto" turns it on
    # for a store that syncs each put (--flush sync; a DLedger member's --flush sync), "on"/"off" force it.
    small_write_pages: str = "auto"
    check_crc_on_read: bool = True  # StoreConfig.check_crc_on_read: every record a PULL or READ serves is checked first
    # Replication (MessageStoreConfig): haSendHeartbeatInterval, haHousekeepingInterval,
    # haMaxGapNotInSync, slaveTimeout, inSyncReplicas, syncFromLastFile.
    ha_send_heartbeat_interval_ms: int = 5000
    ha_housekeeping_interval_ms: int = 20_000
    # haTransferBatchSize is 32 KiB in RocketMQ. Each frame costs a fixed ~20 us of Python here,
    # so catch-up at 32 KiB frames would be capped near 1.5 GB/s in theory and far less on a slow
    # VM; 1 MiB frames amortise it. Must not exceed the slave's ha_frame_size_max.
    ha_transfer_batch_size: int = 1024 * 1024
    ha_frame_size_max: int = 4 * 1024 * 1024  # the slave's read buffer in RocketMQ: 4 MiB
    # No RocketMQ name (it reads through its mapping and lets the kernel's readahead guess): when
    # a frame for a slave is not wholly in the page cache, a worker thread asks the kernel to read
    # this far ahead (fadvise WILLNEED) and reads the frame before sendfile, so the event loop
    # never waits for the disk. 2 GiB catch-ups from a dropped cache, alternating, 5 each: the
    # loop's time in block I/O 1.5-2.1 s -> 0, median 626 -> 749 MB/s, and a producer writing to
    # the master meanwhile 3,128 -> 4,721 puts/s (3 each). 0: the frame only.
    ha_transfer_readahead_size: int = 256 * 1024 * 1024
    ha_max_gap_not_in_sync: int = 256 * 1024 * 1024
    slave_timeout_ms: int = 3000
    in_sync_replicas: int = 1  # slaves that must acknowledge a SYNC_MASTER put
    min_in_sync_replicas: int = 0  # 0: off; else fewer in-sync slaves refuse puts unstored
    sync_from_last_file: bool = False  # RocketMQ's behaviour for an empty slave (issues #3388/#3661)
    flush_before_ack: bool = False  # slave: fsync received bytes before acknowledging them
    # A master whose store recovery found damaged waits this long for a slave to repair it from
    # (hasvc/broker/repairing.py) before it refuses to start: a slave's reconnect back-off
    # (ha_reconnect_backoff_max_ms, 5 s) several times over. 0: refuse at once.
    repair_wait_seconds: float = 60.0
    ha_reconnect_backoff_min_ms: int = 1000
    ha_reconnect_backoff_max_ms: int = 5000  # RocketMQ's HAClient waits 5 s before reconnecting
    slave_id: str = ""
    # Client connections: RocketMQ's remoting frameMaxLength is 16 MiB.
    frame_size_max: int = 16 * 1024 * 1024
    requests_in_flight_max: int = 4096  # per client connection; beyond, the connection waits
    connections_max: int = 10_000
    # Answers queued on one client connection and not yet taken by the kernel (its peer reads
    # them too slowly, or not at all): above, the connection is no longer read until they drain
    # to half (Netty's write-buffer watermarks, Kafka's muted channels). Four of the largest READ
    # or PULL answers (4 MiB each): a consumer's pipelined reads are never held back by it.
    client_answer_bytes_max: int = 16 * 1024 * 1024
    # The same on every client connection together (Kafka's queued.max.request.bytes): beyond,
    # READ and PULL are refused with SERVICE_NOT_AVAILABLE (retry) instead of read. 16 connections
    # muted at once; with the store's own memory well under 512 MiB of RSS.
    client_answer_bytes_total_max: int = 256 * 1024 * 1024
    # A connection muted this long on end is closed: its peer is not reading (draining 8 MiB in
    # this time takes 280 KB/s; a reading client, even on a slow link, does better).
    client_muted_timeout_seconds: float = 30.0
    # Idempotent sends (hasvc/state/dedupe.py): sequences remembered per producer, producers remembered,
    # and how much of the log's end a broker becoming master reads to rebuild the table (a retry
    # reaches the new master within the client's failover timeout, so the end of the log holds it).
    producer_sequence_window: int = 4096
    producers_max: int = 65_536
    producer_table_rebuild_bytes: int = 16 * 1024 * 1024
    # Security and observability.
    secret: bytes | None = dataclasses.field(default=None, repr=False)
    insecure: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    metrics_listen: Address | None = None
    # No RocketMQ name: microseconds the event loop polls for ready sockets before it sleeps
    # (hasvc/busy_poll.py says why and what it costs). 0, off, as Linux's net.core.busy_poll.
    busy_poll_us: int = 0

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
        )

    def small_write_pages_for(self, syncs_each_put: bool) -> bool:
        """StoreConfig.small_write_pages for a store that does (or does not) sync each put."""
        return self.small_write_pages == "on" or (self.small_write_pages == "auto" and syncs_each_put)

    def validate(self) -> BrokerConfig:
        if self.small_write_pages not in SMALL_WRITE_PAGES_CHOICES:
            raise ValueError(f"small_write_pages must be one of {', '.join(SMALL_WRITE_PAGES_CHOICES)}, got {self.small_write_pages!r}")
        for name in ("recovery_accept_lost_entries", "recovery_repair_from_peers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not self.dledger_clean_interval_seconds > 0:
            raise ValueError(f"dledger_clean_interval_seconds must be positive, got {self.dledger_clean_interval_seconds}")
        if self.role is BrokerRole.SLAVE and self.master_ha is None:
            raise ValueError("a slave needs --master-ha HOST:PORT")
        if self.ha_transfer_batch_size > self.ha_frame_size_max:
            raise ValueError("ha_transfer_batch_size must not exceed ha_frame_size_max")
        if self.ha_transfer_readahead_size < 0:
            raise ValueError("ha_transfer_readahead_size must be >= 0 (0: off)")
        if not self.repair_wait_seconds >= 0:
            raise ValueError("repair_wait_seconds must be >= 0 (0: a damaged store is refused at once)")
        if not 0 <= self.busy_poll_us <= BUSY_POLL_US_MAX:
            raise ValueError(f"busy_poll_us must be 0..{BUSY_POLL_US_MAX} (0: off)")
        if self.in_sync_replicas < 0 or self.min_in_sync_replicas < 0:
            raise ValueError("in_sync_replicas and min_in_sync_replicas must be >= 0")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        for name in ("ha_send_heartbeat_interval_ms", "ha_housekeeping_interval_ms", "slave_timeout_ms",
                     "ha_transfer_batch_size", "frame_size_max", "requests_in_flight_max", "connections_max",
                     "client_answer_bytes_max", "client_answer_bytes_total_max", "client_muted_timeout_seconds",
                     "producer_sequence_window", "producers_max"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        exposed = [a for a in (self.listen, self.effective_ha_listen, self.metrics_listen) if a and not is_loopback(a[0])]
        if exposed and self.secret is None and not self.insecure:
            raise ValueError(
                f"refusing to listen on {format_address(exposed[0])} without a secret: give --secret-file "
                "(or HASVC_SECRET), or --insecure to accept unauthenticated peers"
            )
        self.store_config().validate()
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
        shown["ha_listen"] = format_address(self.effective_ha_listen)
        return shown


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


_ADDRESS_FIELDS = {"listen", "ha_listen", "master_ha", "metrics_listen"}


def load_toml(path: str) -> dict[str, Any]:
    """Options from a TOML file's ``[broker]`` table (or its top level), converted to field types."""
    import difflib

    with open(path, "rb") as file:
        try:
            data = tomllib.load(file)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: not valid TOML: {error}") from None
    table = data.get("broker", data)
    known = {field.name for field in dataclasses.fields(BrokerConfig)}
    unknown = sorted(set(table) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{path}: unknown option(s) {', '.join(unknown)}{hint}")
    return {name: convert(name, value) for name, value in table.items()}


def convert(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _ADDRESS_FIELDS:
        return parse_address(value) if isinstance(value, str) else tuple(value)
    if name == "role":
        return BrokerRole(value.upper() if value.upper() in BrokerRole.__members__ else {"sync": "SYNC_MASTER", "async": "ASYNC_MASTER"}[value.lower()])
    if name == "flush":
        return FlushDiskType({"sync": "SYNC_FLUSH", "async": "ASYNC_FLUSH"}.get(value.lower(), value.upper()))
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
