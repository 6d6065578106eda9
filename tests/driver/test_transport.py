"""The transport's file sending over a real loopback TCP connection: ``send_file`` hands segment
bytes to the kernel with ``os.sendfile``, waits when the socket is full, and the HA writer's
segment handle follows the store's segments (a truncated and recreated segment is reopened)."""

import os
import socket
import struct
import types

import pytest
import trio
import trio.testing

from commitlog.mapped_file import MappedFile, segment_name
from commitlog.pagecache import PAGE, drop_from_page_cache, resident_pages
from commitlog.store import MessageStore
from hasvc import transport
from hasvc.broker import Broker
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.broker.ha_master import _OpenSegment, SlaveWriter
from hasvc.protocol import client as cp
from hasvc.protocol import ha, wire
from hasvc.state.transfer import TransferCursor
from tests.cluster import wait_until

SIZE = 8 * 1024 * 1024  # several times the socket buffers: sendfile meets EAGAIN and must wait


async def _connected_pair():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = trio.socket.socket()
    await client.connect(listener.getsockname())
    server, _ = await listener.accept()
    listener.close()
    return transport.Connection(trio.SocketStream(client), "client"), transport.Connection(trio.SocketStream(server), "server")


def _master_with_a_slave_writer(tmp_path, **settings):
    """A SYNC_MASTER broker's store and HA service, with one slave connection's writer over a
    socketpair: (broker, service, writer, connection, the slave's end)."""
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, commitlog_segment_size=1024 * 1024, **settings)
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    service = broker.ha_service = broker.make_ha_service()
    broker.replicator.attach(service)
    left, right = socket.socketpair()
    connection = transport.Connection(trio.SocketStream(trio.socket.from_stdlib_socket(left)), "slave")
    cursor = TransferCursor(0, now=trio.current_time(), batch_size=config.ha_transfer_batch_size,
                            segment_size=config.commitlog_segment_size, heartbeat_seconds=config.ha_send_heartbeat_interval_seconds)  # fmt: skip
    writer = SlaveWriter(connection, cursor)
    service.attach_writer(writer)
    return broker, service, writer, connection, right


async def _receive_all(connection, size, out):
    data = bytearray()
    while len(data) < size:
        chunk = await connection.receive_some()
        assert chunk, "closed early"
        data += chunk
    out.append(bytes(data))


async def test_send_file_sends_the_header_then_the_range_of_the_file(tmp_path):
    payload = os.urandom(SIZE)
    path = tmp_path / "segment"
    path.write_bytes(payload)
    sender, receiver = await _connected_pair()
    assert sender.can_send_file
    received = []
    fd = os.open(path, os.O_RDONLY)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_receive_all, receiver, 12 + SIZE - 1000, received)
            await sender.send_file(b"H" * 12, fd, 1000, SIZE - 1000)
    finally:
        os.close(fd)
        await sender.aclose()
        await receiver.aclose()
    assert received == [b"H" * 12 + payload[1000:]]


async def test_send_file_now_sends_what_the_socket_takes_and_send_file_finishes_the_frame(tmp_path):
    """The writer task's non-blocking pass (header, then ``sendfile`` until the socket is full)
    and the async ``send_file`` for the rest make one frame, byte for byte; nothing is written
    while another send is in progress."""
    payload = os.urandom(SIZE)  # more than the socket buffers: the pass stops part way
    path = tmp_path / "segment"
    path.write_bytes(payload)
    sender, receiver = await _connected_pair()
    received = []
    fd = os.open(path, os.O_RDONLY)
    try:
        async with sender._send_lock:  # a send in progress: nothing written, nothing taken
            assert sender.send_file_now(b"H" * 12, fd, 1000, SIZE - 1000) == (b"H" * 12, 1000)
        header, sent_to = sender.send_file_now(b"H" * 12, fd, 1000, SIZE - 1000)
        assert header == b"" and 1000 < sent_to < SIZE
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_receive_all, receiver, 12 + SIZE - 1000, received)
            await sender.send_file(header, fd, sent_to, SIZE - sent_to)
        small_header, small_end = sender.send_file_now(b"h" * 12, fd, 0, 100)  # room now: all of it
        assert (small_header, small_end) == (b"", 100)
        assert await receiver.receive_exactly(112) == b"h" * 12 + payload[:100]
    finally:
        os.close(fd)
        await sender.aclose()
        await receiver.aclose()
    assert received == [b"H" * 12 + payload[1000:]]


async def test_send_file_past_the_end_of_the_file_is_an_error_not_a_short_frame(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 100)
    sender, receiver = await _connected_pair()
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            await sender.send_file(b"H" * 12, fd, 50, 100)
        except EOFError as error:
            assert "ended at 100, expected 150" in str(error)
        else:
            raise AssertionError("no error")
    finally:
        os.close(fd)
        await sender.aclose()
        await receiver.aclose()


def test_open_segment_reopens_a_segment_that_was_recreated(tmp_path):
    path = str(tmp_path / segment_name(0))
    first = MappedFile(path, file_size=4096, create=True)
    first.append(b"old")
    handle = _OpenSegment()
    fd = handle.open(first)
    assert handle.open(first) == fd  # the same segment: the same descriptor
    first.destroy()  # truncated away; a new segment is created under the same name
    second = MappedFile(path, file_size=4096, create=True)
    second.append(b"new")
    fd = handle.open(second)
    assert os.pread(fd, 3, 0) == b"new"
    handle.close()
    second.close()
    assert handle.fd == -1


def test_loading_a_frame_reads_it_and_the_log_ahead_never_past_its_end(tmp_path):
    """``_OpenSegment.load`` (a worker thread's part of a transfer from a log the page cache let
    go): on return the frame is in the cache; the kernel was asked for ``readahead_size`` more
    behind it, none before it and none past the log's readable end."""
    path = str(tmp_path / segment_name(0))
    with open(path, "wb") as file:
        file.write(os.urandom(256 * PAGE))
    segment = types.SimpleNamespace(path=path, read_position=192 * PAGE)  # the log ends at page 192
    handle = _OpenSegment(readahead_size=64 * PAGE)
    handle.open(segment)
    try:
        drop_from_page_cache([path])
        assert not any(resident_pages(path))
        handle.load(16 * PAGE, 4 * PAGE)
        assert all(resident_pages(path)[16:20])  # waited for
        wait_until(lambda: all(resident_pages(path)[16:80]), timeout=10)
        pages = resident_pages(path)
        assert not any(pages[:16]) and not any(pages[80:])
        drop_from_page_cache([path])
        handle.load(150 * PAGE, 4 * PAGE)
        wait_until(lambda: all(resident_pages(path)[150:192]), timeout=10)
        pages = resident_pages(path)
        assert not any(pages[:150]) and not any(pages[192:])
    finally:
        handle.close()


async def empty_slave(port: int) -> transport.Connection:
    """A slave with an empty log, connected to the HA port and past the handshake: it asked
    for everything from offset 0."""
    slave = transport.Connection(await trio.open_tcp_stream("127.0.0.1", port), "master")
    await transport.client_preface(slave, port_kind=wire.PORT_KIND_HA, secret=None)
    await slave.send_all(ha.encode_slave_hello(ha.SlaveHello("s1", "127.0.0.1:1", 0)))
    (size,) = ha.LENGTH.unpack(await slave.receive_exactly(4))
    ha.decode_master_hello(await slave.receive_exactly(size))
    await slave.send_all(ha.REPORT.pack(0))
    return slave


def log_bytes(store: MessageStore, end: int) -> bytes:
    """The log's bytes from 0 to ``end``, across segments."""
    log = bytearray()
    while len(log) < end:
        with store.read(len(log), end - len(log)) as view:
            log += view
    return bytes(log)


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile", "from-the-mapping"])
async def test_a_transfer_from_a_log_the_page_cache_let_go_is_read_off_the_event_loop(tmp_path, monkeypatch, sendfile):
    """A slave catching up from pages no longer in the cache: the writer task has a worker thread
    read them (``_OpenSegment.load``) before it sends them (``sendfile``; from the mapping, as
    under TLS), and the slave gets the log byte for byte."""
    if not sendfile:
        monkeypatch.setattr(transport.Connection, "can_send_file", property(lambda self: False))
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, commitlog_segment_size=4 * 1024 * 1024,
                          ha_transfer_readahead_size=256 * 1024)  # fmt: skip
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    for round_ in range(200):
        broker.put_service.append(cp.SendRequest("T", 0, [bytes([round_]) * 30_000], [b""], 0, 0))
    commit_log = broker.store.commit_log
    end = commit_log.max_offset
    assert end > config.commitlog_segment_size  # two segments
    commit_log.flush()
    for mapped_file in commit_log.mapped_file_queue.mapped_files:
        mapped_file.drop_cached(mapped_file.flushed_position)
        assert not mapped_file.resident(0, mapped_file.flushed_position // PAGE * PAGE)
    loads = []
    original = _OpenSegment.load
    monkeypatch.setattr(_OpenSegment, "load", lambda self, position, size: (loads.append(position), original(self, position, size)))
    service = broker.ha_service = broker.make_ha_service()
    broker.replicator.attach(service)
    listener = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener[0].socket.getsockname()[1]
    received = bytearray()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, service.handle, listener)
            slave = await empty_slave(port)
            while len(received) < end:
                header = ha.decode_transfer_header(await slave.receive_exactly(12), size_max=config.ha_frame_size_max)
                assert header.offset == len(received)
                received += await slave.receive_exactly(header.size)
            nursery.cancel_scope.cancel()
        assert loads and loads[0] == 0  # read off the loop from the first frame on
        assert received == log_bytes(broker.store, end)
    finally:
        broker.store.close()


def test_streams_other_than_plain_tcp_do_not_claim_sendfile():
    assert not transport.Connection(trio.testing.MemorySendStream(), "memory").can_send_file


async def test_frames_pushed_from_the_put_path_and_sent_by_the_writer_task_never_interleave(tmp_path):
    """Appends pushed at once (``HAService.push``, the socket taking part of a frame or none of
    it) and frames sent by the connection's writer task make one contiguous stream of frames
    whose bytes are the log's."""
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, commitlog_segment_size=64 * 1024 * 1024)
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    service = broker.ha_service = broker.make_ha_service()
    broker.replicator.attach(service)
    listener = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener[0].socket.getsockname()[1]
    received = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, service.handle, listener)
            slave = await empty_slave(port)
            await service.wait_for_writers(1)  # an event, set when its writer task starts
            for round_ in range(40):  # bursts bigger than the socket buffers, pushed from here
                for _ in range(50):
                    broker.put_service.append(cp.SendRequest("T", 0, [bytes([round_]) * 3000], [b""], 0, 0))
                service.push()
                await trio.sleep(0)
            end = broker.store.commit_log.max_offset
            expected_offset = 0
            while expected_offset < end:
                header = ha.decode_transfer_header(await slave.receive_exactly(12), size_max=config.ha_frame_size_max)
                assert header.offset == expected_offset  # contiguous: no frame cut into by another
                received.append(await slave.receive_exactly(header.size))
                expected_offset += header.size
            nursery.cancel_scope.cancel()
        assert b"".join(received) == log_bytes(broker.store, end)
    finally:
        broker.store.close()


async def test_a_push_never_writes_to_a_descriptor_number_reused_after_the_close(tmp_path):
    """An append pushed to a slave connection that has closed (its writer not yet gone from the
    service) must not reach whichever socket was given the closed one's number next."""
    broker, service, writer, connection, right = _master_with_a_slave_writer(tmp_path)
    writer.busy = False  # idle, waiting for appends: a push may send
    number = connection.raw_fileno
    await connection.stream.aclose()
    newcomer, its_peer = socket.socketpair()
    reused = newcomer.fileno() == number
    try:
        if not reused:
            os.dup2(newcomer.fileno(), number)
        broker.put_service.append(cp.SendRequest("T", 0, [b"x" * 100], [b""], 0, 0))
        service.push()
        its_peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            its_peer.recv(100)
        assert writer.cursor.offset == 0  # nothing counted as sent
    finally:
        if not reused:
            os.close(number)
        for sock in (newcomer, its_peer, right):
            sock.close()
        broker.store.close()


async def test_a_push_that_leaves_part_of_the_appends_wakes_the_writer_task(tmp_path):
    """A pushed frame stops at the transfer batch size (and at a segment's end): the writer task
    must be woken for the rest, or it would wait for the next put or heartbeat with a SYNC_MASTER
    put's bytes unsent."""
    broker, service, writer, connection, right = _master_with_a_slave_writer(tmp_path, ha_transfer_batch_size=4096)
    try:
        writer.busy = False
        broker.put_service.append(cp.SendRequest("T", 0, [b"x" * 1000], [b""], 0, 0))
        service.push()  # all of it fits one frame: nothing left for the task
        header = ha.decode_transfer_header(right.recv(12), size_max=1 << 20)
        assert header.offset == 0 and len(right.recv(1 << 16)) == header.size == broker.store.commit_log.max_offset
        assert not writer.wakeup.is_set()
        broker.put_service.append(cp.SendRequest("T", 0, [b"y" * 1000] * 10, [b""] * 10, 0, 0))  # ~10 KiB: more than a batch
        service.push()
        header = ha.decode_transfer_header(right.recv(12), size_max=1 << 20)
        assert header.size <= 4096 and writer.cursor.offset < broker.store.commit_log.max_offset
        assert writer.wakeup.is_set()  # the task sends the rest
    finally:
        await connection.aclose()
        right.close()
        broker.store.close()


async def test_receive_into_fills_the_view_from_pieces_that_arrive_over_time():
    """The slave's frame body: read straight from the descriptor, waiting when the kernel has
    nothing yet; bytes already buffered by an earlier receive come first."""
    sender, receiver = await _connected_pair()
    payload = os.urandom(SIZE)
    target = bytearray(SIZE)
    try:
        async with trio.open_nursery() as nursery:

            async def trickle():
                await sender.send_all(payload[:100])
                await trio.testing.wait_all_tasks_blocked()  # the receiver found the socket empty and waits
                for start in range(100, SIZE, 1 << 20):
                    await sender.send_all(payload[start : start + (1 << 20)])

            nursery.start_soon(trickle)
            assert await receiver.receive_exactly(10) == payload[:10]  # reads ahead: 90 bytes kept
            await receiver.receive_into(memoryview(target)[10:])
    finally:
        await sender.aclose()
        await receiver.aclose()
    assert target[10:] == payload[10:]


async def test_send_small_goes_after_a_send_in_progress_never_into_it():
    """A report written directly while another task is in send_all would land inside its
    bytes: then it waits its turn."""
    sender, receiver = await _connected_pair()
    big = os.urandom(SIZE)  # more than the socket buffers: send_all has to wait for the reader
    received = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender.send_all, big)
            await trio.testing.wait_all_tasks_blocked()  # send_all holds the lock, socket full
            first = os.read(receiver.raw_fileno, 1 << 20)  # room in the socket, send_all not yet back
            nursery.start_soon(_receive_all, receiver, SIZE + 8 - len(first), received)  # runs at our next yield
            await sender.send_small(b"REPORT!!")
        received[0] = first + received[0]
        await sender.send_small(b"ALONE...")  # nothing in progress: one write
        assert await receiver.receive_exactly(8) == b"ALONE..."
    finally:
        await sender.aclose()
        await receiver.aclose()
    assert received[0][:SIZE] == big and received[0][SIZE:] == b"REPORT!!"


async def test_receive_from_the_descriptor_keeps_trio_stream_semantics():
    """receive_some reads the descriptor directly on plain TCP: what has arrived (a wait when
    nothing has), a checkpoint even when the bytes were already there, b"" at the peer's close,
    BrokenResourceError on a reset and ClosedResourceError once closed here."""
    sender, receiver = await _connected_pair()
    try:
        async with trio.open_nursery() as nursery:

            async def later():
                await trio.testing.wait_all_tasks_blocked()  # the receiver found nothing and waits
                await sender.send_all(b"late")

            nursery.start_soon(later)
            assert await receiver.receive_some() == b"late"
        await sender.send_all(b"ready")
        await trio.lowlevel.wait_readable(receiver.raw_fileno)  # the bytes are there before the receive
        with trio.testing.assert_checkpoints():
            assert await receiver.receive_some() == b"ready"
        await sender.send_all(b"x")
        await trio.lowlevel.wait_readable(receiver.raw_fileno)
        with trio.CancelScope() as scope:
            scope.cancel()
            await receiver.receive_some()
        assert scope.cancelled_caught, "a cancelled task's receive raised Cancelled"
        with trio.fail_after(5):  # a receive that took the byte, then raised, would leave nothing
            assert await receiver.receive_some() == b"x"
        await sender.aclose()
        assert await receiver.receive_some() == b""
    finally:
        await receiver.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await receiver.receive_some()


async def test_receive_from_a_reset_connection_is_a_broken_resource():
    sender, receiver = await _connected_pair()
    raw = sender.stream.socket
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
    await sender.aclose()
    await trio.lowlevel.wait_readable(receiver.raw_fileno)  # the reset has arrived
    try:
        with pytest.raises(trio.BrokenResourceError, match="receive from server"):
            await receiver.receive_some()
    finally:
        await receiver.aclose()


async def test_a_readiness_group_reports_readable_members_until_their_bytes_are_taken():
    pairs = [await _connected_pair() for _ in range(3)]
    group = transport.ReadinessGroup()
    try:
        for index, (_, server) in enumerate(pairs):
            group.add(server.raw_fileno, index)
        await pairs[0][0].send_all(b"a")
        await pairs[2][0].send_all(b"c")
        with trio.fail_after(10):
            ready = set(await group.wait())
            while ready != {0, 2}:  # the second send may not have landed when the first woke us
                ready |= set(await group.wait())
        assert pairs[2][1].receive_now() == b"c"
        assert pairs[1][1].receive_now() is None  # nothing has arrived: no wait, no bytes
        with trio.fail_after(10):
            assert await group.wait() == [0]  # level-triggered: still unread; 2 was drained
        group.discard(pairs[0][1].raw_fileno)
        group.discard(pairs[0][1].raw_fileno)  # twice is harmless
        await pairs[1][0].send_all(b"b")
        with trio.fail_after(10):
            assert await group.wait() == [1]  # a discarded member is not reported, bytes or not
        await pairs[1][0].aclose()
        assert pairs[1][1].receive_now() == b"b"
        assert pairs[1][1].receive_now() == b""  # the end of the stream
    finally:
        group.close()
        for client, server in pairs:
            await client.aclose()
            await server.aclose()


async def test_receive_now_keeps_what_the_preface_read_ahead_first():
    client, server = await _connected_pair()
    try:
        await client.send_all(b"headbody")
        assert await server.receive_exactly(4) == b"head"
        assert server.take_buffered() == b"body"  # read ahead with the header
        assert server.take_buffered() == b""
        await server.stream.aclose()
        with pytest.raises(trio.ClosedResourceError):
            server.receive_now()
    finally:
        await client.aclose()


async def test_a_receive_after_a_short_read_waits_first_and_loses_no_bytes(monkeypatch):
    """After a read that took less than it asked (the kernel had nothing more), the next
    receive waits for bytes before reading: no read that finds nothing. Bytes that arrived in
    between are still returned at once (the wait is level-triggered), and a cancelled wait
    takes nothing."""
    sender, receiver = await _connected_pair()
    reads = []
    real_read = os.read

    def counting_read(fd, size):
        try:
            data = real_read(fd, size)
        except BlockingIOError:
            reads.append(None)
            raise
        reads.append(len(data))
        return data

    try:
        await sender.send_all(b"first")
        await trio.lowlevel.wait_readable(receiver.raw_fileno)
        assert await receiver.receive_some() == b"first"  # short: the kernel had nothing more
        monkeypatch.setattr(os, "read", counting_read)
        async with trio.open_nursery() as nursery:

            async def later():
                await trio.testing.wait_all_tasks_blocked()  # the receiver waits, it did not read
                assert reads == []
                await sender.send_all(b"late")

            nursery.start_soon(later)
            assert await receiver.receive_some() == b"late"
        assert reads == [4]  # one read, after the wait: none that found nothing
        await sender.send_all(b"already")
        await trio.lowlevel.wait_readable(receiver.raw_fileno)  # there before the receive asks
        with trio.fail_after(5):
            assert await receiver.receive_some() == b"already"
        await sender.send_all(b"kept")
        await trio.lowlevel.wait_readable(receiver.raw_fileno)
        with trio.CancelScope() as scope:
            scope.cancel()
            await receiver.receive_some()
        assert scope.cancelled_caught
        with trio.fail_after(5):
            assert await receiver.receive_some() == b"kept"
    finally:
        await sender.aclose()
        await receiver.aclose()


async def test_receive_head_reads_a_header_and_what_follows_it_in_one_read_and_keeps_the_rest():
    """A frame's header and the bytes after it land in one read (header, then the caller's
    buffer); bytes past the frame go back with ``unread`` and come first next time; a header
    split across reads, one byte at a time, is still whole."""
    sender, receiver = await _connected_pair()
    frames = [os.urandom(12) + os.urandom(n) for n in (100, 0, 3000, 7)]
    stream = b"".join(frames)
    buffer = memoryview(bytearray(4096))
    try:
        await sender.send_all(stream)  # all in one go: several frames per read
        await trio.lowlevel.wait_readable(receiver.raw_fileno)
        for frame in frames:
            header, got = await receiver.receive_head(12, buffer)
            assert header == frame[:12]
            size = len(frame) - 12
            assert buffer[: min(got, size)] == frame[12 : 12 + min(got, size)]
            if got > size:
                receiver.unread(buffer[size:got])
            elif got < size:
                await receiver.receive_into(buffer[got:size])
            assert bytes(buffer[:size]) == frame[12:]
        async with trio.open_nursery() as nursery:

            async def trickle():
                for byte in stream:
                    await sender.send_all(bytes([byte]))
                    await trio.testing.wait_all_tasks_blocked()

            nursery.start_soon(trickle)
            for frame in frames:
                header, got = await receiver.receive_head(12, buffer[:50])
                assert header == frame[:12] and got <= 1
                size = len(frame) - 12
                if got > size:
                    receiver.unread(buffer[size:got])
                elif got < size:
                    await receiver.receive_into(buffer[got:size])
                assert bytes(buffer[:size]) == frame[12:]
        await sender.send_all(b"H" * 12 + b"body" + b"h" * 12)
        await trio.lowlevel.wait_readable(receiver.raw_fileno)
        assert await receiver.receive_exactly(2) == b"HH"  # reads ahead: the rest is buffered here
        header, got = await receiver.receive_head(10, buffer[:4])  # from what is buffered
        assert (header, got, bytes(buffer[:4])) == (b"H" * 10, 4, b"body")
        receiver.unread(b"xy")
        assert await receiver.receive_exactly(14) == b"xy" + b"h" * 12
        await sender.aclose()
        with pytest.raises(EOFError):
            await receiver.receive_head(12, buffer)
    finally:
        await sender.aclose()
        await receiver.aclose()


async def test_a_readiness_pass_with_no_bytes_loses_no_wake_up():
    """With one member the group is not asked (the member's read finds out); a pass that read
    nothing, then a wait without a look first, still wakes for bytes that come later or that
    came before it."""
    client, server = await _connected_pair()
    group = transport.ReadinessGroup()
    try:
        group.add(server.raw_fileno, "only")
        with trio.testing.assert_checkpoints():
            assert await group.wait(look_first=True) == ["only"]  # nothing to read: no wait either
        assert server.receive_now() is None
        async with trio.open_nursery() as nursery:

            async def later():
                await trio.testing.wait_all_tasks_blocked()  # the group waits in trio
                await client.send_all(b"late")

            nursery.start_soon(later)
            with trio.fail_after(10):
                assert await group.wait(look_first=False) == ["only"]
        assert server.receive_now() == b"late"
        await client.send_all(b"early")
        await trio.lowlevel.wait_readable(server.raw_fileno)
        with trio.fail_after(10):
            assert await group.wait(look_first=False) == ["only"]  # already there: level-triggered
        assert server.receive_now() == b"early"
        other_client, other_server = await _connected_pair()
        try:
            group.add(other_server.raw_fileno, "other")
            await other_client.send_all(b"x")
            await trio.lowlevel.wait_readable(other_server.raw_fileno)
            with trio.fail_after(10):  # two members: the set is asked which one is readable
                assert await group.wait(look_first=True) == ["other"]
                assert await group.wait(look_first=False) == ["other"]
            group.discard(other_server.raw_fileno)
        finally:
            await other_client.aclose()
            await other_server.aclose()
    finally:
        group.close()
        await client.aclose()
        await server.aclose()


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "pwrite"])
async def test_the_slave_takes_frames_however_their_bytes_are_cut(tmp_path, splice):
    """The slave reads a frame's header with what has arrived of its body (one read), gives
    the next frame's bytes back, and splices the rest of a large frame after the part that came
    with its header: frames sent together, heartbeats between them, a large frame then small
    ones, and all of it again one uneven piece at a time, land in the log byte for byte."""
    from hasvc.broker.ha_slave import SPLICE_FRAME_MIN, HAClient
    from hasvc.state.role import RoleState

    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SLAVE, master_ha=("127.0.0.1", 1),
                          commitlog_segment_size=4 * 1024 * 1024, ha_frame_size_max=1024 * 1024,
                          ha_transfer_batch_size=1024 * 1024)  # fmt: skip
    store = MessageStore.open(str(tmp_path), config.store_config())
    client = HAClient(config=config, store=store, role=RoleState(BrokerRole.SLAVE, config.master_ha),
                      listen_address=("127.0.0.1", 2), truncation_locks=(), after_appends=lambda: None)  # fmt: skip
    sizes = [1100, 0, 35_000, 0, 1024 * 1024, 70_000, 1100, 1, 0, SPLICE_FRAME_MIN, 200_000, 1100]
    payload = os.urandom(2 * sum(sizes))
    stream, offset = bytearray(), 0
    for round_ in range(2):
        for size in sizes:
            stream += ha.encode_transfer_header(offset, size) + payload[offset : offset + size]
            offset += size
        if round_ == 0:
            first_round = len(stream)
    master, slave = await _connected_pair()
    watchdog = transport.Watchdog(60, "nothing from the master")
    try:
        async with trio.open_nursery() as nursery:
            pipe = transport.SplicePipe() if splice and transport.SPLICE_AVAILABLE else None
            nursery.start_soon(client._receive_frames, slave, watchdog, pipe)
            await master.send_all(bytes(stream[:first_round]))  # at once: many frames a read
            await trio.testing.wait_all_tasks_blocked()  # the slave took all and waits for more
            assert store.commit_log.max_offset == sum(sizes)
            cut, step = first_round, 1
            while cut < len(stream):  # pieces of 1, 7, 49, ... bytes: headers and bodies split anywhere
                await master.send_all(bytes(stream[cut : cut + step]))
                await trio.testing.wait_all_tasks_blocked()
                cut, step = cut + step, step * 7 % 100_003
            assert store.commit_log.max_offset == offset
            nursery.cancel_scope.cancel()
            if pipe is not None:
                pipe.close()
        assert bytes(store.read(0, offset)) == payload[:offset]
    finally:
        await master.aclose()
        await slave.aclose()
        store.close()


@pytest.mark.parametrize("drained", [False, True], ids=["reads-first", "waits-first"])
@pytest.mark.parametrize("kind", ["receive_some", "receive_into"])
async def test_a_receive_waiting_when_its_connection_is_closed_here_raises_closed(drained, kind):
    """The descriptor's number is looked up once per receive: a close by another task during
    the wait ends the wait with ClosedResourceError, never a read of a reused number."""
    sender, receiver = await _connected_pair()
    try:
        if drained:
            await sender.send_all(b"x")
            await trio.lowlevel.wait_readable(receiver.raw_fileno)
            assert await receiver.receive_some() == b"x"  # short: the next receive waits first
        async with trio.open_nursery() as nursery:

            async def close_later():
                await trio.testing.wait_all_tasks_blocked()
                await receiver.stream.aclose()

            nursery.start_soon(close_later)
            with pytest.raises(trio.ClosedResourceError):
                if kind == "receive_some":
                    await receiver.receive_some()
                else:
                    await receiver.receive_into(memoryview(bytearray(10)))
    finally:
        await sender.aclose()
        await receiver.aclose()


@pytest.mark.parametrize("peer", ["resets", "closes"])
async def test_a_tls_handshake_the_peer_breaks_off_is_a_connect_error_naming_it(tmp_path, peer):
    """A member killed between accepting and finishing the handshake: the connect fails as a
    refused one does (OSError to the transport's callers, one ConnectError line to a client),
    never trio's BrokenResourceError, which a failover client's search took for a bug."""
    from hasvc.client.connection import ConnectError, connect
    from tests.cluster import self_signed_certificate

    _key, cert = self_signed_certificate(str(tmp_path))
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    host, port = listener.getsockname()[:2]

    async def break_off():
        server, _ = await listener.accept()
        await server.recv(1)  # the ClientHello's first byte
        if peer == "resets":
            server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()

    for _attempt in range(2):  # the transport's connect, then the client's
        async with trio.open_nursery() as nursery:
            nursery.start_soon(break_off)
            if _attempt == 0:
                with pytest.raises(ConnectionError, match=f"TLS handshake with {host}:{port} failed"):
                    await transport.connect((host, port), ssl_context=transport.client_ssl_context(ca=cert))
            else:
                with pytest.raises(ConnectError, match=f"^TLS handshake with {host}:{port} failed: .*--tls-ca"):
                    async with connect(f"{host}:{port}", tls_ca=cert):
                        pass
    listener.close()
