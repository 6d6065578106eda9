"""OffsetWaiters: callers waiting for a watermark (flushed offset, slave ack) to pass an offset.

Pure and driver-agnostic: the driver registers a token (a threading.Event, a trio.Event, a
callback...) with the offset it needs and a deadline, then reports progress with ``release`` and
time with ``expire``; both return the tokens whose wait is over. A heap keeps the work per
watermark move proportional to the waiters released, not to all waiters: no polling loops.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

Token = TypeVar("Token")


class WaitersFull(Exception):
    """More waiters than ``waiters_max``."""


class OffsetWaiters(Generic[Token]):
    def __init__(self, *, waiters_max: int):
        assert waiters_max > 0
        self.waiters_max = waiters_max
        self._by_offset: list[tuple[int, int, Token]] = []
        self._by_deadline: list[tuple[float, int]] = []
        self._live: dict[int, Token] = {}
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def add(self, offset: int, deadline: float, token: Token) -> None:
        if len(self._live) >= self.waiters_max:
            raise WaitersFull(f"{len(self._live)} waiters already (waiters_max {self.waiters_max})")
        sequence = next(self._sequence)
        self._live[sequence] = token
        heapq.heappush(self._by_offset, (offset, sequence, token))
        heapq.heappush(self._by_deadline, (deadline, sequence))

    def release(self, watermark: int) -> list[Token]:
        """Tokens whose offset is at or below ``watermark``."""
        released = []
        heap = self._by_offset
        while heap and heap[0][0] <= watermark:
            _, sequence, token = heapq.heappop(heap)
            if self._live.pop(sequence, None) is not None:
                released.append(token)
        return released

    def expire(self, now: float) -> list[Token]:
        """Tokens whose deadline is at or before ``now``."""
        expired = []
        heap = self._by_deadline
        while heap and heap[0][0] <= now:
            _, sequence = heapq.heappop(heap)
            token = self._live.pop(sequence, None)
            if token is not None:
                expired.append(token)
        return expired

    def next_deadline(self) -> float | None:
        heap = self._by_deadline
        while heap and heap[0][1] not in self._live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def lowest_offset(self) -> int | None:
        heap = self._by_offset
        while heap and heap[0][1] not in self._live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def drain(self) -> list[Token]:
        tokens = list(self._live.values())
        self._live.clear()
        self._by_offset.clear()
        self._by_deadline.clear()
        return tokens
