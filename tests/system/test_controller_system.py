"""Controller groups of real ``hasvc controller`` processes on loopback, called by the controller
client as brokers call them (the brokers here are fakes: a register and a heartbeat loop each).
SIGKILL of the controller leader, of every controller, restarts from the snapshot."""

from __future__ import annotations

import contextlib

import pytest
import trio

from hasvc.controller.client import ControllerClient
from hasvc.protocol import controller as cp
from hasvc.testing.controller_group import ControllerGroup
from tests.system.controller_nodes import (controller_status as _status, register_broker,  # the names its tests call
                                           replicated_groups as _without_soft_state,
                                           until_controller_status as _until_status)  # fmt: skip

GROUP = "g1"
WAIT_SECONDS = 30.0  # a condition a test waits for (elections take about a second)
HEARTBEAT_INTERVAL_SECONDS = 0.1  # as a broker's broker_heartbeat_interval_seconds


@pytest.fixture
def controllers(tmp_path):
    groups = []

    def start(size: int, *extra_args: str) -> ControllerGroup:
        group = ControllerGroup(tmp_path, size, extra_args=extra_args)
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.close()


async def _register(client: ControllerClient, name: str) -> int:
    return await register_broker(client, GROUP, name)


class FakeBroker:
    """Heartbeats every HEARTBEAT_INTERVAL_SECONDS while ``beating``; keeps the last view."""

    def __init__(self, client: ControllerClient, broker_id: int) -> None:
        self.client, self.broker_id = client, broker_id
        self.beating = True
        self.view: cp.GroupView | None = None
        self.answered_by: str | None = None

    async def run(self) -> None:
        while True:
            if self.beating:
                with contextlib.suppress(Exception):  # a controller election: the next one goes through
                    answer, _sent = await self.client.heartbeat(group=GROUP, broker_id=self.broker_id,
                                                                epoch=self.view.epoch if self.view else 0, max_offset=0)  # fmt: skip
                    if answer.ok:
                        self.view, self.answered_by = answer.view, self.client.leader
            await trio.sleep(HEARTBEAT_INTERVAL_SECONDS)


async def _elect_once_alive(client: ControllerClient, broker_id: int):
    """ELECT ``broker_id``, again while the controller says it has not heartbeaten lately (a
    loaded machine can delay a heartbeat past the timeout; a test must not depend on timing)."""
    with trio.move_on_after(WAIT_SECONDS):
        while True:
            answer = await client.elect(group=GROUP, broker_id=broker_id)
            if answer.ok or "has not heartbeaten" not in (answer.reason or ""):
                return answer
            await trio.sleep(0.05)
    raise AssertionError(f"broker {broker_id} never heartbeating when asked to take over")


async def _until(predicate, what: str):
    with trio.move_on_after(WAIT_SECONDS):
        while not (value := predicate()):
            await trio.sleep(0.02)
        return value
    raise AssertionError(f"timed out waiting for {what}")


async def _first_master_and_a_full_set(client, a: FakeBroker, b: FakeBroker) -> cp.GroupView:
    """Broker a heartbeats first, so it is the group's first master; then it takes b into the set."""
    view = await _until(lambda: a.view if a.view and a.view.master_id is not None else None, "a first master")
    assert view.master_id == a.broker_id and view.epoch == 1 and view.sync_state_set == (a.broker_id,)
    answer = await client.alter_sync_state_set(group=GROUP, master_id=a.broker_id, epoch=1,
                                               sync_state_set_epoch=view.sync_state_set_epoch,
                                               sync_state_set=[a.broker_id, b.broker_id])  # fmt: skip
    assert answer.ok, answer
    assert answer.view.sync_state_set == (1, 2) and answer.view.sync_state_set_epoch == view.sync_state_set_epoch + 1
    stale = await client.alter_sync_state_set(group=GROUP, master_id=a.broker_id, epoch=1,
                                              sync_state_set_epoch=view.sync_state_set_epoch, sync_state_set=[1])  # fmt: skip
    assert stale.status == "REFUSED" and "SyncStateSet epoch" in stale.reason
    assert stale.view.sync_state_set == (1, 2)  # the set the master goes on with
    return answer.view


async def _start_brokers(nursery, addresses) -> tuple[ControllerClient, FakeBroker, FakeBroker]:
    client = ControllerClient(addresses)
    a = FakeBroker(ControllerClient(addresses), await _register(client, "a"))
    nursery.start_soon(a.run)
    await _until(lambda: a.view, "a's first heartbeat answer")
    b = FakeBroker(ControllerClient(addresses), await _register(client, "b"))
    nursery.start_soon(b.run)
    assert (a.broker_id, b.broker_id) == (1, 2)
    return client, a, b


async def test_a_group_of_one_elects_the_first_master_and_keeps_its_state_across_sigkill(controllers):
    group = controllers(1)
    async with trio.open_nursery() as nursery:
        client, a, b = await _start_brokers(nursery, group.addresses)
        view = await _first_master_and_a_full_set(client, a, b)
        spare = await _register(client, "c")  # a third store, outside the set (a member of the set
        # registering again says it restarted: see test_controller_elect's restarted members)
        await trio.to_thread.run_sync(group.kill, "c0")
        await trio.to_thread.run_sync(group.start, "c0")
        assert await _register(client, "c") == spare  # the same store, the same id
        again = await _until(lambda: b.view if b.view and b.view.sync_state_set_epoch >= view.sync_state_set_epoch
                             and b.answered_by else None, "an answer after the restart")  # fmt: skip
        assert (again.master_id, again.epoch, again.sync_state_set) == (view.master_id, view.epoch, view.sync_state_set)
        # An operator's switchover to the slave in the set; the master itself, or a second time, is refused.
        assert (await client.elect(group=GROUP, broker_id=a.broker_id)).status == "REFUSED"
        moved = await _elect_once_alive(client, b.broker_id)
        assert moved.ok and (moved.view.master_id, moved.view.epoch, moved.view.sync_state_set) == (2, 2, (2,))
        await _until(lambda: b.view.epoch == 2 and b.view.lease, "the new master's first lease")
        assert a.view.master_id == b.broker_id or a.view.epoch < 2
        again = await client.elect(group=GROUP, broker_id=b.broker_id)
        assert again.status == "REFUSED" and "master already" in again.reason
        nursery.cancel_scope.cancel()


async def test_a_lapsed_master_is_replaced_by_the_alive_member_of_its_sync_state_set(controllers):
    group = controllers(1)
    async with trio.open_nursery() as nursery:
        client, a, b = await _start_brokers(nursery, group.addresses)
        view = await _first_master_and_a_full_set(client, a, b)
        a.beating = False  # the master falls silent
        elected = await _until(lambda: b.view if b.view.epoch > view.epoch else None, "a new master")
        assert (elected.master_id, elected.epoch, elected.sync_state_set) == (b.broker_id, view.epoch + 1, (b.broker_id,))
        a.beating = True  # back: told of the new master, not elected again
        await _until(lambda: a.view.epoch == elected.epoch, "the old master hearing of the new one")
        assert a.view.master_id == b.broker_id
        status = await _status(group.address("c0"))
        assert status["groups"][GROUP]["master_id"] == b.broker_id and status["elections"] == 2
        nursery.cancel_scope.cancel()


async def test_a_new_controller_leader_answers_with_the_same_state_after_the_leader_is_sigkilled(controllers):
    group = controllers(3)
    async with trio.open_nursery() as nursery:
        client, a, b = await _start_brokers(nursery, group.addresses)
        view = await _first_master_and_a_full_set(client, a, b)
        old = await trio.to_thread.run_sync(group.leader)
        await trio.to_thread.run_sync(group.kill, old)
        moved = await _until(lambda: a.answered_by not in (None, group.address(old)) and a.view, "a new controller leader")
        # The brokers heartbeat on: the new leader counts their silence from when it became
        # leader, so the master stays, in the same epoch, with the same SyncStateSet.
        assert (moved.master_id, moved.epoch, moved.sync_state_set, moved.sync_state_set_epoch) == (
            view.master_id, view.epoch, view.sync_state_set, view.sync_state_set_epoch)
        answer = await client.alter_sync_state_set(group=GROUP, master_id=1, epoch=1,
                                                   sync_state_set_epoch=view.sync_state_set_epoch, sync_state_set=[1])  # fmt: skip
        assert answer.ok and answer.view.sync_state_set == (1,)
        # The killed controller comes back and catches up.
        await trio.to_thread.run_sync(group.start, old)
        back = await _until_status(group.address(old), lambda s: s["applied_index"] >= 0 and
                                   s["groups"].get(GROUP, {}).get("sync_state_set") == [1], "the old leader caught up")  # fmt: skip
        assert back["role"] != "LEADER" or back["groups"][GROUP]["sync_state_set_epoch"] == answer.view.sync_state_set_epoch
        # Every controller SIGKILLed and started again: the state is on disk. (The brokers
        # heartbeat on: a new leader would elect a master that stayed silent.)
        before = (await _status(group.address(await trio.to_thread.run_sync(group.leader))))["groups"]
        for member in group.ids:
            await trio.to_thread.run_sync(group.kill, member)
        for member in group.ids:
            await trio.to_thread.run_sync(group.start, member)
        after = (await _status(group.address(await trio.to_thread.run_sync(group.leader))))["groups"]
        assert _without_soft_state(after) == _without_soft_state(before), (after, before)
        nursery.cancel_scope.cancel()


async def test_snapshots_let_the_log_be_cut_and_a_restart_replays_what_follows(controllers):
    group = controllers(1, "--set", "snapshot_interval_entries=20", "--set", "log_file_size=16384")
    client = ControllerClient(group.addresses)
    for round_ in range(150):  # each registration is an entry (the same identity: the same id back)
        assert await _register(client, "a") == 1
        assert await _register(client, f"b{round_ % 3}") in (2, 3, 4)
    status = await _until_status(group.address("c0"), lambda s: s["log_first_index"] > 0, "retention after a snapshot")
    assert status["snapshot_index"] >= 280 and status["log_first_index"] <= status["snapshot_index"] + 1
    await trio.to_thread.run_sync(group.kill, "c0")
    await trio.to_thread.run_sync(group.start, "c0")
    restarted = await _status(group.address("c0"))
    assert restarted["log_first_index"] > 0  # the state before the first entry came from the snapshot
    assert _without_soft_state(restarted["groups"]) == _without_soft_state(status["groups"])
    assert await _register(client, "b1") == 3
    await client.aclose()


def test_hasvc_status_reads_a_controller_port(controllers):
    import json
    import subprocess

    from hasvc.testing.launch import hasvc_command

    group = controllers(1)
    group.leader()
    shown = subprocess.run(hasvc_command("status", group.address("c0"), "--json"), capture_output=True, check=True)
    data = json.loads(shown.stdout)
    assert (data["mode"], data["role"], data["self_id"], data["groups"]) == ("controller", "LEADER", "c0", {})
    text = subprocess.run(hasvc_command("status", group.address("c0")), capture_output=True, text=True, check=True)
    assert text.stdout.startswith("role         LEADER")


async def test_a_leader_cut_off_from_its_group_stops_answering_heartbeats(controllers):
    """The lease: with both followers SIGKILLed the leader hears from no quorum, so it answers
    HEARTBEAT NOT_LEADER (naming nobody) instead of renewing masters' leases."""
    from hasvc.controller.client import ControllerClientConfig, ControllerUnavailable

    group = controllers(3)
    leader = await trio.to_thread.run_sync(group.leader)
    client = ControllerClient([group.address(leader)], config=ControllerClientConfig(call_timeout_seconds=1.0))
    broker_id = await _register(client, "a")
    answer, _sent = await client.heartbeat(group=GROUP, broker_id=broker_id, epoch=0, max_offset=0)
    assert answer.ok
    for member in group.ids:
        if member != leader:
            await trio.to_thread.run_sync(group.kill, member)
    await _until_status(group.address(leader), lambda s: not s["holds_lease"], "the leader losing its lease")
    with pytest.raises(ControllerUnavailable, match="not the leader"):
        await client.heartbeat(group=GROUP, broker_id=broker_id, epoch=0, max_offset=0)
    await client.aclose()


def test_a_secret_and_metrics(controllers, tmp_path):
    """With a secret a controller refuses a client without it and answers one with it; its
    metrics are served."""
    import urllib.request

    from hasvc.controller.client import ControllerClientConfig, ControllerUnavailable
    from hasvc.tools.partition import LOOPBACK, free_port

    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret\n")
    metrics = f"{LOOPBACK}:{free_port()}"
    group = ControllerGroup(tmp_path / "with-secret", 1, extra_args=("--metrics-listen", metrics), secret_file=str(secret))
    try:
        group.leader()
        address = group.address("c0")

        async def register(secret_bytes):
            client = ControllerClient([address], secret=secret_bytes, config=ControllerClientConfig(call_timeout_seconds=1.0))
            try:
                return await _register(client, "a")
            finally:
                await client.aclose()

        with pytest.raises(ControllerUnavailable, match="AuthenticationError"):
            trio.run(register, None)
        assert trio.run(register, b"s3cret") == 1
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
        assert "hasvc_controller_leader 1.0" in text and "hasvc_controller_groups 1.0" in text
    finally:
        group.close()


@pytest.mark.skipif(__import__("shutil").which("openssl") is None, reason="the openssl command makes the certificates")
async def test_a_group_over_mutual_tls_elects_a_leader_and_answers(tmp_path):
    from tests.cluster import certificate_authority

    ca, issued = certificate_authority(str(tmp_path), ["c0", "c1", "c2"])

    def tls(member):
        key, cert = issued[member]
        return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca]

    group = await trio.to_thread.run_sync(lambda: ControllerGroup(tmp_path / "tls", 3, member_args=tls, tls_ca=ca))
    try:
        await trio.to_thread.run_sync(group.leader)
        client = ControllerClient(group.addresses, ssl_context=group.ssl_context())
        assert await _register(client, "a") == 1
        await client.aclose()
    finally:
        await trio.to_thread.run_sync(group.close)
