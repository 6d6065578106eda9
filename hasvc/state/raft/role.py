"""The broker role a Raft member plays, beside its Raft role (``hasvc status``: ``role`` and
``raft_role``): a leader plays SYNC_MASTER once every entry of its log is committed and dispatched
and its producer table is rebuilt (``hasvc.broker.raft.broker.RaftBroker._on_role``); every other
member, and a leader until then, plays SLAVE: it serves committed reads and refuses writes naming
the leader it knows. The classic roles are ``hasvc.state.role``; this is their Raft counterpart,
the same ``RoleState`` seam for the put path."""

from __future__ import annotations

from hasvc.config import BrokerRole
from hasvc.state.role import RoleState


class RaftRole(RoleState):
    """RoleState for a member: SLAVE means "not a leader that has caught up"; the refusal names
    the leader this member knows."""

    __slots__ = ("leader_hint",)

    def __init__(self) -> None:
        super().__init__(BrokerRole.SYNC_MASTER, None)
        self.role = BrokerRole.SLAVE
        self.leader_hint = "no leader is known yet"

    def check_invariants(self) -> None:
        assert self.fenced_by is None

    def write_refusal(self) -> str | None:
        if self.role is BrokerRole.SLAVE:
            return f"this DLedger member does not lead: {self.leader_hint}"
        return None
