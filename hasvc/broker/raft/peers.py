"""A Raft member's outbound connections: one sender task per peer keeps a connection to it
(preface, HELLO) and writes what the core addresses to it, from a bounded queue; a Ready's
messages for a peer whose sender is idle are written from the loop itself in one ``writev``
(``send``). An APPEND's entries are read from the data files when it is sent (the stored bytes, a
view of the mapping per data file, written with the frame headers in one ``writev``); what the
socket does not take is copied before any wait, so no view of a mapping is held while a truncate or
retention may change it. The peer never sends on this connection after the preface: a read
watches for its EOF only.

Bytes: what a peer's socket has not taken is the rest of one write, copied (``bytes_queued``). A
write gathers at most ``RAFT_SEND_WRITE_SIZE_MAX`` and one message of what is queued; the pushes
left queued are references to the log, ``RAFT_SEND_QUEUE_MAX`` of them. A peer that accepts and
never reads would hold that write and its sender for good: the rest goes in pieces of
``RAFT_SEND_STALL_PIECE_SIZE`` (1 MiB), and a piece not taken within
``raft_send_stalled_timeout_seconds`` closes the connection (counted per peer, ``closed_stalled``;
logged once per close); the sender dials the peer again as after any lost connection. A peer that
reads slowly is never closed for the size of a write, and one that reads nothing also reads no
heartbeat, so it starts its own election long before that timeout: the close never cuts a peer
that still follows."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import trio

from hasvc import transport
from hasvc.config import BrokerConfig, format_address
from hasvc.protocol import raft as raft_wire
from hasvc.protocol import wire
from hasvc.state.raft.messages import Push, PushType

if TYPE_CHECKING:
    from hasvc.broker.raft.driver import RaftDriver

LOGGER = logging.getLogger(__name__)

# Messages queued for one peer's sender; one more is dropped (Raft re-sends what matters).
RAFT_SEND_QUEUE_MAX = 4096
# Reconnecting to a peer: first pause, doubling up to the max (a peer that restarts is back soon).
RAFT_RECONNECT_MIN_SECONDS = 0.05
RAFT_RECONNECT_MAX_SECONDS = 1.0
# A sender's read of its own connection, which only watches for the peer's EOF (nothing is sent back).
RAFT_WATCH_READ_SIZE = 4096
# What a peer's socket must take of a write within raft_send_stalled_timeout_seconds (the write's
# rest is sent in pieces of this size, each with the timeout): a write (up to
# RAFT_SEND_WRITE_SIZE_MAX and a message) to a peer that reads slowly but reads is never closed for
# its size. push_batch_size_max's default: 1 MiB in 30 s is 35 KB/s.
RAFT_SEND_STALL_PIECE_SIZE = 1024 * 1024
# A sender gathers what is queued for its peer into one write up to this many bytes (one message
# more may pass it); the rest stays queued, as references to the log. What the socket does not take
# of a write is copied: this bounds the copy a peer that stops reading makes a member hold (a
# drained queue was up to RAFT_SEND_QUEUE_MAX pushes of push_batch_size_max, GiBs, while a push
# timeout re-queues the window unanswered). 4 MiB is sixteen 256 KiB passes of puts in one write.
RAFT_SEND_WRITE_SIZE_MAX = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class _Rest:
    """The part of a frame that ``RaftSenders._send_now`` wrote in part and the kernel did not
    take, queued for the sender task to send first on that same connection."""

    connection: transport.Connection
    data: bytes


class RaftSenders:
    """The outbound side of one driver (see the module): ``queues`` (peer -> memory channel),
    ``links`` (the senders' live connections), ``connected`` (STATUS), ``dropped_messages``."""

    def __init__(self, driver: RaftDriver) -> None:
        self._driver = driver  # its secret, client address and TLS context, read at each connect
        self._store = driver.store
        self._group = group = driver.group
        self.queues = {peer: trio.open_memory_channel(RAFT_SEND_QUEUE_MAX) for peer in group.peers if peer != group.self_id}
        self.connected: dict[str, bool] = {peer: False for peer in self.queues}
        self.links: dict[str, transport.Connection] = {}  # the senders' live connections (``_send_now``)
        self.dropped_messages = 0
        # raft_send_stalled_timeout_seconds (the broker sets its config's; a controller keeps the default)
        self.stalled_timeout_seconds: float = BrokerConfig.__dataclass_fields__["raft_send_stalled_timeout_seconds"].default
        self.closed_stalled: dict[str, int] = {peer: 0 for peer in self.queues}  # connections closed so, per peer
        self._waiting_after: dict[str, int] = {peer: 0 for peer in self.queues}  # a write's rest after its piece in progress

    def statistics(self) -> dict[str, int]:
        """STATUS fields (and metrics, ``hasvc_`` before each name) of the outbound connections."""
        return {"raft_connections_closed_stalled": sum(self.closed_stalled.values())}

    def send(self, messages) -> None:
        """Send a Ready's messages, each peer's in their order: written from here in one
        ``writev`` a peer (``_send_now``), else queued for its sender (one more than fits is
        dropped, which Raft survives). A pass of puts at 64 producers x 32 messages makes
        several pushes to each follower (up to push_batch_size_max, 1 MiB, each): a write each
        was a system call and a wake-up of the follower per push."""
        if len(messages) == 1:
            by_peer = {messages[0].target: messages}
        else:
            by_peer = {}
            for message in messages:
                by_peer.setdefault(message.target, []).append(message)
        for target, group in by_peer.items():
            if not self._send_now(target, group):
                queue = self.queues[target][0]
                for message in group:
                    try:
                        queue.send_nowait(message)
                    except trio.WouldBlock:
                        self.dropped_messages += 1

    def _send_now(self, target: str, messages) -> bool:
        """Write ``messages`` (all for ``target``) to its connection from here in one ``writev``,
        when its sender task is idle (waiting for its queue, nothing queued, not sending) on
        plain TCP: a message through the sender task cost that task's step and a scheduler pass
        per message, on every hop of a put (push, acknowledgement, flushed acknowledgement).
        What the kernel does not take is queued, as bytes, for the sender to finish before
        anything else. False: queue them."""
        connection = self.links.get(target)
        if connection is None:
            return False
        statistics = self.queues[target][1].statistics()
        if statistics.current_buffer_used or statistics.tasks_waiting_receive != 1 or connection.raw_fileno < 0:
            return False  # (a send in progress: the sender is not waiting; write_now checks it again too)
        parts, ends = [], []  # ends[i]: parts of messages[:i + 1]
        for message in messages:
            parts += self._frame_parts(message, connection)
            ends.append(len(parts))
        try:
            sent = connection.writev_now(parts)
        except OSError:
            return False  # the sender's own write will meet the error and reconnect
        if sent is None:
            return False
        try:
            self._queue_unsent(target, connection, messages, parts, ends, sent)
        finally:
            parts.clear()  # views of the data files: never held while the log may change
        return True

    def _queue_unsent(self, target: str, connection: transport.Connection, messages, parts: list, ends: list[int],
                      sent: int) -> None:  # fmt: skip
        """Queue for ``target``'s sender what a ``writev`` of ``messages``' ``parts`` did not send
        (``sent`` bytes went): the rest of the message it stopped in, copied (a ``_Rest``: no
        view of a data file outlives the call), then the messages after it as they are (their
        sender frames them when it sends them), not a copy of every unsent byte of a pass."""
        index = 0
        while index < len(parts) and sent >= len(parts[index]):
            sent -= len(parts[index])
            index += 1
        if index == len(parts):
            return
        stopped = next(i for i, end in enumerate(ends) if end > index)  # the message the write stopped in
        queue = self.queues[target][0]
        start = ends[stopped - 1] if stopped else 0
        if index > start or sent:  # begun: its rest must follow on this connection
            rest = [parts[index][sent:], *parts[index + 1 : ends[stopped]]]
            queue.send_nowait(_Rest(connection, b"".join(rest)))  # the buffer is empty: it fits
        else:
            queue.send_nowait(messages[stopped])
        for message in messages[stopped + 1 :]:
            try:
                queue.send_nowait(message)
            except trio.WouldBlock:
                self.dropped_messages += 1


    async def sender(self, peer: str) -> None:
        """Keep a connection to ``peer`` and send it what the core addresses to it; while there
        is none, what is queued is dropped (the core re-sends what still matters)."""
        receive = self.queues[peer][1]
        pause = RAFT_RECONNECT_MIN_SECONDS
        address = self._group.peers[peer]
        while True:
            try:
                connection = await transport.connect(address, ssl_context=self._driver.peer_ssl_context)
                await transport.client_preface(connection, port_kind=wire.PORT_KIND_RAFT, secret=self._driver.secret)
                hello = raft_wire.Hello(self._group.group, self._group.self_id, peer, client_address=self._driver.client_address,
                                        data_start_offset=self._announced_data_start(),
                                        data_file_size=self._store.entries.data_file_size)  # fmt: skip
                await connection.send_all(raft_wire.encode_hello(hello))
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, transport.AuthenticationError, EOFError) as error:
                LOGGER.debug("raft: cannot reach %s at %s: %s", peer, format_address(address), error)
                await self._drop_queued(receive, pause)
                pause = min(pause * 2, RAFT_RECONNECT_MAX_SECONDS)
                continue
            connected_at = trio.current_time()
            self.connected[peer] = True
            self.links[peer] = connection
            try:
                async with connection.stream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_closed, connection, peer, nursery.cancel_scope)
                    while True:
                        parts = self._frame_parts(await receive.receive(), connection)
                        size = sum(map(len, parts))
                        while size < RAFT_SEND_WRITE_SIZE_MAX:  # what else is queued goes in the same write
                            try:
                                more = self._frame_parts(receive.receive_nowait(), connection)
                            except trio.WouldBlock:
                                break
                            parts += more
                            size += sum(map(len, more))
                        try:
                            await self._send_or_close(peer, connection, parts)
                        finally:
                            parts.clear()  # views of the data files: never held while the log may change
            except BaseException as error:
                # The nursery wraps what the loop raised in an exception group: a broken
                # connection is expected, anything else (Cancelled among them) goes on up.
                if not transport.is_expected(error, (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                                                     trio.TooSlowError)):  # fmt: skip
                    raise
                if isinstance(transport.first_leaf(error), trio.TooSlowError):
                    LOGGER.warning("raft: connection to %s at %s closed: %s", peer, format_address(address),
                                   transport.describe(error))  # fmt: skip
                else:
                    LOGGER.info("raft: connection to %s lost: %s", peer, transport.describe(error))
            finally:
                self.connected[peer] = False
                del self.links[peer]
            if trio.current_time() - connected_at < RAFT_RECONNECT_MAX_SECONDS:
                # It did not last (a peer that refuses this member's HELLO closes at once): back off
                # as for a failed connect, or the sender would reconnect in a tight loop.
                await self._drop_queued(receive, pause)
                pause = min(pause * 2, RAFT_RECONNECT_MAX_SECONDS)
            else:
                pause = RAFT_RECONNECT_MIN_SECONDS

    async def _send_or_close(self, peer: str, connection: transport.Connection, parts: list) -> None:
        """Send ``parts`` on ``peer``'s ``connection``, and empty the list: what the socket takes at
        once (``write_now``), then the rest, copied, in pieces of ``RAFT_SEND_STALL_PIECE_SIZE``; a
        piece its socket has not taken within ``stalled_timeout_seconds`` ends the connection
        (TooSlowError, counted)."""
        rest = connection.write_now(parts)
        if rest is None:  # TLS (or closed: the send below says so): all of it
            rest = b"".join(parts)  # a copy (bytes of each view)
            parts.clear()
        if not rest:
            return
        timeout = self.stalled_timeout_seconds
        pieces = range(0, len(rest), RAFT_SEND_STALL_PIECE_SIZE)
        view = memoryview(rest)  # of the copy: no data file's mapping is held across the waits
        try:
            for start in pieces:
                piece = view[start : start + RAFT_SEND_STALL_PIECE_SIZE]
                self._waiting_after[peer] = len(rest) - start - len(piece)
                with trio.move_on_after(timeout) as scope:
                    await connection.send_all(piece)
                if scope.cancelled_caught:
                    self.closed_stalled[peer] += 1
                    raise trio.TooSlowError(f"{peer} did not take {len(piece)} bytes in {timeout:g} s "
                                            "(raft_send_stalled_timeout_seconds): it accepts and does not read")  # fmt: skip
        finally:
            self._waiting_after[peer] = 0

    def bytes_queued(self, peer: str) -> int:
        """What the sender to ``peer`` waits for its socket to take (raft_metrics: a peer not reading)."""
        link = self.links.get(peer)
        waiting = link.bytes_waiting if link is not None else 0
        return waiting + self._waiting_after[peer] if waiting else 0

    def _frame_parts(self, message, connection: transport.Connection) -> list:
        """The frames for ``message`` as parts for one writev: an APPEND's reference run read from
        the store as stored bytes -- a frame header and a view of the data file per run (a run
        stops at a file's end) -- or nothing when the log no longer holds those entries (a
        truncate or retention since the core queued it: dropped, as a lost message); any other
        message encoded. A ``_Rest`` (the end of a frame ``_send_now`` wrote in part): its bytes
        on the connection it began on, nothing on a later one (that frame is lost with its
        connection, as queued messages are; Raft re-sends what matters)."""
        if isinstance(message, _Rest):
            return [message.data] if message.connection is connection else []
        if not isinstance(message, Push) or message.type is not PushType.APPEND or message.entries.data is not None:
            return [raft_wire.encode(message)]
        reference = message.entries
        runs = self._store.entries.read_runs(reference.first_index, reference.count, reference.last_term)
        if runs is None:
            self.dropped_messages += 1
            return []
        parts, prev_term = [], message.prev_term
        for run in runs:
            parts.append(raft_wire.append_header(term=message.term, index=run.first_index, prev_term=prev_term,
                                                 commit_index=message.commit_index, count=run.count,
                                                 last_term=run.last_term, size=len(run.data)))  # fmt: skip
            parts.append(run.data)
            prev_term = run.last_term
        return parts

    @staticmethod
    async def _watch_closed(connection, peer: str, scope: trio.CancelScope) -> None:
        """End the connection to ``peer`` as soon as the peer closes it. The peer never sends on
        it after the preface, so a read returns only at EOF or a reset: a member that died (and
        restarted) is noticed at once and reconnected to, instead of on the next write, which
        is lost -- typically a vote request in the election after a leader's death, splitting the
        vote and costing an election timeout (drill: 1.4-1.8 s failovers, 2 rounds in 50)."""
        try:
            while await connection.stream.receive_some(RAFT_WATCH_READ_SIZE):
                pass  # nothing is expected after the preface: ignored
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        LOGGER.info("raft: connection to %s closed by the peer", peer)
        scope.cancel()

    async def _drop_queued(self, receive, pause: float) -> None:
        with trio.move_on_after(pause):
            while True:
                await receive.receive()
                self.dropped_messages += 1


    def _announced_data_start(self) -> int:
        """What HELLO says of where this log starts: its first data file's offset while its first
        index is 0 (0, or a smooth upgrade's divide); 0, "not said", once retention or a reset
        moved its start (a member that needs entries from before it is RESET, not told)."""
        entries = self._store.entries
        return entries.data_start_offset if entries.first_index() == 0 else 0

