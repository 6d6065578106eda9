"""A DLedger leader's producer table (idempotent sends) is rebuilt from its log in a worker thread
before it takes writes (``RaftBroker._take_writes``): one rebuild at a time, installed whole when
writes start, never changed by a rebuild while writes are taken.

A corrupt drill found the way it broke: a rebuild for an earlier term that ended after the
member led again let a second rebuild start for the new term beside the one already waiting;
that one ran after writes were taken, emptied the live table and refilled it only once its scan
ended, so retries of messages the log held were taken as new meanwhile and stored twice."""

from __future__ import annotations

import threading

import trio

from commitlog.dledger.message_store import DLedgerMessageStore
from hasvc.broker.raft.broker import RaftBroker
from hasvc.config import BrokerRole
from hasvc.protocol import client as cp
from hasvc.state.dedupe import ProducerTable, Stored, Verdict
from hasvc.state.raft.ready import Role
from tests.driver.dledger_leader import WAIT_SECONDS, Outbox, leading, until

PRODUCER = "p1"


async def _send(broker: RaftBroker, outbox: Outbox, request_id: int, sequence: int,
                producer: str = PRODUCER) -> cp.SendResponse:  # fmt: skip
    """SEND_IDEMPOTENT of one message of ``producer``, answered once committed."""
    request = cp.SendRequest("T", 0, [f"m{sequence}".encode()], [b""], producer_id=producer, first_sequence=sequence)
    broker.put_service.put_items([(outbox, cp.Frame(cp.SEND_IDEMPOTENT, request_id, b""), request)])
    await until(lambda: request_id in outbox.answers)
    return outbox.answers[request_id]


async def _next_term(broker: RaftBroker) -> int:
    """Step down (as a higher term seen makes a leader do), then lead the term after it: a
    group of one elects itself once its election timeout passes."""
    node = broker.driver.node
    term = node.term + 1
    node._become_follower(term, None, trio.current_time())
    broker.driver.drain()
    await until(lambda: node.role is Role.LEADER and node.term > term and broker.store.caught_up())
    return node.term


class _Scans:
    """Every rebuild's scan of the log (``find_at_record_ends``) from now on: scan ``n`` reads the
    log, then waits until ``release(n)`` (the first ``held`` ones) before it hands its matches
    over; each notes whether the member was taking writes when it began."""

    def __init__(self, monkeypatch, broker: RaftBroker, *, held: int):
        self.started = 0
        self.while_taking_writes: list[int] = []
        self._gates = [threading.Event() for _ in range(held)]
        real = DLedgerMessageStore.find_at_record_ends

        def scan(store, span_bytes, pattern):
            number = self.started
            self.started += 1
            if broker.role_state.role is BrokerRole.SYNC_MASTER:
                self.while_taking_writes.append(number)
            matches = list(real(store, span_bytes, pattern))
            if number < len(self._gates):
                self._gates[number].wait(WAIT_SECONDS)
            yield from matches

        monkeypatch.setattr(DLedgerMessageStore, "find_at_record_ends", scan)

    def release(self, number: int) -> None:
        self._gates[number].set()


async def test_a_rebuild_for_an_earlier_term_starts_no_second_one_beside_writes(tmp_path, monkeypatch) -> None:
    async with trio.open_nursery() as nursery:
        broker = await leading(tmp_path, nursery)
        outbox = Outbox()
        first = await _send(broker, outbox, 1, 0)
        assert first.status == "PUT_OK", first
        scans = _Scans(monkeypatch, broker, held=3)
        await _next_term(broker)  # leading again: its rebuild waits in its scan
        await until(lambda: scans.started == 1)
        await _next_term(broker)  # and again, that rebuild still running
        broker._on_role()  # what any commit or role change does next: decide from now
        scans.release(0)  # the earlier term's rebuild ends: the member rebuilds for its term
        scans.release(1)
        await until(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER)
        # A rebuild started beside the writes would be scanning now, holding the files: wait
        # for it, or for no rebuild to be running or waiting for them.
        lock = broker.maintenance
        await until(lambda: scans.started > 2 or (not lock.locked() and lock.statistics().tasks_waiting == 0))
        try:
            # Retries are answered from the table the member took writes with: where the log holds them.
            last = broker.store.entries.last_index()
            retry = await _send(broker, outbox, 2, 0)
            assert (retry.offsets, broker.store.entries.last_index()) == (first.offsets, last), "stored twice"
            second = await _send(broker, outbox, 3, 1)
            assert second.status == "PUT_OK", second
            last = broker.store.entries.last_index()
            assert (await _send(broker, outbox, 4, 1)).offsets == second.offsets
            assert broker.store.entries.last_index() == last  # nothing stored again
            assert broker.put_service.duplicate_sends == 2
            assert scans.while_taking_writes == [], f"rebuild scan(s) {scans.while_taking_writes} ran while taking writes"
        finally:
            scans.release(2)
        nursery.cancel_scope.cancel()


async def test_a_new_leader_forgets_sends_its_log_no_longer_holds(tmp_path) -> None:
    """What the table remembered of a send whose entry is no longer in the log (appended while
    this member led, cut when it followed another leader) is forgotten when it leads again: a
    retry of it is stored, not answered with offsets that now hold another message (the rebuild
    installs exactly what the log says)."""
    async with trio.open_nursery() as nursery:
        broker = await leading(tmp_path, nursery)
        outbox = Outbox()
        other = await _send(broker, outbox, 1, 0)
        assert other.status == "PUT_OK", other
        # As if "ghost" 0 had been appended where the log now holds PRODUCER's 0.
        broker.producers.remember("ghost", 0, [Stored(other.offsets[0], 1, 0, other.queue_offsets[0])])
        await _next_term(broker)
        await until(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER)
        retry = await _send(broker, outbox, 2, 0, producer="ghost")
        assert retry.status == "PUT_OK", retry
        assert retry.offsets != other.offsets and broker.put_service.duplicate_sends == 0
        nursery.cancel_scope.cancel()


def test_a_rebuilt_table_replaces_what_was_known() -> None:
    """``replace_with``: the live table then knows what the log said, and no longer what it
    remembered of entries the log no longer holds (cut when this member followed another)."""
    live = ProducerTable(window=8)
    live.remember("gone", 0, [Stored(100, 10, 0, 0)])
    live.remember("p", 0, [Stored(200, 10, 0, 1)])
    rebuilt = ProducerTable(window=8)
    rebuilt.load("p", [(0, Stored(300, 10, 0, 1)), (1, Stored(310, 10, 0, 2))])
    live.replace_with(rebuilt)
    assert live.lookup("gone", 0, 1).verdict is Verdict.NEW
    assert live.lookup("p", 0, 2).stored == (Stored(300, 10, 0, 1), Stored(310, 10, 0, 2))
    assert len(live) == 1
