"""The pure Raft core of DLedger mode (see ``node`` for the theory of operation)."""

from hasvc.state.raft.config import DLEDGER_DEFAULTS, ETCD_LIKE, RaftConfig
from hasvc.state.raft.node import NO_OP, RaftNode
from hasvc.state.raft.ready import (
    BecameCandidate,
    BecameFollower,
    BecameLeader,
    PeerStatus,
    ProposalDone,
    ProposalStatus,
    Proposed,
    RaftStatus,
    Ready,
    RefusalStatus,
    Refused,
    Role,
    TransferAborted,
)
from hasvc.state.raft.storage import Entry, EntryLog, EntryRun, HardState

__all__ = [
    "DLEDGER_DEFAULTS", "ETCD_LIKE", "NO_OP", "BecameCandidate", "BecameFollower", "BecameLeader", "Entry",
    "EntryLog", "EntryRun", "HardState", "PeerStatus", "ProposalDone", "ProposalStatus", "Proposed", "RaftConfig",
    "RaftNode", "RaftStatus", "Ready", "RefusalStatus", "Refused", "Role", "TransferAborted",
]  # fmt: skip
