"""``hasvc drill --mode controller`` with a group of three controllers, short: real processes on
loopback, the controller leader SIGKILLed under load. The brokers must go on acknowledging writes
while the other controllers elect a new leader, keep their master and epoch (no broker election),
and all find the new leader by themselves; nothing acknowledged is lost (checked from disk)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

DRILL_TIMEOUT_SECONDS = 600  # a loaded CI machine; a round takes seconds


def _drill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--mode", "controller", *args],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_SECONDS)  # fmt: skip


def test_a_controller_leader_sigkill_under_load_does_not_stop_writes(tmp_path) -> None:
    report_path = tmp_path / "report.json"
    done = _drill("--controllers", "3", "--nodes", "2", "--fault", "kill-controller-leader", "--rounds", "1",
                  "--producers", "2", "--report", str(report_path))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["controllers"] == 3 and report["ok"]
    (round_,) = report["rounds"]
    assert round_["fault"] == "kill-controller-leader" and round_["lost"] == 0 and round_["duplicated"] == 0
    assert round_["controller_leader"] not in ("", round_["killed"])  # another controller leads, every broker found it
    assert round_["master_kept"]  # the same master in the same epoch after the controller failover
    assert round_["writes_during"] > 0  # acknowledged between the kill and the brokers finding the new leader


def test_a_master_cut_off_from_three_controllers_is_replaced_and_loses_nothing(tmp_path) -> None:
    # each broker reaches each controller only through its relays, also after a NOT_LEADER answer
    # named the leader: cutting the master's relays cuts it off from all three
    report_path = tmp_path / "report.json"
    done = _drill("--controllers", "3", "--fault", "partition-master", "--rounds", "1", "--producers", "2",
                  "--report", str(report_path))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (round_,) = json.loads(report_path.read_text())["rounds"]
    assert round_["new_master"] != round_["killed"] and round_["lost"] == 0 and round_["identical"]


def test_a_controller_leader_kill_needs_a_group_of_controllers() -> None:
    done = _drill("--fault", "kill-controller-leader")
    assert done.returncode == 2 and "--controllers 3" in done.stderr


def test_the_demo_in_controller_mode_fails_a_pair_over_by_itself_and_removes_its_stores() -> None:
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "demo", "--controller", "--producers", "4", "--no-keep"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_SECONDS)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "summary: OK" in out and "0 lost, 0 duplicated" in out and "nobody promoted anyone" in out
    assert "new master" in out and "logs and consume queues byte-identical: True" in out
    assert "SYNC_MASTER" in out and "SLAVE" in out and "controller c0: master" in out
    removed = re.search(r"stores removed \((.+)\)", out)
    assert removed and not os.path.exists(removed.group(1))


def test_an_async_drill_reports_accepted_losses_apart_and_loses_nothing_else(tmp_path) -> None:
    # ASYNC_MASTER brokers: a lone new master acknowledges at once (no wait for the restart); what
    # only the old master acknowledged may be gone after the failover, reported as accepted
    report_path = tmp_path / "report.json"
    done = _drill("--role", "async", "--nodes", "2", "--fault", "partition-master", "--rounds", "1", "--producers", "2",
                  "--report", str(report_path))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["role"] == "ASYNC_MASTER" and report["ok"] and report["accepted_lost"] >= 0
    (round_,) = report["rounds"]
    assert round_["new_master"] != round_["killed"] and round_["lost"] == 0 and round_["identical"]
    assert "ASYNC_MASTER" in done.stdout and "accepted lost" in done.stdout


def test_the_role_option_goes_with_controller_mode_only() -> None:
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "drill", "--mode", "sync", "--role", "async"],
                          capture_output=True, text=True, timeout=DRILL_TIMEOUT_SECONDS)  # fmt: skip
    assert done.returncode == 2 and "--role goes with --mode controller" in done.stderr
