"""Controller groups (``hasvc controller``) and controlled broker groups (``hasvc broker`` under
a controller) of real processes on loopback, for the system tests (test_controller_system,
test_controlled_broker and the tests beside them): a controller's STATUS and waiting for one,
the replicated part of its groups, a fake broker's registration; a controlled group's master
with its slave in sync, the numbered messages found in a store, and a power loss emulated on a
stopped broker's store; an old master back as a slave, both then stopped."""

from __future__ import annotations

import contextlib
import os

import trio

from commitlog.checkpoint import StoreCheckpoint
from commitlog.inspect import iter_records
from hasvc.controller.client import ControllerClient
from hasvc.testing.controlled_group import ControlledGroup

STATUS_WAIT_SECONDS = 60.0  # a controller's STATUS condition a test waits for (a loaded host; nothing is timed)
STATUS_POLL_SECONDS = 0.05


async def controller_status(address: str) -> dict:
    """The controller part of ``address``'s STATUS (a client of its own, closed after)."""
    client = ControllerClient([address])
    try:
        return (await client.status_of(address)).controller
    finally:
        await client.aclose()


async def until_controller_status(address: str, predicate, what: str) -> dict:
    """The first STATUS of ``address`` that ``predicate`` accepts (one not answered is asked again)."""
    with trio.move_on_after(STATUS_WAIT_SECONDS):
        while True:
            with contextlib.suppress(Exception):
                status = await controller_status(address)
                if predicate(status):
                    return status
            await trio.sleep(STATUS_POLL_SECONDS)
    raise AssertionError(f"timed out waiting for {what}")


def replicated_groups(groups: dict) -> dict:
    """The replicated part of STATUS groups (the heartbeat fields are the leader's soft state)."""
    return {name: {**group, "members": {broker_id: {k: member[k] for k in ("identity", "client_address", "ha_address")}
                                        for broker_id, member in group["members"].items()}}
            for name, group in groups.items()}  # fmt: skip


async def register_broker(client: ControllerClient, group: str, name: str) -> int:
    """REGISTER a fake broker ``name`` of ``group`` (its identity and addresses made of the name); its id."""
    answer = await client.register(group=group, identity=f"identity-{name}", client_address=f"127.0.0.1:{name}1",
                                   ha_address=f"127.0.0.1:{name}2")  # fmt: skip
    assert answer.ok, answer
    return answer.broker_id


def start_master_and_slave(group: ControlledGroup) -> tuple[str, str]:
    """Brokers ``a`` and ``b`` started, the controller's master and its slave, once the slave is
    in the SyncStateSet with the master's log end: (master, slave)."""
    group.start_broker("a")
    group.start_broker("b")
    master = group.master()
    slave = "b" if master == "a" else "a"
    group.wait(lambda: group.in_sync(master, [slave]), "the slave in the SyncStateSet")
    return master, slave


def rejoin_and_stop(group: ControlledGroup, old: str, new: str) -> int:
    """The old master ``old`` restarted and caught up as ``new``'s slave, with the same epoch
    history; then both brokers stopped: ``new``'s log end, for the checks from disk."""
    group.restart(old)  # back as the new master's slave
    group.wait(lambda: group.in_sync(new, [old]), "the old master caught up as a slave")
    assert group.status(old)["role"] == "SLAVE"
    assert group.status(old)["epochs"] == group.status(new)["epochs"]
    end = group.status(new)["max_offset"]
    for name in ("a", "b"):
        group.brokers[name].stop()
    return end


def numbered_in_store(store: str, topic: str) -> dict[int, list[int]]:
    """Message number -> the offsets of ``topic``'s records ``m<number>`` (or ``m<number>:...``) in
    the stopped broker's ``store``; every record's crc checked."""
    found: dict[int, list[int]] = {}
    for offset, record, crc_ok in iter_records(store):
        assert crc_ok, offset
        body = bytes(record.body)
        if record.topic == topic and body.startswith(b"m"):
            found.setdefault(int(body.split(b":", 1)[0][1:]), []).append(offset)
    return found


def cut_log(store: str, offset: int) -> None:
    """Zero the stopped broker's commit log from ``offset`` on (what a power loss leaves of pages
    never flushed); its epoch file stays (it is fsynced at every change). The checkpoint's flushed
    offset is lowered to ``offset`` when above: a periodic flush that ran before the kill would have
    put those pages on disk, and a power loss cannot take them (recovery would rightly call the
    missing bytes lost writes)."""
    checkpoint = StoreCheckpoint.open(os.path.join(store, "checkpoint"))
    if checkpoint.master_flushed_offset > offset:
        checkpoint.master_flushed_offset = offset
        checkpoint.flush()
    directory = os.path.join(store, "commitlog")
    for name in sorted(os.listdir(directory)):
        start, path = int(name), os.path.join(directory, name)
        size = os.path.getsize(path)
        if start + size <= offset:
            continue
        with open(path, "r+b") as file:
            file.seek(max(0, offset - start))
            file.write(bytes(size - max(0, offset - start)))
