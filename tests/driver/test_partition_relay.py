"""The partition relay (hasvc.tools.partition) on real loopback sockets: forwards, cuts both ways
like a network that drops packets, heals; waits on the link's own counters, never on sleeps."""

from __future__ import annotations

import pytest
import trio

from hasvc.tools.partition import PartitionRelay, free_port

TEST_TIMEOUT_SECONDS = 10  # a relay that fails to cut or heal leaves a receive waiting: fail, do not hang


async def _echo_server(nursery: trio.Nursery, accepted: list) -> tuple[str, int]:
    async def echo(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    listeners = await nursery.start(trio.serve_tcp, echo, 0)
    return listeners[0].socket.getsockname()[:2]


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


async def _relay_to_echo(nursery: trio.Nursery, accepted: list) -> PartitionRelay:
    echo_address = await _echo_server(nursery, accepted)
    relay = PartitionRelay({"n0": ("127.0.0.1", 1), "n1": echo_address})
    await relay.start(nursery)
    return relay


async def test_forwards_both_ways_and_names_peers() -> None:
    async with trio.open_nursery() as nursery:
        accepted: list = []
        relay = await _relay_to_echo(nursery, accepted)
        link = relay.links[("n0", "n1")]
        peers = relay.peers_for("n0")
        assert peers.startswith("n0-127.0.0.1:1;n1-127.0.0.1:") and peers.endswith(str(link.address[1]))
        async with await trio.open_tcp_stream(*link.address) as stream:
            await stream.send_all(b"hello")
            assert await _receive_exactly(stream, 5) == b"hello"
        assert link.bytes_forwarded == 10 and len(accepted) == 1
        nursery.cancel_scope.cancel()


async def test_isolate_closes_live_connections_and_black_holes_new_ones() -> None:
    with trio.fail_after(TEST_TIMEOUT_SECONDS):
        await _isolate_and_heal()


async def _isolate_and_heal() -> None:
    async with trio.open_nursery() as nursery:
        accepted: list = []
        relay = await _relay_to_echo(nursery, accepted)
        link = relay.links[("n0", "n1")]
        live = await trio.open_tcp_stream(*link.address)
        await live.send_all(b"x")
        assert await _receive_exactly(live, 1) == b"x"

        relay.isolate("n1")
        assert link.cut and relay.links[("n1", "n0")].cut
        assert await live.receive_some(10) == b""  # closed, not left with half a frame
        await live.aclose()

        async with await trio.open_tcp_stream(*link.address) as dark:
            await dark.send_all(b"lost")
            await link.wait_until(lambda it: it.bytes_dropped == 4)
            assert len(accepted) == 1  # nothing reached the member
            relay.heal("n1")
            assert await dark.receive_some(10) == b""  # healed: the black hole is closed
        async with await trio.open_tcp_stream(*link.address) as again:
            await again.send_all(b"back")
            assert await _receive_exactly(again, 4) == b"back"
        assert len(accepted) == 2
        nursery.cancel_scope.cancel()


async def test_isolating_one_member_leaves_the_others_linked() -> None:
    relay = PartitionRelay({"n0": ("127.0.0.1", 1), "n1": ("127.0.0.1", 2), "n2": ("127.0.0.1", 3)})
    relay.isolate("n0")
    assert {pair for pair, link in relay.links.items() if link.cut} == {
        ("n0", "n1"),
        ("n1", "n0"),
        ("n0", "n2"),
        ("n2", "n0"),
    }
    relay.heal()
    assert not any(link.cut for link in relay.links.values())
    with pytest.raises(KeyError, match="unknown member 'n9'"):
        relay.isolate("n9")


async def test_a_target_that_is_down_closes_the_connection() -> None:
    async with trio.open_nursery() as nursery:
        relay = PartitionRelay({"n0": ("127.0.0.1", 1), "n1": ("127.0.0.1", free_port())})
        await relay.start(nursery)
        async with await trio.open_tcp_stream(*relay.links[("n0", "n1")].address) as stream:
            assert await stream.receive_some(10) == b""
        nursery.cancel_scope.cancel()
