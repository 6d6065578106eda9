"""A controller-mode slave's producer table, kept as its log grows (``ProducerFollower``).

Every ``PRODUCER_SCAN_INTERVAL_SECONDS`` the records dispatched since the last look are searched
for producer sequences, so a promotion reads only the last moment's records instead of the last
``producer_table_rebuild_bytes`` (16 MiB: ~0.3-1 s of the failover on this machine). The bytes
are first searched for the tag's literal start, on the loop, a slice at a time
(``tagged_between``): records without producer sequences (the C load generator's, any producer
that sends none) cost that search alone. Only a span that holds the literal is parsed, in a
worker thread. That parse holds the GIL throughout (a regex over the whole span): done for every
span, it stopped the slave's loop -- its reports, so every SYNC_MASTER put -- ~8 ms in every 200
at 64 producers x 1 KiB and 71k puts/s (0.57 us a message of the slave's time; the literal's
search on the loop: 0.25, ``scripts/dev/put_path_time.py --mode controller``). A truncation
below what was searched (the epoch handshake cutting a tail) throws the table away; it is then
rebuilt whole, as a classic promotion does."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import trio

from hasvc.broker.put_service import PRODUCER_TAG, producer_sequences

LOGGER = logging.getLogger(__name__)

# How often a slave searches what it dispatched since the last look for producer sequences: a
# promotion then reads at most about this long's records before it takes writes.
PRODUCER_SCAN_INTERVAL_SECONDS = 0.2
# The bytes a producer sequence's tag starts with (its pattern's literal start, checked below):
# a span without them holds no sequence. Searched for a slice at a time on the loop, a
# checkpoint between slices: ~0.2 ms a MiB here, so no slice holds the slave's reports back
# long (a worker thread would hold the GIL as long, and the loop would wait for it).
PRODUCER_TAG_LITERAL = PRODUCER_TAG.pattern[: PRODUCER_TAG.pattern.index(b"\x01") + 1]
PRODUCER_SCAN_SLICE_BYTES = 1024 * 1024


# no metacharacter before the first \x01: every match of the pattern starts with these bytes
assert re.escape(PRODUCER_TAG_LITERAL) == PRODUCER_TAG_LITERAL and PRODUCER_TAG_LITERAL.endswith(b"\x01"), PRODUCER_TAG_LITERAL


async def tagged_between(store, literal: bytes, start_offset: int, end_offset: int, *,
                         slice_bytes: int = PRODUCER_SCAN_SLICE_BYTES) -> bool:  # fmt: skip
    """Whether ``literal`` lies whole in ``[start_offset, end_offset)`` of ``store``'s log,
    searched ``slice_bytes`` at a time with a checkpoint between (slices overlap by
    ``len(literal) - 1`` bytes: one across a cut is found)."""
    assert slice_bytes >= len(literal) > 0
    offset = start_offset
    while offset < end_offset:
        stop = min(end_offset, offset + slice_bytes)
        if store.find_bytes(literal, offset, stop) >= 0:
            return True
        if stop == end_offset:
            break
        offset = stop - (len(literal) - 1)
        await trio.lowlevel.checkpoint()
    return False


class ProducerFollower:
    """The producer table of ``broker`` (a ``ControlledBroker``) as its log grows while it is a
    slave: searched up to ``scanned_to``, a record boundary (None: not built, or thrown away by
    a truncation below it); ``lock`` keeps one search at a time."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.scanned_to: int | None = None
        self.lock = trio.Lock()
        self.truncations = 0  # cuts of the store so far: a search that saw one meanwhile is dropped

    def truncated(self, offset: int) -> None:
        """The store is being cut at ``offset``: what was searched past it is thrown away."""
        self.truncations += 1
        if self.scanned_to is not None and offset < self.scanned_to:
            self.scanned_to = None

    async def run(self) -> None:
        """On a slave: keep the producer table as its log grows (see the module)."""
        broker = self.broker
        while True:
            if not (broker.role_state.is_slave and broker.role_state.master_ha is not None):
                await broker.wait_role_change()  # a master (or a slave of nobody yet) has nothing to follow
                continue
            await trio.sleep(PRODUCER_SCAN_INTERVAL_SECONDS)
            if broker.role_state.is_slave and broker.role_state.master_ha is not None:
                # the store's maintenance lock: a truncation (which holds it) never cuts what is being read;
                # taken first, as a promotion takes it before the table's lock
                async with broker.store_tasks.maintenance, self.lock:
                    await self.scan(broker.store.reput_from_offset)
        raise AssertionError("unreachable")

    async def scan(self, end: int) -> int:
        """Search the records up to the record boundary ``end`` not searched yet; the sequences
        found (the whole last ``producer_table_rebuild_bytes`` when the table was not built).
        New records without the tag's literal are passed over on the loop (see the module)."""
        store, producers = self.broker.store, self.broker.producers
        start = self.scanned_to
        if start is not None and start >= end:
            return 0
        span = self.broker.config.producer_table_rebuild_bytes
        truncations = self.truncations
        if start is not None and not await tagged_between(store, PRODUCER_TAG_LITERAL, start, end):
            if truncations == self.truncations and start == self.scanned_to:
                self.scanned_to = end  # no sequence there
            return 0
        found = await trio.to_thread.run_sync(lambda: producer_sequences(store, span_bytes=span, start_offset=start, end_offset=end))
        if truncations != self.truncations or start != self.scanned_to:
            return 0  # the log was cut meanwhile: the next look starts over (or from what is left)
        if start is None:
            producers.clear()
            for producer_id, entries in found.items():
                producers.load(producer_id, entries)
        else:
            for producer_id, entries in found.items():
                for sequence, stored in entries:
                    producers.remember(producer_id, sequence, [stored])
        self.scanned_to = end
        return sum(len(entries) for entries in found.values())

    async def rebuild(self, rebuild_whole: Callable[[], Awaitable[None]]) -> None:
        """Before taking writes as master: the table kept as a slave, completed with the records
        since its last look (the log ends at a record boundary now: the promotion cut any partial
        record); rebuilt whole (``rebuild_whole``, the classic way) when none was kept."""
        store = self.broker.store
        async with self.lock:
            if self.scanned_to is None:
                await rebuild_whole()
                self.scanned_to = store.commit_log.max_offset
                return
            started, start = trio.current_time(), self.scanned_to
            found = await self.scan(store.commit_log.max_offset)
            LOGGER.info("producer table: %d producer(s) kept as a slave, %d sequence(s) more from the last %d bytes in %.3f s",
                        len(self.broker.producers), found, store.commit_log.max_offset - start, trio.current_time() - started)  # fmt: skip
