"""What the client's calls return, and its one error."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from commitlog import record as rec
from hasvc.protocol import client as cp


class ClientError(Exception):
    """The broker answered with an error, or the connection failed."""


@dataclasses.dataclass(frozen=True, slots=True)
class SendResult:
    status: str
    offset: int
    queue_id: int
    queue_offset: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "PUT_OK"


@dataclasses.dataclass(frozen=True, slots=True)
class TransferResult:
    """A TRANSFER_LEADER outcome: ``status`` OK or why not (docs/PROTOCOL.md §2), ``details`` the
    response's JSON object (leader_id, term, target_lag_entries, ...)."""

    status: str
    reason: str
    details: dict

    @property
    def ok(self) -> bool:
        return self.status == cp.OK


@dataclasses.dataclass(frozen=True, slots=True)
class PullResult:
    status: str
    records: list[rec.Record]
    next_queue_offset: int
    max_queue_offset: int


def message_properties(tags: str | None, keys: str | None, properties: Mapping[str, str] | None) -> bytes:
    merged = dict(properties or {})
    if tags:
        merged[rec.PROPERTY_TAGS] = tags
    if keys:
        merged[rec.PROPERTY_KEYS] = keys
    return rec.encode_properties(merged)
