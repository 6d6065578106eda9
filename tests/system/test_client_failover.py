"""Idempotent sends and client failover with real processes: a retry is answered with the original
offsets (same master, a restarted master, a promoted slave), and producers using several broker
addresses ride through a SIGKILL of the master without storing any message twice."""

import trio

from commitlog.inspect import iter_records
from hasvc import client as hc
from tests.cluster import slave_acking, status, wait_until


async def send_as(address: str, producer_id: str, first: int, bodies: list[bytes]) -> list[hc.SendResult]:
    async with hc.connect(address) as client:
        return await client.send_batch("Idem", bodies, producer_id=producer_id, first_sequence=first)


def bodies_in_log(store: str, topic: str) -> list[bytes]:
    return [bytes(record.body) for _, record, _ in iter_records(store) if record.topic == topic]


def test_a_retry_is_answered_with_the_original_offsets_and_stored_once(cluster):
    master = cluster.start_master(role="async")
    first = trio.run(send_as, master.address, "p1", 0, [b"a", b"b"])
    assert [r.status for r in first] == ["PUT_OK", "PUT_OK"]
    retry = trio.run(send_as, master.address, "p1", 0, [b"a", b"b"])
    assert [(r.status, r.offset, r.queue_offset) for r in retry] == [(r.status, r.offset, r.queue_offset) for r in first]
    partial = trio.run(send_as, master.address, "p1", 1, [b"b", b"c"])
    assert partial[0].status == "MESSAGE_ILLEGAL" and "in part" in partial[0].reason
    other = trio.run(send_as, master.address, "p2", 0, [b"a"])  # another producer, same sequence: new
    assert other[0].ok and other[0].offset > first[1].offset
    assert status(master)["duplicate_sends"] == 1

    master.stop()  # the table is rebuilt from the log at start-up
    master = cluster.start_master(role="async")
    again = trio.run(send_as, master.address, "p1", 0, [b"a", b"b"])
    assert [r.offset for r in again] == [r.offset for r in first]
    master.stop()
    assert bodies_in_log(cluster.store("master"), "Idem") == [b"a", b"b", b"a"]
    record = next(r for _, r, _ in iter_records(cluster.store("master")) if r.topic == "Idem")
    assert record.properties["HASVC_PRODUCER_ID"] == "p1" and record.properties["HASVC_PRODUCER_SEQ"] == "0"


def test_a_promoted_slave_recognises_a_retry_of_what_was_replicated_to_it(cluster):
    master = cluster.start_master(role="sync")
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    sent = trio.run(send_as, master.address, "p", 0, [b"x" * 100] * 3)
    assert {r.status for r in sent} == {"PUT_OK"}  # on the slave too
    master.kill()
    with hc.BlockingClient(slave.address) as client:
        client.promote(sync=False)
    retry = trio.run(send_as, slave.address, "p", 0, [b"x" * 100] * 3)
    assert [(r.status, r.offset) for r in retry] == [("PUT_OK", r.offset) for r in sent]
    assert "producer table: 1 producer(s), 3 sequence(s)" in slave.log()
    fresh = trio.run(send_as, slave.address, "p", 3, [b"y"])
    assert fresh[0].ok and fresh[0].offset > sent[-1].offset


def test_producers_with_several_addresses_ride_through_a_sigkill_without_duplicates(cluster):
    master = cluster.start_master(role="sync", slave_timeout_ms=1000)
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    addresses = [master.address, slave.address]
    acked: dict[int, int] = {}
    failovers = []

    async def run() -> None:
        async with hc.connect_cluster(addresses, retry_sends=True) as client:
            counter = iter(range(10**9))

            async def producer() -> None:
                while True:
                    number = next(counter)
                    result = await client.send("Ride", f"n{number}".encode())
                    if result.ok:
                        acked[number] = result.offset

            async with trio.open_nursery() as nursery:
                for _ in range(64):
                    nursery.start_soon(producer)
                await trio.sleep(0.7)
                await trio.to_thread.run_sync(master.kill)  # SIGKILL under load
                async with hc.connect(slave.address) as admin:
                    await admin.promote(sync=False)  # no slave left: ASYNC so the producers keep going
                with trio.fail_after(20):
                    while client.address != slave.address or len(acked) < 50:
                        await trio.sleep(0.05)
                await trio.sleep(0.3)
                nursery.cancel_scope.cancel()
            failovers.append(client.failovers)

    trio.run(run)
    assert failovers[0] >= 1
    counts: dict[int, int] = {}
    offsets: dict[int, int] = {}
    slave_status = status(slave)
    slave.stop()
    for offset, record, _ in iter_records(cluster.store("slave")):
        if record.topic == "Ride":
            number = int(bytes(record.body)[1:])
            counts[number] = counts.get(number, 0) + 1
            offsets[number] = offset
    assert all(count == 1 for count in counts.values()), "a message was stored twice"
    assert all(offsets.get(number) == offset for number, offset in acked.items()), "an acknowledged message is missing"
    assert slave_status["role"] == "ASYNC_MASTER"
