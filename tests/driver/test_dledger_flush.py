"""A DLedger member flushes its entries in a worker thread: a flush that hangs leaves the trio loop
serving, and with flush_sync a put is answered only once the flush that covers its entry is done
(a one-member group: its quorum is itself, so PUT_OK means "fsynced here"). With flush_sync, a
small flush (at most SYNC_INLINE_ENTRIES_MAX entries waiting) runs in the loop instead."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import trio
import trio.testing

from commitlog import native
from commitlog.dledger.entry_store import DLedgerMmapFileStore
from hasvc import client as hc
from hasvc.broker.raft import sync as raft_sync
from hasvc.broker.raft.broker import RaftBroker
from hasvc.broker.raft.group import GroupConfig
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.ready import Role

FAST = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.2, election_timeout_max_seconds=0.3,
                  flush_sync=True)  # fmt: skip
WAIT_SECONDS = 10.0  # anything that takes longer failed


def _one_member(tmp_path, raft: RaftConfig = FAST) -> RaftBroker:
    """A DLedger group of one member (its quorum is itself; 1 MiB segments), not started yet."""
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, listen=("127.0.0.1", 0),
                          commitlog_segment_size=1024 * 1024)  # fmt: skip
    return RaftBroker(config, GroupConfig(group="g", self_id="n0", peers={"n0": ("127.0.0.1", 0)}, raft=raft))


class FlushGate:
    """``sync_data_files`` (the driver syncs the data files in a worker thread, then the index
    files) held in its thread until opened; counts the syncs that began and tells the trio loop
    of each (``wait_started``: an event, not a poll)."""

    def __init__(self, monkeypatch) -> None:
        self.open = threading.Event()
        self.started = 0
        self._began = trio.Event()
        token = trio.lowlevel.current_trio_token()
        real = DLedgerMmapFileStore.sync_data_files

        def gated(store: DLedgerMmapFileStore) -> None:
            self.started += 1
            token.run_sync_soon(self._one_began)  # from any thread, the loop's own included
            assert self.open.wait(WAIT_SECONDS), "the test never opened the gate"
            real(store)

        monkeypatch.setattr(DLedgerMmapFileStore, "sync_data_files", gated)

    def _one_began(self) -> None:
        self._began.set()
        self._began = trio.Event()

    async def wait_started(self, count: int) -> None:
        with trio.fail_after(WAIT_SECONDS):
            while self.started < count:
                await self._began.wait()


async def _wait_for(predicate, message: str) -> None:
    """Polled with a deadline: what it waits for follows a flush in a worker thread and the
    DLedger driver exposes no event for it."""
    with trio.fail_after(WAIT_SECONDS):
        while not predicate():
            await trio.sleep(0.01)
    assert predicate(), message


async def test_a_hung_flush_leaves_the_loop_serving_and_a_sync_put_waits_for_its_flush(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(raft_sync, "SYNC_INLINE_ENTRIES_MAX", -1)  # every flush in the worker thread
    gate = FlushGate(monkeypatch)
    broker = _one_member(tmp_path)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(broker.run)
        async with hc.connect(addresses["listen"]) as client:
            # Elected, its no-op entry appended; the flush that would commit it hangs in its thread.
            await gate.wait_started(1)
            assert gate.started == 1
            status = await client.status()  # answered: the loop is not blocked
            assert status["raft_role"] == "LEADER" and status["role"] == "SLAVE", status
            assert status["committed_index"] == -1 and status["flushed_index"] == -1, status
            gate.open.set()
            await _wait_for(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER, "the no-op committed")

            gate.open.clear()
            answers = []
            answered = trio.Event()

            async def put() -> None:
                answers.append(await client.send("T", b"durable"))
                answered.set()

            nursery.start_soon(put)
            await gate.wait_started(2)
            assert gate.started == 2
            await trio.testing.wait_all_tasks_blocked()  # all that can happen without the flush has
            status = await client.status()
            assert answers == [] and status["flushed_index"] < status["ledger_end_index"], (answers, status)
            gate.open.set()
            with trio.fail_after(WAIT_SECONDS):
                await answered.wait()
            assert answers[0].status == "PUT_OK", answers
            assert broker.store.entries.flushed_index() == broker.store.entries.last_index()
        nursery.cancel_scope.cancel()


async def test_a_hung_consume_queue_flush_leaves_the_loop_serving_puts(tmp_path, monkeypatch) -> None:
    """The consume queues are flushed in a worker thread (once a second): while one such flush
    hangs, puts are still stored, committed and answered. (It ran in the event loop before,
    and held every put for its msync.)"""
    from commitlog.dledger.message_store import DLedgerMessageStore

    opened, started = threading.Event(), []
    real = DLedgerMessageStore.flush_consume_queues

    def gated(store, *args) -> None:
        started.append(1)
        assert opened.wait(WAIT_SECONDS), "the test never opened the gate"
        real(store, *args)

    monkeypatch.setattr(DLedgerMessageStore, "flush_consume_queues", gated)
    fast = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.2, election_timeout_max_seconds=0.3)
    broker = _one_member(tmp_path, fast)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(broker.run)
        async with hc.connect(addresses["listen"]) as client:
            await _wait_for(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER, "leading")
            await _wait_for(lambda: started, "a consume queue flush began")
            answer = await client.send("T", b"while the consume queues flush")
            assert answer.status == "PUT_OK", answer
            opened.set()
        nursery.cancel_scope.cancel()


async def test_a_small_sync_flush_runs_in_the_loop_and_a_bigger_one_in_the_thread(tmp_path, monkeypatch) -> None:
    """With flush_sync and one put at a time, each flush covers one entry and runs in the event
    loop's own thread (no hand-off); the put is answered after it. A flush of more than
    SYNC_INLINE_ENTRIES_MAX entries (here: 0, so any) goes to the worker thread."""
    threads: list[str] = []
    real = DLedgerMmapFileStore.sync_data_files

    def recorded(store: DLedgerMmapFileStore) -> None:
        threads.append(threading.current_thread().name)
        real(store)

    monkeypatch.setattr(DLedgerMmapFileStore, "sync_data_files", recorded)
    loop_thread = threading.current_thread().name
    broker = _one_member(tmp_path)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(broker.run)
        async with hc.connect(addresses["listen"]) as client:
            await _wait_for(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER, "leading")
            assert (await client.send("T", b"first")).status == "PUT_OK"  # after the no-op's syncs
            for round_ in range(2):
                del threads[:]
                for n in range(5):
                    answer = await client.send("T", b"one at a time %d" % n)
                    assert answer.status == "PUT_OK", answer
                    entries = broker.store.entries
                    assert entries.flushed_index() == entries.last_index(), (entries.flushed_index(), entries.last_index())
                if round_ == 0:  # a put that meets the index files' sync (INDEX_FLUSH_INTERVAL_SECONDS, in the thread) waits for it
                    assert threads.count(loop_thread) >= 3, threads  # and its flush follows it there
                    monkeypatch.setattr(raft_sync, "SYNC_INLINE_ENTRIES_MAX", 0)
                else:
                    assert threads and loop_thread not in threads, threads
        nursery.cancel_scope.cancel()


async def test_the_index_files_are_synced_at_most_once_an_interval(tmp_path, monkeypatch) -> None:
    """Recovery rebuilds index units from the data files, so the index files are synced off the
    acknowledgement's path and at most every INDEX_FLUSH_INTERVAL_SECONDS (DLedger: every 10 ms,
    which put a worker thread's hand-off behind one put in ten at one writer). Here the interval
    is 0.1 s and puts go on for five of them: the index files are synced, never twice within one."""
    interval = 0.1
    monkeypatch.setattr(raft_sync, "INDEX_FLUSH_INTERVAL_SECONDS", interval)
    started: list[float] = []
    real = DLedgerMmapFileStore.sync_index_files

    def recorded(store: DLedgerMmapFileStore) -> None:
        started.append(time.perf_counter())  # trio's clock runs at the same rate
        real(store)

    monkeypatch.setattr(DLedgerMmapFileStore, "sync_index_files", recorded)
    broker = _one_member(tmp_path)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(broker.run)
        async with hc.connect(addresses["listen"]) as client:
            await _wait_for(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER, "leading")
            until = time.perf_counter() + 5 * interval
            while time.perf_counter() < until:
                assert (await client.send("T", b"x" * 100)).status == "PUT_OK"
        nursery.cancel_scope.cancel()
    periodic = [moment for moment in started if moment < until]  # closing the store syncs everything too
    assert len(periodic) >= 2, started
    gaps = [later - earlier for earlier, later in zip(periodic, periodic[1:])]
    assert all(gap >= interval for gap in gaps), gaps


@pytest.mark.skipif(native.populate is None, reason="the warm-up faults pages in with the C module only")
async def test_the_write_area_is_warmed_ahead_of_the_appends_in_the_worker_thread(tmp_path, monkeypatch) -> None:
    """The data file's pages ahead of the appends are faulted in by the sync's worker thread,
    between syncs (a first write to a page from the loop was a page fault for every fourth 1 KiB
    entry, a sixth of a leader's main thread at 64 producers), as a classic broker's warm-up task
    does; never in the loop."""
    from commitlog.dledger.message_store import DLedgerMessageStore

    threads: list[int] = []
    real = DLedgerMessageStore.warm_commitlog

    def recorded(store: DLedgerMessageStore, ahead=None) -> None:
        threads.append(threading.get_ident())
        real(store, ahead)

    monkeypatch.setattr(DLedgerMessageStore, "warm_commitlog", recorded)
    broker = _one_member(tmp_path, RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.2,
                                              election_timeout_max_seconds=0.3))  # fmt: skip
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(broker.run)
        async with hc.connect(addresses["listen"]) as client:
            await _wait_for(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER, "leading")
            for _ in range(20):
                assert (await client.send("T", b"x" * 1000)).status == "PUT_OK"
            last = broker.store.entries.data_file_list.last
            await _wait_for(lambda: last.populated_position > last.wrote_position + 64 * 1024, "warmed ahead")
        nursery.cancel_scope.cancel()
    assert threads and threading.get_ident() not in threads


@pytest.mark.skipif(native.populate is None, reason="the warm-up faults pages in with the C module only")
async def test_a_leader_whose_appends_are_large_writes_them_with_pwrite_and_warms_nothing_ahead(tmp_path, monkeypatch) -> None:
    """Appends of ``entry_writer.WRITE_THROUGH_MIN`` or more (lowered here below one 1 KiB send)
    go into the data file by ``pwrite`` past the pages warmed while the appends were small, and
    the warm-up no longer runs ahead of them (it would zero pages the ``pwrite`` writes whole
    again): the writer passes the warmed pages and stays past them, while the index files, written
    through the mapping, stay warmed ahead; the entries read back whole."""
    from commitlog.dledger import entry_writer

    monkeypatch.setattr(entry_writer, "WRITE_THROUGH_MIN", 512)
    store_config = BrokerConfig.store_config  # warmed ahead: 8 KiB, less than the sends write (and their units)
    monkeypatch.setattr(BrokerConfig, "store_config", lambda c: dataclasses.replace(store_config(c), warm_ahead_size=8 * 1024))
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, listen=("127.0.0.1", 0),
                          commitlog_segment_size=8 * 1024 * 1024)  # fmt: skip
    raft = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.2, election_timeout_max_seconds=0.3)
    broker = RaftBroker(config, GroupConfig(group="g", self_id="n0", peers={"n0": ("127.0.0.1", 0)}, raft=raft))
    bodies = [b"%04d" % number * 250 for number in range(300)]  # ~330 KiB of entries
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(broker.run)
        async with hc.connect(addresses["listen"]) as client:
            await _wait_for(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER, "leading")
            for body in bodies:
                assert (await client.send("T", body)).status == "PUT_OK"
            await trio.sleep(0.1)  # ten flush ticks: room for a warm-up to run
            entries = broker.store.entries
            last = entries.data_file_list.last
            assert entries.large_appends
            assert last.populated_position < last.wrote_position, (last.populated_position, last.wrote_position)
            index = entries.index_file_list.last  # its units still go through the mapping: warmed
            assert index.populated_position > index.wrote_position, (index.populated_position, index.wrote_position)
            stored = entries.read(entries.first_index(), entries.last_index() + 1, size_max=1 << 30)  # CRCs checked
            assert all(body in bytes(entry.body) for entry, body in zip(stored[-len(bodies):], bodies, strict=True))
        nursery.cancel_scope.cancel()


async def test_a_member_that_syncs_each_append_faults_single_pages_ahead_of_its_writer(tmp_path) -> None:
    """``small_write_pages`` "auto" follows the Raft config's flush_sync, not the store's own
    flush setting (a DLedger member's store keeps ASYNC_FLUSH): docs/design/put-path.md, "The page cache"."""
    for flush_sync in (True, False):
        broker = _one_member(tmp_path / str(flush_sync), dataclasses.replace(FAST, flush_sync=flush_sync))
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            assert broker.store.entries.data_file_list._small_pages is flush_sync
            assert all(f.small_pages is flush_sync for f in broker.store.entries.data_file_list.mapped_files)
            nursery.cancel_scope.cancel()


async def test_a_member_that_does_not_lead_warms_nothing_ahead(tmp_path, monkeypatch) -> None:
    """A follower stores pushes with pwrite (``DLedgerMmapFileStore.append_run``), which needs no
    pages faulted in ahead: only a leader, whose proposals are written through the mapping, warms
    (the test above). Here every look says warming is due, and a member that cannot win an
    election (its two peers are not there) still never warms."""
    from commitlog.dledger.message_store import DLedgerMessageStore
    from commitlog.mapped_file_queue import MappedFileQueue

    warmed: list[int] = []
    monkeypatch.setattr(MappedFileQueue, "needs_warming", lambda queue, size: True)
    monkeypatch.setattr(DLedgerMessageStore, "warm_commitlog", lambda store, ahead=None: warmed.append(1))
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, listen=("127.0.0.1", 0),
                          commitlog_segment_size=1024 * 1024)  # fmt: skip
    peers = {"n0": ("127.0.0.1", 0), "n1": ("127.0.0.1", 1), "n2": ("127.0.0.1", 1)}
    broker = RaftBroker(config, GroupConfig(group="g", self_id="n0", peers=peers, raft=FAST))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await trio.sleep(0.5)  # ~50 flush ticks and two or three elections it cannot win
        assert broker.driver.node.role is not Role.LEADER
        nursery.cancel_scope.cancel()
    assert warmed == []
