"""The answers of the put path (``hasvc.broker.put_service``): what a put produced
(``Appended``), one wait for a watermark (``_Wait``), the answers to the puts of one append sent
by whichever task ends their last wait (``_StoredAnswer``; ``_PassAnswer`` for a pass appended
by one native call), and the timer task's schedule (``WaiterTimer``)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

import trio

from commitlog import pass_encode
from commitlog import record as rec
from hasvc.protocol import client as cp
from hasvc.protocol.client_frames import encode_answers

if TYPE_CHECKING:
    from hasvc.broker.put_service import PutService


@dataclasses.dataclass(slots=True)  # not frozen: built for every put, and frozen __init__ costs 4x
class Appended:
    """What step 2 of a put produced: the status so far and, when stored, the append result."""

    status: rec.PutMessageStatus
    reason: str = ""
    result: object = None  # the AppendResult, only when the records were stored
    queue_id: int = -1


class _Wait:
    """One wait for a watermark (flush or slave ack). ``finish`` ends it once: from the task
    that moved the watermark, the timer, or a drain. A waiting task awaits ``event``; puts
    answered by callback (``_StoredAnswer``) are answered right there, with no task of their own
    and no event: it is made by the first look (a trio.Event made and set for every put that
    nobody waited on was two calls of a lone producer's put)."""

    __slots__ = ("_event", "ok", "callback", "done")

    def __init__(self, callback=None) -> None:
        self._event: trio.Event | None = None
        self.ok = False
        self.callback = callback
        self.done = False

    @property
    def event(self) -> trio.Event:
        """Set once the wait has ended."""
        if self._event is None:
            self._event = trio.Event()
            if self.done:
                self._event.set()
        return self._event

    def finish(self, ok: bool) -> None:
        if self.done:
            return
        self.done, self.ok = True, ok
        if self._event is not None:
            self._event.set()
        callback = self.callback
        if callback is not None:
            # Dropped once called: a _StoredAnswer's bound method held it, and it held this
            # wait, a cycle per pass that kept the pass's puts (frames, results, tuples) alive
            # until the cyclic GC found them: at 64 producers 800 collections in 5 s, a sixth of
            # the master's CPU (gc.callbacks timing; gc.DEBUG_SAVEALL named what they freed).
            self.callback = None
            callback()


class _StoredAnswer:
    """The answers to puts appended together, sent when the highest of them is as safe as
    configured (its waits cover every lower offset). Answered from whichever task ends the last
    wait (the one reading the slave's report, the group commit, the timer): a task per pass had
    cost a spawn and two scheduler passes between the ack and the answers."""

    __slots__ = ("puts", "stored", "status", "reason", "flush_wait", "ack_wait", "started", "registered")

    def __init__(self, puts: PutService, stored: list, started: float) -> None:
        self.puts = puts
        self.stored = stored
        self.started = started
        self.registered = False
        highest = stored[0][1]  # the one ending last (the first of those): no call per put, as max(key=) made two
        highest_end = highest.result.wrote_offset + highest.result.wrote_bytes  # AppendResult.next_offset
        for _, appended in stored:
            result = appended.result
            if result.wrote_offset + result.wrote_bytes > highest_end:
                highest, highest_end = appended, result.wrote_offset + result.wrote_bytes
        self.status, self.reason, self.flush_wait, self.ack_wait = puts._begin_wait(highest, self._one_done)
        self.registered = True
        self._one_done()

    def _one_done(self) -> None:
        if not self.registered:
            return  # a wait ended while the others were being registered
        flush_wait, ack_wait = self.flush_wait, self.ack_wait
        if (flush_wait is not None and not flush_wait.done) or (ack_wait is not None and not ack_wait.done):
            return
        self.registered = False  # answered once
        puts = self.puts
        status, reason = self.status, self.reason
        if (flush_wait is not None and not flush_wait.ok) or (ack_wait is not None and not ack_wait.ok):
            status, reason = puts._final_status(status, reason, flush_wait, ack_wait)
        self._answer(status._name_, reason)  # the member's name (``.name`` is a property: two calls a put)
        puts.run_after_appends()

    def _answer(self, name: str, reason: str) -> None:
        puts = self.puts
        if puts.metrics:
            puts.metrics.put_done_many(name, time.perf_counter() - self.started, len(self.stored))
        prefix = cp.send_response_prefix(name, reason)
        outboxes = set()
        for (outbox, frame), each in self.stored:
            result = each.result
            outbox.respond(frame, prefix + cp.encode_send_response_rest(each.queue_id, result.offsets, result.queue_offsets))
            outboxes.add(outbox)
        for outbox in outboxes:
            outbox.flush()


class _PassAnswer(_StoredAnswer):
    """The answers to a pass appended in one call (``PutService._put_pass``): the pass's end is
    its highest offset, and each request kept has its answer's offsets packed already."""

    __slots__ = ("items", "answers", "kept")

    def __init__(self, puts: PutService, items: list, appended: pass_encode.PassAppend, started: float) -> None:
        self.puts = puts
        self.started = started
        self.registered = False
        self.stored = ()
        self.items, self.answers = items, appended.answers
        self.kept = len(items) - len(appended.refusals) - len(appended.left_out)
        highest = Appended(rec.PutMessageStatus.PUT_OK, "", appended.result)
        self.status, self.reason, self.flush_wait, self.ack_wait = puts._begin_wait(highest, self._one_done)
        self.registered = True
        self._one_done()

    def _answer(self, name: str, reason: str) -> None:
        answer_pass(self.puts, self.items, self.answers, self.kept, name, reason, self.started)


def answer_pass(puts: PutService, items: list, answers: list, kept: int, name: str, reason: str, started: float) -> None:
    """Answer the requests of a pass that were kept (``answers``: per request its packed offsets,
    None when refused) with ``name`` and ``reason``."""
    if puts.metrics:
        puts.metrics.put_done_many(name, time.perf_counter() - started, kept)
    # Every outbox's answers framed and joined by one call (natively when built), each outbox
    # handed its share in one piece: a ``respond`` per request (a header packed, a payload
    # joined, two appends) was a Python call and four builtin ones a put.
    joined = encode_answers(items if type(items) is list else list(items), answers if type(answers) is list else list(answers),
                            cp.send_response_prefix(name, reason))  # fmt: skip
    for outbox, data, count in joined:
        outbox.respond_joined(data, count)
    for outbox, _, _ in joined:
        outbox.flush()


class WaiterTimer:
    """When the waiter timer task next looks at the deadlines by itself (``next_look``), and
    the wake-up that makes it look sooner: ``due`` wakes it only for a deadline before its next
    look (waking it on every put cost a scheduler pass per put)."""

    __slots__ = ("next_look", "_wakeup")

    def __init__(self) -> None:
        self.next_look = math.inf  # asleep at no deadline yet: any waiter wakes it
        self._wakeup = trio.Event()

    @property
    def wake_pending(self) -> bool:
        """Whether it has been told to look before ``next_look``."""
        return self._wakeup.is_set()

    def due(self, deadline: float) -> None:
        """A waiter was registered with ``deadline``."""
        if deadline < self.next_look:
            self._wakeup.set()

    async def sleep_until(self, deadline: float) -> None:
        """Until ``deadline`` or an earlier ``due``."""
        self.next_look = deadline
        with trio.move_on_at(deadline):
            await self._wakeup.wait()
        self.next_look = math.inf  # awake: whatever is registered now is seen by the caller's pass
        self._wakeup = trio.Event()
