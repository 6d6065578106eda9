"""The commit log message record's layout: RocketMQ's MessageExtEncoder / MessageDecoder byte table,
its constants, limits, structs and sizes, and the errors and statuses of a refused record.

Theory of operation
-------------------
A commit log is a sequence of records laid end to end. Every integer is big-endian. A record
(V1 magic, IPv4 hosts) looks like this; docs/FORMAT.md has the full table with IPv6 and V2:

    offset size field
    0      4    TOTALSIZE            whole record, this field included
    4      4    MAGIC                0xDAA320A7 (V1) or 0xDAA320AB (V2: 2-byte topic length)
    8      4    BODYCRC              crc(body) & 0x7FFFFFFF (CRC32C here, CRC32 in RocketMQ stores)
    12     4    QUEUEID
    16     4    FLAG
    20     8    QUEUEOFFSET          index of the record in its consume queue
    28     8    PHYSICALOFFSET       the record's own commit log offset
    36     4    SYSFLAG              bit 0x10: born host is IPv6, bit 0x20: store host is IPv6
    40     8    BORNTIMESTAMP        ms
    48     8    BORNHOST             4-byte IPv4 + int32 port (20 bytes: 16-byte IPv6 + port)
    56     8    STORETIMESTAMP       ms, set by the store inside its append lock
    64     8    STOREHOST            as BORNHOST
    72     4    RECONSUMETIMES
    76     8    PREPARED_TX_OFFSET
    84     4+n  BODY                 int32 length, then the body
    88+n   1+t  TOPIC                V1: signed byte length; V2: int16 length
    ..     2+p  PROPERTIES           int16 length, then name\\x01value\\x02 pairs (UTF-8)

With ``append_record_crc`` (RocketMQ's ``enabledAppendPropCRC``) the properties end with a
20-byte tail ``"__CRC32#" 0x01 <10 ASCII digits> 0x02`` (a 0x02 separator is added before it when
the properties do not end with one): the digits, least significant first, are the masked CRC of
the record's bytes ``[0, TOTALSIZE - 20)``, written after the queue offset, physical offset and
store timestamp are filled. The body CRC covers only the body; the tail covers the header too.

A segment that cannot hold the next record plus 8 bytes ends with a blank record
``[int32 remaining][int32 0xCBD43194]``; the rest of the segment is zero. Records never span
segments.

The record's code is split by concern, each module pure: this one (the layout), ``record_crc``
(checksums and the CRC tail), ``record_fields`` (properties, tags, hosts), ``record_encode``
(prepare and write) and ``record_decode`` (read back); ``commitlog.record`` names them all.
"""

from __future__ import annotations

import enum
import re
import struct
from typing import Final

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
BLANK_MAGIC: Final = 0xCBD43194
BLANK_SIZE: Final = 8  # END_FILE_MIN_BLANK_LENGTH: [int32 remaining][int32 BLANK_MAGIC]

SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8
SYSFLAG_TRANSACTION_ROLLBACK: Final = 0xC
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20

PROPERTY_NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
# The record CRC tail (RocketMQ's MessageConst.PROPERTY_CRC32 and CommitLog.CRC32_RESERVED_LEN):
# a system property, never shown as a user property.
PROPERTY_RECORD_CRC: Final = "__CRC32#"
RECORD_CRC_TAIL_PREFIX: Final = b"__CRC32#\x01"
RECORD_CRC_DIGITS: Final = 10  # a masked CRC is below 2**31: at most 10 decimal digits
RECORD_CRC_TAIL_SIZE: Final = len(RECORD_CRC_TAIL_PREFIX) + RECORD_CRC_DIGITS + 1
assert RECORD_CRC_TAIL_SIZE == 20

# Limits. Bodies follow RocketMQ's maxMessageSize (4 MiB); topics longer than 127 bytes switch to
# the V2 magic (RocketMQ's autoMessageVersionOnTopicLen) and we cap them at 255 bytes so that a
# topic is always a valid directory name; properties are bounded by their int16 length field.
BODY_SIZE_MAX_DEFAULT: Final = 4 * 1024 * 1024
TOPIC_SIZE_MAX: Final = 255
TOPIC_SIZE_MAX_V1: Final = 127
PROPERTIES_SIZE_MAX: Final = 32767
# Topic names become directory names under consumequeue/: RocketMQ's own character set.
TOPIC_PATTERN: Final = re.compile(r"[%|a-zA-Z0-9_-]+")

# The fixed part of a record up to and including the body length, per (born v6, store v6).
PREFIX = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
assert PREFIX.size == 48
TOTAL_SIZE = struct.Struct(">i")
SYSFLAG = struct.Struct(">i")
MAGIC = struct.Struct(">I")
BLANK = struct.Struct(">iI")
assert BLANK.size == BLANK_SIZE
TOPIC_LENGTH_V1 = struct.Struct(">b")
TOPIC_LENGTH_V2 = struct.Struct(">h")
PROPERTIES_LENGTH = struct.Struct(">h")

PHYSICAL_OFFSET_POSITION: Final = 28
QUEUE_OFFSET_POSITION: Final = 20
SYSFLAG_POSITION: Final = 36
BORN_HOST_POSITION: Final = 48


def _header_struct(*, born_v6: bool, store_v6: bool) -> struct.Struct:
    host = lambda v6: "16si" if v6 else "4si"  # noqa: E731
    return struct.Struct(">iIiiiqqiq" + host(born_v6) + "q" + host(store_v6) + "iqi")


# HEADERS[born_v6][store_v6]: everything from TOTALSIZE to the body length field.
HEADERS: Final = tuple(
    tuple(_header_struct(born_v6=b, store_v6=s) for s in (False, True)) for b in (False, True)
)
assert HEADERS[0][0].size == 88
assert HEADERS[1][1].size == 112


def host_size(v6: bool) -> int:
    return 20 if v6 else 8


def calc_record_size(
    *, body_size: int, topic_size: int, properties_size: int, sysflag: int = 0, v2: bool = False
) -> int:
    """RocketMQ's MessageExtEncoder.calMsgLength."""
    born = host_size(bool(sysflag & SYSFLAG_BORNHOST_V6))
    store = host_size(bool(sysflag & SYSFLAG_STOREHOST_V6))
    fixed = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + store + 4 + 8
    topic_length_size = 2 if v2 else 1
    return fixed + 4 + max(body_size, 0) + topic_length_size + topic_size + 2 + max(properties_size, 0)


assert calc_record_size(body_size=0, topic_size=0, properties_size=0) == 91


class RecordError(ValueError):
    """A record that cannot be decoded; ``reason`` says why in a few words."""

    def __init__(self, reason: str, *, position: int | None = None):
        self.reason = reason
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"{reason}{where}")


class PutMessageStatus(enum.Enum):
    """RocketMQ's PutMessageStatus; the names are what clients see."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    DISK_FULL = "DISK_FULL"

    @property
    def stored(self) -> bool:
        """True when the message is in the log (RocketMQ's PutMessageResult.isOk, sendOK)."""
        return self in _STORED


_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


class MessageRejected(ValueError):
    """A message the store refuses before writing anything."""

    def __init__(self, status: PutMessageStatus, reason: str):
        self.status = status
        self.reason = reason
        super().__init__(f"{status.name}: {reason}")
