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
    gate._replay_record(record(json.dumps([["d", "G", "T", 0, 0, 5, 100, 1], ["a", "G", "T", 0, 0]]).encode()))
    gate._replay_record(record(b"not json"))
    gate._replay_record(record(json.dumps([["d", "G", "T", 0, 7, 5, 100, 1], ["d", "G", "T", 0, 1, 6, 100, 1]]).encode()))
    progress = gate.table.queues[("G", "T", 0)]
    assert (progress.committed, sorted(progress.inflight)) == (1, [1])  # the gap at 7 skipped, the next event applied


@given(st.binary(max_size=200))
def test_garbage_progress_records_never_stop_a_replay(data):
    gate = gateway.Gateway(None, gateway.GatewayConfig())
    gate._replay_record(record(data))
    for progress in gate.table.queues.values():
        progress.check_all()


@contextlib.asynccontextmanager
async def bridge_in_thread(**options):
    """A TrioBridge from this asyncio loop to a trio loop run in a thread of its own (as the
    proxy's two threads are); the trio loop is stopped and its thread joined on the way out."""
    import asyncio
    import threading

    import trio

    loop = asyncio.get_running_loop()
    box, ready = {}, threading.Event()

    async def trio_main():
        async with trio.open_nursery() as nursery:
            box["bridge"] = server.TrioBridge(loop, trio.lowlevel.current_trio_token(), nursery, **options)
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


def test_call_soon_calls_back_to_back_share_one_hand_over_and_the_first_after_a_pause_goes_at_once():
    """call_soon (the acks) keeps its calls back until ``hold_seconds`` after the last hand-over
    while others are in flight: the first after a pause and one with none in flight cross at once,
    the ones right behind another together in one hop, and a task's call takes those kept back
    along; every caller gets its own answer, also when the trio loop has ended (RuntimeError)."""
    import asyncio


    hold = 0.5

    def soon(value, answer):
        answer(value * 3)

    async def echo(value):
        return value

    async def main():
        loop = asyncio.get_running_loop()
        async with bridge_in_thread(hold_seconds=hold) as bridge:
            started = loop.time()
            assert await bridge.call_soon(soon, 1) == 3
            assert loop.time() - started < hold  # not kept back: nothing crossed before it
            assert bridge.stats["trio_hops"] == 1
            for i in range(5):  # one at a time, each after the last was answered: never held
                assert await bridge.call_soon(soon, i) == i * 3
            assert loop.time() - started < hold and bridge.stats["trio_hops"] == 6
            answers = await asyncio.gather(*(bridge.call_soon(soon, i) for i in range(50)))
            assert answers == [i * 3 for i in range(50)]
            # the first with none in flight went at once, the 49 behind it together after the hold
            assert loop.time() - started >= hold
            assert bridge.stats["trio_hops"] == 8 and bridge.stats["trio_calls"] == 56
            kept = [asyncio.ensure_future(bridge.call_soon(soon, i)) for i in range(6)]
            await asyncio.sleep(0)
            assert not any(future.done() for future in kept[1:])  # behind the first: kept back
            before = loop.time()
            assert await bridge.call(echo, 7) == 7  # a task's call goes at once and takes them along
            assert await asyncio.gather(*kept) == [i * 3 for i in range(6)]
            assert loop.time() - before < hold
            # one hop for the first (the call rides on it if it is still queued), at most one more
            assert bridge.stats["trio_hops"] in (9, 10) and bridge.stats["trio_calls"] == 63
        await asyncio.sleep(hold)  # a pause: the next call_soon is handed over at once, and fails
        results = await asyncio.gather(*(bridge.call_soon(soon, i) for i in range(3)), return_exceptions=True)
        assert [type(result) for result in results] == [RuntimeError] * 3

    asyncio.run(main())
