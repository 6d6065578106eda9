"""serve_admitted over memory streams with autojump_clock: a stranger's deadline, eviction of the
oldest stranger for a new connection, a known peer kept without a deadline."""

import trio
import trio.testing

from hasvc.admission import Admission, AdmissionLimits, serve_admitted


class _Listener:
    """Hands out the server ends of memory stream pairs the test opens with ``connect``."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel(16)

    async def accept(self):
        return await self._receive.receive()

    def connect(self):
        client, server = trio.testing.memory_stream_pair()
        self._send.send_nowait(server)
        return client


async def _handler(admission: Admission, stream, ticket) -> None:
    """A peer says "member" to be known; anything else leaves it a stranger."""
    data = await stream.receive_some()
    admission.authenticated(ticket)
    if data == b"member" and admission.identified(ticket):
        await stream.send_all(b"welcome")
    await trio.sleep_forever()


async def _closed(client) -> bool:
    with trio.move_on_after(0.001):
        try:
            return await client.receive_some() == b""
        except trio.BrokenResourceError:
            return True
    return False


async def test_a_stranger_is_closed_at_its_deadline_and_a_member_is_kept(autojump_clock):
    admission = Admission(AdmissionLimits(strangers_max=4, stranger_timeout_seconds=3.0, known_max=2), "raft")
    listener = _Listener()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admitted, listener, lambda stream, ticket: _handler(admission, stream, ticket), admission)
        idle = listener.connect()
        member = listener.connect()
        await member.send_all(b"member")
        assert await member.receive_some() == b"welcome"
        await trio.sleep(3.5)
        assert await _closed(idle)
        assert admission.timed_out == 1 and admission.strangers == 0 and admission.known == 1
        await trio.sleep(60)
        assert not await _closed(member)  # known: no deadline
        nursery.cancel_scope.cancel()


async def test_a_new_connection_closes_the_oldest_stranger(autojump_clock):
    admission = Admission(AdmissionLimits(strangers_max=2, stranger_timeout_seconds=3.0, known_max=2), "raft")
    listener = _Listener()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_admitted, listener, lambda stream, ticket: _handler(admission, stream, ticket), admission)
        first, second = listener.connect(), listener.connect()
        await trio.testing.wait_all_tasks_blocked()
        member = listener.connect()  # the strangers are at their cap: the oldest makes room
        await member.send_all(b"member")
        assert await member.receive_some() == b"welcome"
        assert await _closed(first)
        assert not await _closed(second)
        assert admission.evicted == 1 and admission.timed_out == 0 and admission.known == 1
        nursery.cancel_scope.cancel()
