"""A Raft group's configuration (``hasvc node --group --self --peers``): who the members are and
where their Raft ports listen, with the core's timing (``RaftConfig``)."""

from __future__ import annotations

import dataclasses

from hasvc.config import Address
from hasvc.state.raft.config import RaftConfig


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    group: str
    self_id: str
    peers: dict[str, Address]  # every member's Raft address, self included
    raft: RaftConfig
    upgrade_classic: bool = False  # a classic store may be continued as this member's (smooth upgrade)

    def validate(self) -> GroupConfig:
        if self.self_id not in self.peers:
            raise ValueError(f"--self {self.self_id!r} is not among --peers ({', '.join(self.peers)})")
        if len(self.peers) not in (1, 3, 5, 7):
            raise ValueError(f"a DLedger group has an odd number of members (3 or 5), not {len(self.peers)}")
        if not self.group:
            raise ValueError("--group must not be empty")
        self.raft.validate()
        return self


def parse_peers(text: str) -> dict[str, Address]:
    """``n0-HOST:PORT;n1-HOST:PORT;...`` (DLedger's peers syntax) -> {id: address}."""
    from hasvc.config import parse_address

    peers: dict[str, Address] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        member, separator, address = part.partition("-")
        if not separator or not member:
            raise ValueError(f"peer {part!r}: expected ID-HOST:PORT")
        if member in peers:
            raise ValueError(f"peer id {member!r} appears twice")
        peers[member] = parse_address(address)
    if not peers:
        raise ValueError("--peers names no member")
    return peers


def running_already_hint(noun: str, self_id: str) -> str:
    """What a Raft address in use most likely means, for a DLedger ``member`` or a ``controller``:
    said by the CLI's check before the store opens, and by ``open_raft_listener`` after."""
    return f"is a {noun} with --self {self_id} running already? Two cannot run in one group"
