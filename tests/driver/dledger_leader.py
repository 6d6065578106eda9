"""A DLedger leader in-process for driver tests: a group of one ``RaftBroker`` (its quorum is
itself) on loopback, an outbox that keeps the SEND answers it is given, and a bounded wait.
Shared by the tests of the leader's put path (test_dledger_pass, test_dledger_producer_table,
test_dledger_disk_full)."""

from __future__ import annotations

import trio

from hasvc.broker.raft.broker import RaftBroker
from hasvc.broker.raft.group import GroupConfig
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.protocol import client as cp
from hasvc.protocol.client_frames import answers_of
from hasvc.state.raft.config import RaftConfig

FAST = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.2, election_timeout_max_seconds=0.3)
WAIT_SECONDS = 10.0  # anything that takes longer failed


class Outbox:
    """A connection's answers as the put path hands them over: by request id, decoded."""

    def __init__(self):
        self.answers: dict[int, cp.SendResponse] = {}

    def respond(self, frame, payload):
        self.answers[frame.request_id] = cp.decode_send_response(payload)

    def respond_joined(self, data, count):
        for answer in answers_of(data):
            self.respond(answer, answer.payload)

    def flush(self):
        pass


async def until(condition) -> None:
    """Return once ``condition()`` holds; fail after ``WAIT_SECONDS``."""
    with trio.fail_after(WAIT_SECONDS):
        while not condition():
            await trio.sleep(0.01)


async def leading(tmp_path, nursery, **config) -> RaftBroker:
    """A group of one member (its quorum is itself) storing in ``tmp_path``, SYNC_MASTER once its
    no-op is committed; ``config`` adds to its ``BrokerConfig``."""
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, listen=("127.0.0.1", 0),
                          commitlog_segment_size=1024 * 1024, **config)  # fmt: skip
    broker = RaftBroker(config, GroupConfig(group="g", self_id="n0", peers={"n0": ("127.0.0.1", 0)}, raft=FAST))
    await nursery.start(broker.run)
    await until(lambda: broker.role_state.role is BrokerRole.SYNC_MASTER)
    return broker
