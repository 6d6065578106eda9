"""Pure parts of the broker: grouping SENDs read together, splitting a coalesced append."""

import os
import socket
import types

import pytest
import trio
import trio.testing

from commitlog import record as rec
from commitlog.commit_log import AppendResult
from hasvc import transport
from hasvc.broker.outbox import AnswerBudget, Outbox
from hasvc.broker.put_service import Appended, coalesce, split_appended
from hasvc.config import BrokerRole
from hasvc.protocol import client as cp
from hasvc.protocol.client_frames import encode_answers
from hasvc.state.role import RoleState


def request(topic="T", queue_id=0, bodies=(b"x",), flag=0):
    return cp.SendRequest(topic, queue_id, list(bodies), [b""] * len(bodies), flag, 0)


def test_coalesce_groups_the_sends_of_each_queue_and_keeps_their_order():
    sends = [(i, r) for i, r in enumerate([request(), request(), request(queue_id=1), request(), request(flag=4), request(queue_id=1)])]
    groups = coalesce(sends, bytes_max=1000)
    assert [[i for i, _ in group] for group in groups] == [[0, 1, 3], [2, 5], [4]]


def test_coalesce_keeps_every_send_once_and_each_queue_in_order():
    keys = [(t, q) for t in "AB" for q in range(3)]
    sends = [(i, request(topic=keys[i * 7 % 6][0], queue_id=keys[i * 7 % 6][1], bodies=[b"x" * (i % 5 * 100)])) for i in range(60)]
    groups = coalesce(sends, bytes_max=450)
    assert sorted(i for group in groups for i, _ in group) == list(range(60))
    by_queue: dict = {}
    for group in groups:
        assert len({(r.topic, r.queue_id, r.flag) for _, r in group}) == 1
        assert len(group) == 1 or sum(len(b) for _, r in group for b in r.bodies) <= 450
        by_queue.setdefault((group[0][1].topic, group[0][1].queue_id), []).extend(i for i, _ in group)
    assert len(by_queue) == 6 and all(order == sorted(order) for order in by_queue.values())


def test_coalesce_respects_the_byte_limit():
    sends = [(i, request(bodies=[b"x" * 400])) for i in range(5)]
    assert [len(g) for g in coalesce(sends, bytes_max=1000)] == [2, 2, 1]
    assert [len(g) for g in coalesce([(0, request(bodies=[b"x" * 5000]))], bytes_max=1000)] == [1]


def test_split_appended_gives_each_request_its_offsets():
    result = AppendResult(rec.PutMessageStatus.PUT_OK, wrote_offset=100, wrote_bytes=60, store_timestamp=1,
                          offsets=(100, 110, 130, 150), queue_offsets=(7, 8, 9, 10))  # fmt: skip
    pieces = split_appended(Appended(rec.PutMessageStatus.PUT_OK, "", result, 3), [1, 2, 1])
    assert [p.result.offsets for p in pieces] == [(100,), (110, 130), (150,)]
    assert [p.result.queue_offsets for p in pieces] == [(7,), (8, 9), (10,)]
    assert [p.result.next_offset for p in pieces] == [110, 150, 160]
    assert all(p.queue_id == 3 for p in pieces)


class _HeldConnection:
    """send_all blocks until the test lets it go, recording what was sent."""

    raw_fileno = -1  # not a socket: responses go through the writer task only

    def __init__(self):
        self.sent: list[bytes] = []
        self.release = trio.Event()

    async def send_all(self, data: bytes) -> None:
        await self.release.wait()
        self.sent.append(data)


async def test_outbox_bounds_requests_in_flight_and_sends_pending_responses_together():
    connection = _HeldConnection()
    outbox = Outbox(connection, 2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await outbox.reserve()
        await outbox.reserve()
        third = trio.Event()

        async def reserve_third():
            await outbox.reserve()
            third.set()

        nursery.start_soon(reserve_third)
        outbox.respond(cp.Frame(cp.SEND, 7, b""), b"a")
        outbox.respond(cp.Frame(cp.STATUS, 8, b""), b"bc")
        outbox.flush()  # not a socket: this wakes the writer task
        await trio.testing.wait_all_tasks_blocked()
        assert not third.is_set()  # both places held until the responses reach the kernel
        connection.release.set()
        await third.wait()
        assert outbox.in_flight == 1
        assert connection.sent == [
            cp.FRAME_HEADER.pack(6, cp.SEND | cp.RESPONSE_BIT, 7) + b"a" + cp.FRAME_HEADER.pack(7, cp.STATUS | cp.RESPONSE_BIT, 8) + b"bc"
        ]
        nursery.cancel_scope.cancel()


async def test_outbox_takes_a_pass_of_places_and_its_joined_answers_in_order_with_the_rest():
    """``take_places`` holds a place for each request of a pass (never past the limit); a pass's
    answers joined by ``encode_answers`` go out between what was queued before and after them,
    and free one place each once the kernel has them."""
    connection = _HeldConnection()
    outbox = Outbox(connection, 4)
    with pytest.raises(AssertionError):
        outbox.take_places(5)
    outbox.take_places(3)
    assert outbox.in_flight == 3
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await outbox.reserve()
        assert outbox.full
        sends = [(outbox, cp.Frame(cp.SEND, number, b""), None) for number in (1, 2, 3)]
        outbox.respond(cp.Frame(cp.STATUS, 9, b""), b"s")
        [(owner, joined, count)] = encode_answers(sends, [b"a", None, b"c"], b"P")
        assert owner is outbox and count == 2
        outbox.respond_joined(joined, count)
        outbox.respond(cp.Frame(cp.SEND, 2, b""), b"P" + b"b")
        outbox.flush()
        connection.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert outbox.in_flight == 0
        assert connection.sent == [b"".join(cp.FRAME_HEADER.pack(len(payload) + 5, kind | cp.RESPONSE_BIT, request_id) + payload
                                            for kind, request_id, payload in [(cp.STATUS, 9, b"s"), (cp.SEND, 1, b"Pa"),
                                                                              (cp.SEND, 3, b"Pc"), (cp.SEND, 2, b"Pb")])]  # fmt: skip
        nursery.cancel_scope.cancel()


class _SocketConnection:
    """A plain TCP connection's descriptor for ``flush``, and a send_all for the writer task."""

    def __init__(self, sock):
        self.sock = sock
        self.task_sent = b""

    @property
    def raw_fileno(self) -> int:
        return self.sock.fileno()  # -1 once closed, as transport.Connection's

    async def send_all(self, data: bytes) -> None:
        self.task_sent += data
        self.sock.setblocking(True)
        self.sock.sendall(data)
        self.sock.setblocking(False)


def _frame(kind, request_id, payload):
    return cp.FRAME_HEADER.pack(len(payload) + 5, kind | cp.RESPONSE_BIT, request_id) + payload


async def test_outbox_flush_sends_at_once_and_frees_the_places():
    left, right = socket.socketpair()
    left.setblocking(False)
    try:
        connection = _SocketConnection(left)
        outbox = Outbox(connection, 2)
        await outbox.reserve()
        await outbox.reserve()
        outbox.respond(cp.Frame(cp.SEND, 1, b""), b"a")
        outbox.respond(cp.Frame(cp.SEND, 2, b""), b"b")
        assert outbox.full
        outbox.flush()  # no writer task running: the caller sent them
        assert not outbox.full and outbox.in_flight == 0
        assert not outbox.writer_woken  # all sent: the writer task is not woken for nothing
        assert right.recv(100) == _frame(cp.SEND, 1, b"a") + _frame(cp.SEND, 2, b"b")
        outbox.flush()  # nothing queued: nothing sent
        assert connection.task_sent == b""
    finally:
        left.close()
        right.close()


async def test_outbox_flush_leaves_what_the_socket_refused_to_the_writer_task_in_order():
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    left.setblocking(False)
    try:
        connection = _SocketConnection(left)
        outbox = Outbox(connection, 4)
        big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket takes at once
        for request_id, payload in ((1, big), (2, b"after")):
            await outbox.reserve()
            outbox.respond(cp.Frame(cp.SEND, request_id, b""), payload)
        outbox.flush()
        assert outbox.in_flight == 2  # not all sent: the places stay held
        expected = _frame(cp.SEND, 1, big) + _frame(cp.SEND, 2, b"after")
        received = bytearray()

        def drain():
            right.settimeout(10)
            while len(received) < len(expected):
                received.extend(right.recv(1 << 20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(outbox.run)
            await trio.to_thread.run_sync(drain)  # all received: the writer task's last send is done
            await trio.testing.wait_all_tasks_blocked()  # and it is back waiting for work
            assert outbox.in_flight == 0
            nursery.cancel_scope.cancel()
        assert bytes(received) == expected
        assert 0 < len(connection.task_sent) < len(expected)  # the task sent the rest
    finally:
        left.close()
        right.close()


async def test_outbox_flush_never_writes_to_a_descriptor_number_reused_after_the_close():
    """A response completed after its connection closed must not go to whichever socket was
    given the closed one's number next (a newly accepted client then read an answer meant for
    someone else where it expected the server's greeting)."""
    left, right = socket.socketpair()
    left.setblocking(False)
    connection = transport.Connection(trio.SocketStream(trio.socket.from_stdlib_socket(left)), "peer")
    outbox = Outbox(connection, 2)
    await outbox.reserve()
    number = left.fileno()
    await connection.stream.aclose()
    newcomer, its_peer = socket.socketpair()
    reused = newcomer.fileno() == number  # the lowest free number: usually the closed one
    try:
        if not reused:
            os.dup2(newcomer.fileno(), number)  # make it so: the number names another connection
        outbox.respond(cp.Frame(cp.SEND, 1, b""), b"late answer")
        outbox.flush()
        its_peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            its_peer.recv(100)
    finally:
        if not reused:
            os.close(number)
        for sock in (newcomer, its_peer, right):
            sock.close()


class _Sent:
    def __init__(self):
        self.data = b""

    async def send_all(self, *parts) -> None:
        self.data += b"".join(parts)

    send_small = send_all


async def test_a_flushing_slave_reports_only_what_it_has_flushed():
    """With flush_before_ack, a report (a heartbeat between a frame and its flush included)
    acknowledges the flushed end, never the received one."""
    from hasvc.broker.ha_slave import HAClient
    from hasvc.protocol import ha

    def client_of(flush_before_ack):
        log = types.SimpleNamespace(max_offset=5000)
        config = types.SimpleNamespace(flush_before_ack=flush_before_ack)
        store = types.SimpleNamespace(commit_log=log)
        role = RoleState(BrokerRole.SLAVE, ("127.0.0.1", 1))
        return HAClient(config=config, store=store, role=role, listen_address=("127.0.0.1", 2),
                        truncation_locks=(), after_appends=lambda: None)  # fmt: skip

    client = client_of(True)
    client.reports.flushed_to(3000)
    sent = _Sent()
    await client.send_report(sent)
    assert ha.REPORT.unpack(sent.data) == (3000,)
    plain = client_of(False)
    sent = _Sent()
    await plain.send_report(sent)
    assert ha.REPORT.unpack(sent.data) == (5000,)


class _ChunkConnection:
    """send_all takes one chunk each time the test lets it, recording the sizes."""

    raw_fileno = -1

    def __init__(self):
        self.sizes: list[int] = []
        self.go = trio.Semaphore(0)

    async def send_all(self, data) -> None:
        await self.go.acquire()
        self.sizes.append(len(data))


async def test_outbox_mutes_a_connection_above_its_bytes_and_unmutes_it_at_half():
    connection = _ChunkConnection()
    budget = AnswerBudget(64 * 1024 * 1024)
    outbox = Outbox(connection, 100, bytes_max=3 * 1024 * 1024, budget=budget)
    big = b"x" * (2 * 1024 * 1024)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        outbox.take_place()
        outbox.respond_counted(cp.Frame(cp.READ, 1, b""), big)
        assert not outbox.muted and not outbox.full
        outbox.take_place()
        outbox.respond_counted(cp.Frame(cp.READ, 2, b""), big)
        assert outbox.muted and outbox.full  # above 3 MiB: no place for the next request, whatever in_flight is
        assert budget.connections_muted == 1 and budget.bytes_queued == outbox.bytes_queued == 2 * (len(big) + 9)
        outbox.flush()  # wakes the writer: the 4 MiB go in 1 MiB chunks
        for _ in range(2):
            connection.go.release()
            await trio.testing.wait_all_tasks_blocked()
        assert outbox.muted  # 2 MiB + 18 bytes left: above half of 3 MiB
        connection.go.release()
        await trio.testing.wait_all_tasks_blocked()
        assert not outbox.muted and budget.connections_muted == 0  # 1 MiB + 18 left: at most half
        for _ in range(2):
            connection.go.release()
        await trio.testing.wait_all_tasks_blocked()
        assert connection.sizes == [1024 * 1024] * 4 + [18]
        assert outbox.bytes_queued == budget.bytes_queued == 0 and outbox.in_flight == 0
        nursery.cancel_scope.cancel()


async def test_outbox_muted_past_its_timeout_raises_and_gives_its_bytes_back(autojump_clock):
    connection = _ChunkConnection()  # never lets a chunk go: a peer that does not read
    budget = AnswerBudget(64 * 1024 * 1024)
    outbox = Outbox(connection, 100, bytes_max=1024, budget=budget, muted_timeout_seconds=30.0)
    outbox.take_place()
    outbox.respond_counted(cp.Frame(cp.READ, 1, b""), b"x" * 2000)
    assert outbox.muted
    started = trio.current_time()
    with pytest.raises(trio.TooSlowError, match="unread for 30 s"):
        await outbox.wait_room()
    assert trio.current_time() - started == pytest.approx(30.0)
    assert budget.muted_closed == 1
    outbox.discard()
    assert budget.bytes_queued == 0 and budget.connections_muted == 0
