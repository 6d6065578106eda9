"""hasvc's Client writes the only request out at once (``Client._request`` through
``Connection.write_now``) and hands the writer task what the socket does not take: on a socket
pair with small buffers, frames far larger than the buffers reach the broker whole and in order,
one caller after another and several callers at once."""

import socket

import trio

from hasvc import transport
from hasvc.client import connection as hconn
from hasvc.protocol import client as cp

BUFFER_BYTES = 8192  # far below the frames: every large write is partial


class EchoBroker:
    """Reads SEND_IDEMPOTENT frames (after a pause, so the client's socket fills) and answers
    each with the body's length as its offset."""

    def __init__(self, stream):
        self.stream = stream
        self.bodies: list[bytes] = []

    async def run(self) -> None:
        decoder = cp.FrameDecoder(responses=False)
        await trio.sleep(0.05)
        while data := await self.stream.receive_some(BUFFER_BYTES):
            decoder.receive_data(data)
            while (frame := decoder.next_frame()) is not None:
                request = cp.decode_send(bytes(frame.payload), idempotent=True)
                self.bodies.extend(request.bodies)
                payload = cp.encode_send_response_fields("PUT_OK", "", request.queue_id, [len(request.bodies[0])], [0])
                await self.stream.send_all(cp.encode_frame(frame.kind | cp.RESPONSE_BIT, frame.request_id, payload))


def _small_socket_pair():
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), trio.SocketStream(trio.socket.from_stdlib_socket(theirs))


def _body(index: int, size: int) -> bytes:
    return bytes([index % 251]) * size


async def test_large_frames_written_at_once_or_by_the_writer_arrive_whole_and_in_order():
    client_end, broker_end = _small_socket_pair()
    client = hconn.Client(transport.Connection(client_end, "pair"))
    broker = EchoBroker(broker_end)
    sizes = [1 << 20, 10, 300_000, 1, 2 << 20]
    with trio.fail_after(30):  # a lost tail of a frame would leave the broker waiting: fail, not hang
        await _exchange(client, broker, sizes)
    assert broker.bodies[: len(sizes)] == [_body(i, s) for i, s in enumerate(sizes)]
    assert sorted(broker.bodies[len(sizes) :]) == sorted(_body(i, s) for i, s in enumerate(sizes, start=len(sizes)))
    assert not client._pending and not client._outgoing


async def _exchange(client, broker, sizes) -> None:
    async with trio.open_nursery() as nursery:
        for loop in (client._receive_loop, client._send_loop, client._timeout_loop, broker.run):
            nursery.start_soon(loop)
        for index, size in enumerate(sizes):  # one caller: each request is the only one out
            (result,) = await client.send_batch("T", [_body(index, size)], producer_id="p", first_sequence=index)
            assert (result.status, result.offset) == ("PUT_OK", size)
        answers: dict[int, int] = {}

        async def concurrent(index: int, size: int) -> None:
            (result,) = await client.send_batch("T", [_body(index, size)], producer_id="p", first_sequence=index)
            answers[index] = result.offset

        async with trio.open_nursery() as callers:  # several at once: the first may write, the rest queue
            for index, size in enumerate(sizes, start=len(sizes)):
                callers.start_soon(concurrent, index, size)
        assert answers == {index: size for index, size in enumerate(sizes, start=len(sizes))}
        nursery.cancel_scope.cancel()
