"""A run of DLedger entries as stored: what a leader pushes and a follower appends (``EntryRun``).

Theory of operation
-------------------
A run is ``count`` consecutive entries exactly as the leader's data file holds them: each a
48-byte header and its body (``entry_codec``), laid end to end, every ``pos`` field the entry's
data-file offset. Members' data files are byte-identical (``pos`` is a function of the log's
prefix, the data-file size and the log's start), so a follower copies a run into its mapping
as it is, after **one check** of the whole run (``check_run``: native when the C module is
built, else its pure-Python twin ``check_run_python``; the tests compare the two):

    magic 1, 48 <= size <= ENTRY_SIZE_MAX, size = bodySize + 48, the entry whole in the bytes;
    index = first_index + k; term >= 0, >= the previous entry's (the first's: >= prev_term),
    the last one's = last_term; pos = first_pos + its offset in the run and the entry's end
    <= pos_limit (a run never passes a data file's end: the follower's blank record goes
    where the leader's went); channel and chainCrc 0 (reserved: every writer leaves them 0);
    bodyCrc = CRC32 of the body when it is not 0 (0: not computed, DLedger's own files); exactly
    ``count`` entries filling the bytes.

``index_units`` builds the 32-byte index units of a checked run (one native call or its twin).
A run never spans two data files: a leader reading entries across a file's end sends one run
per file (``DLedgerMmapFileStore.read_runs``). ``data`` None is a leader's reference to entries
of its own log (the core's push before the driver reads the bytes at send time).
Pure: no I/O; imports neither trio nor hasvc.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any, Final

from commitlog import native
from commitlog.dledger import entry_codec as codec

# check_run's codes (the C twin returns the same numbers).
RUN_OK: Final = 0
RUN_TRUNCATED: Final = 1  # the bytes end inside an entry, or hold fewer than `count` entries
RUN_BAD_MAGIC: Final = 2
RUN_BAD_SIZE: Final = 3  # size outside [48, ENTRY_SIZE_MAX] or != bodySize + 48
RUN_BAD_INDEX: Final = 4  # not first_index + k
RUN_BAD_TERM: Final = 5  # negative, decreasing, below prev_term, or the last != last_term
RUN_BAD_POS: Final = 6  # not where the entry will be written
RUN_PAST_LIMIT: Final = 7  # the entry ends past pos_limit (a data file's end, less a blank record)
RUN_BAD_CRC: Final = 8  # bodyCrc does not match the body
RUN_TRAILING: Final = 9  # bytes after `count` entries
RUN_BAD_RESERVED: Final = 10  # channel or chainCrc not 0 (every writer, DLedger too, leaves them 0)
RUN_REASONS: Final = {
    RUN_TRUNCATED: "the bytes end inside an entry or hold too few entries",
    RUN_BAD_MAGIC: "unknown magic",
    RUN_BAD_SIZE: "size outside [48, ENTRY_SIZE_MAX] or not bodySize + 48",
    RUN_BAD_INDEX: "index out of sequence",
    RUN_BAD_TERM: "term negative, decreasing, below the previous entry's or not the run's last term",
    RUN_BAD_POS: "pos is not where the entry will be written",
    RUN_PAST_LIMIT: "entry passes the end of its data file",
    RUN_BAD_CRC: "bodyCrc mismatch",
    RUN_TRAILING: "bytes after the last entry",
    RUN_BAD_RESERVED: "channel or chainCrc is not 0",
}
_HEAD = struct.Struct(">iiqqq")  # magic, size, index, term, pos: the first 32 bytes of an entry header
_TAIL = struct.Struct(">iiii")  # channel, chainCrc, bodyCrc, bodySize at offset 32


@dataclasses.dataclass(frozen=True, slots=True)
class EntryRun:
    """Entries ``first_index .. first_index + count - 1`` (the last of term ``last_term``); ``data``
    their stored bytes, or None for a leader's reference to its own log."""

    first_index: int
    count: int
    last_term: int
    # bytes or a read-only memoryview; None: read from the leader's log when sent (not in the repr:
    # up to push_batch_size_max bytes)
    data: Any = dataclasses.field(default=None, repr=False)

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1

    def __len__(self) -> int:
        return self.count

    def headers(self) -> list[tuple[int, int, int, int, int]]:
        """(magic, size, index, term, pos) of every entry, walking the sizes (rare paths: overlap,
        the simulator); ValueError on bytes a walk cannot follow."""
        data, position, found = self.data, 0, []
        if data is None:
            raise ValueError("a reference run has no bytes")
        while position < len(data) and len(found) < self.count:
            if len(data) - position < codec.ENTRY_HEADER.size:
                raise ValueError(f"entry header cut at {position}")
            head = _HEAD.unpack_from(data, position)
            if not codec.BODY_OFFSET <= head[1] <= len(data) - position:
                raise ValueError(f"entry size {head[1]} at {position}")
            found.append(head)
            position += head[1]
        if len(found) != self.count:
            raise ValueError(f"{len(found)} entries, the run says {self.count}")
        return found

    def split_after(self, index: int) -> tuple[int, EntryRun | None]:
        """(term of entry ``index``, the run of the entries after it or None); ``index`` in the run."""
        assert self.first_index <= index <= self.last_index, (index, self.first_index, self.last_index)
        headers = self.headers()
        k = index - self.first_index
        term = headers[k][3]
        if k == self.count - 1:
            return term, None
        offset = sum(head[1] for head in headers[: k + 1])
        return term, EntryRun(index + 1, self.count - k - 1, self.last_term, memoryview(self.data)[offset:])

    def entries(self, entry_class: Callable[[int, int, bytes], Any]) -> list[Any]:
        """The entries, decoded (index, term, body copy), for the simulator's checker and tests."""
        out, position = [], 0
        for _magic, size, index, term, _pos in self.headers():
            out.append(entry_class(index, term, bytes(self.data[position + codec.BODY_OFFSET : position + size])))
            position += size
        return out


def encode_run(entries, *, first_pos: int) -> bytes:
    """The stored bytes of ``entries`` (objects with index, term, body) written from ``first_pos``
    on, as ``write_entry`` lays them out: the simulator's leaders and tests build runs with it."""
    parts, pos = [], first_pos
    for entry in entries:
        parts.append(codec.encode_entry(index=entry.index, term=entry.term, pos=pos, body=entry.body))
        pos += len(parts[-1])
    return b"".join(parts)


def check_run_python(data, count: int, first_index: int, prev_term: int, last_term: int, first_pos: int,
                     pos_limit: int) -> tuple[int, int]:  # fmt: skip
    """(code, number of the entry at fault or ``count``) -- the twin of the native ``check_entries``."""
    position, term_floor, size_total = 0, max(prev_term, 0), len(data)
    for k in range(count):
        if size_total - position < codec.ENTRY_HEADER.size:
            return RUN_TRUNCATED, k
        magic, size, index, term, pos = _HEAD.unpack_from(data, position)
        channel, chain_crc, crc, body_size = _TAIL.unpack_from(data, position + 32)
        if magic != codec.MAGIC_1:
            return RUN_BAD_MAGIC, k
        if not codec.BODY_OFFSET <= size <= codec.ENTRY_SIZE_MAX or body_size + codec.BODY_OFFSET != size:
            return RUN_BAD_SIZE, k
        if size > size_total - position:
            return RUN_TRUNCATED, k
        if index != first_index + k:
            return RUN_BAD_INDEX, k
        if term < term_floor or (k == count - 1 and term != last_term):
            return RUN_BAD_TERM, k
        if pos != first_pos + position:
            return RUN_BAD_POS, k
        if pos + size > pos_limit:
            return RUN_PAST_LIMIT, k
        if channel != 0 or chain_crc != 0:
            return RUN_BAD_RESERVED, k
        if crc != 0 and codec.body_crc(data[position + codec.BODY_OFFSET : position + size]) != crc:
            return RUN_BAD_CRC, k
        term_floor = term
        position += size
    if position != size_total:
        return RUN_TRAILING, count
    return RUN_OK, count


def check_run(run: EntryRun, *, prev_term: int, first_pos: int, pos_limit: int) -> str | None:
    """Why ``run`` cannot be appended with its first entry at ``first_pos`` after an entry of
    ``prev_term`` (-1: none), no entry ending past ``pos_limit``; None when it can."""
    if run.data is None or run.count < 1:
        return "a run with no entries"
    check = native.check_entries or check_run_python
    code, number = check(run.data, run.count, run.first_index, prev_term, run.last_term, first_pos, pos_limit)
    if code == RUN_OK:
        return None
    return f"entry {run.first_index + number} (number {number} of {run.count}): {RUN_REASONS.get(code, code)}"


def index_units_python(data, count: int) -> bytes:
    """The 32-byte index units of the ``count`` entries of a checked run (twin of ``index_units``)."""
    units, position = bytearray(count * codec.INDEX_UNIT_SIZE), 0
    for k in range(count):
        magic, size, index, term, pos = _HEAD.unpack_from(data, position)
        codec.INDEX_UNIT.pack_into(units, k * codec.INDEX_UNIT_SIZE, magic, pos, size, index, term)
        position += size
    return bytes(units)


def index_units(data, count: int) -> bytes:
    return native.index_units(data, count) if native.index_units is not None else index_units_python(data, count)
