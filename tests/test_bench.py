"""The benchmarks run as a user runs them (small sizes; no assertion on speed)."""

import json
import os
import subprocess
import sys

HASVC = [sys.executable, "-m", "hasvc.cli"]


def test_bench_catch_up_copies_the_whole_log_and_stops_its_processes(tmp_path):
    report = tmp_path / "catch-up.json"
    done = subprocess.run(
        [*HASVC, "bench", "catch-up", "--size-gib", "0.02", "--runs", "2", "--dir", str(tmp_path / "b"), "--json", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    log_bytes = data["settings"]["log_bytes"]
    assert log_bytes >= 0.02 * (1 << 30) and data["settings"]["records"] * 1024 == log_bytes
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        assert run["seconds"] > 0 and run["dispatched_seconds"] >= run["seconds"]
        assert run["bytes_per_s"] == log_bytes / run["seconds"]
        assert run["send_ceiling_bytes_per_s"] > 0 and run["sendfile_ceiling_bytes_per_s"] > 0
    assert "catch-up / send" in done.stdout
    # every slave store was deleted, the master's store kept for reuse (--dir), and no broker is left
    assert sorted(os.listdir(tmp_path / "b")) == ["master", "master.log", "slave-0.log", "slave-1.log"]
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftover == []
