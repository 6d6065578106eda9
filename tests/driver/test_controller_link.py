"""The controller drill's relay (``ControllerLink``) on real loopback sockets: it renames the
leader a NOT_LEADER answer names to the broker's own relay to that controller, so a broker that
follows the answer stays behind its relays (a partition cuts it off), and passes every other
answer as it came."""

from __future__ import annotations

import functools

import trio

from hasvc import transport
from hasvc.config import format_address
from hasvc.controller.client import ControllerClient
from hasvc.protocol import controller as cp
from hasvc.protocol import wire
from hasvc.tools.drill_controller import ControllerLink

TEST_TIMEOUT_SECONDS = 10  # a relay that loses an answer leaves the call waiting: fail, do not hang
LEADER = "127.0.0.1:1"  # what the fake controller names as its leader
RELAY_TO_LEADER = "127.0.0.1:2"  # the broker's relay to that leader


async def _fake_controller(stream: trio.SocketStream) -> None:
    """Answers HEARTBEAT NOT_LEADER naming LEADER, STATUS OK with LEADER in its body."""
    connection = transport.Connection(stream, "fake")
    await transport.server_preface(connection, port_kind=wire.PORT_KIND_CONTROLLER, secret=None)
    decoder = cp.ControllerDecoder(answers=False)
    try:
        while data := await connection.receive_some():
            decoder.receive_data(data)
            while (frame := decoder.next_event()) is not None:
                if frame.message.KIND == cp.STATUS:
                    answer = cp.Answer(cp.STATUS, cp.STATUS_OK, controller={"leader_address": LEADER})
                else:
                    answer = cp.not_leader(frame.message.KIND, LEADER, "fake does not lead")
                await connection.send_all(cp.encode_answer(frame.request_id, answer))
    except trio.BrokenResourceError:
        pass


async def test_not_leader_answers_name_the_brokers_relay_and_other_answers_pass_as_they_came() -> None:
    with trio.fail_after(TEST_TIMEOUT_SECONDS):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, _fake_controller, 0, host="127.0.0.1"))
            link = ControllerLink("b0", "c0", listeners[0].socket.getsockname()[:2], {LEADER: RELAY_TO_LEADER})
            await nursery.start(link.serve)
            address = format_address(link.address)
            client = ControllerClient([address])
            try:
                for _ in range(2):  # the second on the kept connection: the stream stays framed
                    answer, _sent = await client._ask(address, cp.HeartbeatRequest("g", 1, 0, 0))
                    assert answer.status == cp.STATUS_NOT_LEADER and answer.leader == RELAY_TO_LEADER
                status, _sent = await client._ask(address, cp.StatusRequest())
                assert status.controller == {"leader_address": LEADER}
            finally:
                await client.aclose()
            nursery.cancel_scope.cancel()
