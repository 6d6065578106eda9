"""A leader's view of each follower (etcd-raft's ``tracker`` package): ``Progress`` and ``ProgressMap``.

Theory of operation
-------------------
A leader keeps one ``Progress`` per follower (DLedger's EntryDispatcher state) in a
``ProgressMap``; a follower's map is empty. A progress is in one of four states (``PushType``):

    COMPARE   find where the follower's log agrees with ours: walk back from its end,
              skipping a whole older term per round trip (etcd's findConflictByTerm)
    TRUNCATE  the follower drops its tail after ``index``, where it agrees with ours
    APPEND    push entries from ``index`` on; at most ``push_in_flight_max`` unacknowledged
              (``window_open``), re-pushed from the match index after ``push_timeout_seconds``;
              after an OUT_OF_ORDER, one push at a time until acknowledged (``probe_from``)
    RESET     it needs an entry retention deleted here: start its log empty at our first
              index (``behind_log_start`` in the status)

During COMPARE the leader narrows the window between ``compare_floor`` (the highest index known
to match, -1 always does) and ``compare_mismatch_from`` (the lowest known to differ: by log
matching every index above it differs too), until the follower's log is a prefix (APPEND) or its
tail past the floor must go (TRUNCATE). Knowledge can go stale (pushes still in flight); the
follower re-checks before it truncates, so staleness costs a round trip, never an entry.

``match_index`` is what the follower last acknowledged (its entries up to there equal ours):
it rises with acknowledgements and goes down to the follower's end when a response says its log
ends below it -- it lost entries, or the response is stale; lowering is safe either way (node's
"Lost entries") -- and COMPARE starts again from there. ``sent_at`` times the oldest unanswered
push (None: nothing in flight to time); ``last_contact_at`` is the last response of any kind in
this term, for check-quorum and leadership transfer.

Probing (etcd's StateProbe). An OUT_OF_ORDER says the follower's log ends before pushes in
flight: the leader goes back to its end (never below the match index) and pushes one batch from
there (``probe_from``), then waits: for an acknowledgement that raises the match index (the whole
window again), or for the push timeout (the same one batch again). An OUT_OF_ORDER that names the
point a probe already pushed from, while that push's timer runs, says nothing new -- another push
of the old window found the same gap, a duplicate, or a member that forgot it had answered (a
core rebuilt after its append failed on a full disk) -- and is ignored, as etcd ignores a stale
rejection. Without that, each answer restarted the whole window, and a follower that cannot
append answered each window again: a storm of pushes that grew with the window (raft_sim seed
5925, 3 nodes). So a follower that cannot append costs one batch per push timeout.

The methods read the leader's log (``LogView``) and never write it; the node builds the
messages. Aggregates over all followers (the commit index a quorum holds, the lowest match index
for retention, check-quorum, the next re-push time, the status) are ``ProgressMap`` methods; the
counting itself is ``hasvc.state.raft.quorum``'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from hasvc.state.raft import quorum
from hasvc.state.raft.log_view import LogView
from hasvc.state.raft.messages import PushResponse, PushResult, PushType
from hasvc.state.raft.ready import PeerStatus


@dataclasses.dataclass(slots=True)
class Progress:
    """The leader's view of one follower (see the module)."""

    state: PushType  # COMPARE, TRUNCATE, APPEND or RESET
    index: int  # COMPARE/TRUNCATE: the index compared or kept; APPEND: the next index to push; RESET: ours first
    match_index: int = -1  # acknowledged: matches the leader's log (flushed there with flush_sync)
    sent_at: float | None = None  # COMPARE/TRUNCATE sent, or oldest unacknowledged APPEND (None: none)
    last_contact_at: float = -math.inf  # last response of any kind in this term
    follower_end: int = -1  # the follower's last index, as last reported
    compare_floor: int = -1
    compare_mismatch_from: float = math.inf
    disk_full: bool | None = None  # as its last HEARTBEAT_RESPONSE in this term said (None: none yet)
    disk_said_at: float = -math.inf  # when that response came
    probe_from: int | None = None  # APPEND after an OUT_OF_ORDER: one push from here at a time (None: the window)

    # ------------------------------------------------------------------ responses

    def on_response(self, m: PushResponse, now: float, log: LogView) -> None:
        """A push response from this follower in the leader's term."""
        self.last_contact_at = now
        last = log.last_index()
        if m.ack_index > last:
            raise ValueError(f"{m.source} acknowledges {m.ack_index} beyond the leader's last index {last}")
        if m.end_index < self.match_index:
            # It lost entries it acknowledged (or the response is stale): count no more than it
            # holds, and find where it matches from its end (see node's "Lost entries").
            self.match_index = m.end_index
            self.sent_at = None
            self.start_compare(m.end_index, log)
            return
        if m.ack_index > self.match_index:
            self.match_index = m.ack_index
            self.sent_at = now if self.state is PushType.APPEND else self.sent_at
            self.probe_from = None  # it appends again: the whole window (etcd: probe -> replicate)
        if self.state is PushType.APPEND:
            if m.type is PushType.APPEND:
                self._on_append_response(m, log)
        elif m.type is self.state and m.request_index == self.index:
            if m.type is PushType.COMPARE:
                self._on_compare_response(m, log)
            elif m.type is PushType.RESET:
                self._on_reset_response(m, log)
            else:
                self._on_truncate_response(m, log)

    def _on_compare_response(self, m: PushResponse, log: LogView) -> None:
        compared = self.index
        self.follower_end = m.end_index
        if m.result is PushResult.SUCCESS:
            self.compare_floor = max(self.compare_floor, compared)
        elif m.result is PushResult.MISMATCH:
            if m.term_at_index == -1:  # no entry there at all
                self.compare_mismatch_from = min(self.compare_mismatch_from, compared)
            else:  # nothing between the last index of a term <= the follower's and `compared` can match
                below = last_index_with_term_at_most(log, m.term_at_index, compared - 1)
                self.compare_mismatch_from = min(self.compare_mismatch_from, max(below, self.compare_floor) + 1)
        self.compare_next(log)

    def _on_truncate_response(self, m: PushResponse, log: LogView) -> None:
        if m.result is PushResult.SUCCESS:
            self.start_append(self.index + 1)
        else:
            self.start_compare(m.end_index, log)

    def _on_reset_response(self, m: PushResponse, log: LogView) -> None:
        if m.result is PushResult.SUCCESS:  # its log is empty at our first index: push from there
            self.start_append(self.index)
        else:  # it holds our entry there after all (a stale view): find where we agree
            self.start_compare(m.end_index, log)

    def _on_append_response(self, m: PushResponse, log: LogView) -> None:
        if m.result is PushResult.OUT_OF_ORDER:
            restart = max(self.match_index + 1, min(self.index, m.end_index + 1))
            if restart < self.index and restart == self.probe_from and self.sent_at is not None:
                return  # a probe from there is in flight and not timed out: nothing new (see the module)
            if restart < self.index or self.probe_from is not None:
                self.probe_from = restart
            self.index = restart
        elif m.result is PushResult.INCONSISTENT_STATE:
            self.start_compare(m.end_index, log)

    # ------------------------------------------------------------------ state changes

    def start_append(self, next_index: int) -> None:
        self.state, self.index, self.sent_at, self.probe_from = PushType.APPEND, next_index, None, None

    def start_compare(self, follower_end: int, log: LogView) -> None:
        """A new COMPARE session: nothing known but the follower's end."""
        self.follower_end = follower_end
        self.compare_floor = -1
        self.compare_mismatch_from = math.inf
        self.compare_next(log)

    def compare_next(self, log: LogView) -> None:
        """COMPARE again, TRUNCATE, or APPEND, from what the window says."""
        floor, end, last = self.compare_floor, self.follower_end, log.last_index()
        self.sent_at = None
        if floor >= end:  # the follower's log is a prefix of ours
            self.start_append(min(floor, end) + 1)
        elif floor >= last or self.compare_mismatch_from == floor + 1:
            self.state, self.index = PushType.TRUNCATE, floor
        else:
            self.state = PushType.COMPARE
            self.index = int(min(last, end, self.compare_mismatch_from - 1))

    # ------------------------------------------------------------------ pushing

    def before_push(self, now: float, timeout: float, log: LogView, first: int) -> None:
        """Before a push: an APPEND window unacknowledged for ``timeout`` goes again from the
        match index (DLedger: maxPushTimeOutMs); a push that would name an entry below our
        ``first`` index (retention deleted it) becomes a RESET."""
        if (
            self.state is PushType.APPEND
            and self.sent_at is not None
            and self.index > self.match_index + 1
            and now >= self.sent_at + timeout
        ):
            self.index = self.match_index + 1
            self.sent_at = None
            if self.probe_from is not None:  # probing: the one batch again, from the match index
                self.probe_from = self.index
        if self.state is PushType.APPEND:
            if self.index < first:  # needs_deleted_entry of an APPEND, written out (every peer, every event)
                self.state, self.index, self.sent_at = PushType.RESET, first, None
        elif self.state is not PushType.RESET and self.needs_deleted_entry(log):
            self.state, self.index, self.sent_at = PushType.RESET, first, None

    def needs_deleted_entry(self, log: LogView) -> bool:
        """Whether the next push to this follower would name an entry below our first index:
        then COMPARE/TRUNCATE/APPEND cannot reach it any more, and a RESET must."""
        first = log.first_index()
        if self.state is PushType.APPEND:
            return self.index < first
        wanted = (self.index,) if self.state is PushType.COMPARE else (self.index, self.index + 1)
        return any(0 <= i < first and i <= log.last_index() for i in wanted)

    def window_open(self, in_flight_max: int) -> bool:
        """APPEND: whether fewer than ``in_flight_max`` pushed entries are unacknowledged (probing:
        whether the probe's one batch is still to be pushed)."""
        if self.probe_from is not None and self.index > self.probe_from:
            return False
        return self.index - self.match_index - 1 < in_flight_max

    def appended(self, count: int, now: float) -> None:
        """APPEND: ``count`` entries from ``index`` were pushed at ``now``."""
        self.index += count
        self.sent_at = now if self.sent_at is None else self.sent_at

    def appends_sent(self, now: float) -> None:
        """APPEND, after a round of pushes: time what is unacknowledged (nothing: no timer).
        Entries the follower may hold already (COMPARE found them; with flush_sync their
        acknowledgement waits for its flush, and may be lost) are timed too."""
        if self.index <= self.match_index + 1:
            self.sent_at = None
        elif self.sent_at is None:
            self.sent_at = now


def last_index_with_term_at_most(log: LogView, term: int, hi: int) -> int:
    """The largest index <= hi whose term is <= `term` (-1 if none): no entry between there and
    the mismatch can equal the follower's, whose terms are all <= `term` (etcd's findConflictByTerm)."""
    lo = log.first_index() - 1
    hi = min(hi, log.last_index())
    while lo < hi:  # terms never decrease along the log: binary search
        mid = (lo + hi + 1) // 2
        if log.term_at(mid) <= term:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ProgressMap(dict[str, Progress]):
    """Every follower's ``Progress`` by member id (etcd's ``tracker.ProgressMap``): a leader's;
    empty on a follower."""

    __slots__ = ()

    def start(self, peers: Iterable[str], compare_from: int, now: float, log: LogView) -> None:
        """A new leader's: every follower COMPAREd from ``compare_from`` (the leader's end before
        its no-op: DLedger compares from there first), as if heard from ``now``."""
        for peer in peers:
            progress = self[peer] = Progress(PushType.COMPARE, compare_from, last_contact_at=now)
            progress.start_compare(compare_from, log)

    def quorum_index(self, own: int, quorum_size: int) -> int:
        """The highest index a quorum holds: the leader's ``own`` mark and every match index."""
        marks = [own]
        for progress in self.values():
            marks.append(progress.match_index)
        return quorum.committed_index(marks, quorum_size)

    def quorum_active(self, now: float, window: float, quorum_size: int) -> bool:
        """Check-quorum: whether a quorum (the leader included) was heard from within ``window``."""
        return quorum.quorum_active((p.last_contact_at for p in self.values()), now=now, window=window,
                                    quorum=quorum_size)  # fmt: skip

    def lowest_match(self, own: int) -> int:
        """The lowest of ``own`` and every follower's match index (what retention must keep)."""
        return min([own, *(p.match_index for p in self.values())])

    def next_push_timeout(self, timeout: float) -> float:
        """When the oldest unanswered push times out (inf: none in flight)."""
        times = [math.inf]
        for progress in self.values():  # a loop, not a generator: this runs after every Ready
            if progress.sent_at is not None:
                times.append(progress.sent_at + timeout)
        return min(times)

    def match_index(self, peer: str) -> int:
        """The last index ``peer`` acknowledged (-1: unknown, or not a leader)."""
        progress = self.get(peer)
        return -1 if progress is None else progress.match_index

    def last_contact_at(self, peer: str) -> float:
        progress = self.get(peer)
        return -math.inf if progress is None else progress.last_contact_at

    def statuses(self, last: int, now: float) -> dict[str, PeerStatus]:
        """Each follower's ``PeerStatus`` (``last``: the leader's last index)."""
        return {
            peer: PeerStatus(p.match_index, last - p.match_index, now - p.last_contact_at, p.state is PushType.RESET)
            for peer, p in self.items()
        }
