"""SEND_IDEMPOTENT through a broker's per-pass put path (``PutService._put_pass``), classic master
and DLedger leader: a pass holding a producer's request, its retry and a request overlapping it in
part is stored once, the retry answered with the original offsets (in the same pass and in a
later one), the overlap refused; with the native module the batch path is not used for them."""

from __future__ import annotations

import pytest
import trio

from commitlog import entry_pass, pass_encode
from hasvc.broker.broker import Broker
from hasvc.broker.outbox import error_response
from hasvc.broker.put_service import PutService
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.protocol import client as cp
from tests.driver.dledger_leader import Outbox, leading, until


def _idempotent(producer: str, first: int, count: int, queue_id: int = 0) -> cp.SendRequest:
    return cp.SendRequest("T", queue_id, [f"{producer}-{first + i}".encode() for i in range(count)], [b"KEYS\x01k\x02"] * count,
                          producer_id=producer, first_sequence=first)  # fmt: skip


def _items(outbox, numbered: list, decoded: bool) -> list:
    """The pass as the client port hands it over: every frame undecoded (its request None) when
    the put path reads them (``decodes_sends``), decoded otherwise (a malformed one answered by
    the port, not handed over)."""
    items = []
    for request_id, request in numbered:
        payload = request if isinstance(request, bytes) else cp.encode_send(request)
        kind = cp.SEND if isinstance(request, cp.SendRequest) and not request.producer_id else cp.SEND_IDEMPOTENT
        frame = cp.Frame(kind, request_id, memoryview(payload))
        if not decoded:
            items.append((outbox, frame, None))
            continue
        try:
            items.append((outbox, frame, cp.decode_send(frame.payload, idempotent=kind == cp.SEND_IDEMPOTENT)))
        except cp.ProtocolError as error:
            outbox.respond(frame, error_response(frame, str(error)))
    return items


async def _put(broker, outbox, numbered: list) -> None:
    items = _items(outbox, numbered, decoded=not broker.put_service.decodes_sends)
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
        await _put(broker, outbox, [
            (7, _idempotent("p1", 0, 2)), (8, _idempotent("p2", 7, 1, queue_id=1)), (9, _idempotent("p1", 3, 1)),
            (10, b"\0\0" + cp.encode_send(_idempotent("p1", 4, 1))[4:]),  # an empty producer id
            (11, cp.encode_send(_idempotent("p1", 4, 1))[:-3]),  # cut
            (12, cp.encode_send(_idempotent("p3", 0, 1))[:4] + (-1).to_bytes(8, "big", signed=True)
             + cp.encode_send(_idempotent("p3", 0, 1))[12:]),  # a negative sequence
        ])  # fmt: skip
        answers = outbox.answers
        assert answers[10].status == "MESSAGE_ILLEGAL" and answers[10].reason.startswith("producer id must be 1..64 bytes")
        assert answers[11].status == "MESSAGE_ILLEGAL" and answers[11].reason == "field runs past the end of the payload"
        assert answers[12].status == "MESSAGE_ILLEGAL" and answers[12].reason == "first sequence -1 is negative"
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
