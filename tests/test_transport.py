"""The transport's file sending over a real loopback TCP connection: ``send_file`` hands segment
bytes to the kernel with ``os.sendfile``, waits when the socket is full, and the HA writer's
segment handle follows the store's segments (a truncated and recreated segment is reopened)."""

import os

import trio
import trio.testing

from commitlog.mapped_file import MappedFile, segment_name
from hasvc import transport
from hasvc.ha_master import _OpenSegment

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


def test_streams_other_than_plain_tcp_do_not_claim_sendfile():
    assert not transport.Connection(trio.testing.MemorySendStream(), "memory").can_send_file
