"""The master's replication service (RocketMQ's HAService / AcceptSocketService / HAConnection).

Theory of operation
-------------------
The broker's HA listener hands every connection to ``HAService.handle``. After the preface and
the handshake, a connection runs two tasks, as RocketMQ's ReadSocketService and
WriteSocketService:

* reader: 8-byte reports. The first is where the slave wants bytes from (its max offset); every
  report acknowledges what is below it and may release SYNC_MASTER puts. A report beyond the
  master's end, or going backwards, closes this connection (``ReplicationViolation``). Nothing
  read for ``ha_housekeeping_interval`` closes it too.
* writer: from the start offset, frames of at most ``ha_transfer_batch_size`` log bytes, never
  across a segment; on plain TCP a frame's bytes go from the segment file to the socket with
  ``os.sendfile`` (Kafka's transfer; no copy in this process and no page faults on its mapping),
  under TLS from the mapping. When caught up it waits for new appends, and sends a heartbeat
  (size 0) after ``ha_send_heartbeat_interval`` of silence.

Bytes: a slave that does not read holds at most one frame here. Its writer waits for the socket
(the kernel's buffer holds the rest back), ``push`` leaves a waiting writer alone, and the wait is
counted (``statistics``: ``ha_bytes_queued``, ``ha_connections_muted``). A wait longer than
``ha_send_stalled_timeout_seconds`` closes the connection: a slave that reports without reading
keeps the report watchdog fed and would hold its writer for good.

Epochs: the master sends its epoch history in the handshake. A slave whose history shares no
entry with the master's is refused (a store from another cluster); a related slave that knows a
newer epoch than the master fences the master (it stops taking writes: a newer master exists).

Where an empty slave starts: the master's oldest retained byte (``min_offset``) — the whole log,
not RocketMQ's last segment (issues #3388/#3661) — unless the slave asked for the last segment.
A slave whose data ends below the master's oldest byte, or beyond its end, is refused at the
handshake with the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable

import trio

from commitlog.commit_log import ReadError
from commitlog.mapped_file import MappedFile
from commitlog.store import MessageStore
from hasvc import admission as port_admission
from hasvc import transport
from hasvc.config import BrokerConfig
from hasvc.protocol import ha, wire
from hasvc.state.handshake import LogView, SlaveAdmission, admit_slave
from hasvc.state.replication import ReplicaSet, ReplicationViolation, SlaveProgress
from hasvc.state.role import RoleState
from hasvc.state.transfer import Heartbeat, Send, TransferCursor, WaitUntil, start_offset

LOGGER = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_SECONDS = 10.0
# The HA port's connections (hasvc/admission.py): slaves past their handshake, counted apart from
# strangers (still in the preface or the handshake), whose oldest makes room for a new connection:
# idle or stalled connections cannot keep a slave from attaching. A preface and a handshake are
# a few round trips; 5 s leaves a loaded master's loop room. 64 slaves is far more than a master
# replicates to (RocketMQ runs one or two).
HA_STRANGERS_MAX = 16
HA_STRANGER_TIMEOUT_SECONDS = 5.0
HA_SLAVES_MAX = 64
# Bytes asked of the kernel per receive of reports (512 of them). Not transport.RECEIVE_SIZE:
# each read of 8 bytes into a 256 KiB bytes object, shrunk after, cost glibc an mmap, an mremap
# and a munmap (above its mmap threshold) once no failed read kept raising that threshold.
REPORTS_RECEIVE_SIZE = 512 * ha.REPORT.size
# What ends one HA connection (logged once, that connection closed); anything else is our bug.
CONNECTION_ERRORS = (
    transport.AuthenticationError, ReplicationViolation, wire.ProtocolError, trio.BrokenResourceError,
    trio.ClosedResourceError, EOFError, trio.TooSlowError, OSError, ReadError,
)  # fmt: skip


class HAService:
    """A master's slaves: ``handle`` serves one HA connection; ``push`` sends new appends to the
    idle ones from the put path. What it needs of the broker is passed in: the configuration,
    the store, the replica set it keeps up to date, the role (a slave with a newer epoch fences
    it) and ``on_ack``, called after every report (it releases the puts the report covers);
    ``on_closed``, when given, after a slave's connection ended and it left the replica set."""

    def __init__(self, *, config: BrokerConfig, store: MessageStore, replicas: ReplicaSet, role: RoleState,
                 on_ack: Callable[[], None], client_address: str = "",
                 on_closed: Callable[[SlaveProgress], None] | None = None) -> None:  # fmt: skip
        self.config = config
        self.on_closed = on_closed
        self.client_address = client_address  # told to slaves in MASTER_HELLO (where a refused SEND should go)
        self.store = store
        self.replicas = replicas
        self.role = role
        self.on_ack = on_ack
        self._ids = 0
        self.admission = port_admission.Admission(
            port_admission.AdmissionLimits(HA_STRANGERS_MAX, HA_STRANGER_TIMEOUT_SECONDS, HA_SLAVES_MAX), "ha")  # fmt: skip
        self._writers: set[SlaveWriter] = set()
        self._writers_changed: trio.Event | None = None  # made by wait_for_writers, set by attach_writer
        self._clock: trio.abc.Clock | None = None  # trio's clock, once a writer is attached (push reads it per put)
        self.bytes_queued = 0  # bytes of frames whose writer waits for the slave's socket to take them
        self.connections_muted = 0  # writers waiting so
        self.closed_stalled = 0  # connections closed after ha_send_stalled_timeout_seconds of it

    def statistics(self) -> dict[str, int]:
        """STATUS fields (and metrics, ``hasvc_`` before each name): the port's connections, and
        what its writers wait to send."""
        return {**self.admission.statistics(), "ha_bytes_queued": self.bytes_queued,
                "ha_connections_muted": self.connections_muted, "ha_connections_closed_stalled": self.closed_stalled}  # fmt: skip

    async def _send_waiting(self, size: int, send, *args) -> None:
        """``await send(*args)`` for ``size`` bytes of a frame the slave's socket did not take at
        once (under TLS, every frame): counted meanwhile; not taken within
        ``ha_send_stalled_timeout_seconds``, the connection ends (TooSlowError)."""
        timeout = self.config.ha_send_stalled_timeout_seconds
        self.bytes_queued += size
        self.connections_muted += 1
        try:
            with trio.move_on_after(timeout) as scope:
                await send(*args)
        finally:
            self.bytes_queued -= size
            self.connections_muted -= 1
            assert self.bytes_queued >= 0 and self.connections_muted >= 0
        if scope.cancelled_caught:
            self.closed_stalled += 1
            raise trio.TooSlowError(f"the slave did not take {size} bytes in {timeout:g} s (ha_send_stalled_timeout_seconds): "
                                    "it reports but does not read")  # fmt: skip

    async def handle(self, stream, ticket: port_admission.Ticket | None = None) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        self._ids += 1
        connection_id = self._ids
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_HA, secret=self.config.secret)
            self.admission.authenticated(ticket)
            hello = await self._handshake(connection)
            if hello is None:
                return
            if not self.admission.identified(ticket):
                LOGGER.warning("refused slave %s from %s: %d slaves connected already (HA_SLAVES_MAX)", hello.slave_id,
                               connection.peer, HA_SLAVES_MAX)  # fmt: skip
                return
            progress = SlaveProgress(connection_id, hello.slave_id, hello.client_address or connection.peer, time.time(),
                                     caught_up_at=trio.current_time())  # lag counts from here until it catches up
            self.replicas.add(progress)
            LOGGER.info("slave %s (%s) connected from %s, its log ends at %d", hello.slave_id, progress.address, connection.peer, hello.max_offset)
            try:
                first_report = trio.Event()
                async with trio.open_nursery() as nursery:
                    watchdog = transport.Watchdog(self.config.ha_housekeeping_interval_seconds, "no report from the slave")
                    nursery.start_soon(watchdog.run)
                    nursery.start_soon(self._read_reports, connection, progress, first_report, watchdog)
                    nursery.start_soon(self._write_frames, connection, progress, first_report, hello)
            finally:
                self.replicas.remove(connection_id)
                if self.on_closed is not None:
                    self.on_closed(progress)
        except BaseException as error:
            if not transport.is_expected(error, CONNECTION_ERRORS):
                raise
            leaf = transport.first_leaf(error)
            if isinstance(leaf, transport.AuthenticationError | ReplicationViolation):
                LOGGER.warning("closing HA connection from %s: %s", connection.peer, leaf)
            else:
                LOGGER.info("HA connection from %s closed: %s", connection.peer, transport.describe(error))
        finally:
            await connection.aclose()

    async def _handshake(self, connection) -> ha.SlaveHello | None:
        buffer = wire.Buffer(size_max=ha.HANDSHAKE_SIZE_MAX + 4)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_SECONDS):
                while (body := ha.take_handshake_frame(buffer)) is None:  # the length is checked first
                    data = await connection.receive_some()
                    if not data:
                        raise EOFError("slave closed during the handshake")
                    buffer.feed(data)
            hello = ha.decode_slave_hello(body)
        except wire.ProtocolError as error:  # refused with the reason, as every other refusal
            await self._refuse(connection, f"bad SLAVE_HELLO: {error}")
            raise
        view = self._log_view()
        admission = admit_slave(hello, view)
        if admission.fence_epoch:
            self.role.epoch_seen(admission.fence_epoch)
            if self.role.fence(admission.fence_reason):
                LOGGER.warning("fenced, refusing writes: %s", admission.fence_reason)
        reason = admission.refusal
        answer = dataclasses.replace(admission.master_hello(view), client_address=self.client_address)
        await connection.send_all(ha.encode_master_hello(answer))
        if reason:
            LOGGER.warning("refused slave %s from %s: %s", hello.slave_id, connection.peer, reason)
            return None
        if len(buffer):
            raise wire.ProtocolError("slave sent data before the handshake was answered")
        return hello

    def _log_view(self) -> LogView:
        store = self.store
        commit_log = store.commit_log
        return LogView(tuple(store.epochs.entries), commit_log.min_offset, commit_log.max_offset, commit_log.segment_size)

    async def _refuse(self, connection, reason: str) -> None:
        """Answer a hello that could not be read with a refusal naming why (best effort: the
        connection closes after it either way)."""
        with trio.move_on_after(HANDSHAKE_TIMEOUT_SECONDS):
            try:
                await connection.send_all(ha.encode_master_hello(SlaveAdmission(reason).master_hello(self._log_view())))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _read_reports(self, connection, progress: SlaveProgress, first_report: trio.Event, watchdog) -> None:
        replicas, commit_log = self.replicas, self.store.commit_log
        clock = trio.lowlevel.current_clock()  # its current_time() is trio.current_time(), one call instead of three
        decoder = ha.ReportDecoder()
        while True:
            data = await connection.receive_some(REPORTS_RECEIVE_SIZE)
            if not data:
                raise EOFError("slave closed the connection")
            for offset in decoder.reports(data):
                first = replicas.on_report(
                    progress.connection_id, offset, master_max_offset=commit_log.max_offset, now=clock.current_time()
                )
                if first:
                    first_report.set()
                self.on_ack()
            watchdog.feed()  # after the reports: the puts they release are answered first
        raise AssertionError("unreachable")

    async def _write_frames(self, connection, progress: SlaveProgress, first_report: trio.Event, hello: ha.SlaveHello) -> None:
        """The connection's writer task: frames as ``TransferCursor`` plans them, from the slave's
        first report on; heartbeats when caught up."""
        config, store = self.config, self.store
        commit_log = store.commit_log
        await first_report.wait()
        offset = start_offset(progress.request_offset, min_offset=commit_log.min_offset, max_offset=commit_log.max_offset,
                              segment_size=commit_log.segment_size, sync_from_last_file=hello.sync_from_last_file)  # fmt: skip
        LOGGER.info("transferring to slave %s from offset %d (it asked for %d)", progress.slave_id, offset, progress.request_offset)
        cursor = TransferCursor(offset, now=trio.current_time(), batch_size=config.ha_transfer_batch_size,
                                segment_size=commit_log.segment_size, heartbeat_seconds=config.ha_send_heartbeat_interval_seconds)  # fmt: skip
        writer = SlaveWriter(connection, cursor)
        segment = _OpenSegment(config.ha_transfer_readahead_size)
        self.attach_writer(writer)
        try:
            while True:  # busy (pushes stay out) everywhere but in the wait for new appends
                if writer.remainder:  # the rest of a frame a push began
                    remainder, writer.remainder = writer.remainder, b""
                    await self._send_waiting(len(remainder), connection.send_all, remainder)
                frame = cursor.frame(commit_log.max_offset)
                if frame is not None:
                    await self._send_frame(writer, segment, frame)
                    continue
                writer.busy = False
                try:
                    next_step = cursor.heartbeat(trio.current_time())
                    if isinstance(next_step, WaitUntil):
                        with trio.move_on_at(next_step.deadline):
                            await writer.wakeup.wait()
                finally:
                    writer.busy = True
                writer.wakeup = trio.Event()
                if cursor.frame(commit_log.max_offset) is None:
                    next_step = cursor.heartbeat(trio.current_time())
                    if isinstance(next_step, Heartbeat):
                        heartbeat = ha.encode_transfer_header(next_step.offset, 0)
                        await self._send_waiting(len(heartbeat), connection.send_all, heartbeat)
                        cursor.heartbeat_sent(now=trio.current_time())
            raise AssertionError("unreachable")
        finally:
            self._writers.discard(writer)
            segment.close()

    def attach_writer(self, writer: SlaveWriter) -> None:
        """A slave connection's sending side joins those ``push`` serves (its writer task's
        first step; detached when the task ends)."""
        self._clock = trio.lowlevel.current_clock()
        self._writers.add(writer)
        if self._writers_changed is not None:
            self._writers_changed.set()
            self._writers_changed = None

    @property
    def writer_count(self) -> int:
        """Slave connections past the handshake, transferring."""
        return len(self._writers)

    async def wait_for_writers(self, count: int = 1) -> None:
        """Until at least ``count`` slave connections are transferring."""
        while len(self._writers) < count:
            if self._writers_changed is None:
                self._writers_changed = trio.Event()
            await self._writers_changed.wait()

    async def _send_frame(self, writer: SlaveWriter, segment: _OpenSegment, frame: Send) -> None:
        """One frame: by ``sendfile`` from the segment file on plain TCP (read from the disk first,
        in a worker thread, when the page cache does not hold it), from the mapping under TLS."""
        store, connection = self.store, writer.connection
        commit_log = store.commit_log
        mapped_file, position, size = commit_log.transfer_span(frame.offset, frame.size_max)
        # Bytes appended since the segment's last flush are dirty pages, which the kernel keeps
        # until it writes them: no ``mincore`` for them (~7 us and a ctypes buffer a frame, ~2 %
        # of a master's loop at 64 x 32); older ones may have left the cache.
        unflushed = position >= mapped_file.flushed_position
        if not unflushed and not mapped_file.resident(position, position + size):
            segment.open(mapped_file)
            await trio.to_thread.run_sync(segment.load, position, size)
        if connection.can_send_file:
            fd = segment.open(mapped_file)
            header, sent_to = connection.send_file_now(ha.encode_transfer_header(frame.offset, size), fd, position, size)
            if header or sent_to < position + size:  # the socket is full: the rest waits for room
                rest = position + size - sent_to
                await self._send_waiting(len(header) + rest, connection.send_file, header, fd, sent_to, rest)
            elif not unflushed:  # a catch-up's frames: let the clients' tasks in between them
                await trio.lowlevel.checkpoint()
        else:  # TLS: from the mapping, through the TLS layer
            data = store.read(frame.offset, size)
            try:
                await self._send_waiting(ha.TRANSFER_HEADER.size + size, connection.send_all,
                                         ha.encode_transfer_header(frame.offset, size), data)  # fmt: skip
            finally:
                data.release()
        writer.cursor.sent(frame, size, now=trio.current_time())  # a push stays out while the task is busy

    def push(self) -> None:
        """Send what was just appended to every idle slave connection now, from the put path,
        as far as its socket takes it without waiting; the connection's writer task sends the
        rest of a frame begun here, and anything the socket refused. Leaving the send to the
        writer task put it behind every other task the put woke (the dispatcher among them):
        a lone SYNC_MASTER producer waited for that on every put."""
        if not self._writers:
            return
        commit_log = self.store.commit_log
        # The log's last segment and readable end, read once (``max_offset`` written out): a slave
        # caught up reads from it, and a frame there is its bytes up to the end (the segment's own
        # end is past it) -- one ``slice``, not ``cursor.frame`` and ``commit_log.read`` a put.
        files = commit_log.mapped_file_queue.mapped_files
        if not files:
            return
        last = files[-1]
        last_start = last.file_from_offset
        end = last_start + (last.wrote_position if last.write_buffer is None else last.read_position)
        for writer in self._writers:
            if writer.busy or writer.remainder:
                continue  # a busy task looks at the log's end before it waits again
            cursor = writer.cursor
            offset = cursor.offset
            if offset >= end:
                continue
            fd = writer.connection.raw_fileno  # now, never kept: a closed socket's number is reused
            if fd < 0:
                writer.wakeup.set()  # TLS, or closed: the task sends (or meets the error)
                continue
            if offset >= last_start:
                frame = None
                data = last.slice(offset - last_start, min(cursor.batch_size, end - offset))
            else:  # behind the last segment (a slave catching up while puts come)
                frame = cursor.frame(end)
                data = commit_log.read(frame.offset, frame.size_max)
            try:
                size = len(data)
                header = ha.TRANSFER_HEADER.pack(offset, size)  # encode_transfer_header
                try:
                    sent = os.writev(fd, [header, data])
                except OSError:  # full (EAGAIN), or broken: the task sends, or meets the error
                    writer.wakeup.set()
                    continue
                if sent < len(header) + size:
                    writer.remainder = (header + bytes(data))[sent:]
                    writer.wakeup.set()
            finally:
                data.release()
            if frame is None:
                cursor.pushed(size, now=self._clock.current_time())
            else:
                cursor.sent(frame, size, now=self._clock.current_time())
            if cursor.offset < end:  # a frame stops at a segment's end and at the batch size
                writer.wakeup.set()


class SlaveWriter:
    """One slave connection's sending side, shared by its writer task and ``push``: the cursor
    (where the next frame starts, when the last was sent), whether the task is in a send (a push
    then stays out: frames must not interleave), and the unsent end of a frame a push began."""

    __slots__ = ("connection", "cursor", "busy", "remainder", "wakeup")

    def __init__(self, connection, cursor: TransferCursor):
        self.connection = connection
        self.cursor = cursor
        self.busy = True  # the task is sending or about to
        self.remainder = b""
        self.wakeup = trio.Event()  # set by push for what it left to the task


class _OpenSegment:
    """The segment file a connection sends from, opened anew by path rather than borrowing the
    store's descriptor: retention may close and delete a segment while a slave still reads it
    (our own descriptor keeps its bytes readable; a segment already gone fails to open), and a
    segment truncated away and created again is a new MappedFile, so it is opened again."""

    def __init__(self, readahead_size: int = 0) -> None:
        self.mapped_file: MappedFile | None = None
        self.fd = -1
        self.readahead_size = readahead_size
        self.readahead_to = 0  # position in the file up to which the kernel was asked to read
        self._scratch = bytearray()  # load reads a frame into it to wait for the disk

    def open(self, mapped_file: MappedFile) -> int:
        if mapped_file is not self.mapped_file:
            self.close()
            self.fd = os.open(mapped_file.path, os.O_RDONLY)
            self.mapped_file = mapped_file
            self.readahead_to = 0
        return self.fd

    def load(self, position: int, size: int) -> None:
        """In a worker thread, for a frame the page cache does not hold whole: ask the kernel to
        read from ``position`` to ``readahead_size`` past it (``POSIX_FADV_WILLNEED``, in the
        background, never past the log's readable end, each range asked once), then read the
        frame itself, waiting for the disk. ``sendfile`` then finds the frame in the cache.
        Reading it from the event loop stopped every client until the disk answered (a catch-up
        from a log the cache had let go: the master's loop 720 ms of 2.6 s in that wait)."""
        mapped_file = self.mapped_file
        assert mapped_file is not None
        end = min(position + max(self.readahead_size, size), mapped_file.read_position)
        start = max(self.readahead_to, position)
        if end > start:
            os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_WILLNEED)
            self.readahead_to = end
        if len(self._scratch) < size:
            self._scratch = bytearray(size)
        with memoryview(self._scratch)[:size] as view:
            os.preadv(self.fd, [view], position)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.mapped_file, self.fd = None, -1
