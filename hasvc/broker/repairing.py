"""A master whose store is damaged repairs it from the first slave that connects, by itself.

Theory of operation
-------------------
``MessageStore.open`` refused the store (``DamagedLogError``: an invalid record below what was
known flushed; nothing was cut). Before giving up, a master listens on its HA port for up to
``repair_wait_seconds``. A slave that connects goes through the preface and sends its
SLAVE_HELLO as always; the master answers with a refusal ("repairing its store"), which the slave
retries like any other, and takes from the hello the slave's client address. Its log must share an
epoch entry with ours (the same cluster). The damaged ranges are then read from that slave with
READ and written back by ``commitlog.repair.repair_from``, which checks every record (size, magic,
fields, PHYSICALOFFSET, body CRC) and that the records fill each range exactly before it writes
anything; the logs of a master and its slaves are byte-identical. Repaired: the listener closes
and the broker opens the store as usual (the same HA port, opened again). A slave whose bytes do
not check is logged and the next one is waited for; no slave in time: the original one-line
refusal, naming ``hasvc store repair``.

While it repairs, the master has no client port open: producers see a refused connection (their
retry reaches it once it serves), never an answer from a damaged log.
"""

from __future__ import annotations

import functools
import logging

import trio

from commitlog import repair
from commitlog.commit_log import DamagedLogError
from commitlog.epoch import EpochEntry, EpochFile, find_consistent_point
from hasvc import transport
from hasvc.client import ClientError, connect
from hasvc.config import BrokerConfig, format_address, parse_address
from hasvc.protocol import client as cp
from hasvc.protocol import ha, wire
from hasvc.state.handshake import LogView, SlaveAdmission

LOGGER = logging.getLogger(__name__)
# As ha_master's: a slave that connects and says nothing is dropped after this long.
HANDSHAKE_TIMEOUT_SECONDS = 10.0
REPAIRING_REASON = "the master is repairing its damaged store from a slave; retry"

# What one slave's attempt may fail with (then the next slave is waited for); anything else is our bug.
ATTEMPT_ERRORS = (
    transport.AuthenticationError, OSError, EOFError, wire.ProtocolError, trio.TooSlowError,
    trio.BrokenResourceError, trio.ClosedResourceError, ClientError, repair.RepairError,
)  # fmt: skip


async def repair_from_a_slave(config: BrokerConfig, damage: DamagedLogError, *, ssl_context) -> repair.RepairReport:
    """Wait up to ``config.repair_wait_seconds`` for a slave and repair the store from it;
    ``damage`` raised again when none could."""
    if config.repair_wait_seconds <= 0:
        raise damage
    epochs = EpochFile.open(config.store).entries
    LOGGER.error("%s -- repairing: waiting up to %.0f s for a slave on the HA port %s",
                 damage, config.repair_wait_seconds, format_address(config.effective_ha_listen))  # fmt: skip
    listener, _socket = await transport.open_listener(config.effective_ha_listen, ssl_context=ssl_context)
    try:
        with trio.move_on_after(config.repair_wait_seconds):
            while True:
                stream = await listener.accept()
                try:
                    report = await _attempt(config, stream, epochs)
                except BaseException as error:
                    if not transport.is_expected(error, ATTEMPT_ERRORS):
                        raise
                    LOGGER.error("repair from a slave failed: %s", transport.describe(error))
                    continue
                if report is not None:
                    return report
    finally:
        await listener.aclose()
    LOGGER.error("no slave repaired the store within %.0f s", config.repair_wait_seconds)
    raise damage


async def _attempt(config: BrokerConfig, stream, epochs: list[EpochEntry]) -> repair.RepairReport | None:
    """One slave: its hello (answered with the refusal), then the repair from its client port.
    None when it is not one to repair from (another cluster)."""
    connection = transport.Connection(stream, transport.peer_name(stream))
    try:
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_HA, secret=config.secret)
        hello = await _read_hello(connection)
        segment_size = config.commitlog_segment_size
        answer = SlaveAdmission(REPAIRING_REASON).master_hello(_view(epochs, segment_size))
        with trio.move_on_after(HANDSHAKE_TIMEOUT_SECONDS):
            await connection.send_all(ha.encode_master_hello(answer))
    finally:
        await connection.aclose()
    slave_epochs = [EpochEntry(epoch, start) for epoch, start in hello.epochs]
    if epochs and find_consistent_point(epochs, 1 << 62, slave_epochs, hello.max_offset) < 0:
        LOGGER.error("slave %s shares no epoch with this store: not repairing from it", hello.slave_id)
        return None
    address = _reachable(hello.client_address, connection.peer)
    LOGGER.warning("repairing the store from slave %s at %s (its log ends at %d)", hello.slave_id, address, hello.max_offset)
    report = await _repair_from(config, address)
    LOGGER.warning("repaired %d damaged ranges from %s (%d bytes, %d records): %s", len(report.repaired), address,
                   report.bytes_written, report.records_written,
                   "; ".join(damage.describe() for damage in report.repaired))  # fmt: skip
    return report


def _reachable(client_address: str, peer: str) -> str:
    """The slave's client address as it told it, with the host it connected from when it listens
    on every interface (0.0.0.0, ::) or told none."""
    try:
        host, port = parse_address(client_address)
        peer_host, _peer_port = parse_address(peer)
    except ValueError:
        return client_address
    if host in ("", "0.0.0.0", "::"):
        host = peer_host
    return format_address((host, port))


async def _read_hello(connection) -> ha.SlaveHello:
    buffer = wire.Buffer(size_max=ha.HANDSHAKE_SIZE_MAX + 4)
    with trio.fail_after(HANDSHAKE_TIMEOUT_SECONDS):
        while (body := ha.take_handshake_frame(buffer)) is None:
            data = await connection.receive_some()
            if not data:
                raise EOFError("slave closed during the handshake")
            buffer.feed(data)
    return ha.decode_slave_hello(body)


def _view(epochs: list[EpochEntry], segment_size: int) -> LogView:
    """What the refusal tells of this log: its epochs and segment size (its offsets are not known
    before the store opens)."""
    return LogView(tuple(epochs), 0, 0, segment_size)


async def _repair_from(config: BrokerConfig, address: str) -> repair.RepairReport:
    """``commitlog.repair.repair_from`` in a worker thread, reading through a client connection
    to ``address`` on this loop."""
    token = trio.lowlevel.current_trio_token()
    async with connect(address, config.secret, tls_ca=config.tls_ca) as client:

        def fetch(offset: int, size_max: int) -> bytes:
            try:
                return trio.from_thread.run(functools.partial(client.read, offset, size_max=size_max), trio_token=token)
            except ClientError as error:
                if str(error).startswith(cp.OFFSET_ILLEGAL):
                    return b""  # the slave's log ends before offset
                raise

        store_config = config.store_config()
        return await trio.to_thread.run_sync(functools.partial(repair.repair_from, config.store, fetch, crc=store_config.crc))


__all__ = ["REPAIRING_REASON", "repair_from_a_slave"]
