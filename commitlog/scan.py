"""Validate a run of records quickly: the recovery scan and ``hasvc store verify``.

Theory of operation
-------------------
Recovery walks a segment record by record from a known-good position and stops at the first
record that is not valid (RocketMQ's ``checkMessageAndReturnSize``). Valid means: the size word
is within bounds, the magic is V1 or V2, the variable-length fields add up to the size word
(``calMsgLength``), the PHYSICALOFFSET field names the record's own offset, and (optionally) the
CRCs match: the body CRC, and for a record written with ``append_record_crc`` the CRC tail at the
end of its properties, which covers every byte before it (header, body, topic, properties). A
record with a tail costs one CRC over the record instead of one over the body; the body's CRC is
computed only when the record CRC fails, to name what failed. The walk ends cleanly at a zero word (the preallocated, never-written tail) or at
a blank record that fills the segment exactly.

``scan_segment`` returns a ``ScanResult`` with a numeric ``code`` and a position; the reasons are
one table, so the pure-Python walk and the optional C walk (``commitlog._scan``, built by setup.py
when a compiler is present) agree to the byte. The C walk exists because the check is a
per-record loop: on a slow 2-core VM a Python iteration costs ~0.15 µs and a ``crc32c`` call
~0.65 µs, which caps a Python scan near 0.5 GB/s on 1 KiB records; the C walk is memory-bound.
Only CRC32C is accelerated; a CRC32 (RocketMQ-written) store is scanned in Python.

``find_next_record`` runs only when recovery found damage (never on the scan's hot path): where
the next valid record starts after an invalid one, so that a damaged range can be named and
repaired without giving up the valid records behind it.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import struct

import crc32c as _crc32c

from commitlog import record as rec

from commitlog import native as _native


class ScanCode(enum.IntEnum):
    END_OF_DATA = 0  # a zero size word: the never-written tail of a preallocated segment
    END_OF_SEGMENT = 1  # a blank record filling the rest of the segment
    BAD_MAGIC = 2
    SIZE_OUT_OF_BOUNDS = 3
    FIELDS_DO_NOT_ADD_UP = 4
    BODY_CRC_MISMATCH = 5
    PHYSICAL_OFFSET_MISMATCH = 6
    BAD_BLANK = 7
    TRUNCATED = 8
    RECORD_CRC_MISMATCH = 9  # the record's CRC tail (append_record_crc) does not match its bytes

    @property
    def clean(self) -> bool:
        return self in (ScanCode.END_OF_DATA, ScanCode.END_OF_SEGMENT)


REASONS = {
    ScanCode.END_OF_DATA: "end of written data",
    ScanCode.END_OF_SEGMENT: "end of segment (blank record)",
    ScanCode.BAD_MAGIC: "bad magic code",
    ScanCode.SIZE_OUT_OF_BOUNDS: "size word out of bounds",
    ScanCode.FIELDS_DO_NOT_ADD_UP: "field lengths do not add up to the size word (half-written record)",
    ScanCode.BODY_CRC_MISMATCH: "body CRC mismatch",
    ScanCode.PHYSICAL_OFFSET_MISMATCH: "PHYSICALOFFSET field does not match the record's position",
    ScanCode.BAD_BLANK: "blank record does not fill the rest of the segment",
    ScanCode.TRUNCATED: "fewer than 8 bytes left and not zero",
    ScanCode.RECORD_CRC_MISMATCH: "record CRC mismatch (a header or properties byte differs from what was written)",
}

NATIVE_AVAILABLE = _native.AVAILABLE
_USE_NATIVE = NATIVE_AVAILABLE


@dataclasses.dataclass(frozen=True, slots=True)
class ScanResult:
    position: int  # where the walk stopped: the end of the last valid record, or the blank
    count: int  # valid records passed
    code: ScanCode
    last_record_position: int  # start of the last valid record, -1 if none

    @property
    def reason(self) -> str:
        return REASONS[self.code]


_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGIC
_PHYSICAL_OFFSET = struct.Struct(">q")
_SYSFLAG = struct.Struct(">i")
_BODY_LENGTH = struct.Struct(">i")
_PROPERTIES_LENGTH = struct.Struct(">h")


def scan_segment(
    buffer,
    *,
    start: int,
    end: int,
    file_from_offset: int,
    crc_function: rec.CrcFunction | None = _crc32c.crc32c,
    native: bool | None = None,
) -> ScanResult:
    """Walk records in ``buffer[start:end]``; ``end`` is the segment's size (blank records must
    fill exactly to it). ``crc_function=None`` skips the CRC check."""
    use_native = _USE_NATIVE if native is None else native and NATIVE_AVAILABLE
    if use_native and crc_function in (None, _crc32c.crc32c):
        position, count, code, last = _native.scan(buffer, start, end, file_from_offset, crc_function is not None)
        return ScanResult(position, count, ScanCode(code), last)
    return _scan_python(buffer, start=start, end=end, file_from_offset=file_from_offset, crc_function=crc_function)


def _scan_python(buffer, *, start, end, file_from_offset, crc_function) -> ScanResult:
    view = memoryview(buffer)
    head = _HEAD.unpack_from
    phys = _PHYSICAL_OFFSET.unpack_from
    sysflag_of = _SYSFLAG.unpack_from
    int32 = _BODY_LENGTH.unpack_from
    int16 = _PROPERTIES_LENGTH.unpack_from
    v1, v2, blank = rec.MAGIC_V1, rec.MAGIC_V2, rec.BLANK_MAGIC
    mask = rec.CRC_MASK
    tail_crc, tail_size = rec.stored_record_crc, rec.RECORD_CRC_TAIL_SIZE
    position = start
    count = 0
    last = -1

    def stop(code: ScanCode) -> ScanResult:
        return ScanResult(position, count, code, last)

    while True:
        left = end - position
        if left < 8:
            if left <= 0 or not any(view[position:end]):
                return stop(ScanCode.END_OF_DATA)
            return stop(ScanCode.TRUNCATED)
        size, magic = head(view, position)
        if magic != v1 and magic != v2:
            if magic == blank:
                return stop(ScanCode.END_OF_SEGMENT if size == left else ScanCode.BAD_BLANK)
            if size == 0 and magic == 0:
                return stop(ScanCode.END_OF_DATA)
            return stop(ScanCode.BAD_MAGIC)
        if size < 91 or size > left:
            return stop(ScanCode.SIZE_OUT_OF_BOUNDS)
        (sysflag,) = sysflag_of(view, position + 36)
        header_size = 48 + (20 if sysflag & 0x10 else 8) + 8 + (20 if sysflag & 0x20 else 8) + 12
        if header_size + 4 + 3 > size:
            return stop(ScanCode.FIELDS_DO_NOT_ADD_UP)
        body_length_at = position + header_size
        (body_size,) = int32(view, body_length_at)
        record_end = position + size
        topic_length_at = body_length_at + 4 + body_size
        if body_size < 0 or topic_length_at + 3 > record_end:
            return stop(ScanCode.FIELDS_DO_NOT_ADD_UP)
        if magic == v1:
            topic_size = view[topic_length_at]
            if topic_size > 127:
                return stop(ScanCode.FIELDS_DO_NOT_ADD_UP)
            properties_length_at = topic_length_at + 1 + topic_size
        else:
            (topic_size,) = int16(view, topic_length_at)
            properties_length_at = topic_length_at + 2 + topic_size
        if topic_size < 0 or properties_length_at + 2 > record_end:
            return stop(ScanCode.FIELDS_DO_NOT_ADD_UP)
        (properties_size,) = int16(view, properties_length_at)
        if properties_size < 0 or properties_length_at + 2 + properties_size != record_end:
            return stop(ScanCode.FIELDS_DO_NOT_ADD_UP)
        if phys(view, position + 28)[0] != file_from_offset + position:
            return stop(ScanCode.PHYSICAL_OFFSET_MISMATCH)
        if crc_function is not None:
            stored = tail_crc(view, record_end, properties_size)
            if stored is None or stored != crc_function(view[position : record_end - tail_size]) & mask:
                body = view[body_length_at + 4 : topic_length_at]
                if crc_function(body) & mask != int32(view, position + 8)[0]:
                    return stop(ScanCode.BODY_CRC_MISMATCH)
                if stored is not None:
                    return stop(ScanCode.RECORD_CRC_MISMATCH)
        last = position
        position = record_end
        count += 1


# Damage only (never on the recovery scan's hot path): where the next valid record starts after an
# invalid one. Candidates are found by their magic code, searched in chunks of this many bytes (a
# copy of at most this much at a time, whatever the segment's size).
_RESYNC_CHUNK_SIZE = 1 << 20
_RESYNC_MAGICS = re.compile(
    b"|".join(re.escape(struct.pack(">I", magic)) for magic in (rec.MAGIC_V1, rec.MAGIC_V2, rec.BLANK_MAGIC))
)


def _record_starts_at(view, position: int, *, end: int, file_from_offset: int, crc_function) -> bool:
    """A valid record (or the blank that fills the segment, or the end of data: zeros to the
    segment's end) starts at ``position``."""
    if position >= end:
        return position == end
    result = scan_segment(view, start=position, end=end, file_from_offset=file_from_offset, crc_function=crc_function)
    if result.count > 0 or result.code is ScanCode.END_OF_SEGMENT:
        return result.count > 0 or result.position == position
    return result.code is ScanCode.END_OF_DATA and result.position == position and _zero(view, position, end)


def _zero(view, start: int, end: int) -> bool:
    for chunk_start in range(start, end, _RESYNC_CHUNK_SIZE):
        if any(bytes(view[chunk_start : min(end, chunk_start + _RESYNC_CHUNK_SIZE)])):
            return False
    return True


def find_next_record(
    buffer, *, start: int, end: int, file_from_offset: int, crc_function: rec.CrcFunction | None = _crc32c.crc32c
) -> int:
    """Where, after the invalid record at ``start``, the next valid one starts in
    ``buffer[:end]``: the first later position whose magic, PHYSICALOFFSET and fields check, or
    where the record's size word points when that is valid (a flipped body byte: the common case,
    and then only the record's own bytes are searched); ``end`` when none: the damage runs to the
    end of the segment."""
    view = memoryview(buffer)
    target = None
    if end - start >= 8:
        (size,) = _BODY_LENGTH.unpack_from(view, start)
        if 8 <= size <= end - start and _record_starts_at(
            view, start + size, end=end, file_from_offset=file_from_offset, crc_function=crc_function
        ):
            target = start + size
    limit = end if target is None else target
    chunk_start = start + 1
    while chunk_start < limit:
        chunk_end = min(end, chunk_start + _RESYNC_CHUNK_SIZE + 8)  # 8: a magic across two chunks
        chunk = bytes(view[chunk_start + 4 : chunk_end])
        for match in _RESYNC_MAGICS.finditer(chunk):
            candidate = chunk_start + match.start()
            if candidate >= limit:
                break
            if _record_starts_at(
                view, candidate, end=end, file_from_offset=file_from_offset, crc_function=crc_function
            ):
                return candidate
        chunk_start += _RESYNC_CHUNK_SIZE
    return limit
