import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zlib

import pytest
from click.testing import CliRunner

from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.store import MessageStore
from hasvc.cli import main
from tests.sizes import SEGMENT_SIZE


@pytest.fixture
def store_dir(tmp_path, small_config):
    path = tmp_path / "store"
    with MessageStore.open(str(path), small_config) as store:
        for i in range(300):
            store.append([rec.Message("Orders" if i % 2 else "Audit", f"body-{i}".encode() * 40, queue_id=i % 2,
                                      properties={"TAGS": "x", "KEYS": str(i)})])  # fmt: skip
    return path


def tree_digest(path) -> dict:
    digest = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as file:
                digest[full] = (hashlib.sha256(file.read()).hexdigest(), os.stat(full).st_mtime_ns)
    return digest


def test_verify_clean_store_reads_only(store_dir):
    before = tree_digest(store_dir)
    result = CliRunner().invoke(main, ["store", "verify", str(store_dir), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["records"] == 300 and report["corrupt_offset"] is None and report["reason"] is None
    assert report["min_offset"] == 0 and report["max_offset"] > SEGMENT_SIZE
    assert report["topics"] == {"Orders": 150, "Audit": 150}
    assert tree_digest(store_dir) == before


def test_verify_reports_the_first_corrupt_offset_and_exits_1(store_dir, small_config):
    with MessageStore.open(str(store_dir), small_config) as store:
        target = store.pull("Orders", 1, 50, 1)[0].physical_offset
    path = store_dir / "commitlog" / f"{target // SEGMENT_SIZE * SEGMENT_SIZE:020d}"
    with open(path, "r+b") as file:
        file.seek(target % SEGMENT_SIZE + 120)
        file.write(b"!")
    result = CliRunner().invoke(main, ["store", "verify", str(store_dir), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["corrupt_offset"] == target and report["reason"] == "body CRC mismatch"
    text = CliRunner().invoke(main, ["store", "verify", str(store_dir)])
    assert f"CORRUPT at offset {target}: body CRC mismatch" in text.output


def test_verify_and_dump_work_on_a_bare_copied_commitlog(store_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(store_dir / "commitlog", bare / "commitlog")
    result = CliRunner().invoke(main, ["store", "verify", str(bare), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["records"] == 300
    dumped = CliRunner().invoke(main, ["store", "dump", str(bare), "--count", "2", "--json"])
    assert len(dumped.output.splitlines()) == 2


def test_dump_json_fields_and_from_offset(store_dir):
    result = CliRunner().invoke(main, ["store", "dump", str(store_dir), "--json", "--count", "3"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [line["queue_offset"] for line in lines] == [0, 0, 1]
    first = lines[0]
    for key in ("offset", "size", "topic", "queue_id", "queue_offset", "properties", "born_timestamp", "store_timestamp", "body_base64"):
        assert key in first
    assert base64.b64decode(first["body_base64"]) == b"body-0" * 40
    assert first["properties"] == {"TAGS": "x", "KEYS": "0"} and first["crc_ok"]
    second = CliRunner().invoke(main, ["store", "dump", str(store_dir), "--json", "--from", str(lines[1]["offset"]), "--count", "1"])
    assert json.loads(second.output)["offset"] == lines[1]["offset"]
    bad = CliRunner().invoke(main, ["store", "dump", str(store_dir), "--from", str(lines[1]["offset"] + 3)])
    assert bad.exit_code != 0 and "not a record boundary" in bad.output


def test_verify_missing_directory_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["store", "verify", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such directory" in result.output  # the help: 2 when it cannot be read at all


def test_verify_with_crc32_reads_a_rocketmq_written_store(tmp_path):
    config = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, crc="crc32")
    with MessageStore.open(str(tmp_path), config) as store:
        store.append([rec.Message("Rocket", b"zlib body")])
        record = store.get_record(0)
        assert record.body_crc == zlib.crc32(b"zlib body") & 0x7FFFFFFF
    assert CliRunner().invoke(main, ["store", "verify", str(tmp_path), "--crc", "crc32"]).exit_code == 0
    wrong = CliRunner().invoke(main, ["store", "verify", str(tmp_path)])
    assert wrong.exit_code == 1 and "CRC" in wrong.output


def test_every_command_has_help():
    for args in (["--help"], ["store", "--help"], ["store", "verify", "--help"], ["store", "dump", "--help"],
                 ["store", "demo", "--help"], ["bench", "append", "--help"], ["bench", "recover", "--help"]):  # fmt: skip
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0 and "Usage:" in result.output


def test_console_script_runs_the_demo_end_to_end(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hasvc.cli", "store", "demo", "--messages", "20000", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo: OK" in done.stdout and "all " in done.stdout


def test_verify_accepts_a_preallocated_empty_segment_after_the_data(store_dir):
    last = sorted(os.listdir(store_dir / "commitlog"))[-1]
    spare = store_dir / "commitlog" / f"{int(last) + SEGMENT_SIZE:020d}"
    spare.write_bytes(bytes(SEGMENT_SIZE))  # what a crash leaves when the next segment was warmed ahead
    assert CliRunner().invoke(main, ["store", "verify", str(store_dir)]).exit_code == 0
    spare.write_bytes(b"junk" + bytes(SEGMENT_SIZE - 4))
    result = CliRunner().invoke(main, ["store", "verify", str(store_dir), "--json"])
    assert result.exit_code == 1 and "later segments hold data" in json.loads(result.output)["reason"]


@pytest.mark.parametrize("module", ["hasvc", "hasvc.cli"])
def test_python_dash_m_runs_the_cli(module):
    """``python -m hasvc`` and ``python -m hasvc.cli`` are the ``hasvc`` console script."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "master" in done.stdout and "node" in done.stdout and "bench" in done.stdout
