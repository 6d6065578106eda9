"""``hasvc.broker.raft.scheduling.RolePolicy``: applied once per change of role, never when off,
and switched off, with one warning, when the system refuses it. Runs on this process's threads
(put back to SCHED_OTHER after each test)."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from hasvc.broker.raft import scheduling

pytestmark = pytest.mark.skipif(not scheduling.SUPPORTED, reason="Linux scheduling policies")


@pytest.fixture(autouse=True)
def _restore():
    yield
    scheduling.set_process_policy(False)


def test_following_runs_every_thread_batch_and_leading_runs_them_other() -> None:
    policy = scheduling.RolePolicy(enabled=True)
    started, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), stop.wait()))  # a thread that exists before the change
    thread.start()
    try:
        started.wait()
        policy.follow(True)
        assert scheduling.process_policies() == {os.SCHED_BATCH}
        policy.follow(False)
        assert scheduling.process_policies() == {os.SCHED_OTHER}
    finally:
        stop.set()
        thread.join()


def test_switched_off_it_never_touches_the_policy() -> None:
    scheduling.RolePolicy(enabled=False).follow(True)
    assert scheduling.process_policies() == {os.SCHED_OTHER}


def test_the_same_role_again_is_not_applied_again(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(scheduling, "set_process_policy", calls.append)
    policy = scheduling.RolePolicy(enabled=True)
    for following in (True, True, False, False, True):
        policy.follow(following)
    assert calls == [True, False, True]


def test_a_refusal_is_said_once_and_switches_it_off(monkeypatch, caplog) -> None:
    calls = []

    def refuse(batch: bool) -> None:
        calls.append(batch)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(scheduling, "set_process_policy", refuse)
    policy = scheduling.RolePolicy(enabled=True)
    with caplog.at_level(logging.WARNING, logger=scheduling.__name__):
        policy.follow(True)
        policy.follow(False)
        policy.follow(True)
    assert calls == [True] and not policy.enabled
    assert [record.getMessage() for record in caplog.records] == [
        "cannot set the scheduling policy (raft_follower_batch_scheduling is off from now): [Errno 1] Operation not permitted"]


def test_a_process_started_under_another_policy_keeps_it() -> None:
    """An operator's ``chrt`` (here SCHED_IDLE, which needs no privilege) is left alone."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        policy = scheduling.RolePolicy(enabled=True)
        policy.follow(True)
        policy.follow(False)
        assert not policy.enabled and os.sched_getscheduler(0) == os.SCHED_IDLE
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
