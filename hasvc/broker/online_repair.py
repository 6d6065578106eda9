"""Damage found in a running classic broker's log is rewritten from a healthy peer, while it serves.

Theory of operation
-------------------
The scrub (``commitlog.scrub``) and the read check (``commitlog.read_check``) find damaged records
in a serving broker's log -- a flipped bit in an old segment -- and list them in the store's
``damaged`` (STATUS ``damaged``); reads of them are refused (DAMAGED), never served. A master and
its slaves hold byte-identical logs, so the bytes of a damaged range can be had from a peer:

* **Which peer** (``repair_sources``, pure): a slave asks its master (its client address from the
  master's MASTER_HELLO); a master asks the slaves that have acknowledged past the range (their
  bytes there came from this log before it was damaged), the most advanced first.
* **Checked before written** (``usable_size``): the fetched bytes must be whole valid records
  (size, magic, fields, PHYSICALOFFSET, body and record CRCs) starting at the range's start and
  reaching at least its end; when the range's end is not a record boundary (a damaged size word
  made the scrub guess), a longer fetch finds the first boundary past it. A peer whose bytes do
  not check is passed over (its copy may be damaged too: its own read check refuses them).
* **Written in place** under the store's maintenance lock (never beside retention, a truncation or
  a scrub step): ``pwrite`` and ``fdatasync`` of those bytes over the range (the mapping shares the
  page cache), then the range is walked again in this log; clean, it leaves ``damaged`` and reads
  are served again. Nothing is ever cut: a range no peer can give stays listed and refused, and is
  tried again every ``REPAIR_RETRY_SECONDS``.

Offline, with the broker stopped, ``hasvc store repair DIR --from HOST:PORT`` does the same for a
store that refuses to open.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable

import trio

from commitlog import record as rec
from commitlog.damage import DamagedRange
from commitlog.scan import ScanCode, scan_segment
from commitlog.store import MessageStore
from hasvc.client import ClientError, connect
from hasvc.state.replication import SlaveProgress

LOGGER = logging.getLogger(__name__)

# A range no peer could give (none connected, none holding it, every copy damaged) is tried again
# this often: a slave that reconnects, or a master that comes back, brings the bytes.
REPAIR_RETRY_SECONDS = 5.0
# How far past a damaged range a fetch may read to find the record boundary that ends it (the
# scrub's range ends where a damaged size word said, a guess): one largest record and its headers.
FETCH_PAST_RANGE_MAX = rec.BODY_SIZE_MAX_DEFAULT + 64 * 1024
# One READ asks for at most this many bytes (a client's answer budget is 16 MiB).
FETCH_SIZE_MAX = 4 * 1024 * 1024
# How long one peer may take to answer one READ before the next peer is tried.
FETCH_TIMEOUT_SECONDS = 10.0

# What one peer's attempt may fail with (the next peer is tried); anything else is our bug.
ATTEMPT_ERRORS = (OSError, EOFError, ClientError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError)


class RepairRefused(Exception):
    """The peer's bytes cannot replace the range (not whole valid records reaching its end)."""


def repair_sources(damage: DamagedRange, *, is_slave: bool, master_client_address: str | None,
                   slaves: Iterable[SlaveProgress]) -> list[str]:  # fmt: skip
    """The client addresses to fetch ``damage`` from, in the order to try them."""
    if is_slave:
        return [master_client_address] if master_client_address else []
    holding = [slave for slave in slaves if slave.ack_offset >= damage.to_offset and slave.address]
    holding.sort(key=lambda slave: -slave.ack_offset)
    return [slave.address for slave in holding]


def usable_size(data: bytes, damage: DamagedRange, *, segment_end: int, crc_function) -> int:
    """How many bytes of ``data`` (fetched from ``damage.from_offset``) replace the range: whole
    valid records from its start to the first record boundary at or past its end. RepairRefused
    when there is none in ``data``."""
    wanted = damage.to_offset - damage.from_offset
    if len(data) < wanted:
        raise RepairRefused(f"the peer holds only {len(data)} bytes of the {wanted} in the range")
    end = len(data) if damage.from_offset + len(data) < segment_end else segment_end - damage.from_offset
    result = scan_segment(data, start=0, end=end, file_from_offset=damage.from_offset, crc_function=crc_function)
    if result.code is ScanCode.END_OF_SEGMENT:
        return end
    if result.code in (ScanCode.END_OF_DATA, ScanCode.TRUNCATED) and result.position >= wanted:
        return result.position  # the last whole record's end (TRUNCATED: the fetch ended inside the next)
    if not result.code.clean and result.code is not ScanCode.TRUNCATED:
        raise RepairRefused(f"the peer's bytes fail at offset {damage.from_offset + result.position}: "
                            f"{result.code.name.lower().replace('_', ' ')}")  # fmt: skip
    raise RepairRefused(f"the peer's whole records from {damage.from_offset} end at "
                        f"{damage.from_offset + result.position}, before the range's end {damage.to_offset}")  # fmt: skip


@dataclasses.dataclass
class RepairStatistics:
    repaired_ranges: int = 0
    repaired_bytes: int = 0
    attempts_failed: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class OnlineRepair:
    """Repairs the store's ``damaged`` ranges from the peers ``sources`` names (see the module)."""

    def __init__(self, *, store: MessageStore, maintenance: trio.Lock, sources: Callable[[DamagedRange], list[str]],
                 secret: bytes | None, tls_ca: str | None) -> None:  # fmt: skip
        self.store = store
        self.maintenance = maintenance
        self.sources = sources
        self.secret = secret
        self.tls_ca = tls_ca
        self.statistics = RepairStatistics()
        self._wakeup = trio.Event()

    def wake(self) -> None:
        """Damage was found: look at it now rather than at the next retry."""
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(REPAIR_RETRY_SECONDS):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            for damage in list(self.store.damaged):
                await self.repair(damage)
        raise AssertionError("unreachable")

    async def repair(self, damage: DamagedRange) -> bool:
        """Try every source for ``damage`` once; True when it was rewritten and checks clean."""
        log = self.store.commit_log
        if damage.from_offset < log.min_offset or damage.to_offset > log.max_offset:
            return False  # retention took it, or it lies past what this log holds: nothing to rewrite
        for address in self.sources(damage):
            try:
                data = await self._fetch(address, damage)
                size = usable_size(data, damage, segment_end=self._segment_end(damage), crc_function=self.store.crc_function)
            except (RepairRefused, *ATTEMPT_ERRORS) as error:
                self.statistics.attempts_failed += 1
                LOGGER.warning("repair of %s from %s failed: %s", damage.describe(), address, error)
                continue
            async with self.maintenance:
                clean = await trio.to_thread.run_sync(functools.partial(self._rewrite, damage, data[:size]))
            if clean:
                self.statistics.repaired_ranges += 1
                self.statistics.repaired_bytes += size
                LOGGER.warning("repaired %s from %s: %d bytes rewritten, checked clean", damage.describe(), address, size)
                return True
            LOGGER.error("repair of %s from %s: the range still fails its checks after the rewrite", damage.describe(), address)
        return False

    def _segment_end(self, damage: DamagedRange) -> int:
        mapped_file = self.store.commit_log.mapped_file_queue.find_mapped_file_by_offset(damage.from_offset)
        return mapped_file.file_from_offset + mapped_file.file_size

    async def _fetch(self, address: str, damage: DamagedRange) -> bytes:
        """The peer's bytes from the range's start: the range, and up to FETCH_PAST_RANGE_MAX past
        it (within its segment and this log's end) in case its end is not a record boundary."""
        start = damage.from_offset
        end = min(damage.to_offset + FETCH_PAST_RANGE_MAX, self._segment_end(damage), self.store.commit_log.max_offset)
        pieces: list[bytes] = []
        async with connect(address, self.secret, tls_ca=self.tls_ca) as client:
            offset = start
            while offset < end:
                with trio.fail_after(FETCH_TIMEOUT_SECONDS):
                    piece = await client.read(offset, size_max=min(FETCH_SIZE_MAX, end - offset))
                if not piece:
                    break
                pieces.append(bytes(piece[: end - offset]))
                offset += len(pieces[-1])
                if offset >= damage.to_offset and self._ends_on_boundary(b"".join(pieces), damage):
                    break
        return b"".join(pieces)

    def _ends_on_boundary(self, data: bytes, damage: DamagedRange) -> bool:
        try:
            usable_size(data, damage, segment_end=self._segment_end(damage), crc_function=self.store.crc_function)
        except RepairRefused:
            return False
        return True

    def _rewrite(self, damage: DamagedRange, data: bytes) -> bool:
        """Write ``data`` over the range's start (worker thread, under ``maintenance``), walk it
        again, and drop the range from ``damaged`` when it is clean."""
        mapped_file = self.store.commit_log.mapped_file_queue.find_mapped_file_by_offset(damage.from_offset)
        position = damage.from_offset - mapped_file.file_from_offset
        if position + len(data) > mapped_file.wrote_position:
            return False
        mapped_file.rewrite(position, data)
        view = mapped_file.view()[position : position + len(data)]
        result = scan_segment(view, start=0, end=len(data), file_from_offset=damage.from_offset,
                              crc_function=self.store.crc_function)  # fmt: skip
        if result.code not in (ScanCode.END_OF_DATA, ScanCode.END_OF_SEGMENT) or (
            result.code is ScanCode.END_OF_DATA and result.position != len(data)
        ):
            return False
        self.store.clear_damage(from_offset=damage.from_offset, to_offset=damage.from_offset + len(data))
        return True


__all__ = ["OnlineRepair", "RepairRefused", "repair_sources", "usable_size"]
