"""A slave's side of a transfer: which frames it takes, and which offset it may report.

Theory of operation
-------------------
The master sends frames (offset, size, bytes) in log order; a frame of size 0 is a heartbeat.
The slave takes a frame only where its log ends (``offset_refusal``: RocketMQ's "master pushed
offset not equal the max phy offset in slave") and only if it fits in the segment it lands in
(``room_refusal``: a frame never crosses a segment boundary); anything else ends the session.

What the slave reports acknowledges everything below it, and a SYNC_MASTER put is answered on it:
so the order of side effects is the contract (raft's "save before send"). A slave appends a frame
before it reports it; with ``flush_before_ack`` it also flushes it first, and reports only the
flushed end, even in a heartbeat between a frame and its flush (``Reports``).
"""

from __future__ import annotations


def offset_refusal(offset: int, *, log_end: int, log_started: bool) -> str | None:
    """Why a frame at ``offset`` cannot be taken by a log written up to ``log_end`` (an empty
    log, ``log_started`` False, takes the master's first offset, wherever it is), or None."""
    if log_started and offset != log_end:
        return f"master pushed offset {offset} but the local log ends at {log_end}"
    return None


def room_refusal(offset: int, size: int, *, room: int) -> str | None:
    """Why a frame of ``size`` bytes does not fit the ``room`` left in its segment, or None."""
    if size > room:
        return f"frame of {size} bytes at {offset} crosses a segment boundary"
    return None


class Reports:
    """What a slave may acknowledge: the end of its log, or with ``flush_before_ack`` the end of
    what it has flushed. Invariant: a report never passes the log's end, and never goes back
    within a session (the master drops a slave that goes backwards)."""

    __slots__ = ("flush_before_ack", "flushed", "reported")

    def __init__(self, *, flush_before_ack: bool) -> None:
        self.flush_before_ack = flush_before_ack
        self.flushed = 0  # the end of what a flush made durable
        self.reported = -1  # the last offset reported this session

    def flushed_to(self, offset: int) -> None:
        assert offset >= self.flushed, (offset, self.flushed)
        self.flushed = offset

    def report(self, *, log_end: int) -> int:
        """The offset to report now, given the log's readable end; remembered as reported."""
        offset = self.flushed if self.flush_before_ack else log_end
        assert offset <= log_end, (offset, log_end)
        assert offset >= self.reported, (offset, self.reported)
        self.reported = offset
        return offset
