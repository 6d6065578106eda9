"""trio drivers over memory streams with autojump_clock: heartbeats, housekeeping and waiter
timeouts checked in virtual time."""

import pytest
import trio
import trio.testing

from commitlog import native
from commitlog.store import MessageStore
from hasvc import transport
from hasvc.broker import Broker, store_tasks
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.protocol import client as cp
from hasvc.protocol.client_frames import answers_of
from hasvc.protocol import ha, wire
from hasvc.state.replication import SlaveProgress

SEGMENT = 64 * 1024


def broker_for(tmp_path, **options) -> Broker:
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, commitlog_segment_size=SEGMENT, **options)
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    return broker


def send_request(body: bytes) -> cp.SendRequest:
    return cp.SendRequest("T", 0, [body], [b""], 0, 0)


async def test_ha_connection_sends_frames_heartbeats_and_drops_a_silent_slave(tmp_path, autojump_clock):
    broker = broker_for(tmp_path)
    broker.put_service.append(send_request(b"replicate me"))
    slave_end, master_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.make_ha_service().handle, master_end)
        connection = transport.Connection(slave_end, "master")
        await transport.client_preface(connection, port_kind=wire.PORT_KIND_HA, secret=None)
        await connection.send_all(ha.encode_slave_hello(ha.SlaveHello("s1", "127.0.0.1:1", 0)))
        (size,) = ha.LENGTH.unpack(await connection.receive_exactly(4))
        hello = ha.decode_master_hello(await connection.receive_exactly(size))
        assert (hello.status, hello.max_offset, hello.segment_size) == (ha.STATUS_OK, broker.store.commit_log.max_offset, SEGMENT)
        await connection.send_all(ha.REPORT.pack(0))
        header = ha.decode_transfer_header(await connection.receive_exactly(12), size_max=1 << 20)
        assert (header.offset, header.size) == (0, hello.max_offset)
        assert await connection.receive_exactly(header.size) == bytes(broker.store.read(0, header.size))
        await connection.send_all(ha.REPORT.pack(header.size))
        await trio.testing.wait_all_tasks_blocked()
        assert [p.ack_offset for p in broker.replicas.slaves.values()] == [header.size]
        quiet_since = trio.current_time()
        heartbeat = ha.decode_transfer_header(await connection.receive_exactly(12), size_max=1 << 20)
        assert (heartbeat.offset, heartbeat.size) == (header.size, 0)
        assert trio.current_time() - quiet_since >= 5.0  # ha_send_heartbeat_interval
        while await connection.receive_some():  # we never report again
            pass
        assert trio.current_time() - quiet_since >= 20.0  # ha_housekeeping_interval
        assert broker.replicas.slaves == {}
    broker.store.close()


async def test_sync_master_put_waits_for_the_covering_ack_or_times_out(tmp_path, autojump_clock):
    broker = broker_for(tmp_path, slave_timeout_ms=3000)
    broker.replicas.add(SlaveProgress(1, "s1", "a", 0.0))
    broker.replicas.on_report(1, 0, master_max_offset=0, now=0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.put_service.waiter_timer_task)
        started = trio.current_time()
        timed_out = await broker.put_service.complete_put(broker.put_service.append(send_request(b"nobody acks this")))
        assert timed_out.status == "FLUSH_SLAVE_TIMEOUT" and timed_out.offsets == [0]
        assert trio.current_time() - started >= 3.0

        appended = broker.put_service.append(send_request(b"acked"))
        results = []

        async def put():
            results.append(await broker.put_service.complete_put(appended))

        nursery.start_soon(put)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []  # waiting: no polling, nothing released yet
        broker.replicas.on_report(1, appended.result.next_offset - 1, master_max_offset=broker.store.commit_log.max_offset, now=1.0)
        broker.replicator.on_report()
        await trio.testing.wait_all_tasks_blocked()
        assert results == []  # an ack short of the record releases nothing
        broker.replicas.on_report(1, appended.result.next_offset, master_max_offset=broker.store.commit_log.max_offset, now=1.0)
        broker.replicator.on_report()
        await trio.testing.wait_all_tasks_blocked()
        assert [r.status for r in results] == ["PUT_OK"]
        nursery.cancel_scope.cancel()
    broker.store.close()


async def test_sync_master_without_slaves_answers_slave_not_available_at_once(tmp_path, autojump_clock):
    broker = broker_for(tmp_path)
    started = trio.current_time()
    response = await broker.put_service.complete_put(broker.put_service.append(send_request(b"alone")))
    assert response.status == "SLAVE_NOT_AVAILABLE" and response.offsets == [0]
    assert trio.current_time() == started
    broker.store.close()


async def test_a_waiter_due_before_the_timers_next_look_wakes_it_and_only_such_a_waiter(tmp_path):
    """Real clock: a deadline before the timer task's own next look must wake it, or it is only
    noticed then; a later one must not (that wake-up was a scheduler pass per put)."""
    broker = broker_for(tmp_path)
    puts = broker.put_service
    assert not puts.timer.wake_pending
    puts.add_ack_wait(100, trio.current_time() + 3.0)
    assert puts.timer.wake_pending  # the timer is not sleeping yet: it is told
    async with trio.open_nursery() as nursery:
        nursery.start_soon(puts.waiter_timer_task)
        await trio.testing.wait_all_tasks_blocked()
        assert not puts.timer.wake_pending and puts.timer.next_look <= trio.current_time() + 0.1
        puts.add_ack_wait(200, trio.current_time() + 3.0)  # due long after the timer's next look
        assert not puts.timer.wake_pending
        puts.add_ack_wait(300, trio.current_time() + 0.001)  # due before it
        assert puts.timer.wake_pending
        nursery.cancel_scope.cancel()
    broker.store.close()


class _Outbox:
    def __init__(self):
        self.answers = []
        self.answered = trio.Event()  # set by every answer

    def respond(self, frame, payload):
        self.answers.append((frame.request_id, cp.decode_send_response(payload).status))
        self.answered.set()
        self.answered = trio.Event()

    def respond_joined(self, data, count):
        for answer in answers_of(data):
            self.respond(answer, answer.payload)

    async def wait_answers(self, count):
        while len(self.answers) < count:
            await self.answered.wait()

    def flush(self):
        pass


async def test_stored_puts_are_answered_when_their_last_wait_ends(tmp_path):
    """SYNC_MASTER with SYNC_FLUSH: puts appended together are answered, by whoever ends the last
    of their waits (the group commit, a slave's report, the timer), once and with the status
    those waits earned; no task is spawned for them."""
    from hasvc.config import FlushDiskType

    broker = broker_for(tmp_path, flush=FlushDiskType.SYNC_FLUSH, slave_timeout_ms=300)
    broker.replicas.add(SlaveProgress(1, "s1", "a", 0.0))
    broker.replicas.on_report(1, 0, master_max_offset=0, now=0.0)
    outbox = _Outbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.put_service.waiter_timer_task)
        nursery.start_soon(broker.store_tasks.group_commit_task, broker.put_service)
        frames = [cp.Frame(cp.SEND, i, b"") for i in (1, 2)]
        broker.put_service.put_items([(outbox, frame, send_request(b"m%d" % frame.request_id)) for frame in frames])
        with trio.fail_after(10):  # the group commit's fdatasync, in a worker thread
            while broker.store.commit_log.flushed_offset < broker.store.commit_log.max_offset:
                await broker.store_tasks.new_data.wait(10)  # notified after every group commit
        await trio.testing.wait_all_tasks_blocked()
        assert outbox.answers == []  # flushed, but no slave has it yet
        end = broker.store.commit_log.max_offset
        broker.replicas.on_report(1, end, master_max_offset=end, now=1.0)
        broker.replicator.on_report()  # answered here, from the report's reader
        assert outbox.answers == [(1, "PUT_OK"), (2, "PUT_OK")]
        broker.replicator.on_report()
        assert len(outbox.answers) == 2  # once

        late = cp.Frame(cp.SEND, 3, b"")
        started = trio.current_time()
        broker.put_service.put_items([(outbox, late, send_request(b"nobody acks this"))])
        with trio.fail_after(10):
            await outbox.wait_answers(3)  # from the timer, at slave_timeout
        assert outbox.answers[2] == (3, "FLUSH_SLAVE_TIMEOUT") and trio.current_time() - started >= 0.3
        nursery.cancel_scope.cancel()
    broker.store.close()



async def test_a_waiting_pass_is_dispatched_right_after_its_answers_not_before(tmp_path):
    """The consume queue units of puts that wait for a slave are written once their answers
    are sent, in the same step (the slave's report no longer waits behind them); puts answered
    at once (refused here: no slave in sync for the second) are dispatched at once."""
    broker = broker_for(tmp_path)
    broker.replicas.add(SlaveProgress(1, "s1", "a", 0.0))
    broker.replicas.on_report(1, 0, master_max_offset=0, now=0.0)
    store, outbox = broker.store, _Outbox()
    answered_at = []
    respond = outbox.respond

    def noted(frame, payload):  # what was dispatched when each answer was written
        answered_at.append(store.reput_from_offset)
        respond(frame, payload)

    outbox.respond = noted
    broker.put_service.put_items([(outbox, cp.Frame(cp.SEND, 1, b""), send_request(b"one"))])
    end = store.commit_log.max_offset
    assert store.reput_from_offset == 0 and outbox.answers == []  # waiting: not dispatched yet
    broker.replicas.on_report(1, end, master_max_offset=end, now=1.0)
    broker.replicator.on_report()
    assert outbox.answers == [(1, "PUT_OK")] and answered_at == [0]
    assert store.reput_from_offset == end  # right after the answer, in the same step
    broker.replicas.remove(1)
    broker.put_service.put_items([(outbox, cp.Frame(cp.SEND, 2, b""), send_request(b"two"))])
    assert outbox.answers[1] == (2, "SLAVE_NOT_AVAILABLE") and store.reput_from_offset == store.commit_log.max_offset
    broker.store.close()


async def test_answered_puts_leave_nothing_for_the_cyclic_collector(tmp_path):
    """Puts answered by a slave's report are freed by reference counting as soon as they are
    answered. A wait holding its answer's bound method, and the answer holding the wait, made a
    cycle per pass that kept every put of the pass (frames, results, tuples) until the cyclic GC
    ran: at 64 producers 800 collections in 5 s, a sixth of the master's CPU."""
    import gc

    from hasvc.broker import put_service

    broker = broker_for(tmp_path)
    broker.replicas.add(SlaveProgress(1, "s1", "a", 0.0))
    broker.replicas.on_report(1, 0, master_max_offset=0, now=0.0)
    outbox = _Outbox()
    ours = (put_service._Wait, put_service._StoredAnswer, put_service.Appended, cp.Frame)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for request_id in range(1, 33, 4):  # passes of four puts
            frames = [cp.Frame(cp.SEND, i, b"") for i in range(request_id, request_id + 4)]
            broker.put_service.put_items([(outbox, frame, send_request(b"m%d" % frame.request_id)) for frame in frames])
            end = broker.store.commit_log.max_offset
            broker.replicas.on_report(1, end, master_max_offset=end, now=1.0)
            broker.replicator.on_report()
        del frames
        assert [status for _, status in outbox.answers] == ["PUT_OK"] * 32
        gc.collect()
        kept = [type(thing).__name__ for thing in gc.garbage if isinstance(thing, ours)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kept == []
    broker.store.close()


@pytest.mark.skipif(not native.AVAILABLE, reason="warming ahead needs the native module (without it there is nothing to warm)")
async def test_the_warm_up_waits_for_a_truncation_but_not_for_a_flush(tmp_path):
    """A long msync (under writeback) held the maintenance lock and the warm-up waited behind
    it, so a busy writer ran past the warmed pages and faulted them in itself. A truncation
    holds both locks: the warm-up must never touch a segment being cut."""
    broker = broker_for(tmp_path)
    queue = broker.store.commit_log.mapped_file_queue
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.store_tasks.warm_task)
        async with broker.store_tasks.maintenance:  # as _async_flush_task holds it around its msync
            async with broker.store_tasks.warming:  # as a truncation holds it (with maintenance)
                broker.put_service.append(send_request(b"x" * 100))
                broker.after_appends(push=False)
                # Quiet for 5x its WARM_INTERVAL_SECONDS pause: the warm-up is parked at the lock.
                await trio.testing.wait_all_tasks_blocked(cushion=5 * store_tasks.WARM_INTERVAL_SECONDS)
                assert broker.store_tasks.warming.statistics().tasks_waiting == 1
                assert queue.last.populated_position == 0
            with trio.fail_after(10):  # polled: the warming runs in a worker thread, out of trio's sight
                while queue.last.populated_position < SEGMENT:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    broker.store.close()
