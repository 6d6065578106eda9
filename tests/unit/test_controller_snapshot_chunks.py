"""The pure part of moving a controller snapshot: the answering side's chunks and the fetching
side's assembly (hasvc/state/controller/snapshot_transfer.py)."""

import random

import pytest

from hasvc.state.controller import state as cs
from hasvc.state.controller.snapshot_transfer import SnapshotAssembly, SnapshotSource, SnapshotTransferError


def _state(groups: int, index: int) -> cs.ControllerState:
    """``groups`` groups of one member, the last registered by Raft entry ``index``."""
    state = cs.ControllerState()
    for number in range(groups):
        state.apply(cs.Register(f"g{number}", f"identity-{number}", "127.0.0.1:1", "127.0.0.1:2"),
                    index=index - groups + 1 + number)  # fmt: skip
    return state


def _fetch(source: SnapshotSource, state: cs.ControllerState, min_index: int) -> cs.ControllerState:
    assembly = SnapshotAssembly(min_index)
    while not assembly.done:
        index, offset = assembly.request()
        chunk = source.chunk(state, index=index, offset=offset)
        assert not isinstance(chunk, str), chunk
        snapshot_index, size, data = chunk
        assembly.receive(index=snapshot_index, size=size, offset=offset, data=data)
    return assembly.state()


@pytest.mark.parametrize("chunk_size", [1, 7, 100, 1 << 20])
def test_a_state_crosses_in_chunks_and_equals_the_source(chunk_size):
    state = _state(5, 40)
    fetched = _fetch(SnapshotSource(chunk_size), state, 30)
    assert fetched == state and fetched.applied_index == 40


def test_a_source_behind_the_index_asked_refuses():
    refusal = SnapshotSource(64).chunk(_state(1, 9), index=10, offset=0)
    assert refusal == "the state here reflects entry 9, below the 10 asked"


def test_a_source_keeps_its_snapshot_for_later_chunks_and_refuses_a_replaced_one():
    source = SnapshotSource(16)
    state = _state(2, 5)
    index, size, first = source.chunk(state, index=5, offset=0)
    state.apply(cs.Register("g9", "identity-9", "h:1", "h:2"), index=6)
    assert source.chunk(state, index=5, offset=16)[0] == 5  # the kept one, though the state moved on
    source.chunk(state, index=6, offset=0)  # a fetcher that needs more: a fresh snapshot
    assert "no longer kept" in source.chunk(state, index=5, offset=16)


def test_chunks_that_do_not_continue_the_snapshot_are_refused():
    data = _state(1, 3).snapshot()
    assembly = SnapshotAssembly(3)
    with pytest.raises(SnapshotTransferError, match="below the 3 asked"):
        assembly.receive(index=2, size=len(data), offset=0, data=data)
    assembly.receive(index=3, size=len(data), offset=0, data=data[:10])
    with pytest.raises(SnapshotTransferError, match="at offset 5, 10 asked"):
        assembly.receive(index=3, size=len(data), offset=5, data=data[5:])
    with pytest.raises(SnapshotTransferError, match="while fetching entry 3"):
        assembly.receive(index=4, size=len(data), offset=10, data=data[10:])
    with pytest.raises(SnapshotTransferError, match="runs past"):
        assembly.receive(index=3, size=len(data), offset=10, data=data[10:] + b"x")


def test_a_damaged_snapshot_fails_its_crc_and_is_not_installed():
    data = bytearray(_state(3, 8).snapshot())
    data[random.Random(1).randrange(8, len(data))] ^= 0x40
    assembly = SnapshotAssembly(0)
    assembly.receive(index=8, size=len(data), offset=0, data=bytes(data))
    with pytest.raises(cs.StateFormatError, match="CRC32C"):
        assembly.state()


def test_a_snapshot_whose_header_names_another_index_than_its_chunks_is_refused():
    data = _state(1, 8).snapshot()
    assembly = SnapshotAssembly(0)
    assembly.receive(index=9, size=len(data), offset=0, data=data)
    with pytest.raises(SnapshotTransferError, match="reflects entry 8, its chunks said 9"):
        assembly.state()
