"""The controller client against fake controllers on loopback: it follows NOT_LEADER to the leader,
tries the others when one is down or names no leader, and gives up with one line after its bound."""


import dataclasses

import pytest
import trio

from hasvc import transport
from hasvc.config import format_address
from hasvc.controller.client import ControllerClient, ControllerClientConfig, ControllerUnavailable, parse_controllers
from hasvc.protocol import controller as cp
from hasvc.protocol import wire

VIEW = cp.GroupView("g1", 1, "127.0.0.1:1", "127.0.0.1:2", 1, (1,), 1)
HEARTBEAT_VIEW = dataclasses.replace(VIEW, lease=True)


async def _fake_controller(answer_for, seen: list, *, task_status=trio.TASK_STATUS_IGNORED):
    """A controller port whose every answer is ``answer_for(request)``."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = format_address(listeners[0].socket.getsockname()[:2])

    async def serve(stream):
        connection = transport.Connection(stream, "peer")
        try:
            await transport.server_preface(connection, port_kind=wire.PORT_KIND_CONTROLLER, secret=None)
            decoder = cp.ControllerDecoder(answers=False)
            while data := await connection.receive_some():
                decoder.receive_data(data)
                while (frame := decoder.next_event()) is not None:
                    seen.append((address, frame.message))
                    await connection.send_all(cp.encode_answer(frame.request_id, answer_for(frame.message)))
        except (trio.BrokenResourceError, EOFError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        task_status.started(address)
        await trio.serve_listeners(serve, listeners, handler_nursery=nursery)


async def test_follows_not_leader_to_the_leader_and_keeps_it():
    seen = []
    async with trio.open_nursery() as nursery:
        leader = await nursery.start(_fake_controller, lambda r: cp.Answer(r.KIND, "OK", view=HEARTBEAT_VIEW), seen)
        follower = await nursery.start(_fake_controller, lambda r: cp.not_leader(r.KIND, leader, "follower"), seen)
        client = ControllerClient([follower, leader])
        before = trio.current_time()
        answer, sent_at = await client.heartbeat(group="g1", broker_id=1, epoch=1, max_offset=0)
        assert answer.ok and answer.view == HEARTBEAT_VIEW
        assert before <= sent_at <= trio.current_time()
        assert client.leader == leader
        await client.heartbeat(group="g1", broker_id=1, epoch=1, max_offset=0)
        assert [address for address, _ in seen] == [follower, leader, leader]  # the second went straight there
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_dead_controller_and_one_that_knows_no_leader_are_passed_over():
    seen = []
    async with trio.open_nursery() as nursery:
        nobody = await nursery.start(_fake_controller, lambda r: cp.not_leader(r.KIND, None, "electing"), seen)
        leader = await nursery.start(_fake_controller, lambda r: cp.refused(r.KIND, "stale epoch", VIEW), seen)
        with trio.socket.socket() as dead:  # a port nobody listens on
            await dead.bind(("127.0.0.1", 0))
            dead_address = format_address(dead.getsockname()[:2])
        client = ControllerClient([dead_address, nobody, leader])
        answer = await client.alter_sync_state_set(group="g1", master_id=1, epoch=1, sync_state_set_epoch=1,
                                                   sync_state_set=[2, 1])  # fmt: skip
        assert answer.status == "REFUSED" and answer.reason == "stale epoch"
        assert client.leader == leader
        assert seen[-1][1].sync_state_set == (1, 2)
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_no_leader_anywhere_is_one_error_after_the_call_timeout():
    seen = []
    async with trio.open_nursery() as nursery:
        first = await nursery.start(_fake_controller, lambda r: cp.not_leader(r.KIND, None, "electing"), seen)
        config = ControllerClientConfig(request_timeout_seconds=0.2, call_timeout_seconds=0.3)
        client = ControllerClient([first], config=config)
        with pytest.raises(ControllerUnavailable, match=r"within 0.3 s .*not the leader \(electing\)"):
            await client.register(group="g1", identity="x", client_address="127.0.0.1:1", ha_address="127.0.0.1:2")
        assert len(seen) > 1  # it went round again after a pause
        await client.aclose()
        nursery.cancel_scope.cancel()


def test_parse_controllers():
    assert parse_controllers("127.0.0.1:1, 127.0.0.1:2") == ["127.0.0.1:1", "127.0.0.1:2"]
    for bad in ("", "host", "127.0.0.1:1,127.0.0.1:1"):
        with pytest.raises(ValueError):
            parse_controllers(bad)


