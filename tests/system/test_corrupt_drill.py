"""``hasvc drill --fault corrupt`` end to end, in each mode: the middle rounds check what changed
since the round before, the last one every store whole, and nothing acknowledged is lost."""

from __future__ import annotations

import json
import subprocess
import sys

DRILL_TIMEOUT_SECONDS = 900  # a drill that hangs fails the test instead of the CI run


def _drill(tmp_path, *args: str) -> dict:
    report = tmp_path / "drill.json"
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--fault", "corrupt", "--rounds", "3", "--producers", "4",
                           "--seed", "5", "--report", str(report), *args], capture_output=True, text=True,
                          timeout=DRILL_TIMEOUT_SECONDS)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["ok"] and data["acknowledged"] > 0 and len(data["rounds"]) == 3
    return data


def test_a_classic_corrupt_drill_checks_each_round_since_the_last_and_the_last_round_whole(tmp_path):
    data = _drill(tmp_path, "--mode", "sync")
    assert data["lost"] == 0
    checked = [r["checked"] for r in data["rounds"]]
    assert checked[0] == "full (the first check)"
    assert checked[1].startswith(("since offset ", "full (rewritten since verified: "))
    assert checked[2] == "full (the last round)"
    assert all(r["checks"]["identical"] and r["checks"]["duplicated"] == 0 and not r["checks"]["queues"] for r in data["rounds"])


def test_a_dledger_corrupt_drill_checks_each_round_since_the_last_and_the_last_round_whole(tmp_path):
    data = _drill(tmp_path, "--mode", "dledger")
    seconds = [r["seconds"] for r in data["rounds"]]
    assert "full check (the first check)" in seconds[0]
    assert "checked since pos " in seconds[1] or "full check (rewritten since verified: " in seconds[1]
    assert "full check (the last round)" in seconds[2]
    assert all(r["identical"] and r["lost"] == 0 and r["duplicated"] == 0 for r in data["rounds"])
