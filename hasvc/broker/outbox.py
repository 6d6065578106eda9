"""A client connection's responses (``Outbox``) and the error answer every request kind shares."""

from __future__ import annotations

import os

import trio

from commitlog import record
from hasvc.protocol import client as client_protocol


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
    response, sent or not, cost one more."""

    def __init__(self, connection, in_flight_max: int):
        assert in_flight_max > 0
        self.connection = connection
        self.in_flight_max = in_flight_max
        self.in_flight = 0
        self._parts: list[bytes] = []
        self.queued = 0  # responses in _parts (not yet handed to the kernel or the writer task)
        self._sending = False  # the writer task is in send_all
        self._wakeup = trio.Event()
        self._room: trio.Event | None = None  # made by a task that waits for room, set by the release

    @property
    def full(self) -> bool:
        return self.in_flight >= self.in_flight_max

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
        assert self.in_flight < self.in_flight_max, "no room: check full first"
        self.in_flight += 1

    async def wait_room(self) -> None:
        """Until a place is free (no checkpoint when one is)."""
        while self.full:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    def respond(self, frame: client_protocol.Frame, payload: bytes) -> None:
        self._parts.append(client_protocol.FRAME_HEADER.pack(len(payload) + 5, frame.kind | client_protocol.RESPONSE_BIT, frame.request_id))
        self._parts.append(payload)
        self.queued += 1

    def flush(self) -> None:
        """Send the queued responses now if the socket takes them all without waiting; what it
        does not take is left to the writer task (in order: nothing else is sent meanwhile).
        Every ``respond`` is followed by a ``flush``: nothing else wakes the writer task."""
        if not self._parts:
            return
        # The descriptor is looked up now, never kept: once the connection is closed its
        # number may already belong to a newly accepted one (a greeting would follow our bytes).
        fd = self.connection.raw_fileno
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
            self._wakeup.set()
            return
        self._parts = []
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
                await self.connection.send_all(b"".join(parts))
            finally:
                self._sending = False
                self._released(count)
        raise AssertionError("unreachable")


def error_response(frame: client_protocol.Frame, reason: str) -> bytes:
    """The answer to a request that is wrong in itself: MESSAGE_ILLEGAL for a send, ERROR otherwise."""
    if frame.kind in client_protocol.SEND_KINDS:
        return client_protocol.encode_send_response(
            client_protocol.SendResponse(record.PutMessageStatus.MESSAGE_ILLEGAL.name, reason, -1, [], [])
        )
    return client_protocol.encode_simple_response(client_protocol.ERROR, reason)
