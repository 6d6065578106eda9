"""hasvc's Client times requests out with one timer task (``Client._timeout_loop``), not a cancel
scope each: a request the broker never answers fails after REQUEST_TIMEOUT_SECONDS, one answered
in time returns, and neither leaves a pending slot or a queued deadline behind."""

import json

import pytest
import trio
import trio.testing

from hasvc import transport
from hasvc.client import connection as hconn
from hasvc.client.results import ClientError
from hasvc.protocol import client as cp


class SilentBroker:
    """Reads request frames; answers STATUS only for the request ids the test lists."""

    def __init__(self, stream, answer_ids: set[int], delay_seconds: float):
        self.stream, self.answer_ids, self.delay_seconds = stream, answer_ids, delay_seconds
        self.seen: list[int] = []

    async def run(self) -> None:
        decoder = cp.FrameDecoder(responses=False)
        async with trio.open_nursery() as nursery:
            while data := await self.stream.receive_some():
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    self.seen.append(frame.request_id)
                    if frame.request_id in self.answer_ids:
                        nursery.start_soon(self._answer, frame.request_id)

    async def _answer(self, request_id: int) -> None:
        await trio.sleep(self.delay_seconds)
        payload = cp.encode_simple_response(cp.OK, "", json.dumps({"role": "test"}).encode())
        await self.stream.send_all(cp.encode_frame(cp.STATUS | cp.RESPONSE_BIT, request_id, payload))


async def _client_against(broker_factory):
    client_end, broker_end = trio.testing.memory_stream_pair()
    client = hconn.Client(transport.Connection(client_end, "memory"))
    broker = broker_factory(broker_end)
    return client, broker


async def test_an_unanswered_request_times_out_and_an_answered_one_returns(autojump_clock):
    client, broker = await _client_against(lambda end: SilentBroker(end, {1}, 10.0))
    async with trio.open_nursery() as nursery:
        for loop in (client._receive_loop, client._send_loop, client._timeout_loop, broker.run):
            nursery.start_soon(loop)
        started = trio.current_time()
        answered = await client.status()  # request 1: answered after 10 s
        assert answered == {"role": "test"}
        assert trio.current_time() - started == pytest.approx(10.0)
        with pytest.raises(ClientError, match="no response within"):
            await client.status()  # request 2: never answered
        assert trio.current_time() - started == pytest.approx(10.0 + hconn.REQUEST_TIMEOUT_SECONDS)
        assert broker.seen == [1, 2]
        assert not client._pending
        await trio.testing.wait_all_tasks_blocked()
        assert not client._deadlines
        nursery.cancel_scope.cancel()


async def test_each_request_times_out_at_its_own_deadline(autojump_clock):
    client, broker = await _client_against(lambda end: SilentBroker(end, set(), 0.0))
    failed_at: dict[int, float] = {}

    async def request(index: int) -> None:
        await trio.sleep(index * 7.0)
        with pytest.raises(ClientError, match="no response within"):
            await client.status()
        failed_at[index] = trio.current_time()

    async with trio.open_nursery() as nursery:
        for loop in (client._receive_loop, client._send_loop, client._timeout_loop, broker.run):
            nursery.start_soon(loop)
        started = trio.current_time()
        async with trio.open_nursery() as requests:
            for index in range(3):
                requests.start_soon(request, index)
        assert {i: t - started for i, t in failed_at.items()} == pytest.approx(
            {i: i * 7.0 + hconn.REQUEST_TIMEOUT_SECONDS for i in range(3)}
        )
        assert not client._pending and not client._deadlines
        nursery.cancel_scope.cancel()


def test_answered_deadlines_are_dropped_and_the_queue_compacted(monkeypatch):
    client = hconn.Client(transport.Connection(trio.testing.memory_stream_pair()[0], "memory"))
    monkeypatch.setattr(hconn, "DEADLINES_QUEUED_MAX", 4)
    client._pending = {1: None, 9: None}
    client._deadlines.extend((float(i), i) for i in range(1, 10))
    client._drop_answered()  # the head (1) is pending: nothing dropped from the front, then compacted
    assert list(client._deadlines) == [(1.0, 1), (9.0, 9)]
    del client._pending[1]
    client._drop_answered()
    assert list(client._deadlines) == [(9.0, 9)]
