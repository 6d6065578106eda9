"""The Spark jobs: a session set up for this machine, export, statistics and replica audit.

Each job is a library function taking a SparkSession; ``hasvc spark …`` and ``scripts/spark_*.py``
are thin wrappers. They run wherever the session runs: ``local[*]`` by default, a cluster with
``--master spark://…``, or under ``spark-submit`` (the session then comes from spark-submit).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from hasvc.spark.datasource import NAME, HasvcDataSource

LOG4J_CONFIG = os.path.join(os.path.dirname(__file__), "log4j2.properties")


def session(master: str | None = "local[*]", *, app_name: str = "hasvc", conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession with the ``hasvc`` data source registered.

    ``master=None`` keeps what spark-submit (or an existing session) set. For local masters the
    driver binds to loopback and the workers run this interpreter (``PYSPARK_PYTHON``), so the
    venv's pyarrow and this package are importable; both must be set before the JVM starts.
    Times are UTC (``spark.sql.session.timeZone``), so per-minute statistics do not depend on the
    machine's zone."""
    local = master is None or master.startswith("local")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)) if local else "200",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
    }
    if local:
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    spark.dataSource.register(HasvcDataSource)


def read(spark: SparkSession, stores: str | Sequence[str], **options) -> DataFrame:
    """The records of one or more stores (options: see hasvc.spark.datasource)."""
    reader = spark.read.format(NAME)
    for key, value in options.items():
        if value is not None:
            reader = reader.option(key, str(value).lower() if isinstance(value, bool) else str(value))
    return reader.load(stores if isinstance(stores, str) else list(stores))


def segments(spark: SparkSession, stores: str | Sequence[str], **options) -> DataFrame:
    """One row per segment range: records, where decoding stopped and why (torn tails show here)."""
    return read(spark, stores, view="segments", **options)


# -- export ----------------------------------------------------------------------------------

PARTITION_COLUMNS = ("topic", "date")


def export(
    spark: SparkSession,
    stores: str | Sequence[str],
    out: str,
    *,
    format: str = "parquet",
    partition_by: Sequence[str] = (),
    mode: str = "errorifexists",
    **options,
) -> DataFrame:
    """Write the records to ``out`` as Parquet or JSON lines (binary bodies become base64 in JSON),
    optionally partitioned by ``topic`` and/or ``date`` (the UTC day of store_ts). Returns the
    DataFrame that was written."""
    if format not in ("parquet", "json"):
        raise ValueError(f"export format must be parquet or json, not {format!r}")
    unknown = set(partition_by) - set(PARTITION_COLUMNS)
    if unknown:
        raise ValueError(f"cannot partition by {sorted(unknown)}; choose from {list(PARTITION_COLUMNS)}")
    df = read(spark, stores, **options)
    if "date" in partition_by:
        df = df.withColumn("date", F.to_date("store_ts"))
    writer = df.write.mode(mode).format(format)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(out)
    return df


# -- stats -----------------------------------------------------------------------------------

PERCENTILES = [0.5, 0.99]


def stats(spark: SparkSession, stores: str | Sequence[str], *, by: Sequence[str] = ("topic", "minute"), **options) -> DataFrame:
    """Per topic and per minute (of store_ts, UTC): messages, bytes, body size p50/p99/max,
    distinct producer hosts, and store latency (store_ts - born_ts) p50/p99/max in ms."""
    df = read(spark, stores, include_body=False, **{"damaged": "flag", **options})  # crc_failures counts them
    if "minute" in by:
        df = df.withColumn("minute", F.date_trunc("minute", "store_ts"))
    latency = F.unix_millis("store_ts") - F.unix_millis("born_ts")
    body_p = F.percentile_approx("body_size", PERCENTILES)
    latency_p = F.percentile_approx(latency, PERCENTILES)
    return (
        df.groupBy(*by)
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("size").alias("bytes"),
            body_p[0].alias("body_p50"),
            body_p[1].alias("body_p99"),
            F.max("body_size").alias("body_max"),
            F.count_distinct("born_host").alias("producers"),
            F.slice(F.array_sort(F.collect_set("born_host")), 1, 8).alias("producer_hosts"),
            latency_p[0].alias("latency_ms_p50"),
            latency_p[1].alias("latency_ms_p99"),
            F.max(latency).alias("latency_ms_max"),
            F.sum(F.when(~F.col("crc_ok"), 1).otherwise(0)).alias("crc_failures"),
        )
        .orderBy(*by)
    )


# -- audit -----------------------------------------------------------------------------------

# Everything a record holds, hashed on the JVM side: two records with the same offset and the
# same value here hold the same fields (properties in their stored order, body bytes via xxhash64).
_RECORD_FIELDS = (
    "size", "topic", "queue_id", "queue_offset", "born_ts", "store_ts", "born_host", "store_host", "sysflag",
    "flag", "body_crc", "body",
)  # fmt: skip


@dataclasses.dataclass
class Range:
    kind: str  # missing (on the slave), extra (on the slave), differs
    start: int
    end: int
    records: int


@dataclasses.dataclass
class AuditReport:
    master: str
    slave: str
    master_records: int
    slave_records: int
    master_end: int  # end of the master's last record
    slave_end: int  # end of the slave's last record: the audit compares everything below it
    compared: int  # records at offsets present on both sides
    not_yet_replicated: int  # master records at or past slave_end (lag, not divergence)
    not_yet_replicated_bytes: int  # master_end - slave_end: the HA lag in log bytes (blank padding included)
    ranges: list[Range]
    first_divergence: int | None
    unclean_segments: list[dict]

    @property
    def diverged(self) -> bool:
        return self.first_divergence is not None

    def as_json(self) -> dict:
        result = dataclasses.asdict(self)
        result["diverged"] = self.diverged
        return result


def _record_keys(spark, store: str, crc: str) -> DataFrame:
    df = read(spark, store, crc=crc, damaged="flag")  # a damaged record is a difference to report
    entries = F.map_entries("properties")
    digest = F.xxhash64(*_RECORD_FIELDS, entries)
    return df.select("phy_offset", (F.col("phy_offset") + F.col("size")).alias("end"), digest.alias("digest"), "crc_ok")


def audit(spark: SparkSession, master: str, slave: str, *, crc: str = "crc32c", ranges_max: int = 1000) -> AuditReport:
    """Compare the slave's log with the master's record by record (offset, size, every field and
    a hash of the body). Below the slave's end, a master record the slave lacks is ``missing``, a
    slave record the master lacks is ``extra`` (a slave record past the master's end is extra
    too), and one that differs is ``differs``; adjacent records of one kind form a range. Master
    records past the slave's end are replication lag, counted but not divergence."""
    m = _record_keys(spark, master, crc).alias("m")
    s = _record_keys(spark, slave, crc).alias("s")
    m.cache()
    s.cache()
    m_count, m_end = m.agg(F.count(F.lit(1)), F.coalesce(F.max("end"), F.lit(0))).first()
    s_count, s_end = s.agg(F.count(F.lit(1)), F.coalesce(F.max("end"), F.lit(0))).first()
    joined = m.join(s, F.col("m.phy_offset") == F.col("s.phy_offset"), "full_outer")
    offset = F.coalesce(F.col("m.phy_offset"), F.col("s.phy_offset"))
    end = F.coalesce(F.col("m.end"), F.col("s.end"))
    kind = (
        F.when(F.col("s.phy_offset").isNull() & (F.col("m.phy_offset") >= F.lit(s_end)), F.lit("lag"))
        .when(F.col("s.phy_offset").isNull(), F.lit("missing"))
        .when(F.col("m.phy_offset").isNull(), F.lit("extra"))
        .when((F.col("m.end") != F.col("s.end")) | (F.col("m.digest") != F.col("s.digest")), F.lit("differs"))
        .when(F.col("m.crc_ok") != F.col("s.crc_ok"), F.lit("differs"))
        .otherwise(F.lit("same"))
    )
    classified = joined.select(offset.alias("phy_offset"), end.alias("end"), kind.alias("kind"))
    classified.cache()
    counts = {row["kind"]: row["count"] for row in classified.groupBy("kind").count().collect()}
    diffs = classified.where(F.col("kind").isin("missing", "extra", "differs"))
    order = Window.orderBy("phy_offset")
    starts_range = (
        F.lag("end").over(order).isNull()
        | (F.lag("end").over(order) != F.col("phy_offset"))
        | (F.lag("kind").over(order) != F.col("kind"))
    )
    grouped = (
        diffs.withColumn("new", starts_range.cast("int"))
        .withColumn("group", F.sum("new").over(order.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        .groupBy("group", "kind")
        .agg(F.min("phy_offset").alias("start"), F.max("end").alias("end"), F.count(F.lit(1)).alias("records"))
        .orderBy("start")
        .limit(ranges_max)
    )
    ranges = [Range(row["kind"], row["start"], row["end"], row["records"]) for row in grouped.collect()]
    unclean = [
        row.asDict()
        for row in segments(spark, [master, slave]).where(~F.col("clean")).orderBy("store", "file_from_offset").collect()
    ]
    for frame in (m, s, classified):
        frame.unpersist()
    return AuditReport(
        master=master,
        slave=slave,
        master_records=m_count,
        slave_records=s_count,
        master_end=m_end,
        slave_end=s_end,
        compared=counts.get("same", 0) + counts.get("differs", 0),
        not_yet_replicated=counts.get("lag", 0),
        not_yet_replicated_bytes=max(m_end - s_end, 0),
        ranges=ranges,
        first_divergence=ranges[0].start if ranges else None,
        unclean_segments=unclean,
    )
