"""trio drivers over memory streams with autojump_clock: heartbeats, housekeeping and waiter
timeouts checked in virtual time."""

import trio
import trio.testing

from commitlog.store import MessageStore
from hasvc import transport
from hasvc.broker import Broker
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.ha_master import HAService
from hasvc.protocol import client as cp
from hasvc.protocol import ha, wire
from hasvc.replication import SlaveProgress

SEGMENT = 64 * 1024


def broker_for(tmp_path, **options) -> Broker:
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, commitlog_segment_size=SEGMENT, **options)
    broker = Broker(config)
    broker.store = MessageStore.open(str(tmp_path), config.store_config())
    return broker


def send_request(body: bytes) -> cp.SendRequest:
    return cp.SendRequest("T", 0, [body], [b""], 0, 0)


async def test_ha_connection_sends_frames_heartbeats_and_drops_a_silent_slave(tmp_path, autojump_clock):
    broker = broker_for(tmp_path)
    broker.append(send_request(b"replicate me"))
    slave_end, master_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(HAService(broker).handle, master_end)
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
        nursery.start_soon(broker._waiter_timer_task)
        started = trio.current_time()
        timed_out = await broker.complete_put(broker.append(send_request(b"nobody acks this")))
        assert timed_out.status == "FLUSH_SLAVE_TIMEOUT" and timed_out.offsets == [0]
        assert trio.current_time() - started >= 3.0

        appended = broker.append(send_request(b"acked"))
        results = []

        async def put():
            results.append(await broker.complete_put(appended))

        nursery.start_soon(put)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []  # waiting: no polling, nothing released yet
        broker.replicas.on_report(1, appended.result.next_offset - 1, master_max_offset=broker.store.commit_log.max_offset, now=1.0)
        broker.on_ack()
        await trio.testing.wait_all_tasks_blocked()
        assert results == []  # an ack short of the record releases nothing
        broker.replicas.on_report(1, appended.result.next_offset, master_max_offset=broker.store.commit_log.max_offset, now=1.0)
        broker.on_ack()
        await trio.testing.wait_all_tasks_blocked()
        assert [r.status for r in results] == ["PUT_OK"]
        nursery.cancel_scope.cancel()
    broker.store.close()


async def test_sync_master_without_slaves_answers_slave_not_available_at_once(tmp_path, autojump_clock):
    broker = broker_for(tmp_path)
    started = trio.current_time()
    response = await broker.complete_put(broker.append(send_request(b"alone")))
    assert response.status == "SLAVE_NOT_AVAILABLE" and response.offsets == [0]
    assert trio.current_time() == started
    broker.store.close()


async def test_a_waiter_with_the_earliest_deadline_wakes_the_timer(tmp_path):
    """Real clock: registering the first waiter must wake the timer task, or its deadline is
    only noticed at the timer's next periodic check (WAITER_TIMER_MAX_SECONDS late)."""
    broker = broker_for(tmp_path)
    assert not broker._timer_wakeup.is_set()
    broker._wait_for(broker._ack_waiters, 100, 3000)
    assert broker._timer_wakeup.is_set()
    broker.store.close()
