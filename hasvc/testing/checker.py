"""RaftChecker: the safety properties a simulated Raft cluster must keep after every step.

Theory of operation
-------------------
The cluster tells the checker about every side effect as it carries a ``Ready`` out, before it
applies it to the node's ``SimLog``; the checker keeps just enough history to check incrementally:

* **Election safety**: at most one leader per term (``on_leader``); a member's saved term never
  goes back and it never saves two different votes in one term, across restarts (``on_hard_state``).
* **Save before send**: every message leaves with a term the member has saved, every vote it
  grants or asks for is the saved vote of that term (``on_send``).
* **Log matching**: every appended entry is recorded by (index, term) with its body and the term of
  the entry before it; another append of the same (index, term) must carry the same body and the
  same previous term, which by induction makes the whole prefixes equal (``on_append``).
* **Committed entries never change or disappear**: the cluster's committed log grows only; each
  member's newly committed entries must equal it (``on_commit``, ``on_start``); no truncation
  removes an entry of it (``on_truncate``); a reset drops only entries below the cluster's committed
  end (gone, not changed) and none of it at or above its index (``on_reset``); and after a crash every committed entry is still in
  the logs of a quorum of members (``after_crash``).
* **Acknowledged means committed, exactly once**: a proposal reported SUCCESS is in the committed
  log at the indexes its leader gave it; no body is committed twice (``on_acked``, ``final``).

Bodies must be unique (the simulated clients never retry); the empty body is a leader's no-op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hasvc.state.raft.messages import VoteRequest, VoteResponse, VoteResult
from hasvc.state.raft.storage import Entry, HardState, LogReset
from hasvc.testing.log import SimLog


class SafetyViolation(AssertionError):
    pass


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SafetyViolation(message)


class RaftChecker:
    def __init__(self, members: Sequence[str]) -> None:
        self.members = tuple(members)
        self.quorum = len(self.members) // 2 + 1
        self.leaders: dict[int, str] = {}
        self._saved: dict[str, HardState] = {}
        self._votes: dict[tuple[str, int], str] = {}
        self._seen: dict[tuple[int, int], tuple[bytes, int]] = {}
        self.committed: list[Entry] = []
        self._body_index: dict[bytes, int] = {}
        self._node_committed: dict[str, int] = {}
        self.acked: dict[bytes, int] = {}

    def on_leader(self, node: str, term: int) -> None:
        other = self.leaders.setdefault(term, node)
        _require(other == node, f"two leaders in term {term}: {other} and {node}")

    def on_hard_state(self, node: str, state: HardState) -> None:
        before = self._saved.get(node)
        if before is not None:
            _require(state.term >= before.term, f"{node} saved term {state.term} after {before.term}")
        self._saved[node] = state
        if state.voted_for is not None:
            vote = self._votes.setdefault((node, state.term), state.voted_for)
            _require(vote == state.voted_for, f"{node} voted for {vote} and {state.voted_for} in term {state.term}")

    def on_send(self, node: str, message: object) -> None:
        """`message` leaves `node` after its Ready's hard state was saved (or none changed)."""
        saved = self._saved.get(node, HardState(0, None, -1))
        term = message.term
        if isinstance(message, VoteRequest | VoteResponse) and message.pre_vote:
            return  # a pre-vote names a term nobody adopted
        _require(term <= saved.term, f"{node} sends {message} in a term it has not saved ({saved})")
        if isinstance(message, VoteRequest):
            _require(saved.term == term and saved.voted_for == node,
                     f"{node} asks for votes in term {term} before saving its own vote ({saved})")  # fmt: skip
        if isinstance(message, VoteResponse) and message.result is VoteResult.ACCEPT:
            _require(saved.term == term and saved.voted_for == message.target,
                     f"{node} grants {message.target} its vote in term {term} before saving it ({saved})")  # fmt: skip

    def on_append(self, node: str, log: SimLog, entries: Sequence[Entry]) -> None:
        previous_term = log.last_term()
        for entry in entries:
            record = (entry.body, previous_term)
            seen = self._seen.setdefault((entry.index, entry.term), record)
            _require(seen == record, f"log matching: {node} appends {entry} after term {previous_term}, "
                                     f"another member had body {seen[0]!r} after term {seen[1]}")  # fmt: skip
            previous_term = entry.term

    def on_truncate(self, node: str, log: SimLog, after_index: int) -> None:
        _require(after_index >= self._node_committed.get(node, -1),
                 f"{node} truncates after {after_index} below its commit {self._node_committed.get(node)}")  # fmt: skip
        for index in range(max(after_index + 1, log.first_index()), min(log.last_index(), len(self.committed) - 1) + 1):
            _require(log.term_at(index) != self.committed[index].term,
                     f"{node} truncates committed entry {self.committed[index]}")  # fmt: skip

    def on_compact(self, node: str, log: SimLog, first_index: int, logs: Mapping[str, SimLog], *,
                   forced: bool = False) -> None:  # fmt: skip
        """Retention moved ``node``'s first index to ``first_index``: every entry it deleted was
        committed and (unless ``forced``: a full disk) is held or was deleted too by every member,
        so no member needs it again. A forced clean may strand a member: it is RESET. So may a
        member whose storage lost entries (it holds a catch-up mark): the floor the leader
        announced may count what it held before, until its first answer says otherwise."""
        _require(first_index <= len(self.committed), f"{node} deletes entries up to {first_index - 1}, "
                                                     f"the cluster committed only {len(self.committed) - 1}")  # fmt: skip
        if forced:
            return
        for member, other in logs.items():
            index = first_index - 1
            if index >= other.first_index() and other.load_hard_state().catch_up_index < 0:
                _require(index <= other.last_index() and other.entry_at(index) == self.committed[index],
                         f"{node} deletes up to {index}, which {member} does not hold")  # fmt: skip

    def on_reset(self, node: str, log: SimLog, reset: LogReset) -> None:
        """``node`` drops its log and starts it empty at ``reset.first_index``: every index below
        is committed cluster-wide (an entry below first_index is simply gone, not changed), its
        term_before_first is the committed entry's, and no committed entry at or above the index
        is among those dropped. Its committed index moves to first_index - 1."""
        index = reset.first_index - 1
        _require(index < len(self.committed), f"{node} resets to {reset.first_index}, the cluster committed only "
                                              f"{len(self.committed) - 1}")  # fmt: skip
        _require(self.committed[index].term == reset.term_before_first,
                 f"{node} resets to {reset.first_index} after term {reset.term_before_first}, "
                 f"committed there: {self.committed[index]}")  # fmt: skip
        for held in range(max(reset.first_index, log.first_index()), min(log.last_index(), len(self.committed) - 1) + 1):
            _require(log.entry_at(held) != self.committed[held], f"{node} drops committed entry {self.committed[held]} "
                                                                 f"in a reset to {reset.first_index}")  # fmt: skip
        self._node_committed[node] = max(self._node_committed.get(node, -1), index)

    def on_start(self, node: str, log: SimLog, committed_index: int) -> None:
        """A member (re)started believing entries up to `committed_index` are committed."""
        _require(committed_index < len(self.committed) or committed_index == -1,
                 f"{node} restarts with commit {committed_index} beyond the cluster's {len(self.committed) - 1}")  # fmt: skip
        for index in range(log.first_index(), committed_index + 1):  # below first_index: deleted by retention
            _require(
                log.entry_at(index) == self.committed[index], f"{node} restarted with a changed committed entry {index}"
            )
        self._node_committed[node] = committed_index

    def on_commit(self, node: str, log: SimLog, committed_index: int) -> None:
        before = self._node_committed.get(node, -1)
        _require(committed_index >= before, f"{node} commit went back from {before} to {committed_index}")
        for index in range(before + 1, committed_index + 1):
            if index < log.first_index():
                _require(index < len(self.committed), f"{node} deleted entry {index} before the cluster committed it")
                continue  # deleted by retention: gone, not changed
            entry = log.entry_at(index)
            if index < len(self.committed):
                _require(
                    entry == self.committed[index],
                    f"{node} commits {entry}, the cluster committed {self.committed[index]}",
                )
                continue
            _require(index == len(self.committed), f"commit gap at {index}")
            self.committed.append(entry)
            if entry.body:
                first = self._body_index.setdefault(entry.body, index)
                _require(first == index, f"body {entry.body!r} committed twice, at {first} and {index}")
        self._node_committed[node] = committed_index

    def on_acked(self, node: str, first_index: int, bodies: Sequence[bytes]) -> None:
        for offset, body in enumerate(bodies):
            index = first_index + offset
            _require(index < len(self.committed), f"{node} acknowledged index {index}, not committed")
            _require(self.committed[index].body == body, f"{node} acknowledged {body!r} at {index}, "
                                                         f"committed there: {self.committed[index].body!r}")  # fmt: skip
            self.acked[body] = index

    def after_crash(self, logs: Mapping[str, SimLog], lost_from: int) -> None:
        """Every committed entry at or above `lost_from` is still in a quorum of logs."""
        for index in range(max(lost_from, 0), len(self.committed)):
            entry = self.committed[index]
            # An entry retention deleted counts as held: every member had it (``on_compact``).
            # A member whose storage lost it (a storage fault) counts if its catch-up mark covers it:
            # the fault took that copy, not the crash; a healthy one must remain all the same.
            holders = healthy = 0
            for log in logs.values():
                held = index < log.first_index() or (index <= log.last_index() and log.entry_at(index) == entry)
                healthy += held
                holders += held or log.load_hard_state().catch_up_index >= index
            _require(holders >= self.quorum, f"committed {entry} survives on {holders} logs, quorum is {self.quorum}")
            _require(healthy >= 1, f"committed {entry} survives on no log")

    def healthy_copy_holds(self, logs: Mapping[str, SimLog], damaged: str, lost_from: int) -> bool:
        """Whether every committed entry at or above ``lost_from`` is held by a member other than
        ``damaged`` (the storage fault that takes them from ``damaged`` leaves a healthy copy)."""
        for index in range(max(lost_from, 0), len(self.committed)):
            entry = self.committed[index]
            if not any(index < log.first_index() or (index <= log.last_index() and log.entry_at(index) == entry)
                       for member, log in logs.items() if member != damaged):  # fmt: skip
                return False
        return True

    def on_vote_granted(self, node: str, candidate: str, candidate_end: tuple[int, int],
                        acknowledged: Mapping[int, int]) -> None:  # fmt: skip
        """``node`` grants ``candidate`` (pre-)vote, whose log ends at (term, index) ``candidate_end``:
        no committed entry ``node`` ever acknowledged ((term -> highest index) ``acknowledged``)
        may be missing from a log that ends there (Raft's up-to-date order; Alagappan et al.:
        a member that lost entries must not vote for a log without them)."""
        for term, index in acknowledged.items():
            if index < len(self.committed) and self.committed[index].term == term:
                _require(candidate_end >= (term, index),
                         f"{node} grants {candidate} (log ending at {candidate_end}) a vote, but acknowledged "
                         f"committed entry {self.committed[index]}")  # fmt: skip

    def final(self) -> None:
        for body, index in self.acked.items():
            _require(self._body_index.get(body) == index, f"acknowledged {body!r} not committed once at {index}")
