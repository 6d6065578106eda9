"""SimNetwork: a seeded network of opaque messages between nodes addressed by id.

Theory of operation
-------------------
``send(source, target, message, now)`` schedules a delivery at ``now + delay`` (uniform in
``[delay_min_seconds, delay_max_seconds]``, plus ``straggler_delay_seconds`` for a
``straggler_probability`` share, which reorders messages unless ``fifo``), or drops it (``drop_probability``),
or schedules it twice (``duplicate_probability``). Partitions split the nodes into sides; a message
between two sides is dropped when sent and again when due (a partition also eats what is in
flight). ``pop_due(now)`` hands out the next delivery due by ``now``, in time order, ties in send
order. Nothing here reads a clock or draws from anything but the ``random.Random`` it is given.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Callable, Iterable
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class NetworkConfig:
    delay_min_seconds: float = 0.0005
    delay_max_seconds: float = 0.005
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    straggler_probability: float = 0.0
    straggler_delay_seconds: float = 0.05
    # First in, first out per (source, target) link, as over one TCP connection; False lets a later
    # message overtake an earlier one.
    fifo: bool = False

    def validate(self) -> NetworkConfig:
        if not 0 <= self.delay_min_seconds <= self.delay_max_seconds:
            raise ValueError(f"need 0 <= delay_min_seconds <= delay_max_seconds, got {self}")
        for name in ("drop_probability", "duplicate_probability", "straggler_probability"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], not {getattr(self, name)}")
        return self


@dataclasses.dataclass(slots=True)
class NetworkStatistics:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0
    partitioned: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    source: str
    target: str
    message: Any


class SimNetwork:
    def __init__(self, rng: random.Random, config: NetworkConfig | None = None) -> None:
        self.config = (config or NetworkConfig()).validate()
        self._rng = rng
        self._queue: list[tuple[float, int, Delivery]] = []
        self._sequence = 0
        self._side: dict[str, int] = {}  # node -> side; absent nodes are all on side 0
        self._link_last: dict[tuple[str, str], float] = {}  # fifo: latest delivery time per link
        self.statistics = NetworkStatistics()
        # A test's scalpel: messages for which this returns True are dropped when sent.
        self.drop_if: Callable[[str, str, Any], bool] | None = None

    # ------------------------------------------------------------------ partitions

    def partition(self, *sides: Iterable[str]) -> None:
        """Split the network: nodes in different `sides` cannot talk; unlisted nodes stay on side 0."""
        self._side = {}
        for number, side in enumerate(sides, start=1):
            for node in side:
                if node in self._side:
                    raise ValueError(f"node {node!r} is on two sides of the partition")
                self._side[node] = number

    def heal(self) -> None:
        self._side = {}

    def connected(self, a: str, b: str) -> bool:
        return self._side.get(a, 0) == self._side.get(b, 0)

    @property
    def partitioned(self) -> bool:
        return bool(self._side)

    # ------------------------------------------------------------------ traffic

    def send(self, source: str, target: str, message: Any, now: float) -> None:
        self.statistics.sent += 1
        if not self.connected(source, target):
            self.statistics.partitioned += 1
            return
        if self.drop_if is not None and self.drop_if(source, target, message):
            self.statistics.dropped += 1
            return
        config = self.config
        if self._rng.random() < config.drop_probability:
            self.statistics.dropped += 1
            return
        copies = 1
        if self._rng.random() < config.duplicate_probability:
            copies = 2
            self.statistics.duplicated += 1
        for _ in range(copies):
            delay = self._rng.uniform(config.delay_min_seconds, config.delay_max_seconds)
            if self._rng.random() < config.straggler_probability:
                delay += config.straggler_delay_seconds
            at = now + delay
            if config.fifo:
                at = max(at, self._link_last.get((source, target), at))
                self._link_last[(source, target)] = at
            self._sequence += 1
            heapq.heappush(self._queue, (at, self._sequence, Delivery(source, target, message)))

    def next_delivery_at(self) -> float:
        return self._queue[0][0] if self._queue else math.inf

    def pop_due(self, now: float) -> Delivery | None:
        """The next delivery due by `now` that the partition lets through (None: nothing due)."""
        while self._queue and self._queue[0][0] <= now:
            _, _, delivery = heapq.heappop(self._queue)
            if self.connected(delivery.source, delivery.target):
                self.statistics.delivered += 1
                return delivery
            self.statistics.partitioned += 1
        return None

    def pop_due_if(self, now: float, wanted) -> Delivery | None:
        """``pop_due``, but only when the next delivery due by ``now`` that the partition lets
        through satisfies ``wanted(delivery)``; else None, and that delivery stays queued."""
        while self._queue and self._queue[0][0] <= now:
            delivery = self._queue[0][2]
            if not self.connected(delivery.source, delivery.target):
                heapq.heappop(self._queue)
                self.statistics.partitioned += 1
                continue
            if not wanted(delivery):
                return None
            heapq.heappop(self._queue)
            self.statistics.delivered += 1
            return delivery
        return None

    def discard_to(self, node: str) -> int:
        """Forget every message in flight to `node` (it crashed); returns how many."""
        kept = [item for item in self._queue if item[2].target != node]
        discarded = len(self._queue) - len(kept)
        if discarded:
            self._queue = kept
            heapq.heapify(self._queue)
        return discarded
