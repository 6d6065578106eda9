"""The gateway's bound on consumer progress waiting for the brokers (``progress_events_queued_max``,
hasvc/proxy/limits.py) and its per-name state, against a fake cluster whose progress puts the test
releases: a call whose events would not fit is refused TOO_MANY_REQUESTS before it changes
anything, and succeeds once the queue drained; locks and arrival events of names clients made up
are gone once their receives are over."""

import json
import types

import pytest
import trio
import trio.testing

pytest.importorskip("hasvc.proxy.pb")

from hasvc import client as hc  # noqa: E402
from hasvc.client.results import SendResult  # noqa: E402
from hasvc.proxy import convert, gateway  # noqa: E402
from hasvc.proxy.pb import Code  # noqa: E402

GROUP, TOPIC = "G", "T"


class HeldCluster:
    """Progress puts wait until the test sets ``release``; every queue of every topic holds
    ``messages`` messages (offsets 0..messages-1) for pulls."""

    def __init__(self, messages: int = 0):
        self.messages = messages
        self.records: list[list] = []
        self.release = trio.Event()

    async def send(self, topic, body, *, queue_id=0, retry=None):
        await self.release.wait()
        self.records.append(json.loads(body))
        return SendResult("PUT_OK", len(self.records) - 1, queue_id, len(self.records) - 1)

    async def pull(self, topic, queue_id, offset, *, count_max):
        taken = [types.SimpleNamespace(queue_offset=o, tags=None, body=memoryview(b"x"))
                 for o in range(offset, min(offset + count_max, self.messages))]  # fmt: skip
        return hc.PullResult("OK", taken, offset + len(taken), self.messages)


def delivered(gate, offset: int) -> str:
    gate.table.apply(["d", GROUP, TOPIC, 0, offset, 100 + offset, gateway.now_ms() + 60_000, 1])
    return convert.encode_receipt_handle(0, offset, 100 + offset)


async def test_acks_beyond_the_limit_are_refused_too_many_requests_and_go_once_the_queue_drained():
    cluster = HeldCluster()
    gate = gateway.Gateway(cluster, gateway.GatewayConfig(progress_events_queued_max=3))
    handles = [delivered(gate, offset) for offset in range(6)]
    answers: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.writer)
        gate.ack_soon(GROUP, TOPIC, handles[:1], answers.append)
        await trio.testing.wait_all_tasks_blocked()  # the writer took it and waits for the brokers
        for handle in handles[1:4]:
            gate.ack_soon(GROUP, TOPIC, [handle], answers.append)
        gate.ack_soon(GROUP, TOPIC, [handles[4]], answers.append)  # a fourth event would not fit
        gate.ack_soon(GROUP, TOPIC, handles[4:], answers.append)
        assert gate.progress.events_queued == 3
        assert [[code for code, _ in answer] for answer in answers] == [[Code.TOO_MANY_REQUESTS], [Code.TOO_MANY_REQUESTS] * 2]
        assert "progress_events_queued_max 3" in answers[0][0][1]
        assert gate.stats["progress_refused"] == 2
        assert sorted(gate.table.queues[(GROUP, TOPIC, 0)].inflight) == [4, 5]  # the refused acks changed nothing
        answers.clear()
        cluster.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert gate.progress.events_queued == 0 and len(answers) == 4  # all answered, OK
        gate.ack_soon(GROUP, TOPIC, handles[4:], answers.append)  # the client retries
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert {code for answer in answers for code, _ in answer} == {Code.OK}
    assert gate.table.queues[(GROUP, TOPIC, 0)].committed == 6


async def test_an_invisible_time_change_and_a_receive_are_refused_while_the_queue_is_full():
    cluster = HeldCluster(messages=100)
    gate = gateway.Gateway(cluster, gateway.GatewayConfig(progress_events_queued_max=32, queues=1))
    handle = delivered(gate, 0)  # group G's, beside group R's receives
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.writer)
        first = await gate.receive("R", TOPIC, 0, None, 32, 60_000, 0)  # the writer takes its 32 deliveries
        await trio.testing.wait_all_tasks_blocked()
        second = await gate.receive("R", TOPIC, 0, None, 32, 60_000, 0)  # 32 queued: no room for another receive's
        refused = await gate.receive("R", TOPIC, 0, None, 32, 60_000, 0)
        with trio.fail_after(30):  # not refused, it would wait for the held put
            code, _, new_handle = await gate.change_invisible(GROUP, TOPIC, handle, 30_000)
        assert gate.progress.events_queued == 32 and gate.progress.events_reserved == 0
        cluster.release.set()
        await trio.testing.wait_all_tasks_blocked()
        again = await gate.receive("R", TOPIC, 0, None, 32, 60_000, 0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [len(first), len(second)] == [32, 32] and [d.record.queue_offset for d in again] == list(range(64, 96))
    assert isinstance(refused, convert.Refused) and refused.code == Code.TOO_MANY_REQUESTS
    assert (code, new_handle) == (Code.TOO_MANY_REQUESTS, "")
    assert gate.stats["progress_refused"] == 2


async def test_locks_and_arrival_events_of_names_clients_made_up_are_forgotten_once_their_receives_end():
    gate = gateway.Gateway(HeldCluster(), gateway.GatewayConfig())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.writer)
        for number in range(50):
            assert await gate.receive(f"G{number}", f"T{number}", 0, None, 32, 60_000, 0) == []
        async with trio.open_nursery() as waiting:  # two long-polling receives on one topic, one woken
            waiting.start_soon(gate.receive, "W1", "Wait", 0, None, 32, 60_000, 1000)
            waiting.start_soon(gate.receive, "W2", "Wait", 0, None, 32, 60_000, 1000)
            await trio.testing.wait_all_tasks_blocked()
            assert "Wait" in gate.waiting_topics() and len(gate._locks) == 0
            waiting.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    assert gate._locks == {} and gate._arrivals == {} and gate._receiving == {}
