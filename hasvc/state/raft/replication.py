"""Log replication: the follower's side of pushes and heartbeats, and the leader's pushes.

Theory of operation
-------------------
Replication (rocketmq-notes §8.6) is DLedger's EntryPusher per follower: COMPARE (walk back to
the last index where the follower's entry equals the leader's, skipping a whole older term per
round trip) -> TRUNCATE (the follower drops its divergent tail) -> APPEND (batched pushes, at most
``push_in_flight_max`` unacknowledged entries, re-pushed after ``push_timeout_seconds``). The
leader's view of each follower, and which of those it is in, is a ``Progress``
(``hasvc.state.raft.tracker``); this module answers pushes as a follower and builds them as a
leader. Every append is guarded by the term of the entry before it, so logs that share an
(index, term) share the whole prefix. An APPEND carries an ``EntryRun``: the leader's core names
the entries (first index, count, last term) and its driver sends them as its store holds them,
read at send time (``EntryLog.read_runs``; by log matching, the same last term means the same
entries); a follower's core has the store check the run's bytes (``EntryLog.check_run``) before
it appends it (``Ready.runs``), so no entry is decoded into an ``Entry`` on either side.

Retention (``RaftNode.retention_floor``): a member's driver deletes only entries below the floor,
which a leader computes from its committed index and every peer's match index and announces in
its heartbeats. Those entries are committed and on every member, so a follower takes an entry
below its own first index as equal to the leader's.

RESET (Kafka's out-of-range follower, etcd's snapshot -- here the log is the state, so the
"snapshot" is empty). A clean forced by a full disk ignores the floor, so a follower may need an
entry below the leader's first index X: the next COMPARE, TRUNCATE or APPEND would name one. The
leader then sends ``ResetPush(index=X, prev_term=T, first_term, pos)``: "discard your log and
start it empty at X; the term of X - 1 is T; entry X lies at pos". The follower accepts only

* from the leader of its current term (``_accept_leader``, as every push: a stale term or another
  member is refused with EXPIRED_TERM / INCONSISTENT_LEADER), and
* only if its log does not hold the leader's entry X (``first_term`` differs or it has no entry
  there) and X is above its committed index; else it answers INCONSISTENT_STATE and the leader
  goes back to COMPARE (the follower holds the leader's log up to X: nothing below X is needed).

Why it is safe. Every entry below X was deleted by the leader's retention, which deletes only
committed entries, and every leader holds every committed entry: so indexes below X are committed
and gone group-wide ("gone, not changed"), and dropping the follower's copies of them loses no
data a member needs. Entries at or above X: the follower holds none equal to the leader's (its
entry X differs or is missing, and by log matching an equal entry above X would make X equal
too), so none of them is committed (the leader would hold it): dropping them is what TRUNCATE
would do. A delayed duplicate RESET after the follower has appended the leader's entry X is
refused by the same check. After a reset the follower's log is empty at X with last term T (so
its vote compares (X - 1, T), never more than it knew), its committed and flushed index are
X - 1 (the store makes the reset durable before the answer goes out: ``Ready.reset`` comes
before the messages), and it answers SUCCESS acknowledging X - 1; the leader goes on with APPEND
from X (the follower takes X - 1 as matching, being below its first index). The leader knows T
because its store records the term of the entry before its first when retention deletes (a store
that does not know it, ``term_before_first() == -1``, cannot reset: the follower stays
``behind_log_start`` and is not pushed to).

``Replication`` is a part of ``RaftNode`` (``hasvc.state.raft.node``), written apart: its
methods work on the node's state, which ``RaftNode.__init__`` declares, and never stand alone.
"""

from __future__ import annotations

from hasvc.state.raft.messages import (
    Heartbeat,
    HeartbeatResponse,
    HeartbeatResult,
    Push,
    PushResponse,
    PushResult,
    PushType,
    ResetPush,
)
from hasvc.state.raft.ready import Role
from hasvc.state.raft.storage import Entry, EntryRun, LogReset
from hasvc.state.raft.tracker import Progress


class Replication:
    """The follower's side of pushes and heartbeats, and the leader's pushes: a part of
    ``RaftNode`` (see the module)."""

    # ------------------------------------------------------------------ follower side of replication

    def _accept_leader(self, source: str, term: int, now: float) -> HeartbeatResult:
        """Whether `source` leads `term` as far as this member knows (and follow it if so)."""
        if term < self.term:
            return HeartbeatResult.EXPIRED_TERM
        if term == self.term and self.role is Role.LEADER:
            return HeartbeatResult.INCONSISTENT_LEADER
        if term == self.term and self.role is Role.FOLLOWER and self.leader_id not in (None, source):
            return HeartbeatResult.INCONSISTENT_LEADER
        self._become_follower(term, source, now)
        return HeartbeatResult.SUCCESS

    def _on_heartbeat(self, m: Heartbeat, now: float) -> None:
        result = self._accept_leader(m.source, m.term, now)
        if result is HeartbeatResult.SUCCESS:
            # The leader vouches that our entries up to m.commit_index equal its own.
            last = self._log.last_index()
            self._matched_index = max(self._matched_index, min(m.commit_index, last))
            self._follow_commit(m.commit_index)
            self._retain_from_index = max(self._retain_from_index, m.retain_from_index)
            self._gap_reported_end = -2  # OUT_OF_ORDER may be answered again (the last one may be lost)
            if m.commit_index > last:
                # Capped at our match index there: the leader believes we hold entries we lost
                # (see node's "Lost entries"). Say where our log ends, or it would wait for a proposal.
                self._gap_reported_end = last
                self._send_push_response(m.source, PushType.APPEND, PushResult.OUT_OF_ORDER, -1)
        self._messages.append(HeartbeatResponse(self.self_id, m.source, self.term, result, self.disk_full))

    def _follow_commit(self, leader_commit: int) -> None:
        commit = min(leader_commit, self._matched_index)
        if commit > self.committed_index:
            self.committed_index = commit

    def _ack_index(self) -> int:
        if self.config.flush_sync:
            return min(self._matched_index, self.flushed_index)
        return self._matched_index

    def _send_push_response(self, leader: str, kind: PushType, result: PushResult, request_index: int,
                            term_at_index: int = -1) -> None:  # fmt: skip
        ack = self._ack_index() if result is PushResult.SUCCESS else -1
        self._acked_index = max(self._acked_index, ack)
        self._messages.append(PushResponse(self.self_id, leader, self.term, kind, result, request_index, ack,
                                           self._log.first_index(), self._log.last_index(), term_at_index))  # fmt: skip

    def _accepts_push_from(self, source: str, term: int, now: float, kind: PushType, index: int) -> bool:
        """Whether ``source`` leads ``term`` as far as we know (adopting it); if not, the push
        (of ``kind`` at ``index``) is answered EXPIRED_TERM or INCONSISTENT_LEADER here."""
        leadership = self._accept_leader(source, term, now)
        if leadership is HeartbeatResult.SUCCESS:
            return True
        result = (
            PushResult.EXPIRED_TERM if leadership is HeartbeatResult.EXPIRED_TERM else PushResult.INCONSISTENT_LEADER
        )
        self._send_push_response(source, kind, result, index)
        return False

    def _on_push(self, m: Push, now: float) -> None:
        if not self._accepts_push_from(m.source, m.term, now, m.type, m.index):
            return
        if m.type is PushType.RESET:
            raise ValueError("a RESET comes as a ResetPush, not in a PUSH frame")
        if m.type is PushType.COMPARE:
            self._on_compare(m)
        elif m.type is PushType.TRUNCATE:
            self._on_truncate(m)
        else:
            self._on_append(m)
        self._follow_commit(m.commit_index)

    def _on_reset_push(self, m: ResetPush, now: float) -> None:
        if not self._accepts_push_from(m.source, m.term, now, PushType.RESET, m.index):
            return
        self._on_reset(m)
        self._follow_commit(m.commit_index)

    def _on_reset(self, m: ResetPush) -> None:
        """Start the log empty at ``m.index`` -- unless we hold the leader's entry there or
        committed it (see the module: what may be dropped and why)."""
        if m.index < 1 or not 0 <= m.prev_term <= m.first_term <= m.term or m.pos < 0:
            raise ValueError(f"RESET to index {m.index}, terms {m.prev_term}/{m.first_term} in term {m.term}, "
                             f"pos {m.pos}")  # fmt: skip
        if m.index <= self.committed_index or self._same_as_ours(m.index, m.first_term):
            self._send_push_response(m.source, PushType.RESET, PushResult.INCONSISTENT_STATE, m.index)
            return
        self._log.reset(LogReset(m.index, m.prev_term, m.pos))
        self.flushed_index = m.index - 1  # the driver makes the reset durable before it sends
        self._matched_index = m.index - 1
        self.committed_index = max(self.committed_index, m.index - 1)
        self._gap_reported_end = -2
        self._send_push_response(m.source, PushType.RESET, PushResult.SUCCESS, m.index)

    def _matches(self, index: int, entries: tuple[Entry, ...]) -> bool:
        """Whether our entry at `index` equals the leader's (index -1: the empty prefix always does)."""
        if index == -1:
            return True
        if not entries or entries[0].index != index:
            raise ValueError(f"push names index {index} but carries {entries[:1]}")
        return self._same_as_ours(index, entries[0].term)

    def _same_as_ours(self, index: int, term: int) -> bool:
        """Whether the leader's entry (index, term) equals ours. Below our first index, retention
        deleted it: it was committed (retention keeps the committed entry) and a leader holds
        every committed entry, so it does."""
        if 0 <= index < self._log.first_index():
            return True
        return self._log.term_or_missing(index) == term

    def _on_compare(self, m: Push) -> None:
        if self._matches(m.index, m.entries):
            self._matched_index = max(self._matched_index, m.index)
            self._send_push_response(m.source, m.type, PushResult.SUCCESS, m.index)
        else:
            self._send_push_response(m.source, m.type, PushResult.MISMATCH, m.index, self._log.term_or_missing(m.index))

    def _on_truncate(self, m: Push) -> None:
        """Drop the tail after `index` -- only if our entry there equals the leader's and the next one
        differs from the leader's next (or the leader has none): so no entry the leader has, and hence
        no committed entry, is ever dropped, however stale the leader's view of us was."""
        ours = [e for e in m.entries if e.index == m.index]
        theirs_next = [e for e in m.entries if e.index == m.index + 1]
        if len(ours) + len(theirs_next) != len(m.entries):
            raise ValueError(f"TRUNCATE at {m.index} carries {m.entries}")
        if not self._matches(m.index, tuple(ours)) or (
            theirs_next and self._same_as_ours(m.index + 1, theirs_next[0].term)
        ):
            self._send_push_response(m.source, m.type, PushResult.INCONSISTENT_STATE, m.index)
            return
        if m.index < self._log.last_index():
            assert m.index >= self.committed_index, ("truncating committed entries", m.index, self.committed_index)
            self._log.truncate(after_index=m.index)
            self.flushed_index = min(self.flushed_index, m.index)
        self._matched_index = m.index
        self._send_push_response(m.source, m.type, PushResult.SUCCESS, m.index)

    def _on_append(self, m: Push) -> None:
        """Append the leader's run after checking it against our log: the entry before it (its
        previous term), where it overlaps ours the last overlapping entry (by log matching, equal
        there means equal before), and the new part's bytes by the store (``check_run``: one native
        walk -- indexes, terms, positions, CRCs). A run the store refuses is answered
        INCONSISTENT_STATE (the leader compares again) and named in ``Ready.refused_runs``."""
        run = m.entries
        if not isinstance(run, EntryRun) or run.data is None or run.first_index != m.index or run.count < 1:
            raise ValueError(f"APPEND at {m.index} carries {run!r:.80}")
        last = self._log.last_index()
        if m.index > last + 1:  # an earlier push was lost: say where we are, once per end index
            if self._gap_reported_end != last:
                self._gap_reported_end = last
                self._send_push_response(m.source, m.type, PushResult.OUT_OF_ORDER, m.index)
            return
        new: EntryRun | None = run
        prev_term = m.prev_term
        consistent = self._same_as_ours(m.index - 1, m.prev_term)
        if consistent and run.first_index <= last:  # overlap (a push sent again): skip what we hold
            overlap_end = min(last, run.last_index)
            try:
                prev_term, new = run.split_after(overlap_end)
            except ValueError as error:  # bytes a walk cannot follow
                self._refused_runs.append(f"from {m.source}: entries {run.first_index}..{run.last_index}: {error}")
                consistent = False
            else:
                consistent = self._same_as_ours(overlap_end, prev_term)
        if consistent and new is not None:
            reason = self._log.check_run(new, prev_term=prev_term)
            if reason is not None:
                self._refused_runs.append(f"from {m.source}: entries {new.first_index}..{new.last_index}: {reason}")
                consistent = False
        if not consistent:
            self._send_push_response(m.source, m.type, PushResult.INCONSISTENT_STATE, m.index)
            return
        if new is not None:
            self._log.append_run(new)
        self._matched_index = max(self._matched_index, run.last_index)
        if new is not None and self.config.flush_sync and self._ack_index() <= self._acked_index:
            # Nothing to acknowledge before these entries are flushed, and persisted() sends
            # that acknowledgement: a response now would tell the leader nothing (its window
            # counts acknowledged entries, not responses), at a message per push each way.
            return
        self._send_push_response(m.source, m.type, PushResult.SUCCESS, m.index)

    # ------------------------------------------------------------------ leader side of replication

    def _on_heartbeat_response(self, m: HeartbeatResponse, now: float) -> None:
        if m.term > self.term:
            self._become_follower(m.term, None, now)
        elif m.term == self.term and self.role is Role.LEADER:
            self._progress[m.source].last_contact_at = now
            self._progress[m.source].disk_full, self._progress[m.source].disk_said_at = m.disk_full, now

    def _on_push_response(self, m: PushResponse, now: float) -> None:
        if m.term > self.term:
            self._become_follower(m.term, None, now)
            return
        if m.term < self.term or self.role is not Role.LEADER:
            return
        self._progress[m.source].on_response(m, now, self._log)

    def _push(self, peer: str, progress: Progress, now: float, first: int, last: int) -> None:
        """Push to ``peer`` what ``progress`` says is due; ``first`` and ``last`` are the log's ends
        (read once by ``_after_event`` for every peer: pushing does not change the log)."""
        timeout = self.config.push_timeout_seconds
        progress.before_push(now, timeout, self._log, first)
        if progress.state is not PushType.APPEND:
            if progress.sent_at is None or now >= progress.sent_at + timeout:
                message = self._control_push(peer, progress)
                if message is not None:
                    self._messages.append(message)
                progress.sent_at = None if message is None else now  # None: nothing in flight to time
            return
        in_flight_max = self.config.push_in_flight_max
        while progress.index <= last and progress.window_open(in_flight_max):
            # Whole batches (a window that opens by one entry must not make one-entry pushes):
            # in flight may pass push_in_flight_max by less than a batch. The push names the
            # entries (a reference run): the driver sends them as its store holds them.
            count = self._log.count_within(progress.index, last + 1, size_max=self.config.push_batch_size_max)
            run = EntryRun(progress.index, count, self._log.term_at(progress.index + count - 1))
            prev_term = self._log.term_or_missing(progress.index - 1)
            self._messages.append(Push(self.self_id, peer, self.term, PushType.APPEND, progress.index, prev_term,
                                       self.committed_index, run))  # fmt: skip
            progress.appended(count, now)
        progress.appends_sent(now)

    def _control_push(self, peer: str, progress: Progress) -> Push | ResetPush | None:
        """The COMPARE, TRUNCATE or RESET for ``progress`` (None: a RESET we cannot send)."""
        index = progress.index
        if progress.state is PushType.RESET:
            first = progress.index = self._log.first_index()  # retention may have moved it since
            prev_term = self._log.term_before_first()
            if prev_term < 0:  # our store does not know the term before its first entry
                return None
            return ResetPush(self.self_id, peer, self.term, first, prev_term, self._log.term_at(first),
                             self._log.first_offset(), self.committed_index)  # fmt: skip
        # COMPARE carries our entry at index; TRUNCATE ours at index and index + 1 (where we have them)
        wanted = (index,) if progress.state is PushType.COMPARE else (index, index + 1)
        last = self._log.last_index()
        entries = tuple(self._log.read(i, i + 1, size_max=0)[0] for i in wanted if 0 <= i <= last)
        return Push(self.self_id, peer, self.term, progress.state, index, -1, self.committed_index, entries)

    def _push_all(self, now: float) -> tuple[int, int]:
        """Push to every follower what is due; return the log's (first, last) index."""
        self._push_due_at = None  # whatever a proposal left goes now
        log = self._log
        first, last = log.first_index(), log.last_index()
        for peer, progress in self._progress.items():
            self._push(peer, progress, now, first, last)
        return first, last
