"""What the Raft core hands its driver: ``Ready`` (etcd-raft's name) and the events inside it.

See ``hasvc.state.raft.node`` for the order in which a driver carries a ``Ready`` out.
"""

from __future__ import annotations

import dataclasses
import enum

from hasvc.state.raft.messages import Message
from hasvc.state.raft.storage import Entry, EntryRun, HardState, LogReset


class Role(enum.Enum):
    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"  # pre-vote and vote phases alike
    LEADER = "LEADER"


class ProposalStatus(enum.Enum):
    SUCCESS = "SUCCESS"  # committed (DLedgerCommitLog: PUT_OK)
    WAIT_QUORUM_ACK_TIMEOUT = "WAIT_QUORUM_ACK_TIMEOUT"  # no quorum within quorum_ack_timeout_seconds
    TERM_CHANGED = "TERM_CHANGED"  # leadership lost before the entry committed


class RefusalStatus(enum.Enum):
    NOT_LEADER = "NOT_LEADER"  # `leader_id` says who leads, when known
    LEADER_PENDING_FULL = "LEADER_PENDING_FULL"  # pending_max proposals are waiting already
    LEADER_TRANSFERRING = "LEADER_TRANSFERRING"  # handing leadership over: retry on the new leader
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"  # transfer target not in the group
    ALREADY_LEADER = "ALREADY_LEADER"  # transfer target is this leader
    TRANSFER_IN_PROGRESS = "TRANSFER_IN_PROGRESS"
    FOLLOWER_FALL_BEHIND_TOO_MUCH = "FOLLOWER_FALL_BEHIND_TOO_MUCH"  # target lags > leadership_transfer_wait_index_max
    FOLLOWER_NOT_REACHABLE = "FOLLOWER_NOT_REACHABLE"  # target silent for an election timeout


@dataclasses.dataclass(frozen=True, slots=True)
class BecameLeader:
    term: int


@dataclasses.dataclass(frozen=True, slots=True)
class BecameFollower:
    term: int
    leader_id: str | None  # None until the term's leader is heard from


@dataclasses.dataclass(frozen=True, slots=True)
class BecameCandidate:
    term: int


RoleChange = BecameLeader | BecameFollower | BecameCandidate


@dataclasses.dataclass(frozen=True, slots=True)
class Proposed:
    """propose() accepted: the bodies are entries first_index..last_index of `term`."""

    first_index: int
    last_index: int
    term: int


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    status: RefusalStatus
    leader_id: str | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ProposalDone:
    """The outcome of one propose() call (all its entries alike)."""

    first_index: int
    last_index: int
    term: int
    status: ProposalStatus


@dataclasses.dataclass(frozen=True, slots=True)
class TransferAborted:
    target: str  # the target did not take over within election_timeout_min_seconds


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work, to be done in field order (see ``hasvc.state.raft.node``)."""

    hard_state: HardState | None = None  # save (fsync) before anything else; None: unchanged
    reset: LogReset | None = None  # then log.reset(...): durable before anything is sent
    truncate_after: int | None = None  # then log.truncate(after_index=...)
    entries: tuple[Entry, ...] = ()  # then log.append(entries)
    runs: tuple[EntryRun, ...] = ()  # then log.append_run(run) for each (a follower's, checked)
    messages: tuple[Message, ...] = ()  # then send
    committed_index: int | None = None  # new commit index; None: unchanged
    role_changes: tuple[RoleChange, ...] = ()
    proposals: tuple[ProposalDone, ...] = ()
    transfers_aborted: tuple[TransferAborted, ...] = ()
    refused_runs: tuple[str, ...] = ()  # APPEND runs refused by log.check_run, why (for the driver's log)

    def is_empty(self) -> bool:
        return self == EMPTY_READY


EMPTY_READY = Ready()


@dataclasses.dataclass(frozen=True, slots=True)
class PeerStatus:
    """A leader's view of one follower (for ``hasvc status``)."""

    match_index: int
    lag_entries: int  # the leader's last index minus match_index
    last_contact_seconds: float  # since its last response in this term (inf: none yet)
    # It needs an entry retention deleted here: being reset to this leader's first index (RESET).
    behind_log_start: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RaftStatus:
    self_id: str
    role: Role
    term: int
    leader_id: str | None
    ledger_end_index: int
    committed_index: int
    flushed_index: int
    pending_count: int
    peers: dict[str, PeerStatus]  # leader only; empty otherwise
    # The catch-up mark's index: this member lost entries and neither votes as itself nor stands
    # for election until its flushed log reaches it again (-1: none; node's "Lost entries").
    catch_up_index: int = -1
