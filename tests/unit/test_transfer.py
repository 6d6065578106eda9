"""Frame planning for one slave (hasvc.state.transfer): the one copy push and the writer share."""

import pytest

from hasvc.state.transfer import Heartbeat, Send, TransferCursor, WaitUntil, start_offset

SEGMENT = 1000


def cursor(offset=0, *, now=0.0, batch_size=300):
    return TransferCursor(offset, now=now, batch_size=batch_size, segment_size=SEGMENT, heartbeat_seconds=5.0)


def test_an_empty_slave_starts_at_the_oldest_byte_or_at_the_last_segment_if_asked():
    assert start_offset(0, min_offset=2000, max_offset=4500, segment_size=SEGMENT, sync_from_last_file=False) == 2000
    assert start_offset(0, min_offset=2000, max_offset=4500, segment_size=SEGMENT, sync_from_last_file=True) == 4000
    assert start_offset(3100, min_offset=2000, max_offset=4500, segment_size=SEGMENT, sync_from_last_file=True) == 3100


def test_frames_stop_at_the_batch_size_the_logs_end_and_a_segments_end():
    transfer = cursor(offset=800)
    assert transfer.frame(log_end=2500) == Send(800, 200)  # the segment ends at 1000
    transfer.sent(Send(800, 200), 200, now=1.0)
    assert transfer.frame(log_end=2500) == Send(1000, 300)  # the batch size
    transfer.sent(Send(1000, 300), 300, now=2.0)
    assert transfer.frame(log_end=1350) == Send(1300, 50)  # the log's end
    transfer.sent(Send(1300, 50), 50, now=3.0)
    assert transfer.frame(log_end=1350) is None


def test_a_shorter_span_from_the_store_moves_the_cursor_by_what_was_sent():
    transfer = cursor()
    frame = transfer.frame(log_end=900)
    transfer.sent(frame, 120, now=1.0)
    assert transfer.offset == 120 and transfer.frame(log_end=900) == Send(120, 300)


def test_a_caught_up_slave_gets_a_heartbeat_after_the_interval_of_silence():
    transfer = cursor(offset=500, now=10.0)
    assert transfer.frame(log_end=500) is None
    assert transfer.heartbeat(12.0) == WaitUntil(15.0)
    assert transfer.heartbeat(15.0) == Heartbeat(500)
    transfer.heartbeat_sent(now=15.0)
    assert transfer.heartbeat(16.0) == WaitUntil(20.0)
    transfer.sent(Send(500, 10), 10, now=17.0)  # a frame is news too
    assert transfer.heartbeat(21.0) == WaitUntil(22.0)


def test_sending_more_than_planned_or_out_of_place_is_our_bug():
    transfer = cursor()
    with pytest.raises(AssertionError):
        transfer.sent(Send(0, 300), 301, now=1.0)
    with pytest.raises(AssertionError):
        transfer.sent(Send(10, 100), 100, now=1.0)
    with pytest.raises(AssertionError):
        transfer.sent(Send(0, 300), 0, now=1.0)
    with pytest.raises(AssertionError):
        transfer.heartbeat_sent(now=-1.0)  # time does not go back


def test_a_push_moves_the_cursor_as_the_frame_it_would_have_planned():
    """``pushed``: a push's frame, sized by the caller within the batch size and the segment."""
    transfer = cursor(offset=800)
    transfer.pushed(200, now=1.0)  # up to the segment's end
    assert transfer.offset == 1000 and transfer.heartbeat(5.5) == WaitUntil(6.0)
    with pytest.raises(AssertionError):
        transfer.pushed(301, now=2.0)  # past the batch size
    with pytest.raises(AssertionError):
        cursor(offset=900).pushed(200, now=1.0)  # across a segment's end
    with pytest.raises(AssertionError):
        transfer.pushed(0, now=2.0)
    with pytest.raises(AssertionError):
        transfer.pushed(10, now=0.5)  # time does not go back


def test_random_schedules_copy_the_log_once_in_order_whoever_sends():
    """The writer task and push take turns at random over a growing log: the frames tile
    [start, end) with no gap or overlap and none crosses a segment."""
    import random

    for seed in range(200):
        rng = random.Random(seed)
        transfer = cursor(offset=rng.randrange(0, 3000), batch_size=rng.randrange(1, 700))
        start, end, now, covered = transfer.offset, transfer.offset, 0.0, []
        for _ in range(60):
            end += rng.choice([0, 0, rng.randrange(1, 900)])
            now += rng.random()
            frame = transfer.frame(end)
            if frame is None:
                continue
            size = rng.randrange(1, frame.size_max + 1)  # the store may end a span sooner
            assert frame.offset // SEGMENT == (frame.offset + size - 1) // SEGMENT, seed
            covered.append((frame.offset, size))
            transfer.sent(frame, size, now=now)
        position = start
        for offset, size in covered:
            assert offset == position, seed
            position += size
        assert position == transfer.offset <= end, seed
