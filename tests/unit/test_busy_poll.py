"""hasvc/busy_poll.py: poll before sleeping, as a plain function of a poll call and a clock, and
its installation into trio's epoll loop."""

import socket

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from hasvc import busy_poll


class FakeEpoll:
    """``results`` in turn for each poll; the clock moves ``step`` seconds per poll."""

    def __init__(self, results, step: float = 1e-6):
        self.results, self.step, self.now = list(results), step, 0.0
        self.calls: list[float] = []
        self.yields = 0

    def poll(self, timeout: float, max_events: int):
        assert max_events == 5
        self.calls.append(timeout)
        self.now += self.step
        return self.results.pop(0) if self.results else []

    def clock(self) -> float:
        return self.now

    def yield_cpu(self) -> None:
        self.yields += 1


def run(epoll: FakeEpoll, timeout: float, spin: float):
    return busy_poll.BusyPoll(spin).wait(epoll.poll, timeout, 5, epoll.clock, epoll.yield_cpu)


def test_nothing_to_wait_for_polls_once_without_spinning():
    epoll = FakeEpoll([[(3, 1)]])
    assert run(epoll, 0, 50e-6) == [(3, 1)]
    assert epoll.calls == [0] and epoll.yields == 0


def test_spinning_off_is_one_blocking_poll():
    epoll = FakeEpoll([[]])
    assert run(epoll, 0.25, 0) == []
    assert epoll.calls == [0.25]


def test_events_found_while_spinning_end_the_wait_without_sleeping():
    epoll = FakeEpoll([[], [], [(7, 1)]])
    assert run(epoll, 1.0, 50e-6) == [(7, 1)]
    assert epoll.calls == [0, 0, 0]  # never a blocking poll
    assert epoll.yields == 2  # the CPU offered to others between polls


def test_nothing_found_sleeps_for_the_rest_of_the_timeout():
    epoll = FakeEpoll([], step=10e-6)
    assert run(epoll, 0.5, 50e-6) == []
    assert epoll.calls[:-1] == [0] * (len(epoll.calls) - 1) and len(epoll.calls) == 6
    assert epoll.calls[-1] == pytest.approx(0.5 - 50e-6)


def test_a_timeout_shorter_than_the_spin_is_never_exceeded():
    epoll = FakeEpoll([], step=10e-6)
    assert run(epoll, 20e-6, 1e-3) == []
    assert epoll.calls[-1] == 0.0 and len(epoll.calls) == 3


@given(
    results=st.lists(st.sampled_from([[], [], [(4, 1)]]), max_size=30),
    timeout=st.sampled_from([0, 1e-6, 30e-6, 0.01, 1.0]),
    spin=st.sampled_from([0, 1e-6, 50e-6, 200e-6]),
    step=st.sampled_from([0.5e-6, 5e-6, 60e-6]),
)
def test_the_first_events_are_returned_and_no_wait_outlasts_its_timeout(results, timeout, spin, step):
    epoll = FakeEpoll(results, step)
    got = run(epoll, timeout, spin)
    made = len(epoll.calls)
    answers = [results[i] if i < len(results) else [] for i in range(made)]
    assert got == answers[-1]  # the last poll's answer is returned ...
    assert not any(answers[:-1])  # ... and no earlier poll found anything
    if timeout <= 0 or spin <= 0:
        assert epoll.calls == [timeout]
        return
    rest = timeout - min(spin, timeout)
    assert set(epoll.calls[:-1]) <= {0}  # zero-timeout polls, then one that may wait
    assert epoll.calls[-1] == 0 or epoll.calls[-1] == pytest.approx(rest)
    budget = min(spin, timeout)
    assert (made - 2) * step < budget + 1e-12  # the spin stops at its budget (then one last poll)
    if epoll.calls[-1] != 0:  # it slept only after spinning dry for the whole budget
        assert (made - 1) * step >= budget - 1e-12


def test_the_budget_grows_for_events_that_come_soon_and_shrinks_to_nothing_for_late_ones():
    poller = busy_poll.BusyPoll(100e-6)
    for _ in range(3):
        poller.woken_after(1e-3)  # slept long: halved each time
    assert poller.budget == pytest.approx(12.5e-6)
    for _ in range(10):
        poller.woken_after(None)  # timed out
    assert poller.budget == 0.0  # below a microsecond: no polling at all
    poller.woken_after(80e-6)  # woken within the limit: polling starts again, at a quarter
    assert poller.budget == pytest.approx(25e-6)
    poller.woken_after(10e-6)
    poller.woken_after(10e-6)
    poller.woken_after(10e-6)
    assert poller.budget == pytest.approx(100e-6)  # doubled, up to the limit


def test_a_poller_that_stopped_polling_sleeps_at_once_and_learns_from_the_wake_up():
    poller = busy_poll.BusyPoll(50e-6)
    poller.budget = 0.0
    epoll = FakeEpoll([[(3, 1)]], step=20e-6)
    assert poller.wait(epoll.poll, 1.0, 5, epoll.clock, epoll.yield_cpu) == [(3, 1)]
    assert epoll.calls == [1.0]  # no zero-timeout poll first
    assert poller.budget == pytest.approx(12.5e-6)  # woken 20 us in: within the limit, so it grows


def test_install_refuses_a_negative_or_huge_setting_and_zero_changes_nothing():
    from trio._core._io_epoll import EpollIOManager

    before = EpollIOManager.get_events
    with pytest.raises(ValueError, match="busy_poll_us"):
        busy_poll.install(-1)
    with pytest.raises(ValueError, match="busy_poll_us"):
        busy_poll.install(busy_poll.BUSY_POLL_US_MAX + 1)
    assert busy_poll.install(0) is False
    assert EpollIOManager.get_events is before


def test_an_installed_loop_still_sleeps_times_out_and_wakes_for_sockets():
    from trio._core._io_epoll import EpollIOManager

    original = EpollIOManager.get_events
    try:
        assert busy_poll.install(50) is True
        assert busy_poll.install(100) is True  # again: replaces the spin, does not stack
        assert EpollIOManager.get_events.busy_poll_original is original

        async def main():
            with trio.move_on_after(0.02) as scope:  # a wait that times out with nothing ready
                await trio.sleep_forever()
            assert scope.cancelled_caught
            a, b = trio.socket.socketpair(type=socket.SOCK_STREAM)
            with a, b:
                async with trio.open_nursery() as nursery:
                    async def later():
                        await trio.sleep(0.01)
                        await a.send(b"x")

                    nursery.start_soon(later)
                    assert await b.recv(1) == b"x"  # woken by the socket, after the spin ran dry

        trio.run(main)
    finally:
        EpollIOManager.get_events = original


@pytest.mark.parametrize("value", [-1, busy_poll.BUSY_POLL_US_MAX + 1])
def test_a_broker_config_names_a_busy_poll_setting_out_of_range(tmp_path, value):
    from hasvc.config import BrokerConfig

    with pytest.raises(ValueError, match=r"busy_poll_us=-?\d+: must be in 0\.\.1,000,000"):
        BrokerConfig(store=str(tmp_path), busy_poll_us=value).validate()
    assert BrokerConfig(store=str(tmp_path), busy_poll_us=50).validate().busy_poll_us == 50
