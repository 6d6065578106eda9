"""free_port's slices: parallel test workers pick their fixed ports from parts of the range that
never overlap."""

import pytest

from hasvc.tools import partition


def test_without_a_slice_the_whole_range(monkeypatch) -> None:
    monkeypatch.delenv("HASVC_FREE_PORT_SLICE", raising=False)
    assert partition._slice(10000, 32768) == (10000, 32768)


@pytest.mark.parametrize("shown", ["", "x", "3/2", "-1/2", "1/0", "1/1000"])
def test_a_slice_that_is_not_one_takes_the_whole_range(monkeypatch, shown) -> None:
    monkeypatch.setenv("HASVC_FREE_PORT_SLICE", shown)
    assert partition._slice(10000, 32768) == (10000, 32768)


def test_the_slices_of_n_workers_are_disjoint_and_ports_fall_in_their_own(monkeypatch) -> None:
    parts = []
    for index in range(4):
        monkeypatch.setenv("HASVC_FREE_PORT_SLICE", f"{index}/4")
        parts.append(partition._slice(partition.FREE_PORT_LOW, partition._ephemeral_low()))
        low, high = parts[-1]
        assert low <= partition.free_port() < high
    assert all(a[1] <= b[0] for a, b in zip(parts, parts[1:], strict=False))
    assert parts[0][0] == partition.FREE_PORT_LOW and parts[-1][1] <= partition._ephemeral_low()
