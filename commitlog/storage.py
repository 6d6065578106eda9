"""``LogStorage``: what classic replication needs of a log, as a protocol.

The master reads spans of its log for a slave (``read``: never past a segment's end nor the
readable end) between ``min_offset`` and ``max_offset``; the slave appends the master's bytes at
its own end (``append_replicated``: the offset must equal ``max_wrote_offset``), cuts its log
back to where its history meets the master's (``truncate``), and reports what it holds or, with
``flush_before_ack``, what ``flush`` made durable (``flushed_offset``). Offsets are global byte
offsets; ``segment_size`` fixes where frames must stop.

Invariants every implementation keeps: ``min_offset <= max_offset <= max_wrote_offset`` and
``flushed_offset <= max_wrote_offset``; the ends never decrease except by ``truncate``.

``commitlog.commit_log.CommitLog`` satisfies it, and so does ``commitlog.memory_log.MemoryLog``,
an in-memory twin that loses what was not flushed when it crashes, so the replication cores can
run in a simulator; ``tests/unit/test_log_storage.py`` runs one contract test against both.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class LogStorage(Protocol):
    segment_size: int

    @property
    def min_offset(self) -> int: ...  # the oldest retained byte

    @property
    def max_offset(self) -> int: ...  # the readable end (committed)

    @property
    def max_wrote_offset(self) -> int: ...  # the end of what was written

    @property
    def flushed_offset(self) -> int: ...  # the end of what is durable

    def read(self, offset: int, size_max: int) -> memoryview: ...

    def append_replicated(self, offset: int, data) -> None: ...

    def truncate(self, offset: int) -> None: ...

    def flush(self, least_pages: int = 0) -> int: ...
