"""What the client's calls return, and its one error."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from commitlog import record as rec
from hasvc.protocol import client as cp


class ClientError(Exception):
    """The broker answered with an error, or the connection failed."""


class ConnectError(ClientError):
    """No session with the broker: it cannot be reached, or the preface failed (a wrong port,
    a wrong secret). The message names the address."""


class DamagedRecordError(ClientError):
    """A record that failed its check: the broker answered DAMAGED, or its body failed its CRC
    on arrival. ``offset`` is its physical offset (-1 when the broker's reason did not parse)."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


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


def send_results(payload: bytes, count: int) -> list[SendResult]:
    """The results of a SEND or SEND_IDEMPOTENT of ``count`` messages from its response payload."""
    response = cp.decode_send_response(payload)
    if not response.offsets:
        # nothing stored: the response's queue id is -1 (docs/PROTOCOL.md, SEND response)
        return [SendResult(response.status, -1, response.queue_id, -1, response.reason) for _ in range(count)]
    return [
        SendResult(response.status, offset, response.queue_id, queue_offset, response.reason)
        for offset, queue_offset in zip(response.offsets, response.queue_offsets, strict=True)
    ]


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
