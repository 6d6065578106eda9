"""Messages between Raft members, as frozen dataclasses (the wire codec is ``hasvc.protocol.raft``).

Every message names its ``source`` and ``target`` member ids and carries the sender's ``term``.
Result codes keep DLedger's names (``DLedgerResponseCode``) where DLedger has the case.

    VoteRequest / VoteResponse   election (and pre-vote: ``pre_vote=True``, nothing is recorded)
    Heartbeat / HeartbeatResponse  the leader's liveness and commit index (DLedger HEART_BEAT)
    Push / PushResponse          DLedger's EntryPusher: COMPARE, TRUNCATE, APPEND (PUSH)
    ResetPush                    ours: "start your log empty at my first index" (answered by a
                                 PushResponse of type RESET); a follower needing an entry that
                                 retention deleted everywhere is caught up this way
    TimeoutNow                   leadership transfer: "campaign now" (DLedger LEADERSHIP_TRANSFER)
"""

from __future__ import annotations

import dataclasses
import enum

from hasvc.state.raft.storage import Entry, EntryRun


class VoteResult(enum.IntEnum):
    ACCEPT = 0
    REJECT_UNKNOWN_LEADER = 1  # the candidate is not a member
    REJECT_UNEXPECTED_LEADER = 2  # the candidate claims our own id
    REJECT_EXPIRED_LEDGER_TERM = 3  # the candidate's last log term is below ours
    REJECT_SMALL_LEDGER_END_INDEX = 4  # same last term, shorter log
    REJECT_EXPIRED_VOTE_TERM = 5  # the request's term is below ours
    REJECT_ALREADY_VOTED = 6  # we voted for another member in this term
    REJECT_ALREADY_HAS_LEADER = 7  # ... and know the leader of this term
    REJECT_TERM_SMALL_THAN_LEDGER = 8  # the request's term is below our last log term
    REJECT_LEADER_LEASE = 9  # ours: we heard from a live leader within the election timeout


class HeartbeatResult(enum.IntEnum):
    SUCCESS = 0
    EXPIRED_TERM = 1  # the heartbeat's term is below ours (the response carries ours)
    INCONSISTENT_LEADER = 2  # another member leads this term (a bug or a rogue peer)


class PushType(enum.IntEnum):
    COMPARE = 1  # does your entry at `index` equal mine? (`entries` holds mine, empty for index -1)
    TRUNCATE = 2  # drop everything after `index` (whose entry, mine, is in `entries`)
    APPEND = 3  # append the run `entries` (an EntryRun from `index`; `prev_term` is the term at index - 1)
    RESET = 4  # ours: a ResetPush (its own message and frame): start the log empty at `index`


class PushResult(enum.IntEnum):
    SUCCESS = 0
    EXPIRED_TERM = 1  # the push's term is below ours
    INCONSISTENT_LEADER = 2  # another member leads this term
    INCONSISTENT_STATE = 3  # entries do not match: the leader goes back to COMPARE
    OUT_OF_ORDER = 4  # ours: an APPEND beyond our end (an earlier push lost); `end_index` says where
    MISMATCH = 5  # COMPARE: our entry at `index` differs or is missing


@dataclasses.dataclass(frozen=True, slots=True)
class VoteRequest:
    source: str
    target: str
    term: int  # the term the candidate asks for (pre-vote: its current term + 1, not adopted)
    ledger_end_index: int
    ledger_end_term: int
    pre_vote: bool = False
    transfer: bool = False  # campaign ordered by the leader (TimeoutNow): voters ignore their lease


@dataclasses.dataclass(frozen=True, slots=True)
class VoteResponse:
    source: str
    target: str
    term: int  # the voter's current term (pre-vote accept: the request's term)
    result: VoteResult
    pre_vote: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    source: str
    target: str
    term: int
    commit_index: int  # the leader's, capped at what this follower acknowledged in this term
    # The leader's retention floor: every member holds every entry from here down to its own
    # first index, and none will need one below it again; -1: not said (older leaders).
    retain_from_index: int = -1


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    source: str
    target: str
    term: int
    result: HeartbeatResult
    # The follower cannot append now (its disk above disk_max_used_space_ratio, or no room for the
    # files its next entries need): a leader whose own disk is full hands over only to a member
    # that said it has room (``hasvc.state.raft.disk_room``).
    disk_full: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Push:
    source: str
    target: str
    term: int
    type: PushType
    index: int  # COMPARE/TRUNCATE: the index compared or kept (-1: the empty prefix); APPEND: entries[0].index
    prev_term: int  # APPEND: term of the entry at index - 1 (-1 when index is 0); else -1
    commit_index: int
    # COMPARE/TRUNCATE: the leader's entries named above. APPEND: an ``EntryRun`` from ``index``: the
    # stored bytes, or (a leader's, before its driver sends it) a reference to its own log's entries.
    entries: tuple[Entry, ...] | EntryRun = ()


@dataclasses.dataclass(frozen=True, slots=True)
class ResetPush:
    """Leader -> a follower that needs an entry below the leader's first index: "discard your log
    and start it empty at ``index``; the term of entry ``index - 1`` is ``prev_term``; your next
    entry lies at ``pos``". ``first_term`` is the term of the leader's entry ``index``: a follower
    whose entry there has that term holds the leader's log up to it and refuses (see ``node``)."""

    source: str
    target: str
    term: int
    index: int  # the leader's first index (>= 1): the follower's log restarts here
    prev_term: int  # term of entry index - 1 (>= 0: the leader knows it)
    first_term: int  # term of the leader's entry `index`
    pos: int  # where entry `index` lies in the leader's data files (the store's offset; opaque to the core)
    commit_index: int


@dataclasses.dataclass(frozen=True, slots=True)
class PushResponse:
    source: str
    target: str
    term: int
    type: PushType
    result: PushResult
    request_index: int  # the request's `index` (an acknowledgement sent after a flush: -1)
    ack_index: int  # every entry up to here matches the leader's (and is flushed with flush_sync)
    begin_index: int  # the follower's first index
    end_index: int  # the follower's last index
    term_at_index: int = -1  # MISMATCH: the follower's term at request_index (-1: no entry there)


@dataclasses.dataclass(frozen=True, slots=True)
class TimeoutNow:
    source: str
    target: str
    term: int


Message = (VoteRequest | VoteResponse | Heartbeat | HeartbeatResponse | Push | ResetPush | PushResponse
           | TimeoutNow)
