"""What a member's sender waits to send to a peer that does not read: counted per peer
(STATUS ``peers.*.bytes_queued``) and summed in the metrics (``hasvc_raft_bytes_queued``,
``hasvc_raft_connections_muted``), back to zero once the peer is gone."""

from __future__ import annotations

import functools
import socket

import trio
import trio.testing
from prometheus_client import CollectorRegistry

from hasvc import transport
from hasvc.broker.raft.peers import RAFT_SEND_WRITE_SIZE_MAX, _Rest
from hasvc.broker.raft_metrics import RaftMetrics
from hasvc.protocol import wire
from tests.driver.test_raft_sender import WAIT_SECONDS, _driver_of_n0

REST_SIZE = 16 * 1024 * 1024  # far more than loopback's socket buffers hold


async def _sending_to_a_silent_peer(nursery, gone: trio.Event):
    """n0's Raft driver with its sender to n1 running and connected; n1 a peer on loopback (a
    small receive buffer) that answers the preface, then reads nothing more, and closes once
    ``gone`` is set."""
    prefaced = trio.Event()

    async def silent_peer(stream: trio.SocketStream) -> None:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        prefaced.set()
        await gone.wait()  # reads nothing more
        await stream.aclose()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, silent_peer, 0, host="127.0.0.1"))
    driver = _driver_of_n0(listeners[0].socket.getsockname()[1])
    nursery.start_soon(driver.senders.sender, "n1")
    with trio.fail_after(WAIT_SECONDS):
        await prefaced.wait()
        while not driver.connected["n1"]:
            await trio.sleep(0.01)
    return driver


async def test_a_peer_that_never_reads_shows_its_queued_bytes_until_it_closes():
    gone = trio.Event()
    async with trio.open_nursery() as nursery:
        driver = await _sending_to_a_silent_peer(nursery, gone)
        assert driver.senders.bytes_queued("n1") == 0 and driver.senders.bytes_queued("n2") == 0
        driver.senders.queues["n1"][0].send_nowait(_Rest(driver.senders.links["n1"], b"x" * REST_SIZE))
        await trio.testing.wait_all_tasks_blocked()
        waiting = driver.senders.bytes_queued("n1")
        assert 0 < waiting < REST_SIZE  # the socket took some, the rest waits

        status = {"peers": {"n1": {"bytes_queued": waiting}, "n2": {"bytes_queued": 0}}}
        metrics = RaftMetrics(status=lambda: status, registry=CollectorRegistry(), trio_token=trio.lowlevel.current_trio_token())
        shown = {family.name: family.samples for family in await trio.to_thread.run_sync(lambda: list(metrics.collect()))}
        assert shown["hasvc_raft_bytes_queued"][0].value == waiting
        assert shown["hasvc_raft_connections_muted"][0].value == 1
        assert {sample.labels["peer"]: sample.value for sample in shown["hasvc_peer_bytes_queued"]} == {"n1": waiting, "n2": 0}

        gone.set()  # the peer closes: the send fails, the connection ends, nothing waits any more
        with trio.fail_after(WAIT_SECONDS):
            while driver.connected["n1"]:
                await trio.sleep(0.01)
        assert driver.senders.bytes_queued("n1") == 0
        nursery.cancel_scope.cancel()


async def test_a_peer_that_never_reads_is_closed_after_the_stall_timeout_and_dialled_again():
    connections: list[trio.SocketStream] = []
    dialled_again = trio.Event()

    async def silent_peer(stream: trio.SocketStream) -> None:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        connections.append(stream)
        if len(connections) == 2:
            dialled_again.set()
        await trio.sleep_forever()  # reads nothing more, never closes

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, silent_peer, 0, host="127.0.0.1"))
        driver = _driver_of_n0(listeners[0].socket.getsockname()[1])
        driver.senders.stalled_timeout_seconds = 0.5  # raft_send_stalled_timeout_seconds, short for the test
        nursery.start_soon(driver.senders.sender, "n1")
        with trio.fail_after(WAIT_SECONDS):
            while not driver.connected["n1"]:
                await trio.sleep(0.01)
        assert driver.senders.closed_stalled == {"n1": 0, "n2": 0}
        assert driver.senders.statistics() == {"raft_connections_closed_stalled": 0}
        driver.senders.queues["n1"][0].send_nowait(_Rest(driver.senders.links["n1"], b"x" * REST_SIZE))
        with trio.fail_after(WAIT_SECONDS):
            while not driver.senders.bytes_queued("n1"):
                await trio.sleep(0.01)  # the write waits for the socket
            await dialled_again.wait()  # closed after the timeout, then dialled as after a lost connection
        assert driver.senders.closed_stalled == {"n1": 1, "n2": 0}
        assert driver.senders.statistics() == {"raft_connections_closed_stalled": 1}
        assert await connections[0].receive_some(REST_SIZE)  # the first connection's bytes, then its EOF
        with trio.fail_after(WAIT_SECONDS):
            while await connections[0].receive_some(REST_SIZE):
                pass
        assert driver.senders.bytes_queued("n1") == 0  # the new connection holds nothing
        nursery.cancel_scope.cancel()


async def test_a_peer_that_reads_slowly_is_not_closed_however_long_the_whole_write_takes():
    """The timeout bounds each piece of a write (RAFT_SEND_STALL_PIECE_SIZE), not the write: a
    drained queue of pushes to a peer that reads, slowly, is sent whole on its connection."""
    got = 0
    done = trio.Event()
    read_size, pause = 256 * 1024, 0.05  # at most 5 MiB/s: the 16 MiB take over 3 s, past the 2 s timeout

    async def slow_peer(stream: trio.SocketStream) -> None:
        nonlocal got
        connection = transport.Connection(stream, transport.peer_name(stream))
        await transport.server_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=None)
        while got < REST_SIZE:
            await trio.sleep(pause)
            data = await stream.receive_some(read_size)
            if not data:
                return
            got += len(data)
        done.set()
        await trio.sleep_forever()  # the connection stays up

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, slow_peer, 0, host="127.0.0.1"))
        driver = _driver_of_n0(listeners[0].socket.getsockname()[1])
        driver.senders.stalled_timeout_seconds = 2.0
        nursery.start_soon(driver.senders.sender, "n1")
        with trio.fail_after(WAIT_SECONDS):
            while not driver.connected["n1"]:
                await trio.sleep(0.01)
        link = driver.senders.links["n1"]
        started = trio.current_time()
        driver.senders.queues["n1"][0].send_nowait(_Rest(link, b"x" * REST_SIZE))
        with trio.fail_after(WAIT_SECONDS):
            await done.wait()
        assert trio.current_time() - started > driver.senders.stalled_timeout_seconds  # else this proves nothing
        assert driver.senders.closed_stalled["n1"] == 0 and driver.senders.links.get("n1") is link
        nursery.cancel_scope.cancel()


async def test_a_write_gathers_a_bounded_share_of_the_queue_and_the_rest_stays_queued():
    """What a peer that stops reading makes a member copy is one write's rest: a write gathers at
    most RAFT_SEND_WRITE_SIZE_MAX (and one message) of the queue, the rest stays queued."""
    piece = 1024 * 1024
    async with trio.open_nursery() as nursery:
        driver = await _sending_to_a_silent_peer(nursery, trio.Event())  # never set: the peer stays
        queue = driver.senders.queues["n1"]
        link = driver.senders.links["n1"]
        count = 4 * RAFT_SEND_WRITE_SIZE_MAX // piece
        for _ in range(count):
            queue[0].send_nowait(_Rest(link, b"x" * piece))
        with trio.fail_after(WAIT_SECONDS):
            while not driver.senders.bytes_queued("n1"):
                await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked()
        assert 0 < driver.senders.bytes_queued("n1") <= RAFT_SEND_WRITE_SIZE_MAX + piece
        assert queue[1].statistics().current_buffer_used >= count - (RAFT_SEND_WRITE_SIZE_MAX // piece + 1)
        nursery.cancel_scope.cancel()
