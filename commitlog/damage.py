"""Damage: bytes a store holds that are not what was written, told apart from a torn tail.

Theory of operation
-------------------
After an unclean shutdown the bytes past the last point known flushed may be torn: a record cut
half-way, a page that never reached the disk. Recovery cuts those, as RocketMQ and Kafka do
past their recovery point. Anything at or below that point (the checkpoint's flushed offset for
a classic log, the persisted index of a DLedger member), and anything at all after a clean
shutdown, was on disk whole once: if it no longer checks, it is *damage*, and damage is never cut
silently. It is recorded as a ``DamagedRange`` (which file, which global byte range, which record
or entry, what failed), reported by the broker (log line at ERROR, STATUS ``damaged``, metrics),
and repaired from a healthy copy, or the store refuses to open with one line that names it.

This module only names things; it does no I/O.
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True, slots=True)
class DamagedRange:
    """``[from_offset, to_offset)`` of a log is damaged.

    ``file`` is the path of the file that holds ``from_offset`` (a segment, a data or index file);
    ``index`` is the record's or entry's index where one is known (-1 otherwise); ``reason`` says
    what failed ("body CRC mismatch", "magic code", ...), as the scan reported it."""

    file: str
    from_offset: int
    to_offset: int
    reason: str
    index: int = -1

    def __post_init__(self) -> None:
        assert self.from_offset >= 0, self
        assert self.to_offset >= self.from_offset, self

    def to_json(self) -> dict:
        """The STATUS form: ``{file, from, to, reason}`` (and ``index`` when known)."""
        answer = {"file": self.file, "from": self.from_offset, "to": self.to_offset, "reason": self.reason}
        if self.index >= 0:
            answer["index"] = self.index
        return answer

    def describe(self) -> str:
        """One line: where and what, for a log line or an error."""
        where = f"{os.path.basename(self.file)} offsets [{self.from_offset}, {self.to_offset})"
        if self.index >= 0:
            where += f" (index {self.index})"
        return f"{where}: {self.reason}"


__all__ = ["DamagedRange"]
