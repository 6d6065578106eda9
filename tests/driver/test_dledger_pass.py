"""A DLedger leader proposes a pass of puts over several queues as one proposal (``PutService``
through ``RaftLog.append_batches``): each request is answered with the offsets the groups
appended one after the other would get, every queue keeps its order, and a group refused for
its content falls back to a proposal per group, so that only the bad request fails."""

from __future__ import annotations

import pytest
import trio

from commitlog import record as rec
from hasvc import client as hc
from hasvc.protocol import client as cp
from hasvc.state.puts import PutTracker
from hasvc.state.raft.ready import Refused, RefusalStatus
from tests.driver.dledger_leader import Outbox, leading, until

BODY_MAX = 4096


async def _leading(tmp_path, nursery):
    return await leading(tmp_path, nursery, max_message_size=BODY_MAX)


def _count_proposals(broker, monkeypatch) -> list[int]:
    """The entries of each proposal the core takes from now on."""
    sizes: list[int] = []
    node = broker.driver.node
    real = node.propose
    monkeypatch.setattr(node, "propose", lambda bodies, now: sizes.append(len(bodies)) or real(bodies, now))
    return sizes


async def _answers(outbox: Outbox, count: int) -> dict[int, cp.SendResponse]:
    await until(lambda: len(outbox.answers) >= count)
    return outbox.answers


def _send(request_id: int, queue_id: int, bodies: list[bytes], topic: str = "T") -> tuple[cp.Frame, cp.SendRequest]:
    props = [f"KEYS\x01k{request_id}-{i}\x02".encode() for i in range(len(bodies))]
    return cp.Frame(cp.SEND, request_id, b""), cp.SendRequest(topic, queue_id, bodies, props, 0, 0)


async def test_a_pass_over_several_queues_is_one_proposal_answered_per_request(tmp_path, monkeypatch) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        proposals = _count_proposals(broker, monkeypatch)
        outbox = Outbox()
        # Interleaved as producers spread over queues send them: 4 groups (T/0, T/1, T/2, U/1).
        sends = [_send(1, 0, [b"a1"]), _send(2, 1, [b"b1", b"b2"]), _send(3, 0, [b"a2", b"a3"]),
                 _send(4, 2, [b"c1"]), _send(5, 1, [b"b3"]), _send(6, 1, [b"u1"], topic="U")]  # fmt: skip
        broker.put_service.put_items([(outbox, frame, request) for frame, request in sends])
        assert proposals == [8]  # the pass's 8 messages, one proposal
        answers = await _answers(outbox, len(sends))
        assert all(answer.status == "PUT_OK" for answer in answers.values()), answers
        # Each queue in its requests' order, queue offsets from 0; every offset answered is where
        # its record lies, with its body and its own properties.
        assert [answers[i].queue_offsets for i in (1, 3)] == [[0], [1, 2]]
        assert [answers[i].queue_offsets for i in (2, 5)] == [[0, 1], [2]]
        assert answers[4].queue_offsets == [0] and answers[6].queue_offsets == [0]
        assert [answers[i].queue_id for i in range(1, 7)] == [0, 1, 0, 2, 1, 1]
        async with hc.connect(broker.addresses()["listen"]) as client:
            for request_id, (_, request) in enumerate(sends, start=1):
                answer = answers[request_id]
                pulled = await client.pull(request.topic, request.queue_id, answer.queue_offsets[0],
                                           count_max=len(request.bodies))  # fmt: skip
                assert [(m.physical_offset, bytes(m.body), m.properties["KEYS"]) for m in pulled.records] == [
                    (offset, body, f"k{request_id}-{i}")
                    for i, (offset, body) in enumerate(zip(answer.offsets, request.bodies, strict=True))
                ]
        # A pass on one queue stays one proposal of its own.
        broker.put_service.put_items([(outbox, *_send(7, 3, [b"d1", b"d2"]))])
        assert proposals == [8, 2]
        assert (await _answers(outbox, 7))[7].queue_offsets == [0, 1]
        nursery.cancel_scope.cancel()


async def test_a_bad_message_in_a_pass_fails_alone(tmp_path, monkeypatch) -> None:
    """Only the request holding an oversize body fails. On the batch path it refuses the pass's
    proposal as a whole and the groups are then proposed one by one (and the bad group's
    requests one by one); on the pass path (``RaftLog.append_pass``, with the native module) the
    others stay one proposal."""
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        proposals = _count_proposals(broker, monkeypatch)
        outbox = Outbox()
        sends = [_send(1, 0, [b"fine"]), _send(2, 1, [b"x" * (BODY_MAX + 1)]), _send(3, 1, [b"also fine"]),
                 _send(4, 2, [b"fine too"])]  # fmt: skip
        broker.put_service.put_items([(outbox, frame, request) for frame, request in sends])
        answers = await _answers(outbox, len(sends))
        assert {i: answers[i].status for i in answers} == {1: "PUT_OK", 2: "MESSAGE_ILLEGAL", 3: "PUT_OK", 4: "PUT_OK"}
        if broker.put_service.decodes_sends:
            assert proposals == [3]  # the pass's kept requests, one proposal
        else:
            assert sorted(proposals) == [1, 1, 1]  # group 0, then request 3 alone, group 2
        assert answers[3].queue_offsets == [0]  # the refused message took no queue offset
        nursery.cancel_scope.cancel()


async def test_a_member_that_cannot_take_writes_refuses_the_whole_pass(tmp_path, monkeypatch) -> None:
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        proposals = _count_proposals(broker, monkeypatch)
        monkeypatch.setattr(PutTracker, "refusal", lambda self, role, in_sync: _Refused())
        outbox = Outbox()
        sends = [_send(1, 0, [b"a"]), _send(2, 1, [b"b"]), _send(3, 0, [b"c"])]
        broker.put_service.put_items([(outbox, frame, request) for frame, request in sends])
        answers = await _answers(outbox, len(sends))
        assert {answer.status for answer in answers.values()} == {"SERVICE_NOT_AVAILABLE"}, answers
        assert proposals == []
        nursery.cancel_scope.cancel()



async def test_a_pass_the_core_refuses_is_refused_whole_and_stores_nothing(tmp_path, monkeypatch) -> None:
    """The core refusing the pass's one proposal (here LEADER_PENDING_FULL) answers every request
    of it with the refusal; nothing is appended, and the queues start where they were."""
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        node = broker.driver.node
        real = node.propose
        last = broker.store.entries.last_index()
        monkeypatch.setattr(node, "propose", lambda bodies, now: Refused(RefusalStatus.LEADER_PENDING_FULL, "n0", "full (test)"))
        outbox = Outbox()
        sends = [_send(1, 0, [b"a"]), _send(2, 1, [b"b"]), _send(3, 0, [b"c"])]
        broker.put_service.put_items([(outbox, frame, request) for frame, request in sends])
        answers = await _answers(outbox, len(sends))
        assert {answer.status for answer in answers.values()} == {"SERVICE_NOT_AVAILABLE"}, answers
        assert all("LEADER_PENDING_FULL" in answer.reason for answer in answers.values()), answers
        assert broker.store.entries.last_index() == last
        monkeypatch.setattr(node, "propose", real)
        broker.put_service.put_items([(outbox, *_send(4, 1, [b"d"]))])
        assert (await _answers(outbox, 4))[4].queue_offsets == [0]  # queue 1 still starts at 0
        nursery.cancel_scope.cancel()

async def test_a_pass_of_send_payloads_is_one_proposal_and_answers_each_request_as_the_batch_path(tmp_path, monkeypatch) -> None:
    """With the native module a leader's pass of SENDs left undecoded by the client port (their
    payloads) is one proposal of the requests kept (``RaftLog.append_pass``): a malformed SEND is
    answered with the decoder's error, a refused one with ``prepare_batch``'s words, the others
    PUT_OK with the offsets where their records lie once committed."""
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        if not broker.put_service.decodes_sends:
            nursery.cancel_scope.cancel()
            pytest.skip("without the native module SENDs are decoded by the client port (the batch path)")
        proposals = _count_proposals(broker, monkeypatch)
        outbox = Outbox()
        good = [_send(1, 0, [b"a1", b"a2"]), _send(3, 1, [b"b1"]), _send(5, 0, [b"a3"])]
        frames = [cp.Frame(cp.SEND, frame.request_id, memoryview(cp.encode_send(request))) for frame, request in good]
        frames.insert(1, cp.Frame(cp.SEND, 2, memoryview(cp.encode_send(_send(2, 0, [b"x" * (BODY_MAX + 1)])[1]))))
        frames.insert(3, cp.Frame(cp.SEND, 4, memoryview(cp.encode_send(good[0][1]))[:-1]))  # cut: malformed
        broker.put_service.put_items([(outbox, frame, None) for frame in frames])
        assert proposals == [4]  # requests 1, 3 and 5: one proposal of their 4 messages
        answers = await _answers(outbox, 5)
        assert {i: answers[i].status for i in answers} == {1: "PUT_OK", 2: "MESSAGE_ILLEGAL", 3: "PUT_OK", 4: "MESSAGE_ILLEGAL",
                                                            5: "PUT_OK"}  # fmt: skip
        assert "max_message_size" in answers[2].reason and answers[2].queue_id == -1
        assert answers[1].queue_offsets == [0, 1] and answers[5].queue_offsets == [2] and answers[3].queue_offsets == [0]
        async with hc.connect(broker.addresses()["listen"]) as client:
            for request_id, (_, request) in zip((1, 3, 5), good):
                answer = answers[request_id]
                pulled = await client.pull(request.topic, request.queue_id, answer.queue_offsets[0], count_max=len(request.bodies))
                assert [(m.physical_offset, bytes(m.body), m.properties["KEYS"]) for m in pulled.records] == [
                    (offset, body, f"k{request_id}-{i}")
                    for i, (offset, body) in enumerate(zip(answer.offsets, request.bodies, strict=True))
                ]
        nursery.cancel_scope.cancel()


class _Refused:
    status = rec.PutMessageStatus.SERVICE_NOT_AVAILABLE
    reason = "not taking writes (test)"
