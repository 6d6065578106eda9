"""The slave's replication client (RocketMQ's HAClient).

Theory of operation
-------------------
Forever: connect to the master's HA port, run the preface and the handshake, report the local max
offset, then read frames. Each frame must start exactly at the local max offset (else the
connection is dropped and opened again — RocketMQ's "master pushed offset not equal the max phy
offset in slave"); its bytes are moved verbatim into the segment (``splice`` through a pipe on
plain TCP, else received into a buffer and written with ``pwrite``; ``StoreTasks.warm_ahead`` says why
not through the mapping) and reported: the slave never
acknowledges bytes it does not have. With ``flush_before_ack`` a flusher task reports instead,
only what it has flushed, flushing the frames that arrived meanwhile together. A heartbeat task
reports at least every ``ha_send_heartbeat_interval``; nothing read for
``ha_housekeeping_interval`` drops the connection. Errors close the connection and are logged
once per change of state; reconnects back off from ``ha_reconnect_backoff_min_ms`` to
``ha_reconnect_backoff_max_ms``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

import trio

from commitlog.commit_log import ReplicationOffsetError
from commitlog.mapped_file import DiskFullError, SyncFailedError
from commitlog.store import MessageStore
from hasvc import transport
from hasvc.config import Address, BrokerConfig, format_address
from hasvc.protocol import ha, wire
from hasvc.state.follower import Reports, offset_refusal, room_refusal
from hasvc.state.handshake import LogView, reconcile
from hasvc.state.role import RoleState

LOGGER = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_SECONDS = 10.0
# Frames at least this big go socket -> pipe -> log with splice; smaller ones (a SYNC_MASTER put's
# frame) through the frame buffer and pwrite: for a 1 KiB frame the pipe's two moves cost ~15 us
# more than readv + pwrite (one writer: p50 354 vs 337 us, 6 alternating pairs).
SPLICE_FRAME_MIN = 64 * 1024
# Bytes of a frame's body read with its header (``Connection.receive_head``): a frame below
# SPLICE_FRAME_MIN whole (one read where a header then a body was two, and an EAGAIN read before
# the next header: 7 -> 5 system calls a put at one writer); a spliced frame's first bytes go
# through the frame buffer, and after a spliced frame the next header is read alone (a catch-up's
# frames of 1-2 MiB keep splicing all but ~nothing).
HEAD_AHEAD_SIZE = SPLICE_FRAME_MIN
# What ends one replication session (then: back off and reconnect); anything else is our bug.
# A full disk (no next segment) or a failed sync ends the session too: the slave reports nothing
# more, says why once, and tries again with backoff (space may free; a failed sync keeps failing
# until a restart, so the slave never acknowledges what it may have lost).
SESSION_ERRORS = (
    transport.AuthenticationError, OSError, EOFError, wire.ProtocolError, ReplicationOffsetError,
    trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, DiskFullError, SyncFailedError,
)  # fmt: skip


class MasterShrankError(transport.AuthenticationError):
    """The master's log ends inside its own epoch below ours (``handshake.reconcile``): we keep
    our bytes and do not follow it; logged at ERROR, shown in STATUS (``replication_refused``)."""


class HAClient:
    """A slave's replication from ``role.master_ha``. What it needs of the broker is passed in:
    the configuration, the store, the role (it says whether a master is connected and remembers
    the master's epoch), the client address it tells the master, the locks held around a
    truncation (background store work must not overlap it) and ``after_appends``, called after
    every frame (dispatch, warm-up)."""

    def __init__(self, *, config: BrokerConfig, store: MessageStore, role: RoleState, listen_address: Address,
                 truncation_locks: Sequence[trio.Lock], after_appends: Callable[[], None]) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.role = role
        self.listen_address = listen_address
        self.truncation_locks = truncation_locks
        self.after_appends = after_appends
        self._last_state = None
        self.reports = Reports(flush_before_ack=config.flush_before_ack)  # one per session
        self._flush_wakeup = trio.Event()

    def _state(self, state: str, detail: str = "", *, level: int | None = None) -> None:
        """Log a state change once (a master that stays down logs one line, not one per retry)."""
        if state != self._last_state:
            if level is None:
                level = logging.WARNING if state in ("disconnected", "refused") else logging.INFO
            LOGGER.log(level, "replication %s%s", state, f": {detail}" if detail else "")
            self._last_state = state

    async def run(self) -> None:
        config = self.config
        backoff = config.ha_reconnect_backoff_min_seconds
        while True:
            try:
                await self._session()
            except BaseException as error:
                if not transport.is_expected(error, SESSION_ERRORS):
                    raise
                leaf = transport.first_leaf(error)
                if isinstance(leaf, MasterShrankError):
                    self.role.replication_refused = transport.describe(error)
                    self._state("refused", f"master {format_address(self.role.master_ha)}: {self.role.replication_refused}",
                                level=logging.ERROR)  # fmt: skip
                elif isinstance(leaf, transport.AuthenticationError):
                    self._state("refused", transport.describe(error))
                else:
                    self._state("disconnected", f"{format_address(self.role.master_ha)}: {transport.describe(error)}")
            self.role.set_master_connected(False)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, config.ha_reconnect_backoff_max_seconds)
        raise AssertionError("unreachable")

    async def _session(self) -> None:
        config, store, role = self.config, self.store, self.role
        ssl_context = transport.client_ssl_context(ca=config.tls_ca, cert=config.tls_cert, key=config.tls_key) if config.tls_ca else None
        connection = await transport.connect(role.master_ha, ssl_context=ssl_context)
        try:
            await transport.client_preface(connection, port_kind=wire.PORT_KIND_HA, secret=config.secret)
            slave_id = config.slave_id or f"slave@{format_address(self.listen_address)}"
            epochs = tuple((e.epoch, e.start_offset) for e in store.epochs.entries)
            hello = ha.SlaveHello(slave_id, format_address(self.listen_address), store.commit_log.max_wrote_offset, epochs, config.sync_from_last_file)
            await connection.send_all(ha.encode_slave_hello(hello))
            master = await self._read_master_hello(connection)
            await self._reconcile(master)
            role.master_client_address = master.client_address or role.master_client_address
            splice = transport.SPLICE_AVAILABLE and connection.raw_fileno >= 0
            self._state("connected", f"master {format_address(role.master_ha)}, its log [{master.min_offset}, {master.max_offset}), "
                                     f"ours ends at {store.commit_log.max_offset}; frames of {SPLICE_FRAME_MIN} bytes or more "
                                     f"{'by splice' if splice else 'by pwrite (no splice here)'}")  # fmt: skip
            role.set_master_connected(True)
            self.reports = Reports(flush_before_ack=config.flush_before_ack)
            if config.flush_before_ack:  # what we have is flushed before we first report it
                self.reports.flushed_to(await trio.to_thread.run_sync(store.flush_commitlog, 0))
            await self.send_report(connection)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat, connection)
                if config.flush_before_ack:
                    self._flush_wakeup = trio.Event()
                    nursery.start_soon(self._flush_and_report, connection)
                watchdog = transport.Watchdog(config.ha_housekeeping_interval_seconds, "nothing from the master")
                nursery.start_soon(watchdog.run)
                with transport.SplicePipe() if splice else contextlib.nullcontext() as pipe:
                    await self._receive_frames(connection, watchdog, pipe)
                nursery.cancel_scope.cancel()
        finally:
            role.set_master_connected(False)
            await connection.aclose()

    async def _reconcile(self, master: ha.MasterHello) -> None:
        """Carry out ``handshake.reconcile``: refuse (AuthenticationError: the session ends and is
        retried), or cut our log back to the last offset our history shares with the master's (a
        former master's unacknowledged tail goes), then adopt the master's epoch history."""
        store = self.store
        commit_log = store.commit_log
        local = LogView(tuple(store.epochs.entries), commit_log.min_offset, commit_log.max_offset, commit_log.segment_size)
        local_end = commit_log.max_wrote_offset
        answer = reconcile(local, local_end, master)
        self.role.epoch_seen(answer.master_epoch)
        if answer.master_shrank:
            raise MasterShrankError(answer.refusal)
        if answer.refusal:
            raise transport.AuthenticationError(answer.refusal)
        self.role.replication_refused = None
        if answer.truncate_to is not None:
            async with contextlib.AsyncExitStack() as locks:
                for lock in self.truncation_locks:
                    await locks.enter_async_context(lock)
                await trio.to_thread.run_sync(store.truncate, answer.truncate_to)
            LOGGER.warning("truncated the log to %d: dropped %d bytes [%d, %d) the master does not have",
                           answer.truncate_to, local_end - answer.truncate_to, answer.truncate_to, local_end)  # fmt: skip
        if answer.epochs is not None:
            store.epochs.replace(list(answer.epochs))

    async def _read_master_hello(self, connection) -> ha.MasterHello:
        buffer = wire.Buffer(size_max=ha.HANDSHAKE_SIZE_MAX + 4)
        with trio.fail_after(HANDSHAKE_TIMEOUT_SECONDS):
            head = await connection.receive_exactly(4)
            buffer.feed(head)
            (size,) = ha.LENGTH.unpack(head)
            if size > ha.HANDSHAKE_SIZE_MAX:
                raise wire.ProtocolError(f"master handshake of {size} bytes")
            buffer.feed(await connection.receive_exactly(size))
        return ha.decode_master_hello(ha.take_handshake_frame(buffer))

    async def send_report(self, connection) -> None:
        """Report what we may acknowledge: the end of the log, or with ``flush_before_ack`` the
        end of what is flushed (a heartbeat between a frame and its flush must not ack it)."""
        offset = self.reports.report(log_end=self.store.commit_log.max_offset)
        await connection.send_small(ha.REPORT.pack(offset))

    async def _heartbeat(self, connection) -> None:
        interval = self.config.ha_send_heartbeat_interval_seconds
        while True:
            await trio.sleep(interval)
            await self.send_report(connection)
        raise AssertionError("unreachable")

    async def _flush_and_report(self, connection) -> None:
        """``flush_before_ack``: flush what has arrived, then report it. Frames that arrive
        during a flush are flushed together by the next one (group commit, as the master's
        SYNC_FLUSH): a flush per frame, in line with receiving, held SYNC_MASTER + slave flush to
        one fsync per frame however many frames were waiting."""
        store = self.store
        while True:
            await self._flush_wakeup.wait()
            self._flush_wakeup = trio.Event()
            self.reports.flushed_to(await trio.to_thread.run_sync(store.flush_commitlog, 0))
            await self.send_report(connection)
        raise AssertionError("unreachable")

    async def _receive_frames(self, connection, watchdog: transport.Watchdog, pipe: transport.SplicePipe | None) -> None:
        """Frames until the session ends. On plain TCP a frame of ``SPLICE_FRAME_MIN`` bytes or
        more moves socket → pipe → log with ``splice``, in pieces of up to the pipe's size (the
        log's end advances piece by piece, as if the master had sent smaller frames): the bytes
        never pass through this process (catch-up of 2 GiB, 8 alternating runs: 487–1,155 MB/s,
        median ~900, against 352–474 receiving into a buffer and writing it with ``pwrite``). Other frames, and all
        under TLS, are received into a buffer and written with ``pwrite``. A header is read with
        what has arrived of its frame's body, up to HEAD_AHEAD_SIZE bytes, into the frame buffer
        (``receive_head``, one read); bytes of the next frame read so go back to the connection."""
        store, config = self.store, self.config
        frame_buffer = memoryview(bytearray(config.ha_frame_size_max))  # its pages stay hot across frames
        ahead = frame_buffer[:HEAD_AHEAD_SIZE]
        spliced = False  # the last frame went by splice: the next header is read alone
        while True:
            # A frame's header, with what has arrived of its body in the frame buffer (one read).
            raw, got = await connection.receive_head(ha.TRANSFER_HEADER.size, ahead[:0] if spliced else ahead)
            watchdog.feed()
            header_offset, size = ha.transfer_header_fields(raw, config.ha_frame_size_max)
            if got > size:  # the next frame's bytes
                connection.unread(frame_buffer[size:got])
                got = size
            # The log's last segment and end read once (``mapped_file_queue.last`` and
            # ``max_wrote_offset`` written out: this runs for every frame).
            files = store.commit_log.mapped_file_queue.mapped_files
            last = files[-1] if files else None
            log_end = last.file_from_offset + last.wrote_position if last is not None else 0
            refusal = offset_refusal(header_offset, log_end=log_end, log_started=last is not None)
            if refusal is not None:
                raise wire.ProtocolError(refusal)
            if size == 0:
                continue  # heartbeat; our heartbeat task reports
            if store.write_failure is not None:  # a sync failed: acknowledge nothing more (see SESSION_ERRORS)
                raise SyncFailedError(store.write_failure)
            room = 0 if last is None else last.file_size - last.wrote_position
            if room == 0:  # a new segment: fallocate and a directory fsync, off the loop
                room = await trio.to_thread.run_sync(store.commit_log.prepare_replication, header_offset)
            refusal = room_refusal(header_offset, size, room=room)
            if refusal is not None:
                raise wire.ProtocolError(refusal)
            spliced = size >= SPLICE_FRAME_MIN and pipe is not None and connection.can_splice
            if spliced:
                offset, remaining = header_offset, size
                if got:  # what came with the header
                    with frame_buffer[:got] as data:
                        store.commit_log.append_replicated(offset, data)
                    offset += got
                    remaining -= got
                while remaining:
                    count = await connection.splice_into(pipe.write_fd, min(remaining, pipe.size))
                    store.commit_log.append_replicated_from_pipe(offset, pipe.read_fd, count)
                    offset += count
                    remaining -= count
            else:
                if got < size:
                    with frame_buffer[got:size] as rest:
                        await connection.receive_into(rest)
                with frame_buffer[:size] as data:
                    store.commit_log.append_replicated(header_offset, data)
            if config.flush_before_ack:
                self._flush_wakeup.set()
            else:
                await self.send_report(connection)  # first: the master waits for it
            watchdog.feed()  # after the report (the master waits for that, not for a clock read)
            self.after_appends()
        raise AssertionError("unreachable")
