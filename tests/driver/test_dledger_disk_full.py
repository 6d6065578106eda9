"""A DLedger leader (a group of one, in-process) whose disk has no room for its next data file
(ENOSPC injected into ``posix_fallocate``): puts are answered DISK_FULL before the Raft core takes
them, and an append that fails anyway (the driver did not see it coming) leaves the core consistent
with the store -- it starts over as a follower -- instead of the "driver did not apply the last
Ready" assertion that stopped the member. Writes resume once there is room."""

from __future__ import annotations

import errno
import os

import trio

from commitlog import mapped_file
from hasvc.config import BrokerRole
from hasvc.state.raft.ready import Role
from tests.driver.dledger_leader import WAIT_SECONDS, Outbox
from tests.driver.test_dledger_pass import _leading, _send

BODY = b"b" * 4000  # a 1 MiB data file holds ~260


class NoRoom:
    def __init__(self, real):
        self.real = real
        self.full = False

    def __call__(self, fd, offset, size):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real(fd, offset, size)


async def _put(broker, outbox: Outbox, request_id: int) -> str:
    broker.put_service.put_items([(outbox, *_send(request_id, 0, [BODY]))])
    with trio.fail_after(WAIT_SECONDS):
        while request_id not in outbox.answers:
            await trio.sleep(0.01)
    return outbox.answers[request_id].status


async def test_a_leader_without_room_answers_disk_full_and_keeps_leading(tmp_path, monkeypatch) -> None:
    no_room = NoRoom(os.posix_fallocate)
    monkeypatch.setattr(mapped_file.os, "posix_fallocate", no_room)
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        outbox = Outbox()
        assert await _put(broker, outbox, 1) == "PUT_OK"
        no_room.full = True
        request_id, status = 1, "PUT_OK"
        while status == "PUT_OK":
            request_id += 1
            assert request_id < 1000, "a 1 MiB data file never filled"
            status = await _put(broker, outbox, request_id)
        assert status == "DISK_FULL" and "no space left" in outbox.answers[request_id].reason
        assert broker.driver.node.role is Role.LEADER and broker.role_state.role is BrokerRole.SYNC_MASTER
        assert broker.status()["disk_full"]
        no_room.full = False
        broker.store.disk.full_at(broker.store.disk.due_at)  # the next measurement
        assert await _put(broker, outbox, request_id + 1) == "PUT_OK"
        nursery.cancel_scope.cancel()


async def test_an_append_that_fails_after_the_core_took_it_restarts_the_core_not_the_member(tmp_path, monkeypatch) -> None:
    no_room = NoRoom(os.posix_fallocate)
    monkeypatch.setattr(mapped_file.os, "posix_fallocate", no_room)
    async with trio.open_nursery() as nursery:
        broker = await _leading(tmp_path, nursery)
        monkeypatch.setattr(broker.driver, "_room_refusal", lambda plan: None)  # as if no check had seen it
        outbox = Outbox()
        assert await _put(broker, outbox, 1) == "PUT_OK"
        no_room.full = True
        node = broker.driver.node
        request_id, status = 1, "PUT_OK"
        while status == "PUT_OK":  # the core takes each; the one that needs the next data file fails
            request_id += 1
            assert request_id < 1000, "a 1 MiB data file never filled"
            status = await _put(broker, outbox, request_id)
        assert status in ("SERVICE_NOT_AVAILABLE", "SLAVE_NOT_AVAILABLE"), status  # never PUT_OK
        assert broker.driver.node is not node  # the core started over from the store
        entries = broker.store.entries
        assert broker.driver.node.last_index == entries.last_index()
        assert entries.data_file_list.last.file_from_offset == 0  # nothing written past the first data file
        no_room.full = False
        with trio.fail_after(WAIT_SECONDS):  # the group of one elects itself again and takes writes
            while broker.role_state.role is not BrokerRole.SYNC_MASTER:
                await trio.sleep(0.01)
        assert await _put(broker, outbox, request_id + 1) == "PUT_OK"
        nursery.cancel_scope.cancel()
