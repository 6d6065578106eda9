"""A master's HA service stopped and started again on the same port (a controller-mode master
named again in a newer epoch does this): once StopHAService returns the port is free, also while
a slave's connection was open. Before, the listener closed only when the cancelled service task
next ran, and the new bind could come first (EADDRINUSE: the broker exited)."""

from __future__ import annotations

import socket

import trio

from commitlog.store import MessageStore
from hasvc.broker import Broker
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.state import role as role_effects
from hasvc.tools.partition import LOOPBACK, free_port

SEGMENT = 64 * 1024
TEST_TIMEOUT_SECONDS = 10


def _bind(port: int) -> None:
    """Bind the port as a listener does (SO_REUSEADDR): fails only while a listener holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((LOOPBACK, port))


async def test_the_ha_port_is_free_once_the_service_is_stopped(tmp_path) -> None:
    port = free_port()
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.SYNC_MASTER, commitlog_segment_size=SEGMENT,
                          listen=(LOOPBACK, 0), ha_listen=(LOOPBACK, port))  # fmt: skip
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    with trio.fail_after(TEST_TIMEOUT_SECONDS):
        async with trio.open_nursery() as nursery:
            broker._nursery = nursery
            await broker._carry_out([role_effects.StartHAService()])
            slave = await trio.open_tcp_stream(LOOPBACK, port)  # a slave's connection, mid-preface
            await trio.testing.wait_all_tasks_blocked()
            await broker._carry_out([role_effects.StopHAService()])
            _bind(port)  # at once, with no checkpoint between: the listener must be closed already
            await broker._carry_out([role_effects.StartHAService()])  # the same port again
            await broker._carry_out([role_effects.StopHAService()])
            await slave.aclose()
    broker.store.close()
