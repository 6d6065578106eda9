"""The ``hasvc`` Spark data source: commit log segment files as a DataFrame.

Theory of operation
-------------------
``spark.read.format("hasvc").load(STORE)`` (or ``.load([STORE_A, STORE_B])``) plans one input
partition per commit log segment. A segment larger than ``split_size`` is cut into ranges at
record starts found by walking the segment's size words from its first byte
(``commitlog.columnar.split_points``): the walk is the only safe way, since a body may contain
any bytes, and it reads 8 bytes per record (on the driver, at every query: about 0.1 s per GiB
of 1 KiB records with the native module, 0.4-0.5 s without). Each task maps its segment read-only and decodes its range with
``commitlog.columnar`` into Arrow record batches — numpy and pyarrow, no trio, no broker.

A range ends where recovery would end it: at the zero tail, a blank record, or the first record
whose fields do not add up (a torn tail); records after that are not returned. The ``segments``
view (``.option("view", "segments")``) returns one row per range saying where and why it ended, so
a torn tail is reported rather than silently shortening the log. A record whose body does not
match its CRC fails the task with a ``DamagedRecordError`` naming its offset and file, or, with
``damaged=flag``, is returned with ``crc_ok = false``: the CRC is checked on the executors in
one native ``crc_ranges`` call per batch, the way a broker checks what it serves (the data source
reads the files directly; no broker is asked).

Options (all strings, as Spark passes them):

=============== ============== ====================================================================
option          default        meaning
=============== ============== ====================================================================
from_offset     0              only records starting at or after this physical offset
to_offset       (none)         only records starting before this physical offset
topics          (all)          comma-separated topic names; other records are skipped while decoding
crc             crc32c         body checksum: crc32c (hasvc), crc32 (RocketMQ stores), none (skip)
damaged         fail           a body that fails its CRC: fail (the task fails naming its offset and
                               file) or flag (a row with crc_ok = false)
include_body    true           false drops the body column (less to move from Python to the JVM)
split_size      268435456      segments above this many bytes are split (256 MiB, see the notes)
view            records        records, or segments (one row per range: where it ended and why)
=============== ============== ====================================================================
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from commitlog import columnar
from commitlog.mapped_file import parse_segment_name
from commitlog.record import CRC_FUNCTIONS

NAME = "hasvc"
SPLIT_SIZE_DEFAULT = 256 * 1024 * 1024  # below this, splitting costs more than it gains (pyspark notes §2)
# A record whose body fails its CRC: fail the task naming it (the default: a query never reads a
# damaged body silently), or flag it (a row with crc_ok = false: stats and compare count them).
DAMAGED_CHOICES = ("fail", "flag")

_SPARK_TYPES = {
    "store": StringType(),
    "phy_offset": LongType(),
    "size": IntegerType(),
    "topic": StringType(),
    "queue_id": IntegerType(),
    "queue_offset": LongType(),
    "tags": StringType(),
    "keys": StringType(),
    "born_ts": TimestampType(),
    "store_ts": TimestampType(),
    "born_host": StringType(),
    "store_host": StringType(),
    "sysflag": IntegerType(),
    "flag": IntegerType(),
    "body_crc": IntegerType(),
    "body_size": IntegerType(),
    "properties": MapType(StringType(), StringType()),
    "body": BinaryType(),
    "crc_ok": BooleanType(),
}
assert tuple(_SPARK_TYPES) == columnar.COLUMN_NAMES

RECORDS_SCHEMA = StructType([StructField(name, kind) for name, kind in _SPARK_TYPES.items()])
SEGMENTS_SCHEMA = StructType(
    [
        StructField("store", StringType()),
        StructField("segment", StringType()),
        StructField("file_from_offset", LongType()),
        StructField("range_start", LongType()),
        StructField("range_stop", LongType()),
        StructField("records", LongType()),
        StructField("valid_end", LongType()),  # physical offset where decoding stopped
        StructField("stop_reason", StringType()),
        StructField("clean", BooleanType()),
    ]
)


class OptionError(ValueError):
    """An option the data source cannot use; the message names it."""


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    stores: tuple[str, ...]
    decode: columnar.Options
    split_size: int
    view: str

    @classmethod
    def parse(cls, options) -> ReadOptions:
        options = {key.lower(): value for key, value in dict(options).items()}
        stores = _stores(options)
        crc = options.get("crc", "crc32c").lower()
        if crc not in (*CRC_FUNCTIONS, "none"):
            raise OptionError(f"hasvc: crc must be one of {sorted(CRC_FUNCTIONS)} or none, not {crc!r}")
        damaged = options.get("damaged", "fail").lower()
        if damaged not in DAMAGED_CHOICES:
            raise OptionError(f"hasvc: damaged must be one of {', '.join(DAMAGED_CHOICES)}, not {damaged!r}")
        topics = options.get("topics")
        view = options.get("view", "records").lower()
        if view not in ("records", "segments"):
            raise OptionError(f"hasvc: view must be records or segments, not {view!r}")
        include_body = _boolean(options, "include_body", True)
        columns = tuple(name for name in columnar.COLUMN_NAMES if include_body or name != "body")
        decode = columnar.Options(
            from_offset=_integer(options, "from_offset", 0),
            to_offset=_integer(options, "to_offset", None),
            topics=frozenset(t.strip() for t in topics.split(",") if t.strip()) if topics else None,
            crc=None if crc == "none" else crc,
            columns=columns,
            damaged=damaged,
        )
        split_size = _integer(options, "split_size", SPLIT_SIZE_DEFAULT)
        if split_size < 1024 * 1024:
            raise OptionError(f"hasvc: split_size must be at least 1 MiB, not {split_size}")
        return cls(stores, decode, split_size, view)

    def schema(self) -> StructType:
        if self.view == "segments":
            return SEGMENTS_SCHEMA
        return StructType([field for field in RECORDS_SCHEMA.fields if field.name in self.decode.columns])


def _stores(options: dict) -> tuple[str, ...]:
    if "paths" in options:
        paths = json.loads(options["paths"])
    elif "path" in options:
        paths = [options["path"]]
    else:
        raise OptionError("hasvc: give a store directory: spark.read.format('hasvc').load(STORE_DIR)")
    for path in paths:
        directory = os.path.join(path, "commitlog")
        if not os.path.isdir(directory):
            what = "does not exist" if not os.path.exists(path) else "has no commitlog/ directory"
            raise OptionError(f"hasvc: store {path!r} {what}; expected a store directory holding commitlog/ segment files")
    return tuple(paths)


def _integer(options: dict, name: str, default):
    if name not in options or options[name] in ("", None):
        return default
    try:
        return int(options[name])
    except ValueError:
        raise OptionError(f"hasvc: option {name} must be an integer, not {options[name]!r}") from None


def _boolean(options: dict, name: str, default: bool) -> bool:
    value = str(options.get(name, default)).lower()
    if value not in ("true", "false"):
        raise OptionError(f"hasvc: option {name} must be true or false, not {value!r}")
    return value == "true"


@dataclasses.dataclass(frozen=True)
class SegmentRange(InputPartition):
    """One task: records starting in [start, stop) of one segment file."""

    store: str
    path: str
    file_from_offset: int
    start: int
    stop: int
    file_size: int


def plan(options: ReadOptions) -> list[SegmentRange]:
    """Input partitions: one per segment, large segments split at walked record starts; segments
    wholly outside [from_offset, to_offset) are skipped."""
    ranges = []
    decode = options.decode
    for store in options.stores:
        directory = os.path.join(store, "commitlog")
        for name in sorted(os.listdir(directory)):
            file_from_offset = parse_segment_name(name)
            path = os.path.join(directory, name)
            if file_from_offset is None or not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            if size == 0:
                continue
            if file_from_offset + size <= decode.from_offset:
                continue
            if decode.to_offset is not None and file_from_offset >= decode.to_offset:
                continue
            points = []
            if size > options.split_size:
                with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    points = columnar.split_points(mapped, size, options.split_size)
            for start, stop in columnar.iter_segment_ranges(size, points):
                ranges.append(SegmentRange(store, path, file_from_offset, start, stop, size))
    return ranges


def read_range(part: SegmentRange, options: ReadOptions):
    """Arrow batches (records view) or one segments-view row for one partition."""
    with open(part.path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        decode = options.decode
        if options.view == "segments":  # walk and check only: an empty topic set keeps no row, so no batch is built
            decode = dataclasses.replace(decode, topics=frozenset(), crc=None, columns=("phy_offset",))
        batches, end = columnar.decode_range(
            mapped,
            start=part.start,
            stop=part.stop,
            segment_end=min(part.file_size, len(mapped)),
            file_from_offset=part.file_from_offset,
            store=part.store,
            options=decode,
            path=part.path,
        )
        if options.view == "segments":
            yield (
                part.store, os.path.basename(part.path), part.file_from_offset, part.start, part.stop,
                end.records, part.file_from_offset + end.position, end.reason, end.clean,
            )  # fmt: skip
            return
        yield from batches
        del batches
    finally:
        try:
            mapped.close()
        except BufferError:  # an Arrow buffer still points into it; the GC unmaps it later
            pass


class HasvcDataSource(DataSource):
    """``spark.read.format("hasvc")``: see the module docstring for options and columns."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return ReadOptions.parse(self.options).schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return HasvcReader(ReadOptions.parse(self.options), schema)


class HasvcReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType):
        if options.view == "records":
            names = tuple(schema.fieldNames())
            unknown = [name for name in names if name not in columnar.COLUMN_NAMES]
            if unknown:
                raise OptionError(f"hasvc: unknown columns {unknown} in the schema; known: {list(columnar.COLUMN_NAMES)}")
            options = dataclasses.replace(options, decode=dataclasses.replace(options.decode, columns=names))
        self.options = options

    def partitions(self) -> list[SegmentRange]:
        ranges = plan(self.options)
        if not ranges:  # Spark needs at least one partition; this one reads nothing
            return [SegmentRange("", "", 0, 0, 0, 0)]
        return ranges

    def read(self, partition: SegmentRange):
        if not partition.path:
            return iter(())
        return read_range(partition, self.options)
