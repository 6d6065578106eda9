"""Check records on their way out of a store: a damaged one is reported, never handed out.

Theory of operation
-------------------
Recovery checks only the tail of the log (after a clean shutdown, nothing at all past the newest
segments): a byte flipped in an older segment is found by the first read of it, or never. So every
read a broker answers goes through here first (``StoreConfig.check_crc_on_read``, on by default).
The check is ``commitlog.scan``'s walk, the recovery scan itself: magic, a size word in bounds,
variable-length fields that add up to it, PHYSICALOFFSET naming the record's own offset, and the
CRCs: the body CRC, and for a record with the CRC tail (``append_record_crc``) the record CRC over
all its bytes before the tail, so a flipped header bit is damage here too. It runs in batches: records that lie end to end in one segment (a PULL of a queue written
by one producer: usually all of them) are one ``scan`` call, native when built (CRC32C with the
SSE4.2 instruction, the GIL released); its pure-Python twin gives the same answer.

Two read shapes:

* ``read_records(spans)``: whole records whose place (offset, size) a consume queue gave (PULL,
  ``MessageStore.pull``). Every record is checked; what is handed out is the records before the
  first damaged one, and the damage.
* ``read_range(offset, size_max)``: raw log bytes (READ). The broker does not know where records
  start in an arbitrary byte range, so it checks only when ``offset`` is a record start (a V1/V2
  magic and a PHYSICALOFFSET equal to ``offset``: a body byte that happens to look like both is a
  1 in 2**95 event): then every whole record in the range is checked, and a record the range's
  size limit cuts is checked by the READ that starts at it. Bytes served from an offset that is no
  record start are not checked here; the client library checks every record it decodes. One
  case stays open: in the newest segment a record whose size word reaches past the served bytes
  (but not past the segment) may be a record still arriving (a slave's log ends where its last
  frame did, inside a record), so it is served unchecked; PULL, which knows each record's size
  from the consume queue, finds a damaged size word anywhere.

A damaged record ends what is handed out: the records (or bytes) before it are served; the
request that starts at it gets the damage (``DamagedRecordError``, or the broker's ``DAMAGED``
status naming the offset). Each damage is a ``DamagedRange``: its file, ``from`` (the record's
offset), ``to`` (the record's end when its size word is believable, else the end of the bytes
examined), and what failed.

Where the check runs, path by path (broker or client, as Kafka's consumers check ``check.crcs``):

* PULL (and ``MessageStore.pull``): the broker, always -- only the broker can report the damage
  (log, STATUS, metrics) and have it repaired, and it checks in one native call per segment before
  copying; the client library checks every record's CRC again as it decodes it (what changed in
  memory or on the wire after the broker's check, and a broker running with the check off).
* READ: the broker, for the whole records it can see start (above); the client library for every
  record it decodes from the bytes (``read_record``).
* The proxy's receive: through the client library's PULL, so both of the above.
* The Spark source: it reads the segment files itself, no broker in between, so its decoder
  checks every body (one native ``crc_ranges`` call per batch) and fails the query at a damaged
  one unless asked to flag it (``commitlog/columnar.py``, option ``damaged``).

This module is pure: no logging, no clock. The stores keep the damage found (``store.damaged``);
the broker logs it and shows it in STATUS.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from typing import Final

import crc32c as _crc32c

from commitlog import native as _native
from commitlog import record as rec
from commitlog import scan
from commitlog.commit_log import ReadError
from commitlog.damage import DamagedRange
from commitlog.scan import REASONS, ScanCode, _scan_python, scan_segment

# A record-start test for READ: TOTALSIZE, MAGIC at 0, PHYSICALOFFSET at 28.
_HEAD = struct.Struct(">iI")
_PHYSICAL_OFFSET = struct.Struct(">q")
RECORD_SIZE_MIN: Final = 91  # the smallest record (commitlog.scan: a size word below it is damage)


class DamagedRecordError(ReadError):
    """A read reached a damaged record: ``damage`` says where and what failed."""

    def __init__(self, damage: DamagedRange):
        super().__init__(describe_for_reader(damage))
        self.damage = damage


def describe_for_reader(damage: DamagedRange) -> str:
    """One line for the reader that was refused: the offset first (what it asked for)."""
    return (f"record at offset {damage.from_offset} is damaged ({damage.reason}; "
            f"{damage.file} bytes [{damage.from_offset}, {damage.to_offset})): not served")  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedRead:
    """What a checked read hands out: ``views`` (whole records, or READ's one byte range; bytes
    copies when asked for) up to the first damaged record, and that damage (None when all was good)."""

    views: list[memoryview] | list[bytes]
    damage: DamagedRange | None = None
    new: bool = False  # the damage was not known before (the broker logs it once)


def noted(checked: CheckedRead, found: list[DamagedRange]) -> CheckedRead:
    """``checked`` with its damage (if any) added to a store's ``found`` list and ``new`` set."""
    if checked.damage is None:
        return checked
    return dataclasses.replace(checked, new=add_damage(found, checked.damage))


Segment = tuple[memoryview, int, str]  # a segment's readable bytes, its first offset, its file's path


def read_records(segment_of: Callable[[int], Segment], spans: Sequence[tuple], *, crc_function: rec.CrcFunction | None,
                 check: bool = True, copy: bool = False, native: bool | None = None) -> CheckedRead:  # fmt: skip
    """The records at ``spans`` ((offset, size, ...) each: a consume queue's units as they are),
    checked unless ``check`` is False: ``segment_of(offset)`` gives the segment holding
    ``offset`` (ReadError outside the readable log), and every span in it is walked in one call
    (native ``check_spans`` when built, else its twin). ``crc_function=None`` still checks every
    other field. ReadError when a span runs past its segment's readable bytes. With ``check``
    False the same call only finds where each segment's spans end (what the bench compares with).
    With ``copy`` the views are ``bytes``, each copied in the same call right after its check
    (a broker sends copies: made while the check has the record in the cache, not read again)."""
    views: list[memoryview] = []
    index, count = 0, len(spans)
    use_native = _native.check_spans is not None and crc_function in (None, _crc32c.crc32c) and (
        scan._USE_NATIVE if native is None else native)  # fmt: skip
    level = (2 if crc_function is not None else 1) if check else 0
    while index < count:
        view, base, path = segment_of(spans[index][0])
        if use_native:
            stop, code, position, *copies = _native.check_spans(view, spans, index, base, level, copy)
        else:
            stop, code, position, *copies = _check_spans_python(view, spans, index, base, crc_function, walk=check, copy=copy)
        if copy:
            views += copies[0]
        else:
            views += [view[span[0] - base : span[0] - base + span[1]] for span in spans[index:stop]]
        if stop == count or code == -1 and stop > index:  # all passed, or the rest lie in the next segment
            index = stop
            continue
        offset, size = spans[stop][0], spans[stop][1]
        if code == -1:
            raise ReadError(f"record at offset {offset} ({size} bytes) runs past the readable log")
        reason = _reason(ScanCode(code), base + position, offset)
        return CheckedRead(views, DamagedRange(path, offset, offset + size, reason))
    return CheckedRead(views)


def _check_spans_python(view: memoryview, spans: Sequence[tuple], start: int, base: int, crc_function: rec.CrcFunction | None,
                        *, walk: bool = True, copy: bool = False) -> tuple:  # fmt: skip
    """Twin of the native ``check_spans`` (see _scan.c; the tests compare them): level 0 is
    ``walk=False``, level 1 ``crc_function=None``; with ``copy`` a fourth result, the bytes of
    every span that passed."""
    copies: list[bytes] = []
    tail = (copies,) if copy else ()
    for index in range(max(start, 0), len(spans)):
        offset, size = spans[index][0], spans[index][1]
        position = offset - base
        if position < 0 or size < 0 or position > len(view) or size > len(view) - position:
            return index, -1, max(position, 0), *tail
        if walk:
            result = _scan_python(view, start=position, end=position + size, file_from_offset=base, crc_function=crc_function)
            if result.code is not ScanCode.END_OF_DATA or result.position != position + size or result.count != 1:
                if result.count >= 1:  # the record passed and ends before its span
                    return index, ScanCode.END_OF_DATA, position + _HEAD.unpack_from(view, position)[0], *tail
                return index, result.code, result.position, *tail
        if copy:
            copies.append(bytes(view[position : position + size]))
    return len(spans), ScanCode.END_OF_DATA, 0, *tail


def _reason(code: ScanCode, stop: int, record_offset: int) -> str:
    if stop != record_offset:
        return "record shorter than its consume-queue unit"
    if code.clean:
        return f"no record where its consume-queue unit points ({REASONS[code]})"
    return REASONS[code]


def is_record_start(view: memoryview, offset: int) -> bool:
    """The bytes at ``view[0:]`` begin a record at ``offset``: V1/V2 magic and PHYSICALOFFSET."""
    if len(view) < rec.PHYSICAL_OFFSET_POSITION + 8:
        return False
    _, magic = _HEAD.unpack_from(view, 0)
    if magic != rec.MAGIC_V1 and magic != rec.MAGIC_V2:
        return False
    return _PHYSICAL_OFFSET.unpack_from(view, rec.PHYSICAL_OFFSET_POSITION)[0] == offset


def read_range(read: Callable[[int, int], memoryview], file_of: Callable[[int], str], offset: int, size_max: int,
               *, crc_function: rec.CrcFunction | None, segment_end: int, entry_header_size: int = 0,
               native: bool | None = None) -> CheckedRead:  # fmt: skip
    """``read(offset, size_max)``, checked when ``offset`` is a record start (module docstring).
    ``segment_end`` is the furthest offset a record starting in the served bytes could reach:
    the end of the segment holding ``offset`` (a record there may be cut by ``size_max``, or, at a
    slave's log end, still be arriving), or DLedger's committed end. A record whose size word
    reaches past the served bytes but not past it is left for the READ that starts at it. ``entry_header_size``
    is 0 for a classic log (records end to end, one walk) or DLedger's entry header size (each
    record follows its entry's header: one walk per entry; entry headers themselves are the
    entry log's checks, and the walk ends, unchecked, at one that does not lead to a record)."""
    view = read(offset, size_max)
    if not is_record_start(view, offset):
        return CheckedRead([view])
    cut = len(view) < segment_end - offset  # bytes past the served ones could complete a cut record
    position = 0
    while True:
        end = len(view)
        if entry_header_size:  # this entry's record alone (a size word out of bounds: the walk says so)
            size = _HEAD.unpack_from(view, position)[0]
            end = min(end, position + size) if size >= RECORD_SIZE_MIN else end
        result = scan_segment(view, start=position, end=end, file_from_offset=offset, crc_function=crc_function,
                              native=native)  # fmt: skip
        stop = result.position
        if _is_damage(view, stop, result.code, cut=cut, bytes_left_in_segment=segment_end - offset - stop):
            size = _HEAD.unpack_from(view, stop)[0] if len(view) - stop >= 8 else 0
            to = offset + stop + size if RECORD_SIZE_MIN <= size <= len(view) - stop else offset + len(view)
            return CheckedRead([view[:stop]], DamagedRange(file_of(offset + stop), offset + stop, to, REASONS[result.code]))
        if not entry_header_size or stop != end or result.code is not ScanCode.END_OF_DATA:
            return CheckedRead([view])
        position = _next_entry_record(view, stop, entry_header_size)
        if position < 0:
            return CheckedRead([view])


_ENTRY_HEAD = struct.Struct(">ii")  # a DLedger entry's magic and size (commitlog.dledger.entry_codec)


def _next_entry_record(view: memoryview, position: int, entry_header_size: int) -> int:
    """Where the record of the next entry with one starts (no-op entries, header only, skipped);
    -1 at the end of the served bytes or at anything that is not an entry header."""
    while len(view) - position >= entry_header_size + 8:
        magic, size = _ENTRY_HEAD.unpack_from(view, position)
        if magic != 1 or size < entry_header_size:
            return -1
        if size > entry_header_size:
            return position + entry_header_size
        position += size
    return -1


def _is_damage(view: memoryview, stop: int, code: ScanCode, *, cut: bool, bytes_left_in_segment: int) -> bool:
    """Whether a walk over served bytes that stopped at ``stop`` with ``code`` found damage, or
    only the end of what was served (clean, or a record the size limit cut)."""
    if code.clean:
        return False
    if not cut:
        return True
    left = len(view) - stop
    if left < 8:  # a header the limit cut
        return False
    size, magic = _HEAD.unpack_from(view, stop)
    fits_segment = left < size <= bytes_left_in_segment
    return not ((magic in (rec.MAGIC_V1, rec.MAGIC_V2) and size >= RECORD_SIZE_MIN or magic == rec.BLANK_MAGIC) and fits_segment)


DAMAGED_RANGES_MAX: Final = 1024  # STATUS lists at most this many (one per damaged spot: more is a dead disk)


def add_damage(found: list[DamagedRange], damage: DamagedRange) -> bool:
    """Add ``damage`` to a store's list unless a range there overlaps it (the same spot found
    again, by another read or by recovery); True when it is new. Past ``DAMAGED_RANGES_MAX`` a
    new range is still reported (True) but not kept."""
    for known in found:
        if known.file == damage.file and known.from_offset < max(damage.to_offset, damage.from_offset + 1) \
                and damage.from_offset < max(known.to_offset, known.from_offset + 1):  # fmt: skip
            return False
    if len(found) < DAMAGED_RANGES_MAX:
        found.append(damage)
    return True


__all__ = ["CheckedRead", "DamagedRecordError", "add_damage", "describe_for_reader", "is_record_start", "noted",
           "read_range", "read_records"]  # fmt: skip
