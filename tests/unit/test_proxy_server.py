"""The proxy's routing answers, completed settings and progress-record replay, without a network."""

import contextlib
import json
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

pb = pytest.importorskip("hasvc.proxy.pb")

from hasvc.proxy import gateway, server  # noqa: E402

definition, Code = pb.definition, pb.Code


def servicer(listen=("127.0.0.1", 8081), advertise=None):
    gate = types.SimpleNamespace(config=gateway.GatewayConfig())
    return server.Servicer(None, gate, listen, advertise)


def endpoints(*addresses):
    result = definition.Endpoints()
    for host, port in addresses:
        result.addresses.add(host=host, port=port)
    return result


def test_the_access_point_is_never_a_wildcard():
    assert servicer(("0.0.0.0", 8081))._access_point(endpoints(("10.1.2.3", 8081))) == ("10.1.2.3", 8081)
    assert servicer(("0.0.0.0", 8081))._access_point(endpoints(("0.0.0.0", 8081))) == ("127.0.0.1", 8081)
    assert servicer(("::", 8081))._access_point(endpoints()) == ("127.0.0.1", 8081)
    assert servicer(("127.0.0.1", 8081))._access_point(endpoints(("localhost", 8081))) == ("127.0.0.1", 8081)
    assert servicer(("0.0.0.0", 8081), ("mq.example", 9876))._access_point(endpoints(("10.1.2.3", 8081))) == ("mq.example", 9876)


def test_a_tls_client_is_routed_to_the_tls_listener():
    proxy = servicer(("0.0.0.0", 8081), ("mq.example", 8081))
    proxy.tls_listen = ("0.0.0.0", 8443)
    assert proxy._access_point(endpoints(("10.1.2.3", 8443))) == ("10.1.2.3", 8443)
    assert proxy._access_point(endpoints(("10.1.2.3", 8081))) == ("mq.example", 8081)


def test_settings_are_completed_for_producers_and_consumers():
    proxy = servicer()
    producer = definition.Settings(client_type=definition.PRODUCER)
    producer.publishing.topics.add(name="T")
    answer = proxy._complete_settings(producer)
    assert answer.publishing.max_body_size == 4 * 1024 * 1024 and answer.publishing.validate_message_type
    assert answer.backoff_policy.max_attempts == 3 and answer.backoff_policy.exponential_backoff.multiplier == 2
    assert [t.name for t in answer.publishing.topics] == ["T"] and not answer.metric.on
    consumer = definition.Settings(client_type=definition.PUSH_CONSUMER)
    consumer.subscription.group.name = "G"
    answer = proxy._complete_settings(consumer)
    assert answer.subscription.receive_batch_size == 32 and answer.subscription.long_polling_timeout.seconds == 20
    assert [d.seconds for d in answer.backoff_policy.customized_backoff.next][:3] == [1, 5, 10]


def record(body: bytes, queue_offset: int = 0):
    return types.SimpleNamespace(body=memoryview(body), queue_offset=queue_offset)


def test_replay_applies_events_and_skips_what_it_cannot_read():
    gate = gateway.Gateway(None, gateway.GatewayConfig())
    gate.progress.replay_record(record(json.dumps([["d", "G", "T", 0, 0, 5, 100, 1], ["a", "G", "T", 0, 0]]).encode()))
    gate.progress.replay_record(record(b"not json"))
    gate.progress.replay_record(record(json.dumps([["d", "G", "T", 0, 7, 5, 100, 1], ["d", "G", "T", 0, 1, 6, 100, 1]]).encode()))
    progress = gate.table.queues[("G", "T", 0)]
    assert (progress.committed, sorted(progress.inflight)) == (1, [1])  # the gap at 7 skipped, the next event applied


def test_a_damaged_progress_record_is_skipped_as_a_garbage_one_is():
    """A progress event record the broker refuses as DAMAGED (or that fails its CRC on arrival)
    is skipped with an ERROR line; the records before and after it are replayed."""
    import trio

    from hasvc import client as hc

    events = {offset: json.dumps([["d", "G", "T", offset, 0, 5, 100, 1]]).encode() for offset in range(6)}  # queue = offset
    damaged = 3

    class Cluster:
        async def pull(self, topic, queue_id, offset, *, count_max):
            if queue_id == gateway.SNAPSHOT_QUEUE:
                return hc.PullResult("OK", [], offset, 0)
            if offset <= damaged < offset + count_max:
                raise hc.DamagedRecordError(f"DAMAGED: record at offset {1000 + damaged} is damaged", 1000 + damaged)
            taken = [record(events[o], o) for o in range(offset, min(offset + count_max, len(events)))]
            return hc.PullResult("OK", taken, offset + len(taken), len(events))

    gate = gateway.Gateway(Cluster(), gateway.GatewayConfig())
    trio.run(gate.replay)
    assert sorted(queue for _, _, queue in gate.table.queues) == [0, 1, 2, 4, 5]


@given(st.binary(max_size=200))
def test_garbage_progress_records_never_stop_a_replay(data):
    gate = gateway.Gateway(None, gateway.GatewayConfig())
    gate.progress.replay_record(record(data))
    for progress in gate.table.queues.values():
        progress.check_all()


@contextlib.asynccontextmanager
async def bridge_in_thread():
    """A TrioBridge from this asyncio loop to a trio loop run in a thread of its own (as the
    proxy's two threads are); the trio loop is stopped and its thread joined on the way out."""
    import asyncio
    import threading

    import trio

    loop = asyncio.get_running_loop()
    box, ready = {}, threading.Event()

    async def trio_main():
        async with trio.open_nursery() as nursery:
            box["bridge"] = server.TrioBridge(loop, trio.lowlevel.current_trio_token(), nursery)
            box["stop"] = trio.Event()
            ready.set()
            await box["stop"].wait()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(trio_main,))
    thread.start()
    await loop.run_in_executor(None, ready.wait)
    try:
        yield box["bridge"]
    finally:
        box["bridge"]._token.run_sync_soon(box["stop"].set)
        await loop.run_in_executor(None, thread.join)


def test_the_bridge_hands_every_result_to_its_own_caller_and_cancels_abandoned_calls():
    """Many calls in flight share hand-overs between the threads (batched both ways): each caller
    still gets its own result or error (calls run as tasks, and call_soon's synchronous ones
    answered at once or later), and a caller that gives up cancels its trio task."""
    import asyncio

    import trio

    finished = []

    async def echo(value):
        for _ in range(value % 3):
            await trio.lowlevel.checkpoint()
        if value % 7 == 0:
            raise ValueError(value)
        return value * 2

    async def forever(tag):
        try:
            await trio.sleep_forever()
        finally:
            finished.append(tag)

    later: list = []

    def soon(value, answer):  # a call_soon function: answers now, later (from another callback), or raises
        if value % 5 == 0:
            raise ValueError(value)
        if value % 2:
            answer(value * 3)
        else:
            later.append((answer, value * 3))
            trio.lowlevel.current_trio_token().run_sync_soon(lambda: [a(v) for a, v in [later.pop()]])

    async def main():
        async with bridge_in_thread() as bridge:
            async def outcome(i):
                try:
                    return "returned", await bridge.call(echo, i)
                except ValueError as error:
                    return "raised", error.args

            results = await asyncio.gather(*(outcome(i) for i in range(300)))
            assert results == [("raised", (i,)) if i % 7 == 0 else ("returned", i * 2) for i in range(300)]

            async def soon_outcome(i):
                try:
                    return "returned", await bridge.call_soon(soon, i)
                except ValueError as error:
                    return "raised", error.args

            results = await asyncio.gather(*(soon_outcome(i) for i in range(300)))
            assert results == [("raised", (i,)) if i % 5 == 0 else ("returned", i * 3) for i in range(300)]
            waiting = [asyncio.ensure_future(bridge.call(forever, tag)) for tag in range(20)]
            await asyncio.sleep(0)
            for task in waiting:
                task.cancel()
            assert all(r is not None for r in await asyncio.gather(*waiting, return_exceptions=True))
            for _ in range(3000):  # every abandoned trio task is cancelled (waits up to ~30 s, then fails)
                if len(finished) == 20:
                    break
                await asyncio.sleep(0.01)
            assert sorted(finished) == list(range(20))

    asyncio.run(main())


def test_attempts_of_one_message_never_overlap_and_each_is_answered():
    """A retry waits for the attempt of its key before it (several may wait at once), another key
    does not wait, and the registry is empty afterwards."""
    import asyncio

    out, overlaps, order = {}, [], []

    class Lane:
        async def send(self, request):
            key = (request.producer_id, request.first_sequence)
            overlaps.append(out.get(key, 0))
            out[key] = out.get(key, 0) + 1
            order.append(key)
            await asyncio.sleep(0.001)
            out[key] -= 1
            return [types.SimpleNamespace(status="PUT_OK", offset=7, queue_offset=3, reason="")]

    class Gate:
        stats = {"sent": 0}

        def prepare_send(self, client_id, message):
            checked = types.SimpleNamespace(message_id=message)
            return types.SimpleNamespace(key=(client_id, len(message)), topic="T", checked=checked,
                                         request=lambda: types.SimpleNamespace(producer_id=client_id, first_sequence=len(message)))  # fmt: skip

        def waiting_topics(self):
            return ()

    proxy = server.Servicer(None, Gate(), ("127.0.0.1", 8081), None)
    proxy.lane = Lane()

    async def scenario():
        return await asyncio.gather(*(proxy._send("c", message) for message in ("a", "b", "c", "dd", "e")))

    outcomes = asyncio.run(scenario())
    assert [outcome.code for outcome in outcomes] == [Code.OK] * 5
    assert overlaps == [0, 0, 0, 0, 0]
    assert order[:2] == [("c", 1), ("c", 2)]  # the other key went at once, beside the first attempt
    assert proxy._sending == {}
    assert Gate.stats["sent"] == 5
