"""A client connection's responses (``Outbox``), the process's budget for answers queued on every
connection (``AnswerBudget``), and the error answer every request kind shares.

Theory of operation: bytes, not only requests
---------------------------------------------
A connection holds at most ``in_flight_max`` requests from when they are read until their answers
reach the kernel; a READ or PULL answer is up to 4 MiB, so that bound alone let one connection
that sends READs and never reads their answers hold 4,096 x 4 MiB in this process (seen: 11.8 GB).
So the answers also count in bytes, where they are queued and once per send (never per put: a
put's answer is a few dozen bytes and is counted with the rest when ``flush`` joins them):

* per connection, ``bytes_max`` (``client_answer_bytes_max``; Netty's write-buffer high
  watermark, Kafka's channel muting): above it the connection is muted -- its place limit drops
  to 0, so the reader takes no more of its requests and the kernel's buffers then stop the peer
  (back-pressure) -- until what is queued drains to half of it (the low watermark). A connection
  muted for ``muted_timeout_seconds`` on end is closed: its peer is not reading.
* per process, ``AnswerBudget.bytes_max`` (``client_answer_bytes_total_max``; Kafka's
  ``queued.max.request.bytes``): while every connection's queued answers together reach it, new
  READs and PULLs are refused with SERVICE_NOT_AVAILABLE (retryable) instead of read from the store.
"""

from __future__ import annotations

import os
import sys

import trio

from commitlog import record
from hasvc.protocol import client as client_protocol


# What the writer task hands to the kernel at a time: a muted connection's queued bytes fall as its
# peer reads (and it is unmuted at the low watermark) instead of only once a 16 MiB send is done.
ANSWER_SEND_CHUNK_SIZE = 1024 * 1024


class AnswerBudget:
    """The answers queued on every client connection of a process, in bytes, against
    ``bytes_max``; what STATUS and the metrics show of them (``statistics``). The outboxes keep
    ``bytes_queued`` and ``connections_muted`` up to date; the port counts refusals."""

    __slots__ = ("bytes_max", "bytes_queued", "connections_muted", "muted_closed", "refused")

    def __init__(self, bytes_max: int = sys.maxsize) -> None:
        assert bytes_max > 0
        self.bytes_max = bytes_max
        self.bytes_queued = 0  # invariant: the sum of every open outbox's bytes_queued
        self.connections_muted = 0
        self.muted_closed = 0  # connections closed for staying muted past their timeout
        self.refused = 0  # READs and PULLs refused while the budget was spent

    @property
    def exhausted(self) -> bool:
        return self.bytes_queued >= self.bytes_max

    def statistics(self) -> dict[str, int]:
        """STATUS fields (and metrics, ``hasvc_`` before each name)."""
        return {"client_bytes_queued": self.bytes_queued, "client_connections_muted": self.connections_muted,
                "client_connections_closed_muted": self.muted_closed, "client_answers_refused": self.refused}  # fmt: skip


class Outbox:
    """A connection's responses: tasks queue them, and they go out in one ``send`` (a response
    per syscall was a fifth of a busy master's CPU). Every request holds one of
    ``in_flight_max`` places from when it is read until its response is handed to the kernel;
    beyond, the connection stops reading. A plain counter: a CapacityLimiter token per request
    cost a dict entry and two method calls on every put.

    Who sends: whoever queued responses (``respond``) calls ``flush`` when done, which writes
    them to the socket at once when nothing else is being sent and the kernel takes them all
    (plain TCP), and otherwise wakes the writer task to send the rest. Answering from the
    writer task alone put a scheduler pass, behind every other task woken by the same put
    (dispatch, replication), between a put's completion and its response; waking it for every
    response, sent or not, cost one more.

    Bytes (see the module): ``bytes_queued`` counts the answers not yet handed to the kernel --
    READ, PULL and STATUS answers as they are queued (``respond_counted``), every answer once
    ``flush`` or the writer task joins them; past ``bytes_max`` the connection is muted."""

    def __init__(self, connection, in_flight_max: int, *, bytes_max: int = sys.maxsize,
                 budget: AnswerBudget | None = None, muted_timeout_seconds: float = float("inf")):  # fmt: skip
        assert in_flight_max > 0
        assert bytes_max > 0
        self.connection = connection
        self.in_flight_max = in_flight_max
        self.in_flight_limit = in_flight_max  # in_flight_max, or 0 while muted (one comparison in the reader's loop)
        self.in_flight = 0
        self.bytes_max = bytes_max
        self.budget = budget if budget is not None else AnswerBudget()
        self.muted_timeout_seconds = muted_timeout_seconds
        self.bytes_queued = 0  # _pending_bytes + _sending_bytes
        self._pending_bytes = 0  # counted bytes in _parts (all of them after a flush that left some)
        self._sending_bytes = 0  # what the writer task's send has not handed to the kernel yet
        self.muted = False
        self._muted_at = 0.0
        self._parts: list[bytes] = []
        # connection.raw_fileno as a call without a Python frame where the connection has one
        # (transport.Connection: a call an answer less with a connection per writer).
        self._raw_fileno = getattr(connection, "raw_fileno_function", None) or (lambda: connection.raw_fileno)
        self.queued = 0  # responses in _parts (not yet handed to the kernel or the writer task)
        self._sending = False  # the writer task is in send_all
        self._wakeup = trio.Event()
        self._room: trio.Event | None = None  # made by a task that waits for room, set by the release

    @property
    def full(self) -> bool:
        return self.in_flight >= self.in_flight_limit

    @property
    def writer_woken(self) -> bool:
        """Whether the writer task has been asked to send what ``flush`` left."""
        return self._wakeup.is_set()

    async def reserve(self) -> None:
        # No checkpoint while there is room: a yield per frame let the rest of the read's frames
        # wait behind every other task and cost a scheduler pass per message.
        await self.wait_room()
        self.in_flight += 1

    def take_place(self) -> None:
        """``reserve`` for a caller that checked ``full`` and must not wait (a shared reader)."""
        assert self.in_flight < self.in_flight_limit, "no room: check full first"
        self.in_flight += 1

    def take_places(self, count: int) -> None:
        """``take_place`` for ``count`` requests read together (room checked for all of them)."""
        assert self.in_flight + count <= self.in_flight_limit, "no room: take at most in_flight_limit - in_flight"
        self.in_flight += count

    async def wait_room(self) -> None:
        """Until a place is free (no checkpoint when one is). Raises TooSlowError when the
        connection stays muted (its answers unread) for ``muted_timeout_seconds``."""
        while self.full:
            if self._room is None:
                self._room = trio.Event()
            if not self.muted:
                await self._room.wait()
                continue
            deadline = self._muted_at + self.muted_timeout_seconds
            with trio.move_on_at(deadline):
                await self._room.wait()
            if self.muted and trio.current_time() >= deadline:
                self.budget.muted_closed += 1
                raise trio.TooSlowError(f"{self.bytes_queued} bytes of answers unread for {self.muted_timeout_seconds:g} s "
                                        f"(client_answer_bytes_max {self.bytes_max}, client_muted_timeout_seconds)")  # fmt: skip

    def respond(self, frame: client_protocol.Frame, payload: bytes) -> None:
        self._parts.append(client_protocol.FRAME_HEADER.pack(len(payload) + 5, frame.kind | client_protocol.RESPONSE_BIT, frame.request_id))
        self._parts.append(payload)
        self.queued += 1

    def respond_joined(self, data: bytes, count: int) -> None:
        """``count`` responses already framed and joined (``client_frames.encode_answers``), queued
        as ``respond`` would queue them one by one: in order, uncounted until ``flush``."""
        self._parts.append(data)
        self.queued += count

    def respond_counted(self, frame: client_protocol.Frame, payload: bytes) -> None:
        """``respond`` for an answer that may be large (READ, PULL, STATUS): counted now, so that
        the reader mutes the connection before it takes the next request."""
        self.respond(frame, payload)
        self._account(self._pending_bytes + len(payload) + client_protocol.FRAME_HEADER.size, self._sending_bytes)

    def _account(self, pending: int, sending: int) -> None:
        """The bytes queued are now ``pending + sending``: the process's total follows, and the
        connection is muted above ``bytes_max``, unmuted at half of it."""
        total = pending + sending
        budget = self.budget
        budget.bytes_queued += total - self.bytes_queued
        self.bytes_queued = total
        self._pending_bytes, self._sending_bytes = pending, sending
        if self.muted:
            if total <= self.bytes_max // 2:
                self.muted = False
                self.in_flight_limit = self.in_flight_max
                budget.connections_muted -= 1
                if self._room is not None:
                    self._room.set()
                    self._room = None
        elif total > self.bytes_max:
            self.muted = True
            self.in_flight_limit = 0
            self._muted_at = trio.current_time()
            budget.connections_muted += 1
        assert budget.connections_muted >= 0
        assert budget.bytes_queued >= total

    def discard(self) -> None:
        """The connection ended: what it had queued leaves the process's total."""
        self._parts = []
        self._account(0, 0)

    def flush(self) -> None:
        """Send the queued responses now if the socket takes them all without waiting; what it
        does not take is left to the writer task (in order: nothing else is sent meanwhile).
        Every ``respond`` is followed by a ``flush``: nothing else wakes the writer task."""
        if not self._parts:
            return
        # The descriptor is looked up now, never kept: once the connection is closed its
        # number may already belong to a newly accepted one (a greeting would follow our bytes).
        fd = self._raw_fileno()
        if self._sending or fd < 0:
            self._wakeup.set()  # the task sends them (after what it is sending)
            return
        data = b"".join(self._parts)
        try:
            sent = os.write(fd, data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._wakeup.set()  # the task's send meets the error and ends the connection
            return
        if sent < len(data):
            self._parts = [data[sent:]]
            self._account(len(data) - sent, 0)
            self._wakeup.set()
            return
        self._parts = []
        if self.bytes_queued:  # counted answers all sent (put answers alone are never counted)
            self._account(0, 0)
        self.in_flight -= self.queued  # _released written out: once a put
        self.queued = 0
        if self._room is not None:
            self._room.set()
            self._room = None

    def _released(self, count: int) -> None:
        self.in_flight -= count
        if self._room is not None:  # an Event per release, waited for or not, was ~2 % of a busy master
            self._room.set()
            self._room = None

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if not self._parts:
                continue  # flushed by the caller after all
            parts, self._parts = self._parts, []
            count, self.queued = self.queued, 0
            self._sending = True
            try:
                data = b"".join(parts)
                del parts
                self._account(0, len(data))
                if len(data) <= ANSWER_SEND_CHUNK_SIZE:
                    await self.connection.send_all(data)
                else:
                    view = memoryview(data)
                    for start in range(0, len(data), ANSWER_SEND_CHUNK_SIZE):
                        await self.connection.send_all(view[start : start + ANSWER_SEND_CHUNK_SIZE])
                        self._account(self._pending_bytes, max(0, len(data) - start - ANSWER_SEND_CHUNK_SIZE))
                    del view
                del data
            finally:
                self._sending = False
                self._account(self._pending_bytes, 0)
                self._released(count)
        raise AssertionError("unreachable")


def error_response(frame: client_protocol.Frame, reason: str) -> bytes:
    """The answer to a request that is wrong in itself: MESSAGE_ILLEGAL for a send, ERROR otherwise."""
    if frame.kind in client_protocol.SEND_KINDS:
        return client_protocol.encode_send_response(
            client_protocol.SendResponse(record.PutMessageStatus.MESSAGE_ILLEGAL.name, reason, -1, [], [])
        )
    return client_protocol.encode_simple_response(client_protocol.ERROR, reason)
