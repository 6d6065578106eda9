"""A controller whose log starts past its state catches up by itself: three real ``hasvc
controller`` processes cut their logs after snapshots; one is SIGKILLed and its store wiped (or
its snapshot file deleted), and when it starts again the leader RESETs it to its first index and
it fetches a snapshot over the controller port (SNAPSHOT), installs it, and ends with the leader's
state."""

from __future__ import annotations

import contextlib
import os
import shutil

import trio

from hasvc.controller.client import ControllerClient
from hasvc.controller.config import SNAPSHOT_DIRECTORY, SNAPSHOT_FILE
from hasvc.testing.controller_group import ControllerGroup

WAIT_SECONDS = 60.0  # a condition a test waits for (a loaded host; nothing here is timed)
ROUNDS_MAX = 2000  # two registrations a round, until the leader cut its log (a few hundred entries do)


async def _status(address: str) -> dict:
    client = ControllerClient([address])
    try:
        return (await client.status_of(address)).controller
    finally:
        await client.aclose()


async def _until_status(address: str, predicate, what: str) -> dict:
    with trio.move_on_after(WAIT_SECONDS):
        while True:
            with contextlib.suppress(Exception):
                status = await _status(address)
                if predicate(status):
                    return status
            await trio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _replicated(groups: dict) -> dict:
    """The replicated part of STATUS groups (the heartbeat fields are the leader's soft state)."""
    return {name: {**group, "members": {broker_id: {k: member[k] for k in ("identity", "client_address", "ha_address")}
                                        for broker_id, member in group["members"].items()}}
            for name, group in groups.items()}  # fmt: skip


async def _register(client: ControllerClient, group: str, name: str) -> int:
    answer = await client.register(group=group, identity=f"identity-{name}", client_address=f"127.0.0.1:{name}",
                                   ha_address=f"127.0.0.1:{name}")  # fmt: skip
    assert answer.ok, answer
    return answer.broker_id


async def _cut_logs(group: ControllerGroup, client: ControllerClient) -> str:
    """Enough commands that the leader snapshots and cuts its log; the leader's id."""
    for round_ in range(ROUNDS_MAX):
        await _register(client, f"g{round_ % 7}", f"{round_ % 5}")
        await _register(client, "g-main", f"{round_ % 3}")
        if round_ % 50 == 49:
            leader = await trio.to_thread.run_sync(group.leader)
            if (await _status(group.address(leader)))["log_first_index"] > 0:
                return leader
    raise AssertionError(f"the leader's log not cut after {ROUNDS_MAX} rounds of registrations")


async def _caught_up(group: ControllerGroup, member: str, leader: str) -> dict:
    """Wait until ``member`` applied what the leader did; both statuses' replicated state."""
    expected = await _status(group.address(leader))
    status = await _until_status(group.address(member), lambda s: s["applied_index"] >= expected["applied_index"],
                                 f"{member} applying up to entry {expected['applied_index']}")  # fmt: skip
    expected = await _status(group.address(leader))
    status = await _until_status(group.address(member), lambda s: s["applied_index"] == expected["applied_index"],
                                 f"{member} at the leader's entry {expected['applied_index']}")  # fmt: skip
    return status, expected


async def test_a_wiped_controller_fetches_a_snapshot_and_ends_with_the_leaders_state(tmp_path):
    group = ControllerGroup(tmp_path, 3, extra_args=("--set", "snapshot_interval_entries=20",
                                                     "--set", "log_file_size=16384"))  # fmt: skip
    client = ControllerClient(group.addresses)
    try:
        leader = await _cut_logs(group, client)
        wiped = next(member for member in group.ids if member != leader)
        await trio.to_thread.run_sync(group.kill, wiped)
        shutil.rmtree(os.path.join(group.directory, wiped))
        await trio.to_thread.run_sync(group.start, wiped)
        status, expected = await _caught_up(group, wiped, leader)
        assert status["snapshots_installed"] >= 1 and not status["snapshot_needed"], status
        assert status["log_first_index"] > 0  # reset to the leader's first index: the state came from the snapshot
        assert _replicated(status["groups"]) == _replicated(expected["groups"])
        assert os.path.exists(os.path.join(group.directory, wiped, SNAPSHOT_DIRECTORY, SNAPSHOT_FILE))
        # It goes on applying what follows, and it can lead with that state.
        assert await _register(client, "g-after", "9") == 1
        status, expected = await _caught_up(group, wiped, leader)
        assert _replicated(status["groups"]) == _replicated(expected["groups"]) and "g-after" in status["groups"]
        for member in group.ids:
            if member != wiped:
                await trio.to_thread.run_sync(group.kill, member)
        await trio.to_thread.run_sync(group.start, leader)
        assert await trio.to_thread.run_sync(group.leader) in (wiped, leader)
        assert await _register(client, "g-main", "0") == 1  # the same identity, the same id: the state was whole
    finally:
        await client.aclose()
        group.close()


async def test_a_controller_restarted_without_its_snapshot_fetches_one_instead_of_stopping(tmp_path):
    """The log starts past the state at start (the snapshot file is gone): it used to stop and
    ask an operator to copy the file; it fetches one."""
    group = ControllerGroup(tmp_path, 3, extra_args=("--set", "snapshot_interval_entries=20",
                                                     "--set", "log_file_size=16384"))  # fmt: skip
    client = ControllerClient(group.addresses)
    try:
        leader = await _cut_logs(group, client)
        member = next(m for m in group.ids if m != leader)
        await trio.to_thread.run_sync(group.kill, member)
        os.remove(os.path.join(group.directory, member, SNAPSHOT_DIRECTORY, SNAPSHOT_FILE))
        await trio.to_thread.run_sync(group.start, member)
        status, expected = await _caught_up(group, member, leader)
        assert status["snapshots_installed"] == 1, status
        assert _replicated(status["groups"]) == _replicated(expected["groups"])
    finally:
        await client.aclose()
        group.close()
