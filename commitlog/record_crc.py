"""The record's checksums: the CRC functions by name and the record CRC tail (its layout is in
``commitlog.record_layout``): building it, sealing a written record with it, and reading it back.
Pure."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

import crc32c as _crc32c

from commitlog.record_layout import PROPERTY_SEPARATOR, RECORD_CRC_DIGITS, RECORD_CRC_TAIL_PREFIX, RECORD_CRC_TAIL_SIZE

# -- checksums -------------------------------------------------------------------------------

CrcFunction = Callable[[bytes | bytearray | memoryview], int]
CRC_FUNCTIONS: Final[dict[str, CrcFunction]] = {"crc32c": _crc32c.crc32c, "crc32": zlib.crc32}
CRC_MASK: Final = 0x7FFFFFFF


def crc_function_by_name(name: str) -> CrcFunction:
    try:
        return CRC_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown checksum {name!r}; choose one of {sorted(CRC_FUNCTIONS)}") from None


# -- the record CRC tail ---------------------------------------------------------------------

_DIGIT_ZERO: Final = ord("0")
_TAIL_SEPARATOR: Final = ord(PROPERTY_SEPARATOR)
RECORD_CRC_DAMAGED: Final = -1  # what stored_record_crc says of a tail out of its shape


def record_crc_tail(crc: int) -> bytes:
    """The 20-byte tail holding the masked CRC ``crc``: ten digits, least significant first, as
    RocketMQ's ``MessageDecoder.createCrc32`` writes them."""
    assert 0 <= crc <= CRC_MASK, crc
    digits = bytearray(RECORD_CRC_DIGITS)
    for index in range(RECORD_CRC_DIGITS):
        crc, digit = divmod(crc, 10)
        digits[index] = _DIGIT_ZERO + digit
    return RECORD_CRC_TAIL_PREFIX + bytes(digits) + PROPERTY_SEPARATOR.encode()


def record_crc_properties(properties: bytes) -> bytes:
    """The properties a record with the tail stores, the tail's digits still zero: a 0x02 first
    when the properties do not end with one (RocketMQ's needAppendLastPropertySeparator)."""
    separator = PROPERTY_SEPARATOR.encode() if properties and properties[-1] != _TAIL_SEPARATOR else b""
    return properties + separator + record_crc_tail(0)


def record_crc_extra_size(properties: bytes) -> int:
    """The bytes the tail adds to a record with these properties (20, or 21 with a separator)."""
    return RECORD_CRC_TAIL_SIZE + (1 if properties and properties[-1] != _TAIL_SEPARATOR else 0)


def seal_record(buffer, position: int, size: int, crc_function: CrcFunction) -> None:
    """Write the tail of the record at ``position``: the CRC of its bytes before the tail. Called
    once every other field is in place (queue offset, physical offset, store timestamp)."""
    end = position + size
    tail_at = end - RECORD_CRC_TAIL_SIZE
    buffer[tail_at:end] = record_crc_tail(crc_function(memoryview(buffer)[position:tail_at]) & CRC_MASK)


def stored_record_crc(view, end: int, properties_size: int) -> int | None:
    """The CRC the tail of the record ending at ``end`` holds; None when the record has no tail
    (written without one, by an older store or RocketMQ); ``RECORD_CRC_DAMAGED`` when the tail's
    name is there and its digits or separator are not, or the name is one byte off and the rest
    is in shape (the name is not covered by the CRC, so it is recognised by its shape).
    ``commitlog/_scan.c`` (``record_crc_state``) is its twin."""
    if properties_size < RECORD_CRC_TAIL_SIZE:
        return None
    tail = bytes(view[end - RECORD_CRC_TAIL_SIZE : end])
    prefix_size = len(RECORD_CRC_TAIL_PREFIX)
    digits = tail[prefix_size:-1]
    if tail[-1] == _TAIL_SEPARATOR and digits.isdigit() and tail.startswith(RECORD_CRC_TAIL_PREFIX):
        return int(digits[::-1])
    prefix_off = sum(a != b for a, b in zip(tail, RECORD_CRC_TAIL_PREFIX))
    rest_off = sum(not _DIGIT_ZERO <= c <= _DIGIT_ZERO + 9 for c in digits) + (tail[-1] != _TAIL_SEPARATOR)
    # The name intact: the record was sealed (no producer may send that name), so any digit or
    # separator wrong is damage (zeros where a torn or lost write left them, too); the name one
    # byte off with the rest in shape: damage as well.
    if prefix_off == 0 or (prefix_off == 1 and rest_off == 0):
        return RECORD_CRC_DAMAGED
    return None
