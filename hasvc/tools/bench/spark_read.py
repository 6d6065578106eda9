"""``hasvc bench spark-read``: the hasvc data source against the reader a user would write by hand.

One store of 1 KiB records (``size_gib`` of log, segments of ``segment_mib`` — small enough for
``binaryFile``, which reads each whole file into the JVM and runs out of heap on 1 GiB segments)
is read in one SparkSession by two readers, each into ``count()`` and into a Parquet export:

- **hasvc**: ``spark.read.format("hasvc")`` — one partition per segment, each task maps its file
  and decodes it with ``commitlog.columnar`` into Arrow batches.
- **binaryFile + mapInArrow**: ``spark.read.format("binaryFile")`` hands each file's bytes to a
  ``mapInArrow`` function that decodes them with the same ``commitlog.columnar`` decoder.

Both produce the same columns. The readers alternate inside every run so that the machine's
noise falls on both; we print each run, then medians, rows/s, MB/s of log bytes and the ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from commitlog.mapped_file import parse_segment_name
from hasvc.tools.bench.store import RECORD_SIZE, build_store, machine

def _decode_files(batches):
    """mapInArrow function of the hand-written reader: each binaryFile row is one whole segment."""
    from commitlog import columnar

    for batch in batches:
        paths = batch.column("path").to_pylist()
        contents = batch.column("content")
        for index, path in enumerate(paths):
            buffer = contents[index].as_buffer()
            file_from_offset = parse_segment_name(os.path.basename(path.replace("file:", "")))
            decoded, _ = columnar.decode_range(
                buffer, start=0, stop=len(buffer), segment_end=len(buffer), file_from_offset=file_from_offset,
                store="bench",
            )  # fmt: skip
            yield from decoded


def bench_spark_read(*, size_gib: float, segment_mib: int, runs: int, master: str, directory: str | None, keep: bool,
                     echo=print) -> dict:  # fmt: skip
    from hasvc import spark as hs

    owned = directory is None
    directory = directory or tempfile.mkdtemp(prefix="hasvc-bench-spark-")
    store = os.path.join(directory, "store")
    out = os.path.join(directory, "export")
    try:
        records, log_bytes = build_store(store, size_gib=size_gib, segment_mib=segment_mib, echo=echo)
        started = time.monotonic()
        # binaryFile hands whole files to mapInArrow, by default up to 10,000 per Arrow batch: with
        # 64 MiB files that exhausts the default 1 GiB heap, so the hand-written reader gets one file
        # per batch and both readers get a 4 GiB driver (settings a user of binaryFile would need).
        spark = hs.session(master, conf={"spark.driver.memory": "4g", "spark.sql.execution.arrow.maxRecordsPerBatch": "1"})
        echo(f"SparkSession {master} started in {time.monotonic() - started:.1f} s")

        def hasvc_reader():
            return hs.read(spark, store)

        def binary_file_reader():
            files = spark.read.format("binaryFile").option("pathGlobFilter", "[0-9]*").load(os.path.join(store, "commitlog"))
            return files.mapInArrow(_decode_files, hs.RECORDS_SCHEMA)

        readers = {"hasvc": hasvc_reader, "binaryFile+mapInArrow": binary_file_reader}
        workloads = {
            "count": lambda df: df.count(),
            "parquet": lambda df: df.write.mode("overwrite").parquet(out),
        }
        # warm-up: JIT and the first Python workers, on a slice of the data
        hs.read(spark, store, to_offset=64 << 20).count()
        times: dict[tuple[str, str], list[float]] = {(r, w): [] for r in readers for w in workloads}
        if runs < 1:
            raise ValueError("--runs must be at least 1")
        for run in range(runs):
            for workload, action in workloads.items():
                for reader, make in readers.items():
                    t0 = time.monotonic()
                    result = action(make())
                    elapsed = time.monotonic() - t0
                    if workload == "count" and result != records:
                        raise RuntimeError(f"{reader} counted {result} records, expected {records}")
                    times[(reader, workload)].append(elapsed)
                    echo(f"run {run + 1}/{runs}  {workload:<8} {reader:<22} {elapsed:6.2f} s  {log_bytes / elapsed / 1e6:6.0f} MB/s")
        spark.stop()
        results = {}
        echo("")
        echo(f"{records:,} records of {RECORD_SIZE} B, {log_bytes / 1e9:.2f} GB in {segment_mib} MiB segments, {master}, median of {runs}")
        echo(f"{'workload':<9} {'reader':<22} {'seconds':>8} {'rows/s':>10} {'MB/s':>7}")
        for workload in workloads:
            for reader in readers:
                values = times[(reader, workload)]
                median = statistics.median(values)
                results[f"{workload}/{reader}"] = {
                    "seconds": values, "median_s": median, "rows_per_s": records / median, "mb_per_s": log_bytes / median / 1e6,
                }  # fmt: skip
                echo(f"{workload:<9} {reader:<22} {median:8.2f} {records / median:10,.0f} {log_bytes / median / 1e6:7.0f}")
            ratio = statistics.median(times[("binaryFile+mapInArrow", workload)]) / statistics.median(times[("hasvc", workload)])
            results[f"{workload}/ratio"] = ratio
            echo(f"{workload:<9} {'hasvc vs hand-written':<22} {ratio:8.2f}x")
        return {"machine": machine(), "records": records, "log_bytes": log_bytes, "segment_mib": segment_mib,
                "master": master, "runs": runs, "results": results}  # fmt: skip
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if owned and not keep:
            shutil.rmtree(directory, ignore_errors=True)
        elif keep:
            echo(f"kept {directory}")
