"""A Raft port in use when a DLedger member or a controller opens it (the CLI's check passed, then
another process bound it): one line naming the address, the noun and the --self, no traceback."""

import errno

import pytest

from hasvc import transport
from hasvc.broker.raft.listener import open_raft_listener
from hasvc.config import format_address


@pytest.mark.parametrize("noun", ["member", "controller"])
async def test_a_raft_address_in_use_is_one_line_naming_it(noun) -> None:
    taken, socket = await transport.open_listener(("127.0.0.1", 0))
    address = transport.listener_address(socket)
    try:
        with pytest.raises(OSError) as raised:
            await open_raft_listener(address, noun=noun, self_id="x1")
    finally:
        await taken.aclose()
    assert raised.value.errno == errno.EADDRINUSE
    message = str(raised.value)
    assert f"the Raft address {format_address(address)} of {noun} x1 (its entry in --peers) is in use" in message
    assert f"is a {noun} with --self x1 running already?" in message
    assert "\n" not in message and raised.value.__cause__ is None


async def test_a_free_raft_address_opens() -> None:
    listener, socket = await open_raft_listener(("127.0.0.1", 0), noun="member", self_id="n0")
    try:
        assert transport.listener_address(socket)[1] != 0
    finally:
        await listener.aclose()
