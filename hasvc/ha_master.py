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

Epochs: the master sends its epoch history in the handshake. A slave whose history shares no
entry with the master's is refused (a store from another cluster); a related slave that knows a
newer epoch than the master fences the master (it stops taking writes: a newer master exists).

Where an empty slave starts: the master's oldest retained byte (``min_offset``) — the whole log,
not RocketMQ's last segment (issues #3388/#3661) — unless the slave asked for the last segment.
A slave whose data ends below the master's oldest byte, or beyond its end, is refused at the
handshake with the reason.
"""

from __future__ import annotations

import logging
import os
import time

import trio

from commitlog.commit_log import ReadError
from commitlog.epoch import EpochEntry, find_consistent_point
from commitlog.mapped_file import MappedFile
from hasvc import transport
from hasvc.protocol import ha, wire
from hasvc.replication import ReplicationViolation, SlaveProgress

LOGGER = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_SECONDS = 10.0
# A refusal's reason in MASTER_HELLO is cut to this many characters (at most 4 bytes each: with
# 1000 epoch entries the frame stays under ha.HANDSHAKE_SIZE_MAX); the log keeps it whole.
REFUSAL_REASON_CHARS_MAX = 4096
# What ends one HA connection (logged once, that connection closed); anything else is our bug.
CONNECTION_ERRORS = (
    transport.AuthenticationError, ReplicationViolation, wire.ProtocolError, trio.BrokenResourceError,
    trio.ClosedResourceError, EOFError, trio.TooSlowError, OSError, ReadError,
)  # fmt: skip


class HAService:
    def __init__(self, broker):
        self.broker = broker
        self._ids = 0
        self._writers: set[_Writer] = set()

    async def handle(self, stream) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        self._ids += 1
        connection_id = self._ids
        broker = self.broker
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_HA, secret=broker.config.secret)
            hello = await self._handshake(connection)
            if hello is None:
                return
            progress = SlaveProgress(connection_id, hello.slave_id, hello.client_address or connection.peer, time.time(),
                                     caught_up_at=time.monotonic())  # lag counts from here until it catches up
            broker.replicas.add(progress)
            LOGGER.info("slave %s (%s) connected from %s, its log ends at %d", hello.slave_id, progress.address, connection.peer, hello.max_offset)
            try:
                first_report = trio.Event()
                async with trio.open_nursery() as nursery:
                    watchdog = transport.Watchdog(broker.config.ha_housekeeping_interval_ms / 1000, "no report from the slave")
                    nursery.start_soon(watchdog.run)
                    nursery.start_soon(self._read_reports, connection, progress, first_report, watchdog)
                    nursery.start_soon(self._write_frames, connection, progress, first_report, hello)
            finally:
                broker.replicas.remove(connection_id)
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
        store = self.broker.store
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
        max_offset, min_offset = store.commit_log.max_offset, store.commit_log.min_offset
        slave_epoch = hello.epochs[-1][0] if hello.epochs else 0
        slave_entries = [EpochEntry(e, s) for e, s in hello.epochs]
        related = not slave_entries or not store.epochs.entries or find_consistent_point(
            slave_entries, hello.max_offset, store.epochs.entries, max_offset
        ) >= 0
        reason = ""
        if not related:
            reason = (f"no consistent point between the slave's epochs {list(hello.epochs)} and the master's "
                      f"{[(e.epoch, e.start_offset) for e in store.epochs.entries]}: the store is not from this cluster")  # fmt: skip
        elif slave_epoch > store.epochs.last_epoch:
            self.broker._peer_epoch = max(self.broker._peer_epoch, slave_epoch)
            self.broker.fence(f"slave {hello.slave_id} knows epoch {slave_epoch}, newer than ours {store.epochs.last_epoch}")
            reason = f"this master is behind your epoch {slave_epoch}: it is fenced and refuses writes"
        elif hello.max_offset > max_offset and not hello.epochs:
            reason = f"the slave's log ends at {hello.max_offset}, beyond the master's end {max_offset}"
        elif 0 < hello.max_offset < min_offset:
            reason = (f"the slave's log ends at {hello.max_offset} but the master's oldest retained offset is "
                      f"{min_offset}: clear the slave's store to resynchronise")  # fmt: skip
        await self._answer_hello(connection, reason)
        if reason:
            LOGGER.warning("refused slave %s from %s: %s", hello.slave_id, connection.peer, reason)
            return None
        if len(buffer):
            raise wire.ProtocolError("slave sent data before the handshake was answered")
        return hello

    async def _answer_hello(self, connection, reason: str) -> None:
        """MASTER_HELLO: accepted when ``reason`` is empty, else refused with it (cut to
        ``REFUSAL_REASON_CHARS_MAX``: two 1000-entry histories quoted would not fit the frame)."""
        store = self.broker.store
        if len(reason) > REFUSAL_REASON_CHARS_MAX:
            reason = reason[: REFUSAL_REASON_CHARS_MAX - 3] + "..."
        await connection.send_all(
            ha.encode_master_hello(ha.MasterHello(
                ha.STATUS_REFUSED if reason else ha.STATUS_OK, store.commit_log.max_offset, store.commit_log.min_offset,
                store.commit_log.segment_size, tuple((e.epoch, e.start_offset) for e in store.epochs.entries), reason,
            ))  # fmt: skip
        )

    async def _refuse(self, connection, reason: str) -> None:
        """Answer a hello that could not be read with a refusal naming why (best effort: the
        connection closes after it either way)."""
        with trio.move_on_after(HANDSHAKE_TIMEOUT_SECONDS):
            try:
                await self._answer_hello(connection, reason)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _read_reports(self, connection, progress: SlaveProgress, first_report: trio.Event, watchdog) -> None:
        broker = self.broker
        decoder = ha.ReportDecoder()
        while True:
            data = await connection.receive_some()
            watchdog.feed()
            if not data:
                raise EOFError("slave closed the connection")
            decoder.receive_data(data)
            while (offset := decoder.next_report()) is not None:
                first = broker.replicas.on_report(
                    progress.connection_id, offset, master_max_offset=broker.store.commit_log.max_offset, now=time.monotonic()
                )
                if first:
                    first_report.set()
                broker.on_ack()

    async def _write_frames(self, connection, progress: SlaveProgress, first_report: trio.Event, hello: ha.SlaveHello) -> None:
        broker = self.broker
        store = broker.store
        await first_report.wait()
        offset = progress.request_offset
        if offset == 0:
            if hello.sync_from_last_file:
                last = store.commit_log.max_offset
                offset = last - last % store.commit_log.segment_size
            else:
                offset = store.commit_log.min_offset
        LOGGER.info("transferring to slave %s from offset %d (it asked for %d)", progress.slave_id, offset, progress.request_offset)
        batch_size = broker.config.ha_transfer_batch_size
        heartbeat = broker.config.ha_send_heartbeat_interval_ms / 1000
        writer = _Writer(connection, offset)
        segment = _OpenSegment(broker.config.ha_transfer_readahead_size)
        self._writers.add(writer)
        try:
            while True:  # busy (pushes stay out) everywhere but in the wait for new appends
                if writer.remainder:  # the rest of a frame a push began
                    remainder, writer.remainder = writer.remainder, b""
                    await connection.send_all(remainder)
                offset = writer.offset
                if offset < store.commit_log.max_offset:
                    mapped_file, position, size = store.commit_log.transfer_span(offset, batch_size)
                    if not mapped_file.resident(position, position + size):  # ~7 us a frame
                        segment.open(mapped_file)
                        await trio.to_thread.run_sync(segment.load, position, size)
                    if connection.can_send_file:
                        fd = segment.open(mapped_file)
                        await connection.send_file(ha.encode_transfer_header(offset, size), fd, position, size)
                    else:  # TLS: from the mapping, through the TLS layer
                        data = store.read(offset, size)
                        try:
                            await connection.send_all(ha.encode_transfer_header(offset, size), data)
                        finally:
                            data.release()
                    writer.offset = offset + size
                    writer.last_write = trio.current_time()
                    continue
                writer.busy = False
                try:
                    with trio.move_on_at(writer.last_write + heartbeat):
                        await writer.wakeup.wait()
                finally:
                    writer.busy = True
                writer.wakeup = trio.Event()
                if trio.current_time() - writer.last_write >= heartbeat and writer.offset >= store.commit_log.max_offset:
                    await connection.send_all(ha.encode_transfer_header(writer.offset, 0))
                    writer.last_write = trio.current_time()
        finally:
            self._writers.discard(writer)
            segment.close()

    def push(self) -> None:
        """Send what was just appended to every idle slave connection now, from the put path,
        as far as its socket takes it without waiting; the connection's writer task sends the
        rest of a frame begun here, and anything the socket refused. Leaving the send to the
        writer task put it behind every other task the put woke (the dispatcher among them):
        a lone SYNC_MASTER producer waited for that on every put."""
        if not self._writers:
            return
        store = self.broker.store
        end = store.commit_log.max_offset
        batch_size = self.broker.config.ha_transfer_batch_size
        for writer in self._writers:
            if writer.busy or writer.remainder or writer.offset >= end:
                continue  # a busy task looks at the log's end before it waits again
            fd = writer.connection.raw_fileno  # now, never kept: a closed socket's number is reused
            if fd < 0:
                writer.wakeup.set()  # TLS, or closed: the task sends (or meets the error)
                continue
            data = store.read(writer.offset, batch_size)
            try:
                size = len(data)
                header = ha.encode_transfer_header(writer.offset, size)
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
            writer.offset += size
            writer.last_write = trio.current_time()
            if writer.offset < end:  # a frame stops at a segment's end and at the batch size
                writer.wakeup.set()


class _Writer:
    """One slave connection's sending side, shared by its writer task and ``push``: where the
    next frame starts, whether the task is in a send (a push then stays out: frames must not
    interleave), and the unsent end of a frame a push began."""

    __slots__ = ("connection", "offset", "busy", "remainder", "last_write", "wakeup")

    def __init__(self, connection, offset: int):
        self.connection = connection
        self.offset = offset
        self.busy = True  # the task is sending or about to
        self.remainder = b""
        self.last_write = trio.current_time()
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
