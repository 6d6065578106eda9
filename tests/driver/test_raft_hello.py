"""HELLO carries the sender's data-file size, and a member refuses a peer whose size differs.

The data-file size (``commitlog_segment_size``) decides every entry's ``pos`` and every blank
record, so members with different sizes cannot hold byte-identical logs: an APPEND from the one
fails the other's position check forever. The refusal comes at HELLO, with the reason in the log,
before any vote or push (docs/PROTOCOL.md §4, HELLO).
"""

from __future__ import annotations

import functools
import logging
import types

import trio
import trio.testing

from hasvc import transport
from hasvc.broker.raft.driver import RaftDriver
from hasvc.broker.raft.group import GroupConfig
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.messages import Heartbeat
from hasvc.testing.log import SimLog

WAIT_SECONDS = 10.0
FILE_SIZE = 1 << 30


def _driver(self_id: str, ports: dict[str, int], *, data_file_size: int) -> RaftDriver:
    log = SimLog()
    log.data_start_offset = 0
    log.data_file_size = data_file_size
    group = GroupConfig("g", self_id, {member: ("127.0.0.1", port) for member, port in ports.items()}, RaftConfig())
    return RaftDriver(group=group, store=types.SimpleNamespace(entries=log, disk_full=lambda: None), secret=None,
                      on_commit=lambda *_: None, on_role=lambda *_: None)  # fmt: skip


async def test_the_sender_says_its_data_file_size_in_its_hello():
    hellos: list[raft_wire.Hello] = []
    got = trio.Event()

    async def peer(stream: trio.SocketStream) -> None:
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        decoder = raft_wire.RaftDecoder()
        while not hellos:
            decoder.receive_data(await stream.receive_some(4096))
            event = decoder.next_event()
            if event is not None:
                hellos.append(event)
        got.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, peer, 0, host="127.0.0.1"))
        driver = _driver("n0", {"n0": 1, "n1": listeners[0].socket.getsockname()[1], "n2": 1},
                         data_file_size=64 * 1024 * 1024)  # fmt: skip
        nursery.start_soon(driver.senders.sender, "n1")
        with trio.fail_after(WAIT_SECONDS):
            await got.wait()
        assert hellos == [raft_wire.Hello("g", "n0", "n1", data_file_size=64 * 1024 * 1024)]
        nursery.cancel_scope.cancel()


async def _connect_as_n1(port: int, hello: raft_wire.Hello) -> transport.Connection:
    connection = await transport.connect(("127.0.0.1", port))
    await transport.client_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
    await connection.send_all(raft_wire.encode_hello(hello))
    return connection


async def _closed(connection: transport.Connection) -> bool:
    """Whether the member closed the connection (EOF or a reset) within WAIT_SECONDS."""
    with trio.move_on_after(WAIT_SECONDS):
        try:
            return await connection.stream.receive_some(4096) == b""
        except trio.BrokenResourceError:
            return True
    return False


async def test_a_hello_with_another_data_file_size_is_refused_with_the_reason(caplog):
    caplog.set_level(logging.WARNING, logger="hasvc")
    driver = _driver("n0", {"n0": 1, "n1": 1, "n2": 1}, data_file_size=FILE_SIZE)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, driver.listener.serve_peer, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        other = await _connect_as_n1(port, raft_wire.Hello("g", "n1", "n0", data_file_size=FILE_SIZE // 2))
        assert await _closed(other)
        assert driver.refused_connections == 1
        assert "n1's data files are 536870912 bytes, this member's 1073741824" in caplog.text
        assert "commitlog_segment_size" in caplog.text
        # The same size, and a HELLO that does not say one (an older member): accepted, and the
        # member steps what follows (a heartbeat makes n1 its leader).
        for term, size in ((1, FILE_SIZE), (2, 0)):
            same = await _connect_as_n1(port, raft_wire.Hello("g", "n1", "n0", data_file_size=size))
            await same.send_all(raft_wire.encode(Heartbeat("n1", "n0", term, -1)))
            with trio.fail_after(WAIT_SECONDS):
                while (driver.node.term, driver.node.leader_id) != (term, "n1"):
                    await trio.sleep(0.01)
            assert driver.refused_connections == 1
            await same.stream.aclose()
            with trio.fail_after(WAIT_SECONDS):
                while "n1" in driver.listener.inbound:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
