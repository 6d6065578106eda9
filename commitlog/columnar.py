"""Decode a run of commit log records into Arrow columns at once: the Spark reader's decoder.

Theory of operation
-------------------
``decode_record`` (commitlog.record) decodes one record with a dozen ``struct`` calls; at about
2 µs a record that caps a Python reader near 0.5 GB/s of 1 KiB records before Spark does any work.
This module decodes a whole segment range with numpy and pyarrow instead, following the same
layout (the constants come from ``commitlog.record``; ``tests/spark/test_columnar.py`` checks it field
for field against ``decode_record`` and stop for stop against ``commitlog.scan``):

1. **Walk** (one C call, ``_scan.walk_starts``, when the native module is built; otherwise the
   only per-record Python loop, a third of the decode time): from a known record start, read
   each record's size word and magic and step to the next record. Records carry no sync marker and a body can
   contain anything, so this chain is the only safe way to find record starts. The walk stops at
   the range's end, the never-written zero tail, a blank record, a bad magic or a size word that
   does not fit — the first checks of RocketMQ's ``checkMessageAndReturnSize``.
2. **Check** every walked record at once: the variable-length fields must add up to the size word
   and PHYSICALOFFSET must name the record's own offset. The first record that fails ends the
   range, exactly where recovery (``scan_segment``) would stop; what follows is a torn tail or
   garbage and is not decoded.
3. **Gather** the fixed fields with numpy (one fancy index over the 48-byte prefix, then the
   host-dependent fields at per-record positions), and the variable ones — body, topic,
   properties — as one ``large_binary`` array whose offsets interleave every record's
   ``[body start, body end, topic start, topic end, properties start, properties end]`` over the
   segment bytes (zero copy); taking every other element in C++ yields each column.
4. **Check the body CRC** per record (``crc_ok``; all of a batch's bodies in one native
   ``crc_ranges`` call with the GIL released when built), and for a record with the CRC tail
   (``append_record_crc``) the record CRC over its bytes before the tail as well: a bit flip, in
   the body or in the header, becomes a row with ``crc_ok = false``, not a failed job.

Properties become a ``map<string,string>`` by splitting on the separators in C++ with the
upstream rule (``name\\x01value\\x02``; pairs with an empty name or value are skipped); the
record CRC tail (``__CRC32#``) is left out, as ``decode_properties`` leaves it out. A record
that repeats a property name keeps every pair in the map; ``tags`` and ``keys`` take the last one,
as RocketMQ's decoder does. Bytes that are not UTF-8 in a topic or properties are replaced
(U+FFFD), as ``decode_properties`` does.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
from collections.abc import Iterator, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from commitlog import native as _native
from commitlog import record as rec
from commitlog.damage import DamagedRange
from commitlog.read_check import DamagedRecordError
from commitlog.scan import REASONS, ScanCode

# Rows per Arrow batch: large enough that per-batch costs vanish, small enough that a batch of
# 4 MiB bodies stays bounded (the byte limit).
BATCH_ROWS_MAX: Final = 32768
BATCH_BYTES_MAX: Final = 64 * 1024 * 1024

_PREFIX = np.dtype(
    [
        ("size", ">i4"),
        ("magic", ">u4"),
        ("body_crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical_offset", ">i8"),
        ("sysflag", ">i4"),
        ("born_ts", ">i8"),
    ]
)
assert _PREFIX.itemsize == rec.PREFIX.size == rec.BORN_HOST_POSITION
assert _PREFIX.fields["physical_offset"][1] == rec.PHYSICAL_OFFSET_POSITION
assert _PREFIX.fields["queue_offset"][1] == rec.QUEUE_OFFSET_POSITION
assert _PREFIX.fields["sysflag"][1] == rec.SYSFLAG_POSITION
_AFTER_STORE_HOST: Final = 4 + 8  # RECONSUMETIMES, PREPARED_TX_OFFSET

PROPERTIES_TYPE: Final = pa.map_(pa.string(), pa.string())
TIMESTAMP_TYPE: Final = pa.timestamp("us", tz="UTC")

# Every column the decoder can build, in the order of the Spark schema.
COLUMNS: Final = (
    ("store", pa.string()),
    ("phy_offset", pa.int64()),
    ("size", pa.int32()),
    ("topic", pa.string()),
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("tags", pa.string()),
    ("keys", pa.string()),
    ("born_ts", TIMESTAMP_TYPE),
    ("store_ts", TIMESTAMP_TYPE),
    ("born_host", pa.string()),
    ("store_host", pa.string()),
    ("sysflag", pa.int32()),
    ("flag", pa.int32()),
    ("body_crc", pa.int32()),
    ("body_size", pa.int32()),
    ("properties", PROPERTIES_TYPE),
    ("body", pa.binary()),
    ("crc_ok", pa.bool_()),
)
ARROW_SCHEMA: Final = pa.schema(COLUMNS)
COLUMN_NAMES: Final = tuple(name for name, _ in COLUMNS)


@dataclasses.dataclass(frozen=True, slots=True)
class RangeEnd:
    """Where decoding a range stopped: ``code`` is None when it reached the range's end."""

    position: int  # segment position of the first byte not decoded
    records: int  # valid records in the range (before offset and topic filters)
    code: ScanCode | None

    @property
    def reason(self) -> str:
        return "end of range" if self.code is None else REASONS[self.code]

    @property
    def clean(self) -> bool:
        return self.code is None or self.code.clean


# -- 1. walk ---------------------------------------------------------------------------------


WALK_CHUNK_RECORDS: Final = 1 << 20  # record starts the native walk writes per call (8 MiB)


def walk(buffer, start: int, stop: int, segment_end: int, *, native: bool | None = None) -> tuple[np.ndarray, int, ScanCode | None]:
    """Record starts in ``[start, stop)`` by following size words; ``segment_end`` bounds the
    records (a record may not run past it). Returns (starts, position, code): ``position`` is
    where the walk ended and ``code`` why (None: it reached ``stop``). Native when built."""
    if native is None:
        native = _native.walk_starts is not None
    if native:
        return _walk_native(buffer, start, stop, segment_end)
    head = rec.BLANK.unpack_from
    v1, v2, blank = rec.MAGIC_V1, rec.MAGIC_V2, rec.BLANK_MAGIC
    starts: list[int] = []
    append = starts.append
    position = start
    code = None
    while position < stop:
        left = segment_end - position
        if left < rec.BLANK_SIZE:
            code = ScanCode.TRUNCATED if any(memoryview(buffer)[position:segment_end]) else ScanCode.END_OF_DATA
            break
        size, magic = head(buffer, position)
        if magic != v1 and magic != v2:
            if magic == blank:
                code = ScanCode.END_OF_SEGMENT if size == left else ScanCode.BAD_BLANK
            elif size == 0 and magic == 0:
                code = ScanCode.END_OF_DATA
            else:
                code = ScanCode.BAD_MAGIC
            break
        if size < 91 or size > left:
            code = ScanCode.SIZE_OUT_OF_BOUNDS
            break
        append(position)
        position += size
    return np.array(starts, dtype=np.int64), position, code


def _walk_native(buffer, start: int, stop: int, segment_end: int) -> tuple[np.ndarray, int, ScanCode | None]:
    chunks = []
    position = start
    while True:
        out = np.empty(min(WALK_CHUNK_RECORDS, max(stop - position, 0) // 91 + 1), dtype=np.int64)
        count, position, code = _native.walk_starts(buffer, position, stop, segment_end, out)
        chunks.append(out[:count])
        if count < len(out) or code != -1:
            break
    starts = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return starts, position, None if code == -1 else ScanCode(code)


def split_points(buffer, segment_end: int, split_size: int) -> list[int]:
    """Record starts at which to cut a segment into ranges of about ``split_size`` bytes: the
    first record start at or after each multiple of ``split_size``, found by the walk from the
    segment's start (never guessed). The last range runs to the segment's end."""
    starts, _, _ = walk(buffer, 0, segment_end, segment_end)
    if len(starts) == 0:
        return []
    cuts = np.arange(split_size, segment_end, split_size, dtype=np.int64)
    indices = np.searchsorted(starts, cuts)
    points = sorted({int(starts[i]) for i in indices if i < len(starts)} - {0})
    return points


# -- 2 and 3. check and gather ---------------------------------------------------------------


def _be_at(data: np.ndarray, positions: np.ndarray, dtype: str) -> np.ndarray:
    """Big-endian integers of ``dtype`` read at ``positions`` (each clipped into the buffer;
    callers mask out records whose positions were out of bounds)."""
    width = np.dtype(dtype).itemsize
    clipped = np.clip(positions, 0, len(data) - width)
    gathered = data[clipped[:, None] + np.arange(width)]
    return gathered.view(dtype).reshape(-1).astype(np.int64)


@dataclasses.dataclass(slots=True)
class _Fields:
    """Per-record positions and fixed fields of validated records (numpy arrays)."""

    starts: np.ndarray
    prefix: np.ndarray  # _PREFIX records
    born_width: np.ndarray
    store_width: np.ndarray
    store_ts: np.ndarray
    body_at: np.ndarray
    body_size: np.ndarray
    topic_at: np.ndarray
    topic_size: np.ndarray
    properties_at: np.ndarray
    properties_size: np.ndarray

    def select(self, keep: np.ndarray) -> _Fields:
        return _Fields(*(getattr(self, f.name)[keep] for f in dataclasses.fields(self)))


def _check_and_gather(data: np.ndarray, starts: np.ndarray, file_from_offset: int) -> tuple[_Fields, int | None, ScanCode | None]:
    """Fields of the records at ``starts``; if one fails a check, the records before it and
    (its index, its code)."""
    prefix = data[starts[:, None] + np.arange(_PREFIX.itemsize)].view(_PREFIX).reshape(-1)
    sizes = prefix["size"].astype(np.int64)
    ends = starts + sizes
    sysflag = prefix["sysflag"]
    born_width = np.where(sysflag & rec.SYSFLAG_BORNHOST_V6, 20, 8)
    store_width = np.where(sysflag & rec.SYSFLAG_STOREHOST_V6, 20, 8)
    store_ts_at = starts + _PREFIX.itemsize + born_width
    body_length_at = store_ts_at + 8 + store_width + _AFTER_STORE_HOST
    header_size = body_length_at - starts
    bad = header_size + 4 + 3 > sizes
    body_size = _be_at(data, body_length_at, ">i4")
    body_at = body_length_at + 4
    topic_length_at = body_at + body_size
    bad |= (body_size < 0) | (topic_length_at + 3 > ends)
    v2 = prefix["magic"] == rec.MAGIC_V2
    topic_size = np.where(v2, _be_at(data, topic_length_at, ">i2"), _be_at(data, topic_length_at, "u1"))
    bad |= ~v2 & (topic_size > rec.TOPIC_SIZE_MAX_V1)
    topic_at = topic_length_at + np.where(v2, 2, 1)
    properties_length_at = topic_at + topic_size
    bad |= (topic_size < 0) | (properties_length_at + 2 > ends)
    properties_size = _be_at(data, properties_length_at, ">i2")
    properties_at = properties_length_at + 2
    bad |= (properties_size < 0) | (properties_at + properties_size != ends)
    misplaced = prefix["physical_offset"] != file_from_offset + starts
    store_ts = _be_at(data, store_ts_at, ">i8")
    fields = _Fields(
        starts, prefix, born_width, store_width, store_ts, body_at, body_size, topic_at, topic_size,
        properties_at, properties_size,
    )  # fmt: skip
    failed = bad | misplaced
    if not failed.any():
        return fields, None, None
    first = int(np.argmax(failed))
    code = ScanCode.FIELDS_DO_NOT_ADD_UP if bad[first] else ScanCode.PHYSICAL_OFFSET_MISMATCH
    return fields.select(slice(0, first)), first, code


# -- decoding a range ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """What to decode: an offset window ``[from_offset, to_offset)`` over record starts, topics
    (None: all), the body checksum (None: do not check), and which columns to build."""

    from_offset: int = 0
    to_offset: int | None = None
    topics: frozenset[str] | None = None
    crc: str | None = "crc32c"
    columns: tuple[str, ...] = COLUMN_NAMES
    # A record whose body fails its CRC: "flag" returns it as a row with crc_ok false; "fail"
    # raises DamagedRecordError naming it (every body is then checked, crc_ok asked for or not).
    damaged: str = "flag"


def decode_range(
    buffer,
    *,
    start: int,
    stop: int,
    segment_end: int,
    file_from_offset: int,
    store: str = "",
    options: Options = Options(),
    path: str = "",
) -> tuple[list[pa.RecordBatch], RangeEnd]:
    """Decode the records whose start lies in ``[start, stop)`` of one segment (``buffer`` holds
    the whole segment, the file at ``path``; ``start`` must be a record start). Returns Arrow
    batches with ``options.columns`` in that order, and where and why decoding stopped."""
    unknown = set(options.columns) - set(COLUMN_NAMES)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}; the decoder builds {list(COLUMN_NAMES)}")
    crc_function = rec.crc_function_by_name(options.crc) if options.crc else None
    batches: list[pa.RecordBatch] = []
    starts, position, code = walk(buffer, start, stop, segment_end)
    if len(starts) == 0:
        return batches, RangeEnd(position, 0, code)
    data = np.frombuffer(buffer, dtype=np.uint8, count=segment_end)
    fields, first_bad, bad_code = _check_and_gather(data, starts, file_from_offset)
    if first_bad is not None:
        position, code = int(starts[first_bad]), bad_code
    end = RangeEnd(position, len(fields.starts), code)
    keep = _filter(buffer, data, fields, file_from_offset, options)
    if keep is not None:
        fields = fields.select(keep)
    base = pa.py_buffer(buffer)
    total = len(fields.starts)
    chunk_start = 0
    while chunk_start < total:
        chunk_end = _chunk_end(fields, chunk_start)
        chunk = fields.select(slice(chunk_start, chunk_end))
        batches.append(_build(base, buffer, chunk, file_from_offset, store, options, crc_function, path))
        chunk_start = chunk_end
    return batches, end


def _chunk_end(fields: _Fields, chunk_start: int) -> int:
    limit = min(chunk_start + BATCH_ROWS_MAX, len(fields.starts))
    sizes = fields.prefix["size"][chunk_start:limit].astype(np.int64)
    over = np.nonzero(np.cumsum(sizes) > BATCH_BYTES_MAX)[0]
    return chunk_start + max(int(over[0]), 1) if len(over) else limit


def _filter(buffer, data, fields: _Fields, file_from_offset: int, options: Options) -> np.ndarray | None:
    offsets = file_from_offset + fields.starts
    keep = None
    if options.from_offset > file_from_offset or options.to_offset is not None:
        keep = offsets >= options.from_offset
        if options.to_offset is not None:
            keep &= offsets < options.to_offset
    if options.topics is not None:
        wanted = pa.array(sorted(topic.encode() for topic in options.topics), type=pa.binary())
        topics = _slices(pa.py_buffer(buffer), [(fields.topic_at, fields.topic_at + fields.topic_size)])[0]
        matches = pc.is_in(topics, value_set=wanted).to_numpy(zero_copy_only=False)
        keep = matches if keep is None else keep & matches
    return keep


def _slices(base: pa.Buffer, spans: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[pa.Array]:
    """One binary array per (starts, ends) pair, all cut from ``base`` in one pass: the offsets of
    every record's spans interleaved form one large_binary array over ``base`` (spans of a record
    are in order and records are in order, so the offsets never go back); every other element of
    it is a wanted span."""
    width = 2 * len(spans)
    count = len(spans[0][0])
    offsets = np.empty(count * width, dtype=np.int64)
    for index, (starts, ends) in enumerate(spans):
        offsets[2 * index :: width] = starts
        offsets[2 * index + 1 :: width] = ends
    whole = pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), base])
    result = []
    for index in range(len(spans)):
        taken = whole.take(pa.array(np.arange(2 * index, len(offsets) - 1, width, dtype=np.int64)))
        result.append(taken.cast(pa.binary()))
    return result


def _build(base, buffer, fields: _Fields, file_from_offset, store, options: Options, crc_function, path: str) -> pa.RecordBatch:
    wanted = set(options.columns)
    count = len(fields.starts)
    prefix = fields.prefix
    spans = [(fields.topic_at, fields.topic_at + fields.topic_size)]
    needs_properties = wanted & {"properties", "tags", "keys"}
    if needs_properties:
        spans.append((fields.properties_at, fields.properties_at + fields.properties_size))
    if "body" in wanted:
        spans.insert(0, (fields.body_at, fields.body_at + fields.body_size))
    cut = _slices(base, spans)
    body = cut.pop(0) if "body" in wanted else None
    topic = _text(cut[0])
    columns: dict[str, pa.Array] = {}
    if needs_properties:
        properties = _properties(cut[1])
        columns["properties"] = properties
        columns["tags"] = pc.map_lookup(properties, pa.scalar(rec.PROPERTY_TAGS), "last")
        columns["keys"] = pc.map_lookup(properties, pa.scalar(rec.PROPERTY_KEYS), "last")
    if "store" in wanted:
        columns["store"] = pa.array([store], pa.string()).take(pa.array(np.zeros(count, dtype=np.int32)))
    columns["phy_offset"] = pa.array(file_from_offset + fields.starts)
    columns["size"] = pa.array(prefix["size"].astype(np.int32))
    columns["topic"] = topic
    columns["queue_id"] = pa.array(prefix["queue_id"].astype(np.int32))
    columns["queue_offset"] = pa.array(prefix["queue_offset"].astype(np.int64))
    columns["born_ts"] = _timestamps(prefix["born_ts"].astype(np.int64))
    columns["store_ts"] = _timestamps(fields.store_ts)
    if "born_host" in wanted:
        columns["born_host"] = _hosts(buffer, fields.starts + rec.BORN_HOST_POSITION, fields.born_width)
    if "store_host" in wanted:
        at = fields.starts + rec.BORN_HOST_POSITION + fields.born_width + 8
        columns["store_host"] = _hosts(buffer, at, fields.store_width)
    columns["sysflag"] = pa.array(prefix["sysflag"].astype(np.int32))
    columns["flag"] = pa.array(prefix["flag"].astype(np.int32))
    body_crc = prefix["body_crc"].astype(np.int32)
    columns["body_crc"] = pa.array(body_crc)
    columns["body_size"] = pa.array(fields.body_size.astype(np.int32))
    if body is not None:
        columns["body"] = body
    if "crc_ok" in wanted or options.damaged == "fail" and crc_function is not None:
        columns["crc_ok"] = _crc_ok(buffer, fields, body_crc, crc_function)
        if options.damaged == "fail" and crc_function is not None:
            _fail_on_damage(columns["crc_ok"], fields, file_from_offset, path, buffer, crc_function)
    return pa.RecordBatch.from_arrays(
        [columns[name] for name in options.columns],
        schema=pa.schema([ARROW_SCHEMA.field(name) for name in options.columns]),
    )


# Spark's timestamps are microseconds in an int64 and dates in years 1..9999; a millisecond value
# outside that (a corrupt header: these fields are not covered by the CRC) becomes null.
_MILLIS_MIN: Final = -62135596800000  # 0001-01-01
_MILLIS_MAX: Final = 253402300799999  # 9999-12-31 23:59:59.999


def _timestamps(millis: np.ndarray) -> pa.Array:
    invalid = (millis < _MILLIS_MIN) | (millis > _MILLIS_MAX)
    micros = np.where(invalid, 0, millis) * 1000
    return pa.array(micros, TIMESTAMP_TYPE, mask=invalid if invalid.any() else None)


def _text(values: pa.Array) -> pa.Array:
    """Binary to string; bytes that are not UTF-8 become U+FFFD, as the record decoder does."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", errors="replace") for v in values.to_pylist()], pa.string())


def _properties(encoded: pa.Array) -> pa.Array:
    """``name\\x01value\\x02...`` per record to a map, with decode_properties' rule: a pair needs
    a non-empty name and a non-empty value."""
    count = len(encoded)
    pairs = pc.split_pattern(_text(encoded), rec.PROPERTY_SEPARATOR)
    flat = pairs.flatten()
    parents = pc.list_parent_indices(pairs).to_numpy()
    at = pc.find_substring(flat, rec.PROPERTY_NAME_VALUE_SEPARATOR).to_numpy()
    lengths = pc.binary_length(flat).to_numpy()
    keep = (at > 0) & (at < lengths - 1)
    keep &= ~pc.starts_with(flat, _TAIL_NAME).to_numpy(zero_copy_only=False)  # not a user property
    kept = flat.filter(pa.array(keep))
    split = pc.split_pattern(kept, rec.PROPERTY_NAME_VALUE_SEPARATOR, max_splits=1)
    keys = pc.list_element(split, 0)
    values = pc.list_element(split, 1)
    counts = np.bincount(parents[keep], minlength=count)
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=PROPERTIES_TYPE)


def _hosts(buffer, at: np.ndarray, widths: np.ndarray) -> pa.Array:
    """``ip:port`` (``[ip]:port`` for IPv6) per record. A log holds few distinct hosts, so each
    distinct value is formatted once and the column is a take from those."""
    data = np.frombuffer(buffer, dtype=np.uint8)
    if (widths == 8).all():
        keys = data[at[:, None] + np.arange(8)].view(">u8").reshape(-1)
        unique, inverse = np.unique(keys, return_inverse=True)
        texts = [_host_text(int(key).to_bytes(8, "big")) for key in unique]
    else:
        raw = data[np.clip(at, 0, len(data) - 20)[:, None] + np.arange(20)].copy()
        raw[widths == 8, 8:] = 0
        flags = (widths == 20).astype(np.uint8)[:, None]
        keys = np.ascontiguousarray(np.hstack([flags, raw])).view("V21").reshape(-1)
        unique, inverse = np.unique(keys, return_inverse=True)
        texts = [_host_text(key.tobytes()[1:] if key.tobytes()[0] else key.tobytes()[1:9]) for key in unique]
    return pa.array(texts, pa.string()).take(pa.array(inverse.reshape(-1).astype(np.int32)))


def _host_text(raw: bytes) -> str:
    ip, port = raw[:-4], struct.unpack(">i", raw[-4:])[0]
    address = ipaddress.ip_address(ip)
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


_TAIL_NAME: Final = rec.RECORD_CRC_TAIL_PREFIX.decode()
_TAIL_TEMPLATE: Final = np.frombuffer(rec.RECORD_CRC_TAIL_PREFIX, dtype=np.uint8)
_DIGIT_WEIGHTS: Final = 10 ** np.arange(rec.RECORD_CRC_DIGITS, dtype=np.int64)  # least significant first


def _record_tails(data: np.ndarray, fields: _Fields) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per record: has a CRC tail, has a tail one byte off its shape (damaged), the CRC the tail
    holds (``record.stored_record_crc`` for a whole batch)."""
    count = len(fields.starts)
    ends = fields.properties_at + fields.properties_size
    possible = fields.properties_size >= rec.RECORD_CRC_TAIL_SIZE
    at = np.where(possible, ends - rec.RECORD_CRC_TAIL_SIZE, 0)
    tails = data[at[:, None] + np.arange(rec.RECORD_CRC_TAIL_SIZE)] if count else np.zeros((0, 20), np.uint8)
    prefix_size = len(_TAIL_TEMPLATE)
    digits = tails[:, prefix_size:-1].astype(np.int64) - ord("0")
    off = (tails[:, :prefix_size] != _TAIL_TEMPLATE).sum(axis=1)
    off += ((digits < 0) | (digits > 9)).sum(axis=1) + (tails[:, -1] != ord(rec.PROPERTY_SEPARATOR))
    value = (np.clip(digits, 0, 9) * _DIGIT_WEIGHTS).sum(axis=1)
    return possible & (off == 0), possible & (off == 1), value


def _crc_ok(buffer, fields: _Fields, stored: np.ndarray, crc_function, *, native: bool | None = None) -> pa.Array:
    if crc_function is None:
        return pa.nulls(len(fields.starts), pa.bool_())
    if native is None:
        native = _native.crc_ranges is not None
    tailed, damaged, tail_crc = _record_tails(np.frombuffer(buffer, dtype=np.uint8), fields)
    record_length = np.where(tailed, fields.prefix["size"].astype(np.int64) - rec.RECORD_CRC_TAIL_SIZE, 0)
    body_crc = _crcs(buffer, fields.body_at, fields.body_size, crc_function, native)
    record_crc = _crcs(buffer, fields.starts, record_length, crc_function, native) if tailed.any() else tail_crc
    return pa.array((body_crc == stored) & ~damaged & (~tailed | (record_crc == tail_crc)))


def _crcs(buffer, starts: np.ndarray, lengths: np.ndarray, crc_function, native: bool) -> np.ndarray:
    """The masked CRC of each range ``[starts[i], starts[i] + lengths[i])``."""
    if native and crc_function is rec.CRC_FUNCTIONS["crc32c"]:  # one C call for the whole chunk
        computed = np.empty(len(starts), dtype=np.int64)
        _native.crc_ranges(buffer, np.ascontiguousarray(starts, dtype=np.int64),
                           np.ascontiguousarray(lengths, dtype=np.int64), computed)  # fmt: skip
        return computed
    view = memoryview(buffer)
    mask = rec.CRC_MASK
    return np.fromiter(
        (crc_function(view[a:b]) & mask for a, b in zip(starts.tolist(), (starts + lengths).tolist())),
        dtype=np.int64,
        count=len(starts),
    )


def _fail_on_damage(crc_ok: pa.Array, fields: _Fields, file_from_offset: int, path: str, buffer, crc_function) -> None:
    """Raise DamagedRecordError for the first record of the chunk that fails its body CRC or its
    record CRC (the reason says which)."""
    if pc.all(crc_ok).as_py():
        return
    first = int(np.argmin(crc_ok.to_numpy(zero_copy_only=False)))
    offset = file_from_offset + int(fields.starts[first])
    size = int(fields.prefix["size"][first])
    body_at = int(fields.body_at[first])
    body_ok = crc_function(memoryview(buffer)[body_at : body_at + int(fields.body_size[first])]) & rec.CRC_MASK \
        == int(fields.prefix["body_crc"][first])  # fmt: skip
    raise DamagedRecordError(DamagedRange(path, offset, offset + size, "record CRC mismatch" if body_ok else "body CRC mismatch"))


def host_text(host: rec.Host) -> str:
    """A decoded host as the ``born_host`` / ``store_host`` columns show it."""
    address = ipaddress.ip_address(host[0])
    return f"[{address}]:{host[1]}" if address.version == 6 else f"{address}:{host[1]}"


def iter_segment_ranges(segment_end: int, points: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(start, stop) ranges from split points: [0, p1), [p1, p2), ..., [pn, segment_end)."""
    edges = [0, *points, segment_end]
    yield from zip(edges, edges[1:])
