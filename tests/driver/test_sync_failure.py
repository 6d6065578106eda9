"""A broker whose log's sync fails (EIO injected into the sync): the puts waiting for that flush
are never answered PUT_OK, later puts are refused, STATUS and the log say why in one line, and
the broker goes on (reads, STATUS) without ever syncing again."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os

import trio

from commitlog import mapped_file
from commitlog.store import MessageStore
from hasvc.broker import Broker
from hasvc.broker.broker import store_condition
from hasvc.config import BrokerConfig, BrokerRole, FlushDiskType
from hasvc.protocol import client as cp
from hasvc.protocol.client_frames import answers_of

SEGMENT = 64 * 1024


class _Outbox:
    def __init__(self):
        self.answers = []
        self.answered = trio.Event()

    def respond(self, frame, payload):
        self.answers.append((frame.request_id, cp.decode_send_response(payload).status))
        self.answered.set()
        self.answered = trio.Event()

    def respond_joined(self, data, count):
        for answer in answers_of(data):
            self.respond(answer, answer.payload)

    async def wait_answers(self, count):
        while len(self.answers) < count:
            await self.answered.wait()

    def flush(self):
        pass


def send_request(body: bytes) -> cp.SendRequest:
    return cp.SendRequest("T", 0, [body], [b""], 0, 0)


async def test_a_failed_group_commit_answers_its_puts_flush_disk_timeout_and_refuses_later_ones(tmp_path, monkeypatch, caplog):
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.ASYNC_MASTER, commitlog_segment_size=SEGMENT,
                          flush=FlushDiskType.SYNC_FLUSH)  # fmt: skip
    broker = Broker(config)
    store_config = dataclasses.replace(config.store_config(), sync_flush_timeout_ms=600_000)
    broker.attach_store(MessageStore.open(str(tmp_path), store_config))
    syncs = []

    def failing_sync(*args):
        syncs.append(args)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    outbox = _Outbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.put_service.waiter_timer_task)
        nursery.start_soon(broker.store_tasks.group_commit_task, broker.put_service)
        broker.put_service.put_items([(outbox, cp.Frame(cp.SEND, 1, b""), send_request(b"flushed"))])
        with trio.fail_after(10):
            await outbox.wait_answers(1)
        assert outbox.answers == [(1, "PUT_OK")]

        monkeypatch.setattr(mapped_file, "_native_sync_range", failing_sync)
        monkeypatch.setattr(mapped_file.os, "fdatasync", failing_sync)
        with caplog.at_level(logging.ERROR, logger="hasvc.broker.store_tasks"):
            broker.put_service.put_items([(outbox, cp.Frame(cp.SEND, 2, b""), send_request(b"lost?"))])
            with trio.fail_after(10):  # answered by the failure, not by sync_flush_timeout (10 minutes)
                await outbox.wait_answers(2)
        assert outbox.answers[1] == (2, "FLUSH_DISK_TIMEOUT")
        failure = broker.store.write_failure
        assert failure is not None and "Input/output error" in failure
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == [failure]
        assert "\n" not in failure
        assert store_condition(broker.store) == {"write_failure": failure}  # STATUS adds these

        broker.put_service.put_items([(outbox, cp.Frame(cp.SEND, 3, b""), send_request(b"refused"))])
        with trio.fail_after(10):
            await outbox.wait_answers(3)
        assert outbox.answers[2] == (3, "SERVICE_NOT_AVAILABLE")
        assert len(syncs) == 1  # never synced again
        assert broker.store.get_record(0).body == b"flushed"  # reads go on
        nursery.cancel_scope.cancel()
    broker.store.close(clean=False)
