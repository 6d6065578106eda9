"""A Raft member's store re-checked in the background and its damaged entries repaired from the
other members (``hasvc.broker.raft.broker.RaftBroker`` runs it): the scrub
(``commitlog.scrub.EntryScrubber``) walks every data file at ``scrub_bytes_per_second``; a damaged
entry it or a read finds is fetched from a member that holds it committed (READ on its client
port: the members' data files are byte-identical) and rewritten in place."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from commitlog.dledger.entry_codec import BODY_OFFSET as ENTRY_HEADER_SIZE
from commitlog.dledger.entry_codec import ENTRY_SIZE_MAX
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.mapped_file import StoreError
from commitlog.scrub import EntryScrubber
from hasvc import transport
from hasvc.broker.raft.group import GroupConfig
from hasvc.broker.store_tasks import SCRUB_PASS_PAUSE_SECONDS, SCRUB_STEP_PAUSE_MIN_SECONDS
from hasvc.client import ClientError, connect
from hasvc.config import BrokerConfig
from hasvc.protocol import wire

if TYPE_CHECKING:
    from hasvc.broker.raft.driver import RaftDriver

LOGGER = logging.getLogger(__name__)

# The scrub walks at most this many entry bytes a step, on the trio thread (native checks of the
# entries and of their messages' CRCs, a comparison of the units: well under a millisecond here).
RAFT_SCRUB_STEP_BYTES = 256 * 1024
# Fetching one damaged entry from one member for its repair (connect, two READs or a few for the
# largest entry): longer than any answer of a member that serves, shorter than a pass's pause.
REPAIR_FETCH_TIMEOUT_SECONDS = 10.0
# A damaged entry no member gave a copy of is tried again this many times a pass, this long apart
# (a member that just started learns its peers' client ports from their HELLOs within a second or
# two), then passed over until the next pass.
REPAIR_ATTEMPTS_PER_PASS = 3
REPAIR_RETRY_SECONDS = 1.0
# What fetching from one member may fail with (the next member is tried); anything else is our bug.
REPAIR_FETCH_ERRORS = (transport.AuthenticationError, OSError, EOFError, wire.ProtocolError, trio.TooSlowError,
                       trio.BrokenResourceError, trio.ClosedResourceError, ClientError)  # fmt: skip


class EntryRepair:
    """The scrub and repair task of one member (``run``); ``scrubber`` once it runs (STATUS)."""

    def __init__(self, *, config: BrokerConfig, group: GroupConfig, store: DLedgerMessageStore, driver: RaftDriver,
                 maintenance: trio.Lock) -> None:  # fmt: skip
        self._config = config
        self._group = group
        self._store = store
        self._driver = driver  # the peers' client ports, learnt from their HELLOs
        # Held for each step and each rewrite, as retention holds it (no reset or deletion under them).
        self._maintenance = maintenance
        self.scrubber: EntryScrubber | None = None  # the store's background check, once running

    async def run(self) -> None:
        """The member's store re-checked in the background (``commitlog.scrub.EntryScrubber``),
        ``scrub_bytes_per_second`` (0: off): every data file, every entry whole (header against
        its index unit, bodyCrc, the message's CRCs) and its consume-queue units (rewritten from
        the record where they differ). A damaged entry -- found by the scrub, or by a read
        (STATUS ``damaged``) -- is repaired in place from a member that holds it committed
        (``_repair_entry``): never cut, and nothing of a healthy copy changes. On the trio thread,
        a step of at most RAFT_SCRUB_STEP_BYTES at a time with ``maintenance`` held, as
        retention runs (the entry files are never reset or deleted under it)."""
        rate = self._store.config.scrub_bytes_per_second
        if rate <= 0:
            return
        self.scrubber = EntryScrubber(self._store)
        tried: set[tuple[str, int]] = set()  # damage reads found that a repair was tried for this pass
        while True:
            async with self._maintenance:
                step = self.scrubber.step(RAFT_SCRUB_STEP_BYTES)
            for topic, queue_id, queue_offset in step.units_repaired:
                LOGGER.warning("scrub: consume queue %s/%d unit %d did not match its record: rewritten from it",
                               topic, queue_id, queue_offset)  # fmt: skip
            for damage in step.damaged:
                tried.add((damage.file, damage.from_offset))
                if self._store.record_damage(damage):
                    LOGGER.error("scrub: damaged entry at %s: repairing it from a member that holds it", damage.describe())
                for attempt in range(1, REPAIR_ATTEMPTS_PER_PASS + 1):  # the peers' ports are learnt as they connect
                    if await self._repair_entry(damage, damage.index, damage.from_offset,
                                                last_attempt=attempt == REPAIR_ATTEMPTS_PER_PASS):  # fmt: skip
                        self.scrubber.repaired(damage)
                        break
                    if attempt < REPAIR_ATTEMPTS_PER_PASS:
                        await trio.sleep(REPAIR_RETRY_SECONDS)
                else:
                    self.scrubber.skip(damage)
            for damage in [d for d in self._store.read_damaged if (d.file, d.from_offset) not in tried]:
                tried.add((damage.file, damage.from_offset))  # found by a read: once a pass
                found = self._store.damaged_entry(damage)
                if found is not None:
                    await self._repair_entry(damage, *found)
            if step.pass_completed:
                tried.clear()
                await trio.sleep(SCRUB_PASS_PAUSE_SECONDS)
            else:
                await trio.sleep(max((step.checked_to - step.checked_from) / rate, SCRUB_STEP_PAUSE_MIN_SECONDS))
        raise AssertionError("unreachable")

    async def _repair_entry(self, damage, index: int, pos: int, *, last_attempt: bool = True) -> bool:
        """Fetch committed entry ``index`` (at data offset ``pos``) from each member that announced
        its client port in turn, with READ (the members' data files are byte-identical), and
        write the first copy that checks over this member's (``DLedgerMessageStore.repair_entry``:
        the entry, its message and agreement with what is left of this copy). True once repaired;
        False when no member gave a copy that checks (said in one line on the ``last_attempt``:
        where, what each member answered, and that the next pass tries again)."""
        tried = []
        for member, address in sorted(self._driver.peer_client_addresses.items()):
            if member == self._group.self_id or not address:
                continue
            try:
                with trio.fail_after(REPAIR_FETCH_TIMEOUT_SECONDS):
                    data = await self._fetch_entry(address, pos)
            except REPAIR_FETCH_ERRORS as error:
                tried.append(f"{member}: {transport.describe(error) if isinstance(error, OSError) else error}")
                continue
            async with self._maintenance:
                try:
                    rewritten = self._store.repair_entry(index, pos, data)
                except StoreError as error:
                    tried.append(f"{member}: {error}")
                    continue
            LOGGER.warning("scrub: entry %d at offset %d repaired from %s's copy (%s)", index, pos, member,
                           ", ".join(rewritten) or "this copy was whole again: nothing rewritten")  # fmt: skip
            return True
        if last_attempt:
            LOGGER.error("scrub: damaged entry at %s not repaired: no member gave a copy that checks (%s); it stays in "
                         "STATUS damaged, reads of it answer DAMAGED, and the scrub tries again next pass",
                         damage.describe(), "; ".join(tried) or ("a group of one has no other copy" if len(self._group.peers) == 1
                                                                  else "no member's client port is known yet"))  # fmt: skip
        return False

    async def _fetch_entry(self, address: str, pos: int) -> bytes:
        """The stored bytes of the entry at data offset ``pos`` on the member at ``address``
        (READ serves committed entries only, headers included), its header's size long."""
        async with connect(address, self._config.secret, tls_ca=self._config.tls_ca) as client:
            data = bytearray(await client.read(pos, size_max=ENTRY_HEADER_SIZE))
            size = int.from_bytes(data[4:8], "big", signed=True) if len(data) >= 8 else -1
            if not ENTRY_HEADER_SIZE <= size <= ENTRY_SIZE_MAX:
                raise ClientError(f"no entry at offset {pos} there (size word {size})")
            while len(data) < size:
                more = await client.read(pos + len(data), size_max=size - len(data))
                if not more:
                    raise ClientError(f"the entry at offset {pos} ends at {pos + len(data)} there")
                data += more
            return bytes(data[:size])
