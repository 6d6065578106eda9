"""Idempotent sends: telling a producer's retry from a new message.

Theory of operation
-------------------
A client that may retry a send (after a lost connection or a failover) sends it as SEND_IDEMPOTENT
with a producer id (random, one per client instance) and the sequence number of its first message;
message ``i`` of the request has sequence ``first + i``. The broker stores both in every record's
properties (``HASVC_PRODUCER_ID``, ``HASVC_PRODUCER_SEQ``), so they travel to slaves with the log
bytes, and keeps, per producer, where its most recent ``window`` sequences were stored.

A request whose sequences are all known is a retry: it is answered with the original offsets,
after the same flush and replication waits as a new put (so a retry of a put that was stored but
never acknowledged waits until it is safe). A request whose sequences are all unknown and newer
than the window is new and appended. Anything else (partly known, or older than the window so that
the broker cannot tell) is refused with MESSAGE_ILLEGAL and a reason; nothing is stored.

The table lives in memory. A broker that becomes master (at start-up, or by promotion) rebuilds it
from the last ``producer_table_rebuild_bytes`` of its log, so a retry that reaches a promoted slave
finds the records that were replicated to it before the old master died. Bytes the old master
never replicated are not in the new master's log, so their retry is stored once, there; the old
master cuts them when it rejoins.

Bounds: ``window`` sequences per producer (older ones are forgotten), ``producers_max`` producers
(the least recently used is forgotten first).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from typing import Final

PROPERTY_PRODUCER_ID: Final = "HASVC_PRODUCER_ID"
PROPERTY_PRODUCER_SEQ: Final = "HASVC_PRODUCER_SEQ"
# Kafka keeps the last 5 batches per producer; we keep sequences, which cover any batching.
SEQUENCE_WINDOW_DEFAULT: Final = 4096
PRODUCERS_MAX_DEFAULT: Final = 65536


class Verdict(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    REFUSED = "refused"


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """Where one message of a producer was stored."""

    offset: int
    size: int
    queue_id: int
    queue_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Lookup:
    verdict: Verdict
    stored: tuple = ()  # DUPLICATE: one Stored per message, in sequence order (lookup_pass: or a pass's (frame, index))
    reason: str = ""


class _Producer:
    __slots__ = ("sequences", "high")

    def __init__(self) -> None:
        self.sequences: collections.OrderedDict[int, Stored] = collections.OrderedDict()  # insertion order
        self.high = -1  # the highest sequence ever stored


class ProducerTable:
    def __init__(self, *, window: int = SEQUENCE_WINDOW_DEFAULT, producers_max: int = PRODUCERS_MAX_DEFAULT):
        if window < 1 or producers_max < 1:
            raise ValueError("window and producers_max must be positive")
        self.window = window
        self.producers_max = producers_max
        self._producers: collections.OrderedDict[str, _Producer] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._producers)

    def clear(self) -> None:
        self._producers.clear()

    def lookup(self, producer_id: str, first: int, count: int) -> Lookup:
        producer = self._producers.get(producer_id)
        if producer is None:
            return Lookup(Verdict.NEW)
        self._producers.move_to_end(producer_id)
        return self._judge(producer, producer_id, first, count)

    def lookup_pass(self, frames: list[tuple[str, int, int, bool]]) -> list[Lookup]:
        """The verdicts of a pass's SEND_IDEMPOTENT frames, read together: ``frames`` each
        (producer id, first sequence, messages, writable), in the order read. Each frame is
        judged as ``lookup`` judges it once every earlier frame of the pass that is NEW and
        writable (not refused for its content: the pass stores it) has been remembered, as the
        batch path remembers a frame before it looks the next one up. Such a frame's sequences
        are known as (its number in ``frames``, the message's index) in a DUPLICATE's
        ``stored``, for the caller to resolve once they are stored. Nothing is remembered here
        (the caller remembers what the pass stored); a producer seen more than once in the pass
        is judged on a copy of what is known of it."""
        seen = collections.Counter(producer_id for producer_id, _, _, _ in frames)
        scratch: dict[str, _Producer] = {}
        verdicts = []
        for number, (producer_id, first, count, writable) in enumerate(frames):
            if seen[producer_id] == 1:
                verdicts.append(self.lookup(producer_id, first, count))
                continue
            producer = scratch.get(producer_id)
            if producer is None:
                producer = scratch[producer_id] = _Producer()
                known = self._producers.get(producer_id)
                if known is not None:
                    producer.sequences.update(known.sequences)
                    producer.high = known.high
            if producer_id in self._producers:
                self._producers.move_to_end(producer_id)
            lookup = self._judge(producer, producer_id, first, count)
            verdicts.append(lookup)
            if lookup.verdict is Verdict.NEW and writable:
                self._remember_in(producer, first, [(number, index) for index in range(count)])
        return verdicts

    def _judge(self, producer: _Producer, producer_id: str, first: int, count: int) -> Lookup:
        known = [producer.sequences.get(sequence) for sequence in range(first, first + count)]
        if all(stored is not None for stored in known):
            return Lookup(Verdict.DUPLICATE, tuple(known))
        if any(stored is not None for stored in known):
            return Lookup(Verdict.REFUSED, reason=f"sequences {first}..{first + count - 1} of producer {producer_id} "
                                                  "overlap an earlier send only in part")  # fmt: skip
        forgotten_below = producer.high - self.window + 1
        if first < forgotten_below:
            return Lookup(Verdict.REFUSED, reason=f"sequence {first} of producer {producer_id} is older than the "
                                                  f"{self.window} sequences remembered (highest {producer.high}): "
                                                  "cannot tell a retry from a new message")  # fmt: skip
        return Lookup(Verdict.NEW)

    def remember(self, producer_id: str, first: int, stored: list[Stored] | tuple[Stored, ...]) -> None:
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers[producer_id] = _Producer()
            while len(self._producers) > self.producers_max:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(producer_id)
        self._remember_in(producer, first, stored)

    def _remember_in(self, producer: _Producer, first: int, stored) -> None:
        sequences = producer.sequences
        for index, each in enumerate(stored):
            sequences[first + index] = each
        producer.high = max(producer.high, first + len(stored) - 1)
        while len(sequences) > self.window:
            sequences.popitem(last=False)

    def load(self, producer_id: str, entries: list[tuple[int, Stored]]) -> None:
        """Set what is known of one producer from the log, oldest first (a rebuild)."""
        producer = self._producers[producer_id] = _Producer()
        producer.sequences.update(entries[-self.window :])
        producer.high = max(sequence for sequence, _ in entries)
        while len(self._producers) > self.producers_max:
            self._producers.popitem(last=False)

    def replace_with(self, other: ProducerTable) -> None:
        """Know exactly what ``other`` knows (a table rebuilt aside, installed in one step)."""
        self._producers.clear()
        self._producers.update(other._producers)
        while len(self._producers) > self.producers_max:
            self._producers.popitem(last=False)
