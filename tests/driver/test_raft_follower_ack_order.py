"""With flush_sync, a follower's acknowledgement of a push leaves as soon as its flush is done,
before the commit that push carried is applied (the consume-queue dispatch): at one writer that
dispatch sat between the follower's append and its flush, on the path to every put's answer."""

from __future__ import annotations

import types

from hasvc.broker.raft import sync as raft_sync
from hasvc.broker.raft.driver import RaftDriver
from hasvc.broker.raft.group import GroupConfig
from hasvc.state.raft.config import RaftConfig
from hasvc.state.raft.messages import Push, PushResponse, PushResult, PushType
from hasvc.state.raft.storage import Entry
from hasvc.testing.log import SimLog


class SyncedLog(SimLog):
    """A SimLog with what the driver's syncs call (``EntrySync``), each sync recorded."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.data_start_offset = 0
        self._events = events

    def flush_target(self) -> int:
        return self.last_index()

    def sync_data_files(self) -> None:
        self._events.append(("sync", self.last_index()))
        self.flush()

    def flushed_to(self, target: int) -> int:
        return self.flushed_index()


def _follower(events: list) -> RaftDriver:
    """Member n1's driver (flush_sync), its sends and commits recorded in ``events``."""
    log = SyncedLog(events)
    store = types.SimpleNamespace(entries=log, disk_full=lambda: None,
                                  set_committed=lambda index: events.append(("commit", index)))  # fmt: skip
    group = GroupConfig("g", "n1", {"n0": ("127.0.0.1", 1), "n1": ("127.0.0.1", 1), "n2": ("127.0.0.1", 1)},
                        RaftConfig(flush_sync=True))  # fmt: skip
    driver = RaftDriver(group=group, store=store, secret=None, on_commit=lambda: events.append(("dispatch",)),
                        on_role=lambda *_: None)  # fmt: skip
    driver.senders.send = lambda messages: events.extend(
        ("ack", m.ack_index) for m in messages if isinstance(m, PushResponse) and m.result is PushResult.SUCCESS)
    return driver


async def test_a_flush_sync_follower_acknowledges_before_it_applies_the_commit_a_push_carried():
    events: list = []
    driver = _follower(events)
    log = driver.store.entries
    for index, commit in ((0, -1), (1, 0)):  # the second push commits the first entry
        push = Push("n0", "n1", 1, PushType.APPEND, index, 1 if index else -1, commit, log.run_of((Entry(index, 1, b"e%d" % index),)))
        driver.node.step(push, 0.0)
        driver.drain()
    second = events[events.index(("ack", 0)) + 1 :]
    # The second entry synced and acknowledged first, then its push's commit applied.
    assert second == [("sync", 1), ("ack", 1), ("commit", 0), ("dispatch",)], events
    assert log.flushed_index() == 1


async def test_a_follower_flush_for_the_worker_thread_starts_after_the_commit_is_applied(monkeypatch):
    """More entries waiting than SYNC_INLINE_ENTRIES_MAX (here 0): the flush goes to the worker
    thread, started once the commit is applied, as before (only the flush in the loop moved)."""
    events: list = []
    monkeypatch.setattr(raft_sync, "SYNC_INLINE_ENTRIES_MAX", 0)
    monkeypatch.setattr(raft_sync.EntrySync, "start", lambda self, **_: events.append(("thread",)))
    driver = _follower(events)
    log = driver.store.entries
    for index, commit in ((0, -1), (1, 0)):
        push = Push("n0", "n1", 1, PushType.APPEND, index, 1 if index else -1, commit, log.run_of((Entry(index, 1, b"e%d" % index),)))
        driver.node.step(push, 0.0)
        driver.drain()
    assert events == [("thread",), ("commit", 0), ("dispatch",), ("thread",)], events
