"""A controller whose log starts past its state catches up by itself: three real ``hasvc
controller`` processes cut their logs after snapshots; one is SIGKILLed and its store wiped (or
its snapshot file deleted), and when it starts again the leader RESETs it to its first index and
it fetches a snapshot over the controller port (SNAPSHOT), installs it, and ends with the leader's
state."""

from __future__ import annotations

import os
import shutil

import trio

from hasvc.controller.client import ControllerClient
from hasvc.controller.config import SNAPSHOT_DIRECTORY, SNAPSHOT_FILE
from hasvc.testing.controller_group import ControllerGroup
from tests.system.controller_nodes import controller_status, register_broker, replicated_groups, until_controller_status

ROUNDS_MAX = 2000  # two registrations a round, until a member cut its log (a few hundred entries do)


async def _register_until(client: ControllerClient, cut, what: str) -> str:
    """Registrations, 100 a round of checks, until ``cut()`` (awaited) returns a member's id; that id."""
    for round_ in range(ROUNDS_MAX):
        await register_broker(client, f"g{round_ % 7}", f"{round_ % 5}")
        await register_broker(client, "g-main", f"{round_ % 3}")
        if round_ % 50 == 49 and (member := await cut()) is not None:
            return member
    raise AssertionError(f"{what} not cut after {ROUNDS_MAX} rounds of registrations")


async def _cut_logs(group: ControllerGroup, client: ControllerClient) -> str:
    """Enough commands that the leader snapshots and cuts its log; the leader's id."""

    async def leader_cut() -> str | None:
        leader = await trio.to_thread.run_sync(group.leader)
        return leader if (await controller_status(group.address(leader)))["log_first_index"] > 0 else None

    return await _register_until(client, leader_cut, "the leader's log")


async def _caught_up(group: ControllerGroup, member: str, leader: str) -> dict:
    """Wait until ``member`` applied what the leader did; both statuses' replicated state."""
    expected = await controller_status(group.address(leader))
    status = await until_controller_status(group.address(member),
                                           lambda s: s["applied_index"] >= expected["applied_index"],
                                           f"{member} applying up to entry {expected['applied_index']}")  # fmt: skip
    expected = await controller_status(group.address(leader))
    status = await until_controller_status(group.address(member),
                                           lambda s: s["applied_index"] == expected["applied_index"],
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
        assert replicated_groups(status["groups"]) == replicated_groups(expected["groups"])
        assert os.path.exists(os.path.join(group.directory, wiped, SNAPSHOT_DIRECTORY, SNAPSHOT_FILE))
        # It goes on applying what follows, and it can lead with that state.
        assert await register_broker(client, "g-after", "9") == 1
        status, expected = await _caught_up(group, wiped, leader)
        assert replicated_groups(status["groups"]) == replicated_groups(expected["groups"])
        assert "g-after" in status["groups"]
        for member in group.ids:
            if member != wiped:
                await trio.to_thread.run_sync(group.kill, member)
        await trio.to_thread.run_sync(group.start, leader)
        assert await trio.to_thread.run_sync(group.leader) in (wiped, leader)
        assert await register_broker(client, "g-main", "0") == 1  # the same identity, the same id: the state was whole
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
        # Its own log cut too: a log still starting at 0 would replay the whole state without a
        # snapshot (CI once saw 0 installed). Each member cuts its own, after one of its own
        # snapshots once the leader's announced floor passed a whole file; that can take more
        # entries than the leader's cut did (CI once waited for it with none coming), so the
        # registrations go on until it has.

        async def member_cut() -> str | None:
            return member if (await controller_status(group.address(member)))["log_first_index"] > 0 else None

        await _register_until(client, member_cut, f"{member}'s log")
        await trio.to_thread.run_sync(group.kill, member)
        os.remove(os.path.join(group.directory, member, SNAPSHOT_DIRECTORY, SNAPSHOT_FILE))
        await trio.to_thread.run_sync(group.start, member)
        status, expected = await _caught_up(group, member, leader)
        assert status["snapshots_installed"] == 1, status
        assert replicated_groups(status["groups"]) == replicated_groups(expected["groups"])
    finally:
        await client.aclose()
        group.close()
