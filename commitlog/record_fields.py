"""A record's properties (``name\\x01value\\x02`` pairs), the consume queue's tag hash, and hosts
(``("ip", port)`` pairs packed as 4 or 16 bytes and a port). Pure."""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Mapping

from commitlog.record_layout import PROPERTY_NAME_VALUE_SEPARATOR, PROPERTY_RECORD_CRC, PROPERTY_SEPARATOR, PROPERTY_TAGS

# -- properties and tags ---------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` for every pair (MessageDecoder.messageProperties2String)."""
    return "".join(
        f"{name}{PROPERTY_NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
        if value is not None
    ).encode()


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    """MessageDecoder.string2messageProperties: malformed segments are skipped, as upstream."""
    text = bytes(data).decode("utf-8", errors="replace")
    properties: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        index = segment.find(PROPERTY_NAME_VALUE_SEPARATOR)
        if len(segment) >= 3 and 0 < index < len(segment) - 1:
            properties[segment[:index]] = segment[index + 1 :]
    properties.pop(PROPERTY_RECORD_CRC, None)  # the record CRC tail is not a user property
    return properties


@functools.lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: int32 arithmetic over UTF-16 code units."""
    value = 0
    units = text.encode("utf-16-be")
    for (unit,) in struct.iter_unpack(">H", units):
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def tags_code(properties: Mapping[str, str]) -> int:
    """The consume queue's tag hash: Java hashCode of the TAGS property, 0 without one."""
    tags = properties.get(PROPERTY_TAGS)
    return java_string_hash(tags) if tags else 0


# -- hosts -----------------------------------------------------------------------------------

Host = tuple[str, int]


@functools.lru_cache(maxsize=1024)
def encode_host(host: Host) -> tuple[bytes, int, bool]:
    """(packed ip, port, is_v6) for a ("ip", port) pair."""
    ip = ipaddress.ip_address(host[0])
    return ip.packed, host[1], ip.version == 6


def decode_host(ip: bytes, port: int) -> Host:
    return str(ipaddress.ip_address(ip)), port
