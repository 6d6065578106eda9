"""The client port's reader (``ClientPort._read_client``) in one process, against a put path that
only records what it is handed: a receive that is exactly one SEND frame is queued for the pass
straight from the read, and must be the frame the decoder would give, under the same checks
(frame size, the connection's places in flight) as every other frame. Plain sockets
(TCP on loopback), so the connection is read by the port's readiness group."""

from __future__ import annotations

import contextlib
import socket
import types

import trio
import trio.testing

from hasvc import transport
from hasvc.broker.client_port import ClientPort
from hasvc.protocol import client as cp
from hasvc.protocol import wire

FRAME_SIZE_MAX = 4096


class _RecordingPuts:
    """A put path that decodes SENDs with its pass (as the native one does) and answers none."""

    decodes_sends = True

    def __init__(self) -> None:
        self.items: list = []

    def put_items(self, items: list) -> None:
        self.items += items


def _port(puts: _RecordingPuts, *, requests_in_flight_max: int) -> ClientPort:
    config = types.SimpleNamespace(
        connections_max=16, secret=None, frame_size_max=FRAME_SIZE_MAX, requests_in_flight_max=requests_in_flight_max,
        client_answer_bytes_max=1 << 20, client_answer_bytes_total_max=1 << 24, client_muted_timeout_seconds=60.0,
    )  # fmt: skip
    return ClientPort(config=config, store=None, puts=puts, status=lambda: {"role": "test"},
                      promote=None, demote=None)  # fmt: skip


def _send_frame(request_id: int, body: bytes) -> bytes:
    return cp.encode_frame(cp.SEND, request_id, cp.encode_send(cp.SendRequest("T", 0, [body], [b""], 0, 0)))


async def _connected(nursery: trio.Nursery, port: ClientPort) -> trio.SocketStream:
    """A client connection served by ``port``, past its preface."""
    with socket.create_server(("127.0.0.1", 0)) as listener:  # TCP: the port names its peer by address
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    nursery.start_soon(port.serve_client, trio.SocketStream(trio.socket.from_stdlib_socket(server)))
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(client))
    await transport.client_preface(transport.Connection(stream, "port"), port_kind=wire.PORT_KIND_CLIENT, secret=None)
    return stream


@contextlib.asynccontextmanager
async def _port_and_client(requests_in_flight_max: int):
    """A port whose put path records what it is given, serving one client connection: (the
    recorder, the client's stream)."""
    puts = _RecordingPuts()
    port = _port(puts, requests_in_flight_max=requests_in_flight_max)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(port.append_task)
        yield puts, await _connected(nursery, port)
        nursery.cancel_scope.cancel()


async def _until(predicate) -> None:
    with trio.fail_after(10):
        while not predicate():
            await trio.sleep(0.01)


async def test_a_send_in_one_receive_is_the_frame_the_decoder_gives():
    async with _port_and_client(8) as (puts, stream):
        frame = _send_frame(7, b"body")
        await stream.send_all(frame)
        await _until(lambda: puts.items)
        outbox, got, request = puts.items[0]
        expected = cp.FrameDecoder(responses=False)
        expected.receive_data(frame)
        want = expected.next_frame()
        assert (got.kind, got.request_id, bytes(got.payload)) == (want.kind, want.request_id, bytes(want.payload))
        assert isinstance(got.payload, memoryview) and got.payload.readonly
        assert request is None and outbox.in_flight == 1


async def test_a_send_in_one_receive_waits_for_a_place_in_flight():
    """``requests_in_flight_max`` 1: the second SEND, alone in its receive, is taken only once
    the first is answered (taken at once, it was a second request in flight)."""
    async with _port_and_client(1) as (puts, stream):
        await stream.send_all(_send_frame(1, b"first"))
        await _until(lambda: puts.items)
        await stream.send_all(_send_frame(2, b"second"))
        for _ in range(20):  # the port reads it (and must leave it) meanwhile
            await trio.sleep(0.01)
        assert [frame.request_id for _, frame, _ in puts.items] == [1]
        outbox, first, _ = puts.items[0]
        assert outbox.in_flight == 1
        outbox.respond(first, b"answered")
        outbox.flush()
        await _until(lambda: len(puts.items) >= 2)
        assert [frame.request_id for _, frame, _ in puts.items] == [1, 2]
        assert outbox.in_flight == 1


async def test_an_oversize_send_in_one_receive_closes_the_connection_unput():
    async with _port_and_client(8) as (puts, stream):
        frame = _send_frame(1, b"x" * FRAME_SIZE_MAX)  # whole, but past frame_size_max
        assert len(frame) > FRAME_SIZE_MAX + cp.FRAME_HEADER.size
        await stream.send_all(frame)
        with trio.fail_after(10):
            while await stream.receive_some(65536):
                pass  # closed by the port
        assert puts.items == []


async def test_the_sends_of_a_receive_are_queued_in_order_each_holding_a_place():
    """Many SENDs a receive (one cut across two receives): queued for the pass in the order sent,
    each the frame the decoder gives, each holding a place; past ``requests_in_flight_max`` the
    rest wait until answers free places."""
    frames = [_send_frame(number, bytes([number]) * number) for number in range(1, 8)]
    stream_bytes = b"".join(frames)
    cut = len(b"".join(frames[:4])) + 5  # inside the fifth frame's header
    async with _port_and_client(5) as (puts, stream):
        await stream.send_all(stream_bytes[:cut])
        await _until(lambda: len(puts.items) >= 4)
        await stream.send_all(stream_bytes[cut:])
        await _until(lambda: len(puts.items) >= 5)
        for _ in range(20):  # the port has read the rest (and must leave it) meanwhile
            await trio.sleep(0.01)
        assert [frame.request_id for _, frame, _ in puts.items] == [1, 2, 3, 4, 5]
        outbox = puts.items[0][0]
        assert outbox.in_flight == 5
        for _, frame, _ in puts.items[:2]:
            outbox.respond(frame, b"answered")
        outbox.flush()
        await _until(lambda: len(puts.items) >= 7)
        assert [(frame.kind, frame.request_id, bytes(frame.payload)) for _, frame, _ in puts.items] == [
            (cp.SEND, number, cp.encode_send(cp.SendRequest("T", 0, [bytes([number]) * number], [b""], 0, 0))) for number in range(1, 8)]
        assert all(request is None and isinstance(frame.payload, memoryview) for _, frame, request in puts.items)
        assert outbox.in_flight == 5


async def test_the_sends_before_a_refused_frame_are_queued_and_the_connection_closed():
    """A receive of two SENDs and then a frame of an unknown kind: the SENDs are queued (as the
    one-frame-at-a-time decoder handed them out before refusing the next), the connection closes."""
    async with _port_and_client(8) as (puts, stream):
        await stream.send_all(_send_frame(1, b"a") + _send_frame(2, b"b") + cp.FRAME_HEADER.pack(6, 99, 3) + b"x")
        with trio.fail_after(10):
            while await stream.receive_some(65536):
                pass  # closed by the port
        assert [frame.request_id for _, frame, _ in puts.items] == [1, 2]
