"""SEND_IDEMPOTENT through a broker's per-pass put path (``PutService._put_pass``), classic master
and DLedger leader: a pass holding a producer's request, its retry and a request overlapping it in
part is stored once, the retry answered with the original offsets (in the same pass and in a
later one), the overlap refused; with the native module the batch path is not used for them."""

from __future__ import annotations

import pytest
import trio

from commitlog import entry_pass, pass_encode
from hasvc.broker.broker import Broker
from hasvc.broker.put_service import PutService
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.protocol import client as cp
from tests.driver.dledger_leader import Outbox, leading, until


def _idempotent(producer: str, first: int, count: int, queue_id: int = 0) -> cp.SendRequest:
    return cp.SendRequest("T", queue_id, [f"{producer}-{first + i}".encode() for i in range(count)], [b"KEYS\x01k\x02"] * count,
                          producer_id=producer, first_sequence=first)  # fmt: skip


def _items(outbox, numbered: list) -> list:
    items = []
    for request_id, request in numbered:
        if request.producer_id:
            items.append((outbox, cp.Frame(cp.SEND_IDEMPOTENT, request_id, b""), request))
        else:
            items.append((outbox, cp.Frame(cp.SEND, request_id, memoryview(cp.encode_send(request))), None))
    return items


async def _put(broker, outbox, numbered: list) -> None:
    items = _items(outbox, numbered)
    if not broker.put_service.decodes_sends:  # the client port decodes every SEND itself then
        items = [(o, f, r if r is not None else cp.decode_send(f.payload)) for o, f, r in items]
    broker.put_service.put_items(items)
    await until(lambda: all(request_id in outbox.answers for request_id, _ in numbered))


@pytest.mark.parametrize("mode", ["classic", "dledger"])
async def test_a_pass_stores_a_producers_request_once_and_answers_its_retries_with_its_offsets(tmp_path, monkeypatch, mode):
    if pass_encode.NATIVE and (mode == "classic" or entry_pass.NATIVE):
        def batch_path(*_args, **_kwargs):
            raise AssertionError("a SEND_IDEMPOTENT took the batch path")
        monkeypatch.setattr(PutService, "_append_idempotent", batch_path)
    async with trio.open_nursery() as nursery:
        if mode == "classic":
            broker = Broker(BrokerConfig(store=str(tmp_path), role=BrokerRole.ASYNC_MASTER, listen=("127.0.0.1", 0)))
            await nursery.start(broker.run)
        else:
            broker = await leading(tmp_path, nursery)
        outbox = Outbox()
        plain = cp.SendRequest("T", 1, [b"plain"], [b""])
        await _put(broker, outbox, [
            (1, _idempotent("p1", 0, 2)),  # new
            (2, plain),
            (3, _idempotent("p1", 0, 2)),  # its retry, in the same pass
            (4, _idempotent("p1", 1, 2)),  # overlaps it in part
            (5, _idempotent("p2", 7, 1, queue_id=1)),  # another producer, a gap is fine
            (6, _idempotent("p1", 2, 1)),  # the next sequence, in the same pass
        ])  # fmt: skip
        await _put(broker, outbox, [(7, _idempotent("p1", 0, 2)), (8, _idempotent("p2", 7, 1, queue_id=1)), (9, _idempotent("p1", 3, 1))])
        answers = outbox.answers
        for request_id in (1, 2, 3, 5, 6, 7, 8, 9):
            assert answers[request_id].status == "PUT_OK", (request_id, answers[request_id])
        assert answers[4].status == "MESSAGE_ILLEGAL" and "overlap an earlier send only in part" in answers[4].reason
        assert answers[3].offsets == answers[7].offsets == answers[1].offsets and len(answers[1].offsets) == 2
        assert answers[3].queue_offsets == answers[1].queue_offsets == [0, 1]
        assert answers[8].offsets == answers[5].offsets
        assert answers[6].queue_offsets == [2] and answers[9].queue_offsets == [3]  # stored once each: queue 0 holds 4
        assert answers[2].queue_offsets == [0] and answers[5].queue_offsets == [1]
        assert broker.put_service.duplicate_sends == 3
        nursery.cancel_scope.cancel()
