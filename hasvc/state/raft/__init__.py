"""The pure Raft core of DLedger mode (see ``node`` for the theory of operation)."""

from hasvc.state.raft.config import DLEDGER_DEFAULTS, ETCD_LIKE, RaftConfig
from hasvc.state.raft.node import NO_OP, RaftNode
from hasvc.state.raft.ready import (
    BecameCandidate,
    BecameFollower,
    BecameLeader,
    ProposalDone,
    ProposalStatus,
    Proposed,
    Ready,
    RefusalStatus,
    Refused,
    Role,
    TransferAborted,
)
from hasvc.state.raft.storage import Entry, EntryLog, HardState

__all__ = [
    "DLEDGER_DEFAULTS", "ETCD_LIKE", "NO_OP", "BecameCandidate", "BecameFollower", "BecameLeader", "Entry",
    "EntryLog", "HardState", "ProposalDone", "ProposalStatus", "Proposed", "RaftConfig", "RaftNode", "Ready",
    "RefusalStatus", "Refused", "Role", "TransferAborted",
]  # fmt: skip
