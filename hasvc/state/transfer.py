"""What the master sends one slave next: one copy of the frame planning.

Theory of operation
-------------------
A slave connection's sending side is a cursor over the master's log: the offset the next frame
starts at and when something was last sent. The writer task and the put path's ``push`` (which
sends new appends at once when the task is idle) both ask it the same two questions and tell it
what they sent:

* ``frame(log_end)``: the next frame, ``Send(offset, size_max)`` (at most ``batch_size`` bytes,
  never past the log's end, never across a segment), or None when the slave has everything.
  The driver reads the span from the store (which may end it sooner, at its readable end) and
  sends it by ``sendfile``, ``writev`` or through TLS: those are its business.
* ``heartbeat(now)``: when caught up, ``Heartbeat(offset)`` once ``heartbeat_seconds`` have
  passed since the last send (a frame of size 0, RocketMQ's haSendHeartbeatInterval), else
  ``WaitUntil(deadline)``.
* ``sent(size, now=)`` / ``heartbeat_sent(now=)``: what went out.

Invariants: the offset only moves forward, by what was planned at most; a frame never crosses a
segment boundary; ``last_send`` never goes back.

``start_offset`` is where an empty slave starts: the master's oldest retained byte (the whole
log, not RocketMQ's last segment: issues #3388/#3661) unless it asked for the last segment.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    offset: int
    size_max: int


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class WaitUntil:
    deadline: float


def start_offset(request_offset: int, *, min_offset: int, max_offset: int, segment_size: int,
                 sync_from_last_file: bool) -> int:  # fmt: skip
    """Where the transfer to a slave that first reported ``request_offset`` starts."""
    assert request_offset >= 0 and segment_size > 0
    if request_offset:
        return request_offset
    if sync_from_last_file:
        return max_offset - max_offset % segment_size
    return min_offset


class TransferCursor:
    __slots__ = ("offset", "last_send", "batch_size", "segment_size", "heartbeat_seconds")

    def __init__(self, offset: int, *, now: float, batch_size: int, segment_size: int, heartbeat_seconds: float) -> None:
        assert offset >= 0 and batch_size > 0 and segment_size > 0 and heartbeat_seconds > 0
        self.offset = offset
        self.last_send = now
        self.batch_size = batch_size
        self.segment_size = segment_size
        self.heartbeat_seconds = heartbeat_seconds

    def frame(self, log_end: int) -> Send | None:
        """The next frame to send, or None when the slave is caught up with ``log_end``."""
        offset = self.offset
        if offset >= log_end:
            return None
        segment_end = offset - offset % self.segment_size + self.segment_size
        return Send(offset, min(self.batch_size, log_end - offset, segment_end - offset))

    def heartbeat(self, now: float) -> Heartbeat | WaitUntil:
        """When caught up: a heartbeat now, or when one is due."""
        due = self.last_send + self.heartbeat_seconds
        if now >= due:
            return Heartbeat(self.offset)
        return WaitUntil(due)

    def sent(self, planned: Send, size: int, *, now: float) -> None:
        """``size`` bytes of the ``planned`` frame went out (the store may end a span sooner)."""
        assert planned.offset == self.offset, (planned, self.offset)
        assert 0 < size <= planned.size_max, (size, planned)
        assert now >= self.last_send, (now, self.last_send)
        self.offset += size
        self.last_send = now  # _sent_at written out: once a put

    def pushed(self, size: int, *, now: float) -> None:
        """``sent`` for a frame of ``size`` bytes from ``offset`` that ``frame`` would have planned
        (its size at most ``batch_size`` and never across a segment: the caller's to ensure) --
        a push per put, without the plan's object."""
        assert 0 < size <= self.batch_size, (size, self.batch_size)
        assert self.offset // self.segment_size == (self.offset + size - 1) // self.segment_size, (self.offset, size)
        assert now >= self.last_send, (now, self.last_send)
        self.offset += size
        self.last_send = now

    def heartbeat_sent(self, *, now: float) -> None:
        self._sent_at(now)

    def _sent_at(self, now: float) -> None:
        assert now >= self.last_send, (now, self.last_send)
        self.last_send = now
