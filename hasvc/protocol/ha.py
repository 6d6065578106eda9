"""The HA (replication) protocol: handshake, then the seed's data phase, exactly.

Theory of operation
-------------------
A slave connects to the master's HA port. After the preface (``wire.py``) comes one handshake
exchange, each side a length-prefixed frame:

    slave  -> master  SLAVE_HELLO   u32 length | u16 flags | u16 n | slave id (n bytes UTF-8)
                                    | u16 m | slave client address (m bytes) | i64 slave max offset
                                    | u32 k | k x (i32 epoch, i64 start offset)
    master -> slave   MASTER_HELLO  u32 length | u8 status | i64 master max offset | i64 master min offset
                                    | u64 segment size | u32 k | k x (i32 epoch, i64 start offset)
                                    | u16 r | reason (r bytes UTF-8, empty when status is 0)
                                    | u16 c | master client address (c bytes UTF-8, HOST:PORT; may be absent)

flags bit 0: sync from the master's last segment only (RocketMQ's syncFromLastFile). Status 0
accepts; anything else refuses with the reason and closes. The master's client address lets a
slave refuse a SEND naming where to send instead; a hello that ends after the reason (an older
master) leaves it unknown.

Then the data phase is RocketMQ's (HAConnection / HAClient), byte for byte:

    slave  -> master  REPORT   i64 slave max offset                      (8 bytes, repeated)
    master -> slave   TRANSFER i64 offset | i32 size | size bytes of log  (12-byte header)

The first REPORT is where the master starts; every REPORT acknowledges everything below it. A
TRANSFER with size 0 is a heartbeat. A TRANSFER's bytes never cross a segment, and its offset must
equal the slave's max offset.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Final

from hasvc.protocol.wire import Buffer, ProtocolError

REPORT = struct.Struct(">q")
assert REPORT.size == 8
TRANSFER_HEADER = struct.Struct(">qi")
assert TRANSFER_HEADER.size == 12
LENGTH = struct.Struct(">I")
EPOCH_ENTRY = struct.Struct(">iq")
assert EPOCH_ENTRY.size == 12

FLAG_SYNC_FROM_LAST_FILE: Final = 0x1
# A handshake frame holds at most this many bytes (1000 epoch entries, as RocketMQ's buffer, fit).
HANDSHAKE_SIZE_MAX: Final = 64 * 1024
EPOCH_ENTRIES_MAX: Final = 1000

STATUS_OK: Final = 0
STATUS_REFUSED: Final = 1

EpochEntries = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class SlaveHello:
    slave_id: str
    client_address: str
    max_offset: int
    epochs: EpochEntries = ()
    sync_from_last_file: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class MasterHello:
    status: int
    max_offset: int
    min_offset: int
    segment_size: int
    epochs: EpochEntries = ()
    reason: str = ""
    client_address: str = ""  # the master's client port, HOST:PORT ("" unknown)


def _text(value: str) -> bytes:
    data = value.encode()
    if len(data) > 0xFFFF:
        raise ValueError("text field over 65535 bytes")
    return struct.pack(">H", len(data)) + data


def _epochs(entries: EpochEntries) -> bytes:
    if len(entries) > EPOCH_ENTRIES_MAX:
        raise ValueError(f"more than {EPOCH_ENTRIES_MAX} epoch entries")
    return struct.pack(">I", len(entries)) + b"".join(EPOCH_ENTRY.pack(e, s) for e, s in entries)


def _framed(body: bytes) -> bytes:
    if len(body) > HANDSHAKE_SIZE_MAX:
        raise ValueError("handshake frame too large")
    return LENGTH.pack(len(body)) + body


def encode_slave_hello(hello: SlaveHello) -> bytes:
    flags = FLAG_SYNC_FROM_LAST_FILE if hello.sync_from_last_file else 0
    return _framed(
        struct.pack(">H", flags)
        + _text(hello.slave_id)
        + _text(hello.client_address)
        + REPORT.pack(hello.max_offset)
        + _epochs(hello.epochs)
    )


def encode_master_hello(hello: MasterHello) -> bytes:
    return _framed(
        struct.pack(">Bqq", hello.status, hello.max_offset, hello.min_offset)
        + struct.pack(">Q", hello.segment_size)
        + _epochs(hello.epochs)
        + _text(hello.reason)
        + _text(hello.client_address)
    )


class _Reader:
    """Cursor over one handshake frame; every read is bounds-checked."""

    def __init__(self, data: bytes):
        self.data = data
        self.position = 0

    def unpack(self, fmt: struct.Struct | str):
        layout = struct.Struct(fmt) if isinstance(fmt, str) else fmt
        if self.position + layout.size > len(self.data):
            raise ProtocolError("handshake frame ends in the middle of a field")
        values = layout.unpack_from(self.data, self.position)
        self.position += layout.size
        return values

    def text(self) -> str:
        (size,) = self.unpack(">H")
        if self.position + size > len(self.data):
            raise ProtocolError("handshake text field runs past the frame")
        raw = self.data[self.position : self.position + size]
        self.position += size
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError("handshake text field is not UTF-8") from None

    def epochs(self) -> EpochEntries:
        (count,) = self.unpack(">I")
        if count > EPOCH_ENTRIES_MAX:
            raise ProtocolError(f"{count} epoch entries, more than {EPOCH_ENTRIES_MAX}")
        return tuple(self.unpack(EPOCH_ENTRY) for _ in range(count))

    def done(self) -> None:
        if self.position != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.position} unexpected bytes after the handshake fields")


def take_handshake_frame(buffer: Buffer) -> bytes | None:
    """The body of one length-prefixed handshake frame, or None until it is complete."""
    head = buffer.peek(LENGTH.size)
    if head is None:
        return None
    (size,) = LENGTH.unpack(head)
    if size > HANDSHAKE_SIZE_MAX:
        raise ProtocolError(f"handshake frame of {size} bytes, more than {HANDSHAKE_SIZE_MAX}")
    if len(buffer) < LENGTH.size + size:
        return None
    buffer.take(LENGTH.size)
    return buffer.take(size)


def decode_slave_hello(body: bytes) -> SlaveHello:
    reader = _Reader(body)
    (flags,) = reader.unpack(">H")
    slave_id = reader.text()
    client_address = reader.text()
    (max_offset,) = reader.unpack(REPORT)
    epochs = reader.epochs()
    reader.done()
    if max_offset < 0:
        raise ProtocolError(f"slave reports a negative max offset {max_offset}")
    return SlaveHello(slave_id, client_address, max_offset, epochs, bool(flags & FLAG_SYNC_FROM_LAST_FILE))


def decode_master_hello(body: bytes) -> MasterHello:
    reader = _Reader(body)
    status, max_offset, min_offset = reader.unpack(">Bqq")
    (segment_size,) = reader.unpack(">Q")
    epochs = reader.epochs()
    reason = reader.text()
    client_address = reader.text() if reader.position < len(reader.data) else ""
    reader.done()
    if min(max_offset, min_offset) < 0 or min_offset > max_offset:
        raise ProtocolError(f"master offsets [{min_offset}, {max_offset}) are impossible")
    return MasterHello(status, max_offset, min_offset, segment_size, epochs, reason, client_address)


REPORTS_BUFFERED_MAX = 1024 * 1024  # RocketMQ's read buffer for reports: 1 MiB


class ReportDecoder:
    """Master side: the slave's 8-byte reports, in order. The bytes received and where the next
    report starts in them, not a ``Buffer``: a report is one ``unpack_from`` (a Buffer's ``take``
    was five Python calls, and a SYNC_MASTER put reads a report and looks for a second)."""

    def __init__(self) -> None:
        self._data = b""
        self._position = 0  # the next report's first byte in _data

    def receive_data(self, data: bytes) -> None:
        rest = len(self._data) - self._position
        if rest + len(data) > REPORTS_BUFFERED_MAX:
            raise ProtocolError(f"more than {REPORTS_BUFFERED_MAX} bytes buffered from the peer")
        self._data = self._data[self._position :] + data if rest else bytes(data)
        self._position = 0

    def reports(self, data: bytes) -> list[int]:
        """``receive_data`` and every whole report then buffered, in order: one call a receive
        (a SYNC_MASTER put's is one report, taken without buffering it: the fed and next_report's
        look for a second were three calls on the answer's path). A negative report refuses the
        receive's reports whole (ProtocolError: the master closes the connection)."""
        if len(data) == REPORT.size and self._position == len(self._data):
            (offset,) = REPORT.unpack(data)
            if offset < 0:
                raise ProtocolError(f"slave reported a negative offset {offset}")
            return [offset]
        self.receive_data(data)
        offsets = []
        while (offset := self.next_report()) is not None:
            offsets.append(offset)
        return offsets

    def next_report(self) -> int | None:
        position = self._position
        if len(self._data) - position < REPORT.size:
            return None
        (offset,) = REPORT.unpack_from(self._data, position)
        self._position = position + REPORT.size
        if offset < 0:
            raise ProtocolError(f"slave reported a negative offset {offset}")
        return offset


@dataclasses.dataclass(frozen=True, slots=True)
class TransferHeader:
    offset: int
    size: int


def transfer_header_fields(data: bytes | memoryview, size_max: int) -> tuple[int, int]:
    """(offset, size) of a transfer header, checked; ProtocolError otherwise. The slave's per-frame
    form: a tuple, not a ``TransferHeader`` (a frozen dataclass: ~1 us a frame)."""
    offset, size = TRANSFER_HEADER.unpack(data)
    if offset < 0:
        raise ProtocolError(f"transfer frame for negative offset {offset}")
    if size < 0 or size > size_max:
        raise ProtocolError(f"transfer frame of {size} bytes, outside 0..{size_max} (the slave's ha_frame_size_max: "
                            f"the master's ha_transfer_batch_size must not exceed it)")  # fmt: skip
    return offset, size


def decode_transfer_header(data: bytes | memoryview, *, size_max: int) -> TransferHeader:
    return TransferHeader(*transfer_header_fields(data, size_max))


class TransferDecoder:
    """Slave side, whole frames out of a byte stream: the reference decoder of the data phase
    (the property tests check the framing with it). The HA client itself reads the 12-byte
    header with ``decode_transfer_header`` and the bytes straight into its segment."""

    def __init__(self, *, size_max: int):
        self.size_max = size_max
        self._buffer = Buffer(size_max=2 * (size_max + TRANSFER_HEADER.size))
        self._header: TransferHeader | None = None

    def receive_data(self, data: bytes) -> None:
        self._buffer.feed(data)

    def next_frame(self) -> tuple[int, bytes] | None:
        if self._header is None:
            head = self._buffer.take(TRANSFER_HEADER.size)
            if head is None:
                return None
            self._header = decode_transfer_header(head, size_max=self.size_max)
        body = self._buffer.take(self._header.size)
        if body is None:
            return None
        header, self._header = self._header, None
        return header.offset, body


def encode_transfer_header(offset: int, size: int) -> bytes:
    return TRANSFER_HEADER.pack(offset, size)
