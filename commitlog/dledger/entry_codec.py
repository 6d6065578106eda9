"""DLedger's entry, index unit and blank record: ``DLedgerEntryCoder`` byte for byte.

Theory of operation
-------------------
A DLedger data file is a sequence of entries laid end to end. Every integer is big-endian
(Java ``ByteBuffer``). An entry is a 48-byte header and its body (openmessaging/dledger 0.3.1.2,
``entry/DLedgerEntry.java``, ``entry/DLedgerEntryCoder.java#encode``):

    offset size field
    0      4    magic       MAGIC_1 = 1 (DLedgerMmapFileStore.CURRENT_MAGIC)
    4      4    size        whole entry, header included: 48 + body size
    8      8    index       0, 1, 2, ... consecutive along the log
    16     8    term        leader term that created the entry, never decreasing along the log
    24     8    pos         absolute data-file offset of this entry (POS_OFFSET = 24)
    32     4    channel     reserved, 0
    36     4    chainCrc    reserved, 0 (DLedger never computes it)
    40     4    bodyCrc     hasvc: zlib CRC32 of the body as int32, 0 = not computed (DLedger writes 0)
    44     4    bodySize    body size (DLedgerEntry.HEADER_SIZE = 44)
    48     n    body        (DLedgerEntry.BODY_OFFSET = 48)

An entry never spans data files. When ``size + 8`` does not fit in the rest of a data file, the
rest is filled with a blank record (``MmapFileList.preAppend``): ``[int32 -1][int32 remaining]``
followed by zeros up to the end of the file, and the entry goes to the next file.

Entry ``i`` has an index unit (32 bytes) at offset ``i * 32`` of the index files
(``DLedgerEntryCoder.encodeIndex``):

    offset size field
    0      4    magic       the entry's magic
    4      8    pos         the entry's pos
    12     4    size        the entry's size
    16     8    index       the entry's index
    24     8    term        the entry's term

``bodyCrc``: DLedger reserves the field and leaves it 0 (its ``equals`` ignores it). hasvc fills it
in so that recovery can tell a torn entry (header written, body not) from a whole one; a reader
verifies it only when it is non-zero, so DLedger-written files read as before.

This module is pure: it encodes into new bytes and decodes from buffers it is handed. Decoders
raise ``EntryFormatError`` (never ``struct.error`` or ``IndexError``) on anything malformed.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Final

MAGIC_1: Final = 1  # DLedgerMmapFileStore.MAGIC_1; the only magic DLedger 0.3.1.2 writes
BLANK_MAGIC_CODE: Final = -1  # MmapFileList.BLANK_MAGIC_CODE
MIN_BLANK_SIZE: Final = 8  # MmapFileList.MIN_BLANK_LEN: [int32 -1][int32 remaining]

ENTRY_HEADER = struct.Struct(
    ">"
    "i"  # magic      MAGIC_1
    "i"  # size       48 + body size
    "q"  # index      entry index, >= 0
    "q"  # term       leader term, >= 0
    "q"  # pos        absolute data-file offset of the entry
    "i"  # channel    reserved, 0
    "i"  # chainCrc   reserved, 0
    "i"  # bodyCrc    CRC32 of the body (int32), 0 = not computed
    "i"  # bodySize   body size
)
assert ENTRY_HEADER.size == 48
HEADER_SIZE: Final = 44  # DLedgerEntry.HEADER_SIZE: the header without bodySize
BODY_OFFSET: Final = ENTRY_HEADER.size  # DLedgerEntry.BODY_OFFSET
POS_OFFSET: Final = 24  # DLedgerEntry.POS_OFFSET

INDEX_UNIT = struct.Struct(
    ">"
    "i"  # magic      the entry's magic
    "q"  # pos        the entry's pos
    "i"  # size       the entry's size
    "q"  # index      the entry's index
    "q"  # term       the entry's term
)
assert INDEX_UNIT.size == 32
INDEX_UNIT_SIZE: Final = INDEX_UNIT.size  # DLedgerMmapFileStore.INDEX_UNIT_SIZE

BLANK = struct.Struct(
    ">"
    "i"  # magic      BLANK_MAGIC_CODE (-1)
    "i"  # size       bytes from the blank record to the end of the data file
)
assert BLANK.size == MIN_BLANK_SIZE

# The largest entry body: one RocketMQ message record (DLedgerCommitLog puts one message in one
# entry) with the largest body (maxMessageSize, 4 MiB), topic (255 bytes) and properties (32 767
# bytes) and IPv6 hosts fits in 4 MiB + 64 KiB. DLedger itself encodes into a 4 MiB buffer
# (``localEntryBuffer``) and so refuses the largest messages; a larger size field is damage.
ENTRY_BODY_SIZE_MAX: Final = 4 * 1024 * 1024 + 64 * 1024
ENTRY_SIZE_MAX: Final = BODY_OFFSET + ENTRY_BODY_SIZE_MAX

class EntryFormatError(ValueError):
    """Bytes that are not a valid entry, index unit or blank; ``reason`` says why in a few words."""

    def __init__(self, reason: str, *, position: int | None = None):
        self.reason = reason
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{reason}{where}")


@dataclasses.dataclass(frozen=True, slots=True)
class EntryHeader:
    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_size: int


@dataclasses.dataclass(frozen=True, slots=True)
class IndexUnit:
    magic: int
    pos: int
    size: int
    index: int
    term: int


def body_crc(body) -> int:
    """CRC32 (java.util.zip.CRC32, zlib's) of ``body`` as a signed int32, as the field holds it."""
    crc = zlib.crc32(body)
    return crc - (1 << 32) if crc & 0x80000000 else crc


def entry_size(body_size: int) -> int:
    return BODY_OFFSET + body_size


def encode_entry(*, index: int, term: int, pos: int, body, magic: int = MAGIC_1) -> bytes:
    """One whole entry, header and body, with its bodyCrc filled in."""
    size = entry_size(len(body))
    if size > ENTRY_SIZE_MAX:
        raise ValueError(f"entry of {size} bytes is larger than ENTRY_SIZE_MAX={ENTRY_SIZE_MAX}")
    if index < 0 or term < 0 or pos < 0:
        raise ValueError(f"index {index}, term {term} and pos {pos} must be >= 0")
    header = ENTRY_HEADER.pack(magic, size, index, term, pos, 0, 0, body_crc(body), len(body))
    return header + bytes(body)


def write_entry(buffer, position: int, *, index: int, term: int, pos: int, body, magic: int = MAGIC_1) -> int:
    """``encode_entry`` straight into ``buffer`` at ``position`` (a data file's mapping); return
    the entry's size. The caller has checked the limits (``encode_entry`` raises on them)."""
    size = BODY_OFFSET + len(body)
    ENTRY_HEADER.pack_into(buffer, position, magic, size, index, term, pos, 0, 0, body_crc(body), len(body))
    buffer[position + BODY_OFFSET : position + size] = body
    return size


def decode_entry_header(buffer, position: int = 0) -> EntryHeader:
    """The header of the entry at ``position``, checked on its own (not against where it lies)."""
    if position < 0 or len(buffer) - position < ENTRY_HEADER.size:
        raise EntryFormatError(f"{max(0, len(buffer) - position)} bytes, an entry header is 48", position=position)
    header = EntryHeader(*ENTRY_HEADER.unpack_from(buffer, position))
    if header.magic != MAGIC_1:
        raise EntryFormatError(f"unknown magic {header.magic}", position=position)
    if not BODY_OFFSET <= header.size <= ENTRY_SIZE_MAX:
        raise EntryFormatError(f"size {header.size} outside [{BODY_OFFSET}, {ENTRY_SIZE_MAX}]", position=position)
    if header.body_size + BODY_OFFSET != header.size:
        raise EntryFormatError(f"size {header.size} != bodySize {header.body_size} + 48", position=position)
    if header.index < 0 or header.term < 0 or header.pos < 0:
        raise EntryFormatError(
            f"negative index {header.index}, term {header.term} or pos {header.pos}", position=position
        )
    return header


def check_body(header: EntryHeader, buffer, position: int = 0) -> None:
    """Raise unless the whole body is there and matches bodyCrc (when it is not 0)."""
    end = position + header.size
    if len(buffer) < end:
        raise EntryFormatError(f"entry of {header.size} bytes cut at {len(buffer) - position}", position=position)
    if header.body_crc != 0 and body_crc(buffer[position + BODY_OFFSET : end]) != header.body_crc:
        raise EntryFormatError(f"bodyCrc mismatch (entry index {header.index})", position=position)


def decode_entry(buffer, position: int = 0) -> tuple[EntryHeader, bytes]:
    """The entry at ``position``: its header and a copy of its body."""
    header = decode_entry_header(buffer, position)
    check_body(header, buffer, position)
    return header, bytes(buffer[position + BODY_OFFSET : position + header.size])


def encode_blank(remaining: int) -> bytes:
    """The blank record that fills the last ``remaining`` bytes of a data file (zeros after it)."""
    if remaining < MIN_BLANK_SIZE:
        raise ValueError(f"a blank record needs {MIN_BLANK_SIZE} bytes, {remaining} left")
    return BLANK.pack(BLANK_MAGIC_CODE, remaining)


def peek_blank(buffer, position: int) -> int | None:
    """The size field of the blank record at ``position``, or None if no blank starts there."""
    if position < 0 or len(buffer) - position < MIN_BLANK_SIZE:
        return None
    magic, remaining = BLANK.unpack_from(buffer, position)
    return remaining if magic == BLANK_MAGIC_CODE else None


def encode_index_unit(*, pos: int, size: int, index: int, term: int, magic: int = MAGIC_1) -> bytes:
    return INDEX_UNIT.pack(magic, pos, size, index, term)


def decode_index_unit(buffer, position: int = 0) -> IndexUnit:
    """The index unit at ``position``; raises on a short buffer or values no entry can have."""
    if position < 0 or len(buffer) - position < INDEX_UNIT_SIZE:
        raise EntryFormatError(f"{max(0, len(buffer) - position)} bytes, an index unit is 32", position=position)
    unit = IndexUnit(*INDEX_UNIT.unpack_from(buffer, position))
    if unit.magic != MAGIC_1:
        raise EntryFormatError(f"index unit with unknown magic {unit.magic}", position=position)
    if not BODY_OFFSET <= unit.size <= ENTRY_SIZE_MAX:
        raise EntryFormatError(f"index unit size {unit.size} outside [{BODY_OFFSET}, {ENTRY_SIZE_MAX}]", position=position)
    if unit.pos < 0 or unit.index < 0 or unit.term < 0:
        raise EntryFormatError(f"index unit with negative pos {unit.pos}, index {unit.index} or term {unit.term}",
                               position=position)  # fmt: skip
    return unit
