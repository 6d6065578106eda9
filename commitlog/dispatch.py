"""The dispatch parser: records (or DLedger entries holding records) in a segment's bytes, read
into runs of consume-queue units per queue, without checking CRCs or decoding hosts.

``dispatch_units`` is native when built (``commitlog/_scan.c``) and its Python twin otherwise; a
run is ``(topic bytes, queue id, first queue offset, count, packed units, first offset, last end,
max store timestamp)``. A call stops at its limit, at a blank (``_STOP_BLANK``), at a record it
cannot parse (``_STOP_MALFORMED``), or, native, before a record it leaves to the twin
(``_STOP_SLOW``: TAGS that are not UTF-8). Both message stores dispatch with it (``StoreSteps``,
``commitlog.dledger.message_dispatch``), and so do the queue rebuilds of ``inspect`` and ``scrub``;
``_runs_between`` and ``_record_places`` walk a span for the store's reads. Pure.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Iterator

from commitlog import native as _native
from commitlog import record as rec
from commitlog.consume_queue import CQ_UNIT

@dataclasses.dataclass(frozen=True, slots=True)
class RecordPlace:
    offset: int
    size: int
    queue_id: int
    queue_offset: int


def _record_places(view: memoryview, start: int, limit: int, base: int) -> list[tuple[int, int, int, int]]:
    """(offset, size, queue id, queue offset) of each queued record in ``view[start:limit]`` is, from the dispatch parser (records
    that get no consume queue unit, prepared and rolled-back transactions, are left out)."""
    return list(_places_of(_runs_between(view, start, limit, base)))


def _runs_between(view: memoryview, start: int, limit: int, base: int) -> list[tuple]:
    """The dispatch parser's runs of the records in ``view[start:limit]`` (to a blank, a record
    that cannot be parsed, or ``limit``), without writing any unit."""
    found = []
    position = start
    while position < limit:
        before = position
        position, stop, _records, runs = dispatch_units(view, position, limit, base, DISPATCH_RECORDS_PER_CALL)
        found += runs
        if stop == _STOP_SLOW:
            position, stop, _records, runs = _dispatch_units_python(view, position, limit, base, records_max=1)
            found += runs
        if stop in (_STOP_BLANK, _STOP_MALFORMED) or position == before:
            break
    return found


def _places_of(runs) -> Iterator[tuple[int, int, int, int]]:
    for _topic, queue_id, first_queue_offset, _count, units, *_ in runs:
        for index, (offset, size, _tags) in enumerate(CQ_UNIT.iter_unpack(units), first_queue_offset):
            yield offset, size, queue_id, index


_STOP_LIMIT, _STOP_BLANK, _STOP_MALFORMED, _STOP_SLOW = 0, 1, 2, 3
# Records parsed per call: bounds the runs built in one go.
DISPATCH_RECORDS_PER_CALL = 4096


def _dispatch_units_python(view: memoryview, start: int, limit: int, base: int, records_max: int = DISPATCH_RECORDS_PER_CALL):
    """Python twin of the native ``dispatch_units``: parse records from ``start`` and group them
    into runs per queue with consecutive queue offsets, units packed. Returns ``(stop position,
    stop kind, records read, [(topic bytes, queue id, first queue offset, count, units, first
    offset, last end, max store timestamp)])``."""
    runs: list[list] = []
    newest: dict[tuple[bytes, int], list] = {}
    position = start
    records = 0
    stop = _STOP_LIMIT
    pack = CQ_UNIT.pack
    while position < limit and records < records_max:
        if limit - position < 8:
            break  # the rest of this record has not arrived (a slave between two frames)
        if rec.peek_blank(view, position) is not None:
            stop = _STOP_BLANK
            break
        size, magic = rec.BLANK.unpack_from(view, position)
        if magic in (rec.MAGIC_V1, rec.MAGIC_V2) and size >= 91 and size > limit - position:
            break  # incomplete: wait for more bytes, as ReputMessageService does
        try:
            size, physical, topic, queue_id, queue_offset, sysflag, store_ts, tags = rec.decode_dispatch(
                view, position, limit
            )
        except rec.RecordError:
            stop = _STOP_MALFORMED
            break
        if physical != base + position:
            stop = _STOP_MALFORMED
            break
        records += 1
        offset = base + position
        position += size
        transaction = sysflag & rec.SYSFLAG_TRANSACTION_MASK
        if transaction in (rec.SYSFLAG_TRANSACTION_PREPARED, rec.SYSFLAG_TRANSACTION_ROLLBACK):
            continue
        key = (topic.encode(), queue_id)
        run = newest.get(key)
        if run is None or run[2] + run[3] != queue_offset:
            run = [key[0], queue_id, queue_offset, 0, bytearray(), offset, 0, store_ts]
            runs.append(run)
            newest[key] = run
        run[3] += 1
        run[4] += pack(offset, size, tags)
        run[6] = offset + size
        run[7] = max(run[7], store_ts)
    return position, stop, records, [(t, q, f, c, bytes(u), o, e, s) for t, q, f, c, u, o, e, s in runs]


dispatch_units = _native.dispatch_units or _dispatch_units_python


def _dispatch_entries_python(view: memoryview, start: int, limit: int, base: int, records_max: int,
                             entry_header: int) -> tuple[int, int, int, list[tuple]]:  # fmt: skip
    """Python twin of the native ``dispatch_units(..., entry_header)``: walk DLedger entries from
    ``start`` (each ``[magic 1][size]...``, a header of ``entry_header`` bytes and one record or,
    a no-op, none) and group their records' units into runs as ``dispatch_units`` does. Returns
    ``(position, stop kind, entries read, runs)``; a stop names the entry it stopped at: 1 a blank
    (magic -1), 2 an entry not whole or whose body is not exactly one record."""
    runs: list[list] = []
    newest: dict[tuple[bytes, int], list] = {}
    position, entries, stop = start, 0, _STOP_LIMIT
    while position < limit and entries < records_max:
        if limit - position < 8:
            stop = _STOP_MALFORMED
            break
        magic, size = _ENTRY_MAGIC_SIZE.unpack_from(view, position)
        if magic == -1:
            stop = _STOP_BLANK
            break
        if magic != 1 or not entry_header <= size <= limit - position:
            stop = _STOP_MALFORMED
            break
        if size > entry_header:
            end, kind, records, found = _dispatch_units_python(view, position + entry_header, position + size, base, 1)
            if kind != _STOP_LIMIT or records != 1 or end != position + size:
                stop = _STOP_MALFORMED
                break
            for topic, queue_id, first, count, units, first_offset, last_end, store_ts in found:
                run = newest.get((topic, queue_id))
                if run is None or run[2] + run[3] != first:
                    run = newest[(topic, queue_id)] = [topic, queue_id, first, 0, bytearray(), first_offset, 0, store_ts]
                    runs.append(run)
                run[3] += count
                run[4] += units
                run[6] = last_end
                run[7] = max(run[7], store_ts)
        position += size
        entries += 1
    return position, stop, entries, [(t, q, f, c, bytes(u), o, e, s) for t, q, f, c, u, o, e, s in runs]


_ENTRY_MAGIC_SIZE = struct.Struct(">ii")  # a DLedger entry header's first two fields (commitlog.dledger.entry_codec)


def dispatch_entries(view, start: int, limit: int, base: int, records_max: int, entry_header: int):
    """``dispatch_units`` over DLedger entries: one native walk (``_STOP_SLOW`` at an entry whose
    TAGS are not UTF-8: the caller takes that one through the twin), else the twin."""
    if _native.dispatch_units is not None:
        return _native.dispatch_units(view, start, limit, base, records_max, entry_header)
    return _dispatch_entries_python(view, start, limit, base, records_max, entry_header)


@functools.lru_cache(maxsize=4096)
def _topic_name(topic: bytes) -> str | None:
    """The topic as a directory name, or None when it cannot be one (skipped, counted). Cached:
    the same few topics come back in every dispatch."""
    try:
        text = topic.decode()
    except UnicodeDecodeError:
        return None
    return text if rec.TOPIC_PATTERN.fullmatch(text) else None
