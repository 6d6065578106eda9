"""A Raft sender notices that its peer closed the connection without writing anything to it.

Connections between members carry messages one way, so a follower's connection to another
follower is idle between elections. A peer that died and came back used to be noticed only when
the next message -- the vote request of the election after a leader's death -- was written into
the dead connection and lost, splitting the vote (drill: failovers of 1.4-1.8 s instead of ~0.35 s).
"""

from __future__ import annotations

import functools
import types

import trio
import trio.testing

from hasvc import transport
from hasvc.broker.raft.driver import RaftDriver
from hasvc.broker.raft.group import GroupConfig
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.messages import VoteRequest
from hasvc.state.raft.ready import Ready
from hasvc.testing.log import SimLog

WAIT_SECONDS = 10.0


def _driver_of_n0(n1_port: int) -> RaftDriver:
    """Member n0's driver, its peer n1 at ``n1_port`` (n2 unreachable), over an in-memory log."""
    log = SimLog()
    log.data_start_offset = 0
    group = GroupConfig("g", "n0", {"n0": ("127.0.0.1", 1), "n1": ("127.0.0.1", n1_port), "n2": ("127.0.0.1", 1)},
                        RaftConfig())  # fmt: skip
    return RaftDriver(group=group, store=types.SimpleNamespace(entries=log, disk_full=lambda: None), secret=None,
                      on_commit=lambda *_: None, on_role=lambda *_: None)  # fmt: skip


async def test_a_sender_reconnects_when_its_idle_peer_closes_the_connection():
    hellos: list[int] = []
    second = trio.Event()

    async def fake_peer(stream: trio.SocketStream) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        await stream.receive_some(4096)  # the HELLO
        hellos.append(1)
        if len(hellos) == 1:
            await stream.aclose()  # the peer "dies": the sender has nothing to write
        else:
            second.set()
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, fake_peer, 0, host="127.0.0.1"))
        nursery.start_soon(_driver_of_n0(listeners[0].socket.getsockname()[1]).senders.sender, "n1")
        with trio.fail_after(WAIT_SECONDS):
            await second.wait()  # reconnected with nothing queued for n1
        assert len(hellos) == 2
        nursery.cancel_scope.cancel()


async def test_a_peer_that_closes_at_once_is_not_reconnected_to_in_a_tight_loop():
    """A peer that refuses this member's HELLO closes the connection at once: the sender backs off
    as for a failed connect (RAFT_RECONNECT_MIN_SECONDS doubling), it does not spin. The bound is
    an upper one: a slower machine only makes fewer connections."""
    connections = 0

    async def refusing_peer(stream: trio.SocketStream) -> None:
        nonlocal connections
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        await stream.receive_some(4096)  # the HELLO, refused
        connections += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, refusing_peer, 0, host="127.0.0.1"))
        nursery.start_soon(_driver_of_n0(listeners[0].socket.getsockname()[1]).senders.sender, "n1")
        await trio.sleep(0.5)  # pauses 0.05 + 0.1 + 0.2 (+ 0.4): at most 4 or 5 connections
        assert 1 <= connections <= 6, connections
        nursery.cancel_scope.cancel()


async def _n0_sending_to_a_reading_n1(nursery: trio.Nursery, received: list, count: int, got_all: trio.Event):
    """n0's driver with its sender to n1 connected, n1 a listener that decodes what arrives into
    ``received`` and sets ``got_all`` after ``count`` events (the HELLO is the first)."""

    async def reading_peer(stream: trio.SocketStream) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        decoder = raft_wire.RaftDecoder()
        while len(received) < count:
            decoder.receive_data(await stream.receive_some(4096))
            while (event := decoder.next_event()) is not None:
                received.append(event)
        got_all.set()
        await trio.sleep_forever()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, reading_peer, 0, host="127.0.0.1"))
    driver = _driver_of_n0(listeners[0].socket.getsockname()[1])
    nursery.start_soon(driver.senders.sender, "n1")
    with trio.fail_after(WAIT_SECONDS):
        while not driver.connected["n1"]:
            await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked()
    return driver


async def test_the_messages_of_one_ready_for_a_peer_go_in_one_write():
    """A Ready's messages for one peer -- a pass of puts at 64 producers x 32 messages makes
    several pushes to each follower -- are written with one ``writev`` from the driver while the
    peer's sender is idle (a write each was a system call and a wake-up of the peer per push),
    and arrive whole and in their order."""
    received: list = []
    got_all = trio.Event()
    messages = [VoteRequest("n0", "n1", term, 5, 1) for term in (2, 3, 4)]

    async with trio.open_nursery() as nursery:
        driver = await _n0_sending_to_a_reading_n1(nursery, received, 1 + len(messages), got_all)  # the HELLO, then the messages
        link = driver.senders.links["n1"]
        writes = []
        writev_now = link.writev_now
        link.writev_now = lambda parts: writes.append(len(parts)) or writev_now(parts)
        driver.node.ready = lambda: Ready(messages=tuple(messages))  # a Ready with three messages for n1
        driver.drain()
        assert writes == [len(messages)]  # one writev, a frame each
        with trio.fail_after(WAIT_SECONDS):
            await got_all.wait()
        assert received[1:] == messages
        nursery.cancel_scope.cancel()


async def test_what_the_one_write_did_not_send_is_the_rest_of_one_message_and_the_messages_after_it():
    """A socket that takes only part of the write (a pass of pushes larger than its buffer): the
    rest of the message it stopped in is queued as bytes, the messages after it as messages (their
    sender frames them when it sends them), not a copy of every unsent byte; the peer gets every
    message whole and in order."""
    received: list = []
    got_all = trio.Event()
    messages = [VoteRequest("n0", "n1", term, 5, 1) for term in (2, 3, 4, 5)]

    async with trio.open_nursery() as nursery:
        driver = await _n0_sending_to_a_reading_n1(nursery, received, 1 + len(messages), got_all)
        link = driver.senders.links["n1"]
        frame = len(raft_wire.encode(messages[0]))
        writev_now = link.writev_now
        link.writev_now = lambda parts: writev_now([b"".join(parts)[: frame + 3]])  # the second one begun
        queued = []
        send_nowait = driver.senders.queues["n1"][0].send_nowait
        driver.senders.queues["n1"] = (types.SimpleNamespace(send_nowait=lambda item: queued.append(item) or send_nowait(item)),
                                driver.senders.queues["n1"][1])  # fmt: skip
        driver.node.ready = lambda: Ready(messages=tuple(messages))
        driver.drain()
        assert [type(item).__name__ for item in queued] == ["_Rest", "VoteRequest", "VoteRequest"]
        assert queued[0].data == raft_wire.encode(messages[1])[3:] and queued[1:] == messages[2:]
        link.writev_now = writev_now
        with trio.fail_after(WAIT_SECONDS):
            await got_all.wait()
        assert received[1:] == messages
        nursery.cancel_scope.cancel()
