"""The Spark data source and jobs on a real local SparkSession, over stores written by MessageStore."""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("numpy")
if shutil.which("java") is None:  # pragma: no cover - .ci/run installs a JRE
    pytest.skip("Spark needs Java 17+ on the PATH", allow_module_level=True)

from pyspark.sql import functions as F  # noqa: E402

from commitlog import record as rec  # noqa: E402
from commitlog.config import StoreConfig  # noqa: E402
from commitlog.store import MessageStore  # noqa: E402
from hasvc import spark as hs  # noqa: E402

SEGMENT = 2 * 1024 * 1024  # above split_size's 1 MiB minimum, so a segment can be split
TOPICS = ("orders", "payments", "audit")


@pytest.fixture(scope="session")
def spark():
    session = hs.session("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


def write_store(path, count, *, body_size=lambda i: 200 + (i * 37) % 900, born_hosts=("10.0.0.1", "10.0.0.2")):
    """``count`` messages over three topics; returns what was appended, keyed by physical offset."""
    written = {}
    with MessageStore.open(str(path), StoreConfig(commitlog_segment_size=SEGMENT)) as store:
        for first in range(0, count, 50):
            messages = [
                rec.Message(
                    TOPICS[i % 3], bytes([i % 251]) * body_size(i), queue_id=i % 4,
                    properties={"TAGS": f"tag{i % 2}", "KEYS": f"key-{i}"}, born_timestamp=1_700_000_000_000 + i,
                    born_host=(born_hosts[i % len(born_hosts)], 4000 + i % 3),
                )  # fmt: skip
                for i in range(first, min(first + 50, count))
            ]
            result = store.append(messages)
            assert result.status is rec.PutMessageStatus.PUT_OK
            for message, offset, queue_offset in zip(messages, result.offsets, result.queue_offsets):
                written[offset] = (message, store.get_record(offset).size, queue_offset)
    return written


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("master")
    return str(path), write_store(path, 6000)


def test_every_record_with_its_fields(spark, store):
    path, written = store
    rows = hs.read(spark, path).orderBy("phy_offset").collect()
    assert len(rows) == len(written) == 6000
    assert len(os.listdir(os.path.join(path, "commitlog"))) >= 3  # several segments, one partition each
    for row, (offset, (message, size, queue_offset)) in zip(rows, sorted(written.items())):
        assert (row.store, row.phy_offset, row.size, row.topic) == (path, offset, size, message.topic)
        assert (row.queue_id, row.queue_offset, row.body) == (message.queue_id, queue_offset, message.body)
        assert (row.tags, row.keys) == (message.properties["TAGS"], message.properties["KEYS"])
        assert row.properties == message.properties and row.crc_ok and row.body_size == len(message.body)
        assert row.born_host == f"{message.born_host[0]}:{message.born_host[1]}"
        assert row.born_ts.timestamp() * 1000 == pytest.approx(message.born_timestamp)


def test_several_stores_at_once_and_options(spark, store, tmp_path):
    path, written = store
    other = str(tmp_path / "other")
    write_store(other, 100)
    counts = {r.store: r["count"] for r in hs.read(spark, [path, other]).groupBy("store").count().collect()}
    assert counts == {path: 6000, other: 100}
    offsets = sorted(written)
    window = hs.read(spark, path, from_offset=offsets[100], to_offset=offsets[3000], topics="orders,audit")
    expected = [o for o in offsets[100:3000] if written[o][0].topic in ("orders", "audit")]
    assert [r.phy_offset for r in window.orderBy("phy_offset").select("phy_offset").collect()] == expected
    no_body = hs.read(spark, path, include_body=False)
    assert "body" not in no_body.columns and no_body.count() == 6000


def test_a_split_segment_yields_each_record_once(spark, store):
    path, written = store
    whole = hs.read(spark, path)
    split = hs.read(spark, path, split_size=1024 * 1024)
    assert split.rdd.getNumPartitions() > whole.rdd.getNumPartitions()
    offsets = [r.phy_offset for r in split.select("phy_offset").collect()]
    assert len(offsets) == len(set(offsets)) and sorted(offsets) == sorted(written)
    ranges = hs.segments(spark, path, split_size=1024 * 1024).collect()
    assert sum(r.records for r in ranges) == 6000 and all(r.clean for r in ranges)


def damaged_copy(source, target, damage):
    shutil.copytree(source, target)
    segment = sorted(os.listdir(os.path.join(target, "commitlog")))[-1]
    with open(os.path.join(target, "commitlog", segment), "r+b") as file:
        damage(file, int(segment))
    return target


def record_at(written, index):
    offset = sorted(written)[index]
    return offset, written[offset]


def test_a_torn_tail_ends_the_segment_and_is_reported(spark, store, tmp_path):
    path, written = store
    last_offset, (_, last_size, _) = record_at(written, -1)

    def tear(file, file_from):  # the last record's second half never reached the disk
        file.seek(last_offset - file_from + last_size // 2)
        file.write(bytes(last_size - last_size // 2))

    torn = damaged_copy(path, str(tmp_path / "torn"), tear)
    assert hs.read(spark, torn).count() == 5999
    [report] = hs.segments(spark, torn).where(~F.col("clean")).collect()
    assert report.valid_end == last_offset and "do not add up" in report.stop_reason


def test_a_bit_flip_fails_the_query_or_with_damaged_flag_is_a_row_with_crc_ok_false(spark, store, tmp_path):
    path, written = store
    offset, (message, size, _) = record_at(written, -10)

    def flip(file, file_from):
        file.seek(offset - file_from + size - len(message.body) - 30)  # inside the body
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0x04]))

    flipped = damaged_copy(path, str(tmp_path / "flipped"), flip)
    bad = hs.read(spark, flipped, damaged="flag").where(~F.col("crc_ok")).select("phy_offset").collect()
    assert [r.phy_offset for r in bad] == [offset]
    assert hs.read(spark, flipped, damaged="flag").count() == 6000
    # by default the damaged body is never handed out: the query fails naming it, whatever it selects
    segment = os.path.join(flipped, "commitlog", f"{offset // SEGMENT * SEGMENT:020d}")
    with pytest.raises(Exception, match=f"record at offset {offset} is damaged .body CRC mismatch; {segment}"):
        hs.read(spark, flipped).select("body").collect()
    assert hs.read(spark, flipped, crc="none").count() == 6000  # crc=none checks nothing


def test_a_missing_store_is_a_clear_error(spark, store, tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        hs.read(spark, str(tmp_path / "nowhere")).count()
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="has no commitlog/ directory"):
        hs.read(spark, str(tmp_path / "empty")).count()
    with pytest.raises(Exception, match="crc must be one of"):
        hs.read(spark, store[0], crc="md5").count()
    with pytest.raises(Exception, match="damaged must be one of fail, flag"):
        hs.read(spark, store[0], damaged="skip").count()


def test_audit_of_an_identical_copy_passes(spark, store, tmp_path):
    path, _ = store
    copy = shutil.copytree(path, str(tmp_path / "copy"))
    report = hs.audit(spark, path, copy)
    assert not report.diverged and report.ranges == [] and report.compared == 6000
    assert report.not_yet_replicated == 0 and report.master_end == report.slave_end


def test_audit_of_a_lagging_slave_passes_and_counts_the_lag(spark, store, tmp_path):
    path, written = store
    lagging = str(tmp_path / "lagging")
    write_store(lagging, 5000)  # the same messages in the same order: a byte prefix, up to timestamps
    offsets = sorted(written)
    report = hs.audit(spark, path, lagging)
    # store timestamps differ between two writes, so every shared record differs: proves the digest sees them
    assert report.diverged and report.ranges[0].kind == "differs" and report.ranges[0].start == 0
    shutil.rmtree(lagging)
    shutil.copytree(path, lagging)
    MessageStore.open(lagging, StoreConfig(commitlog_segment_size=SEGMENT)).truncate(offsets[5000])
    report = hs.audit(spark, path, lagging)
    assert not report.diverged and report.slave_records == 5000 and report.not_yet_replicated == 1000
    assert report.not_yet_replicated_bytes == report.master_end - offsets[5000]


def test_audit_of_a_tampered_copy_names_the_offset(spark, store, tmp_path):
    path, written = store
    offset, (message, size, _) = record_at(written, -100)

    def tamper(file, file_from):
        file.seek(offset - file_from + size - len(message.body) - 30)
        file.write(b"X")

    tampered = damaged_copy(path, str(tmp_path / "tampered"), tamper)
    report = hs.audit(spark, path, tampered)
    assert report.diverged and report.first_divergence == offset
    assert [(r.kind, r.start, r.end, r.records) for r in report.ranges] == [("differs", offset, offset + size, 1)]


def test_export_parquet_partitioned_and_json(spark, store, tmp_path):
    path, written = store
    out = str(tmp_path / "parquet")
    hs.export(spark, path, out, partition_by=["topic", "date"])
    assert sorted(name for name in os.listdir(out) if name.startswith("topic=")) == sorted(f"topic={t}" for t in TOPICS)
    assert all(name.startswith("date=") for t in TOPICS for name in os.listdir(os.path.join(out, f"topic={t}")))
    back = spark.read.parquet(out)
    assert back.count() == 6000
    first = back.where(F.col("phy_offset") == 0).first()
    assert first.body == written[0][0].body and first.topic == written[0][0].topic
    out_json = str(tmp_path / "json")
    hs.export(spark, path, out_json, format="json", topics="payments")
    lines = []
    for name in sorted(os.listdir(out_json)):
        if name.endswith(".json"):
            with open(os.path.join(out_json, name)) as file:
                lines += [json.loads(line) for line in file]
    assert len(lines) == 2000 and {line["topic"] for line in lines} == {"payments"}


def test_stats_per_topic(spark, store):
    path, written = store
    table = {r.topic: r for r in hs.stats(spark, path, by=["topic"]).collect()}
    assert set(table) == set(TOPICS)
    for topic, row in table.items():
        mine = [(m, size) for m, size, _ in written.values() if m.topic == topic]
        assert row.messages == len(mine) and row.bytes == sum(size for _, size in mine)
        assert row.body_max == max(len(m.body) for m, _ in mine)
        assert row.producers == 2 and row.crc_failures == 0
    per_minute = hs.stats(spark, path).collect()
    assert sum(r.messages for r in per_minute) == 6000


def spark_env():
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


def test_cli_audit_exits_1_on_divergence_under_spark_submit(store, tmp_path):
    """The spark-submit path: scripts/spark_audit.py with the package shipped as --py-files."""
    path, written = store
    offset, (message, size, _) = record_at(written, 10)
    tampered = str(tmp_path / "tampered")
    shutil.copytree(path, tampered)
    with open(os.path.join(tampered, "commitlog", "00000000000000000000"), "r+b") as file:
        file.seek(offset + size - len(message.body) - 30)
        file.write(b"Y")
    pyfiles = str(tmp_path / "hasvc.zip")
    hasvc = os.path.join(os.path.dirname(sys.executable), "hasvc")
    subprocess.run([hasvc, "spark", "pyfiles", pyfiles], check=True, capture_output=True)
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above tests/spark/
    done = subprocess.run(
        [submit, "--master", "local[2]", "--py-files", pyfiles, os.path.join(root, "scripts", "spark_audit.py"), path, tampered],
        env=spark_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"DIVERGED at offset {offset}" in done.stdout
    assert f"differs     [{offset}, {offset + size})  1 records" in done.stdout


def test_bench_spark_read_runs_as_a_user_runs_it(tmp_path):
    """`hasvc bench spark-read` end to end on a small store: both readers count every record
    (the command checks the count itself) and the JSON report holds both medians and the ratios."""
    hasvc = os.path.join(os.path.dirname(sys.executable), "hasvc")
    report = tmp_path / "bench.json"
    done = subprocess.run(
        [hasvc, "bench", "spark-read", "--size-gib", "0.01", "--segment-mib", "2", "--runs", "1",
         "--dir", str(tmp_path / "bench"), "--json", str(report)],
        env=spark_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["records"] == 10486 and data["log_bytes"] == 10486 * 1024
    for workload in ("count", "parquet"):
        for reader in ("hasvc", "binaryFile+mapInArrow"):
            assert len(data["results"][f"{workload}/{reader}"]["seconds"]) == 1
        assert data["results"][f"{workload}/ratio"] > 0
    assert "count     hasvc vs hand-written" in done.stdout
    assert os.path.exists(tmp_path / "bench" / "store" / "bench-store.txt")  # --dir keeps the store for reuse
