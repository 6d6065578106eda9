import pytest

from commitlog.waiters import OffsetWaiters, WaitersFull


def test_release_returns_exactly_the_waiters_covered():
    waiters = OffsetWaiters(waiters_max=10)
    for offset in (300, 100, 200):
        waiters.add(offset, deadline=10.0, token=offset)
    assert waiters.release(99) == []
    assert waiters.release(200) == [100, 200]
    assert waiters.lowest_offset() == 300 and len(waiters) == 1


def test_expire_and_release_never_hand_out_a_token_twice():
    waiters = OffsetWaiters(waiters_max=10)
    waiters.add(100, deadline=1.0, token="a")
    waiters.add(200, deadline=2.0, token="b")
    assert waiters.expire(1.5) == ["a"]
    assert waiters.release(1000) == ["b"]
    assert waiters.expire(99.0) == [] and waiters.next_deadline() is None


def test_the_number_of_waiters_is_bounded():
    waiters = OffsetWaiters(waiters_max=2)
    waiters.add(1, deadline=1.0, token=1)
    waiters.add(2, deadline=1.0, token=2)
    with pytest.raises(WaitersFull):
        waiters.add(3, deadline=1.0, token=3)
    assert sorted(waiters.drain()) == [1, 2] and len(waiters) == 0
