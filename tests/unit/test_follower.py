"""A slave's side of a transfer (hasvc.state.follower): frames taken, offsets reported."""

import pytest

from hasvc.state.follower import Reports, offset_refusal, room_refusal


def test_a_frame_is_taken_only_where_the_log_ends():
    assert offset_refusal(500, log_end=500, log_started=True) is None
    assert offset_refusal(600, log_end=500, log_started=True) == "master pushed offset 600 but the local log ends at 500"
    assert offset_refusal(400, log_end=500, log_started=True) is not None
    assert offset_refusal(7_000, log_end=0, log_started=False) is None  # an empty log starts where the master says


def test_a_frame_never_crosses_a_segment():
    assert room_refusal(900, 100, room=100) is None
    assert room_refusal(900, 101, room=100) == "frame of 101 bytes at 900 crosses a segment boundary"


def test_a_slave_reports_its_logs_end():
    reports = Reports(flush_before_ack=False)
    assert reports.report(log_end=300) == 300
    assert reports.report(log_end=800) == 800


def test_with_flush_before_ack_only_the_flushed_end_is_reported_even_in_a_heartbeat():
    reports = Reports(flush_before_ack=True)
    reports.flushed_to(200)
    assert reports.report(log_end=900) == 200  # a frame arrived, not yet flushed: not acknowledged
    reports.flushed_to(900)
    assert reports.report(log_end=900) == 900


def test_reports_never_pass_the_log_or_go_back():
    reports = Reports(flush_before_ack=True)
    reports.flushed_to(500)
    with pytest.raises(AssertionError):
        reports.report(log_end=400)  # flushed bytes the log does not hold: our bug
    with pytest.raises(AssertionError):
        reports.flushed_to(100)
    plain = Reports(flush_before_ack=False)
    plain.report(log_end=500)
    with pytest.raises(AssertionError):
        plain.report(log_end=400)  # the master drops a slave that goes backwards
