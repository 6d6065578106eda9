"""The gateway's acknowledgements (hasvc/proxy/gateway.py ``ack_soon``) against a fake cluster whose
progress puts the test releases: an ack is answered only once the record holding it is stored,
the entries of one AckMessage share one record, and refused entries keep their own codes."""

import json

import pytest
import trio
import trio.testing

pytest.importorskip("hasvc.proxy.pb")

from hasvc.client.results import SendResult  # noqa: E402
from hasvc.proxy import convert, gateway  # noqa: E402
from hasvc.proxy.pb import Code  # noqa: E402

GROUP, TOPIC = "G", "T"


class HeldCluster:
    """Stores progress records in a list; each put waits until the test sets ``release``."""

    def __init__(self, status: str = "PUT_OK"):
        self.status = status
        self.records: list[list] = []
        self.stored_at: list[float] = []  # trio's clock when each record was stored
        self.release = trio.Event()

    async def send(self, topic, body, *, queue_id=0, retry=None):
        await self.release.wait()
        self.records.append(json.loads(body))
        self.stored_at.append(trio.current_time())
        offset = len(self.records) - 1 if self.status == "PUT_OK" else -1
        return SendResult(self.status, offset, queue_id, offset)


def delivered(gate, offset: int, nonce: int) -> str:
    gate.table.apply(["d", GROUP, TOPIC, 0, offset, nonce, gateway.now_ms() + 60_000, 1])
    return convert.encode_receipt_handle(0, offset, nonce)


@pytest.mark.parametrize(
    ("status", "stored_code"), [("PUT_OK", Code.OK), ("FLUSH_SLAVE_TIMEOUT", Code.SLAVE_PERSISTENCE_TIMEOUT)]
)
async def test_acks_of_one_message_share_a_record_and_are_answered_once_it_is_stored(status, stored_code):
    cluster = HeldCluster(status)
    gate = gateway.Gateway(cluster, gateway.GatewayConfig())
    first, second = delivered(gate, 0, 11), delivered(gate, 1, 12)
    delivered(gate, 2, 13)
    stale = convert.encode_receipt_handle(0, 2, 99)
    answers: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.writer)
        gate.ack_soon(GROUP, TOPIC, [first, stale, "not a handle", second], answers.append)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == []  # the record is not stored yet: nobody is answered
        cluster.release.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    (codes,) = answers
    assert [code for code, _ in codes] == [
        stored_code,
        Code.INVALID_RECEIPT_HANDLE,
        Code.INVALID_RECEIPT_HANDLE,
        stored_code,
    ]
    assert "malformed" in codes[2][1] and "stale" in codes[1][1]
    assert cluster.records == [[["a", GROUP, TOPIC, 0, 0], ["a", GROUP, TOPIC, 0, 1]]]  # one record, both acks
    assert gate.table.queues[(GROUP, TOPIC, 0)].committed == 2


async def test_an_ack_that_needs_no_record_is_answered_at_once():
    cluster = HeldCluster()
    gate = gateway.Gateway(cluster, gateway.GatewayConfig())
    handle = delivered(gate, 0, 5)
    gate.table.apply(["a", GROUP, TOPIC, 0, 0])
    answers: list = []
    gate.ack_soon(GROUP, TOPIC, [handle], answers.append)  # a retried ack of an acknowledged message
    gate.ack_soon("bad group!", TOPIC, [handle, handle], answers.append)
    gate.ack_soon(GROUP, TOPIC, [], answers.append)
    assert answers[0] == [(Code.OK, "OK (already acknowledged)")]
    assert [code for code, _ in answers[1]] == [Code.ILLEGAL_CONSUMER_GROUP] * 2
    assert answers[2] == [] and cluster.records == []


async def test_acks_arriving_while_a_record_is_stored_go_into_the_next_one_together():
    cluster = HeldCluster()
    gate = gateway.Gateway(cluster, gateway.GatewayConfig(progress_record_interval_seconds=0))
    handles = [delivered(gate, offset, 100 + offset) for offset in range(5)]
    answers: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.writer)
        gate.ack_soon(GROUP, TOPIC, handles[:1], answers.append)
        await trio.testing.wait_all_tasks_blocked()  # the writer is storing the first record
        for handle in handles[1:]:
            gate.ack_soon(GROUP, TOPIC, [handle], answers.append)
        cluster.release.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [len(record) for record in cluster.records] == [1, 4]
    assert answers == [[(Code.OK, "OK")]] * 5


@pytest.mark.parametrize("interval", [0.005, 0.0])
async def test_records_wait_for_as_many_calls_as_the_last_answered_or_an_interval(mock_clock, interval):
    """Group commit: after a record that answered N >= 2 calls, the next waits until N calls wait
    again or an interval after the last record started; never the first after a pause, nor the
    one after a record that answered a single call (a consumer acking one message at a time)."""
    cluster = HeldCluster()
    cluster.release.set()  # every record is stored as soon as it is sent
    gate = gateway.Gateway(cluster, gateway.GatewayConfig(progress_record_interval_seconds=interval))
    handles = [delivered(gate, offset, 100 + offset) for offset in range(7)]
    answers: list = []

    async def ack(*indexes: int) -> None:
        for index in indexes:  # one AckMessage call each
            gate.ack_soon(GROUP, TOPIC, [handles[index]], answers.append)
        await trio.testing.wait_all_tasks_blocked()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.writer)
        await ack(0, 1)
        assert len(answers) == 2  # the first record after a pause goes at once, answering two calls
        mock_clock.jump(0.001)
        await ack(2)
        assert len(answers) == (2 if interval else 3)  # held: one call of the two is back
        await ack(3)
        assert len(answers) == 4 and cluster.stored_at[-1] == trio.current_time()  # both back: at once
        mock_clock.jump(0.001)
        await ack(4)
        if interval:
            assert len(answers) == 4  # held: the other caller is not back ...
            mock_clock.jump(interval)  # ... until the interval after the last record's start
            await trio.testing.wait_all_tasks_blocked()
            assert cluster.stored_at[-1] == trio.current_time()
        assert len(answers) == 5
        mock_clock.jump(0.001)  # right behind a record that answered one call: not held
        await ack(5)
        assert len(answers) == 6 and cluster.stored_at[-1] == trio.current_time()
        mock_clock.jump(1.0)  # a pause: the next record is not held
        await ack(6)
        assert len(answers) == 7 and cluster.stored_at[-1] == trio.current_time()
        nursery.cancel_scope.cancel()
    assert answers == [[(Code.OK, "OK")]] * 7
    assert [len(record) for record in cluster.records] == ([2, 2, 1, 1, 1] if interval else [2, 1, 1, 1, 1, 1])
