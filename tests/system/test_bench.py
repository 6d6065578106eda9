"""The benchmarks run as a user runs them (small sizes; no assertion on speed)."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from commitlog.pagecache import PAGE, drop_from_page_cache, resident_pages

HASVC = [sys.executable, "-m", "hasvc.cli"]


@pytest.mark.parametrize("cold", [False, True])
def test_bench_catch_up_copies_the_whole_log_and_stops_its_processes(tmp_path, cold):
    report = tmp_path / "catch-up.json"
    done = subprocess.run(
        [*HASVC, "bench", "catch-up", "--size-gib", "0.02", "--runs", "2", "--dir", str(tmp_path / "b"), "--json", str(report),
         *(["--cold"] if cold else [])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["settings"]["cold"] is cold and ("dropped from the page cache" in done.stdout) is cold
    log_bytes = data["settings"]["log_bytes"]
    assert log_bytes >= 0.02 * (1 << 30) and data["settings"]["records"] * 1024 == log_bytes
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        assert run["seconds"] > 0 and run["dispatched_seconds"] >= run["seconds"]
        assert run["bytes_per_s"] == log_bytes / run["seconds"]
        assert run["send_ceiling_bytes_per_s"] > 0 and run["sendfile_ceiling_bytes_per_s"] > 0
        assert run["fraction_of_files"] == run["bytes_per_s"] / run["files_ceiling_bytes_per_s"]
    assert "catch-up / send" in done.stdout
    # every slave store was deleted, the master's store kept for reuse (--dir), and no broker is left
    assert sorted(os.listdir(tmp_path / "b")) == ["master", "master.log", "slave-0.log", "slave-1.log"]
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftover == []


ENVELOPE = {"benchmark", "machine", "versions", "settings"}


def _in(tmp_path) -> dict[str, str]:
    """The environment for a script or benchmark whose temporary directories go under ``tmp_path``
    (parallel test workers: what one leaves is not confused with another's)."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def run_bench(tmp_path, *args) -> tuple[dict, str]:
    report = tmp_path / f"{args[0]}.json"
    done = subprocess.run([*HASVC, "bench", *args, "--json", str(report)], capture_output=True, text=True, timeout=300,
                          env=_in(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data.keys() >= ENVELOPE and data["benchmark"] == args[0]
    assert data["machine"]["cpus"] == os.cpu_count() and data["versions"]["trio"]
    return data, done.stdout


@pytest.mark.parametrize("load_generator", ["c", "python"])
def test_bench_sync_write_reports_every_run_its_statuses_and_every_process(tmp_path, load_generator):
    if load_generator == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler for scripts/hasvc_load.c")
    data, out = run_bench(tmp_path, "sync-write", "--producers", "8", "--batch", "4", "--duration", "1", "--runs", "2",
                          "--load-generator", load_generator)  # fmt: skip
    assert data["settings"]["load_generator"] == load_generator and f"{load_generator} load generator" in out
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        # every acknowledged message was counted under PUT_OK, in whole requests of 4
        assert run["statuses"]["PUT_OK"] == pytest.approx(run["acked_per_second"] * run["seconds"]) and run["requests"] > 0
        assert run["statuses"]["PUT_OK"] == 4 * run["requests"]
        assert run["p50_us"] <= run["p99_us"] <= run["p999_us"]
        assert set(run["cpu_percent"]) == {"master", "slave", "load generator"}
    for key in ("acked_per_second", "mb_per_second", "p50_us", "p99_us", "p999_us"):
        low, median, high = data["summary"][key]["low"], data[key], data["summary"][key]["high"]
        assert low <= median <= high
    assert data["statuses"] == {"PUT_OK": sum(run["statuses"]["PUT_OK"] for run in data["runs"])}


def test_bench_sync_write_against_a_controller_managed_pair_waits_for_its_set_and_removes_it(tmp_path):
    data, out = run_bench(tmp_path, "sync-write", "--mode", "controller", "--producers", "4", "--duration", "0.5",
                          "--runs", "1", "--load-generator", "python")  # fmt: skip
    assert data["settings"]["role"] == "controller" and data["settings"]["target"] == "local controller-managed pair"
    (run,) = data["runs"]
    # the run starts once the slave is in the elected master's SyncStateSet (a loaded machine may
    # still see the set shrink for a moment and a put answered otherwise: not counted as acked)
    assert run["statuses"].get("PUT_OK", 0) > 0
    assert set(run["cpu_percent"]) == {"master", "slave", "controller", "load generator"}
    assert glob.glob(os.path.join(tmp_path, "hasvc-bench-controller-*")) == []


def test_bench_read_alternates_the_check_and_reads_every_record_in_both_layers(tmp_path):
    report = tmp_path / "read.json"
    done = subprocess.run([*HASVC, "bench", "read", "--size-gib", "0.005", "--pairs", "2", "--dir", str(tmp_path / "b"),
                           "--json", str(report)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    records = int(0.005 * (1 << 30)) // 1024
    runs = data["runs"]
    assert [(r["pair"], r["check"], r["layer"]) for r in runs] == [
        (0, True, "store"), (0, True, "broker"), (0, False, "store"), (0, False, "broker"),
        (1, False, "store"), (1, False, "broker"), (1, True, "store"), (1, True, "broker")]  # fmt: skip
    assert all(r["records"] == records and r["cpu_us_per_record"] > 0 for r in runs)
    assert len(data["summary"]["broker_cpu_us_per_record"]["on_over_off_per_pair"]) == 2
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftover == []


def test_bench_append_and_recover_share_the_family_shape(tmp_path):
    data, _ = run_bench(tmp_path, "append", "--sizes", "1024", "--batch", "1", "--flush", "async", "--runs", "2", "--seconds", "0.3")
    (result,) = data["results"]
    assert len(result["runs"]) == 2 and result["msgs_per_second"]["low"] <= result["msgs_per_second"]["median"]
    data, _ = run_bench(tmp_path, "recover", "--size-mb", "16", "--runs", "2", "--segment-size-mb", "8")
    native = data["scan"].get("native") or data["scan"]["python"]
    assert native["records"] > 0 and len(native["runs"]) >= 1 and "this process" in native["cpu_percent"]


def test_cold_catch_up_drops_the_log_from_the_page_cache(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(os.urandom(64 * PAGE))
    with open(path, "rb") as file:
        file.read()  # in the page cache
    assert all(resident_pages(path))
    drop_from_page_cache([str(path)])
    assert not any(resident_pages(path))


@pytest.mark.parametrize("mode", ["classic", "controller", "dledger"])
def test_put_path_time_times_the_put_path_in_every_broker(tmp_path, mode):
    """scripts/dev/put_path_time.py: each broker's put-path functions are wrapped for the measured
    window only and their calls, wall and CPU time reported per message; the process that takes
    the puts reports the put path, its peers the replication side of it."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for scripts/hasvc_load.c")
    report = tmp_path / "times.json"
    done = subprocess.run([sys.executable, "scripts/dev/put_path_time.py", "--mode", mode, "--producers", "4", "--seconds", "0.5",
                           "--json", str(report)], capture_output=True, text=True, timeout=120, env=_in(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert data["messages"] > 0 and data["messages"] == data["requests"], data
    processes = data["processes"]
    taker = "master" if mode != "dledger" else next(name for name in processes if name.startswith("leader"))
    functions = processes[taker]["functions"]
    assert "hasvc.broker.put_service:PutService.put_items" in functions, functions.keys()
    own = {"classic": "hasvc.broker.ha_master:HAService.push", "dledger": "hasvc.broker.raft.driver:RaftDriver.propose_plan",
           "controller": "hasvc.broker.controlled:SyncStateSetReplicator._feed_acks"}[mode]  # fmt: skip
    other = "hasvc.broker.raft.driver:RaftDriver.propose_plan" if mode != "dledger" else "hasvc.broker.ha_master:HAService.push"
    assert own in functions and other not in functions, functions.keys()
    for row in functions.values():
        assert row["calls_per_request"] > 0 and row["wall_us_per_message"] > 0 and row["cpu_us_per_message"] >= 0, row
    for name, process in processes.items():
        if name != taker:  # a slave or a follower stores what it is sent; it takes no puts
            assert "hasvc.broker.put_service:PutService.put_items" not in process["functions"], (name, process)
            if mode == "dledger":
                assert "commitlog.dledger.entry_writer:EntryWriter.append_run" in process["functions"], (name, process)
    assert glob.glob(os.path.join(tmp_path, "hasvc-put-times-*")) == [], "work directory left"


def test_calls_per_put_profiles_the_brokers_of_a_pair(tmp_path):
    """scripts/dev/calls_per_put.py: each broker process is profiled for the measured window only
    and its calls are counted per request (the brokers' main threads run hasvc's put path)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for scripts/hasvc_load.c")
    report = tmp_path / "calls.json"
    done = subprocess.run([sys.executable, "scripts/dev/calls_per_put.py", "--seconds", "0.5", "--top", "40", "--json", str(report)],
                          capture_output=True, text=True, timeout=120, env=_in(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert data["requests"] > 0 and data["messages"] == data["requests"], data
    assert set(data["processes"]) == {"master", "slave"}, data["processes"].keys()
    master = {row["function"] for row in data["processes"]["master"]["top"]}
    assert any("hasvc/" in name or "commitlog/" in name for name in master), master
    for process in data["processes"].values():
        assert process["calls_per_request"] > 10, process
    assert glob.glob(os.path.join(tmp_path, "hasvc-calls-*")) == [], "work directory left"


def test_dledger_followers_compares_a_pair_a_group_and_a_group_with_a_follower_stopped(tmp_path):
    """scripts/dev/dledger_followers.py: each kind is started fresh, measured and stopped by PID; in
    the stopped kind one follower (never the leader) used no CPU over the window while the
    group still acknowledged every put (the leader and the other follower are a quorum)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for scripts/hasvc_load.c")
    report = tmp_path / "followers.json"
    done = subprocess.run([sys.executable, "scripts/dev/dledger_followers.py", "--producers", "4", "--seconds", "0.5",
                           "--rounds", "1", "--warm-up-mib", "1", "--json", str(report)], capture_output=True, text=True, timeout=180,
                          env=_in(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    rows = {row["kind"]: row for row in data["rows"]}
    assert list(rows) == ["pair", "group", "stopped"], data["rows"]
    for row in rows.values():
        assert row["acked_per_second"] > 0 and set(row["statuses"]) == {"PUT_OK"}, row
    assert set(rows["pair"]["cpu_us_per_message"]) == {"master", "slave"}
    group, stopped = rows["group"]["cpu_us_per_message"], rows["stopped"]["cpu_us_per_message"]
    assert len(group) == 3 and sum(name.startswith("leader") for name in group) == 1, group
    [paused] = [name for name in stopped if name.startswith("stopped ")]
    assert stopped[paused] == 0.0 and not paused.startswith("stopped leader"), stopped
    assert all(value > 0 for name, value in stopped.items() if name != paused), stopped
    assert set(data["ratios"]) == {"group/pair", "stopped/pair", "stopped/group"}, data["ratios"]
    assert glob.glob(os.path.join(tmp_path, "hasvc-bench-*")) == [], "a store was left"


@pytest.mark.parametrize("mode", ["classic", "dledger"])
def test_put_path_inprocess_answers_every_put_of_every_pass(tmp_path, mode):
    """scripts/dev/put_path_inprocess.py: a broker alone in its process (a classic ASYNC_MASTER, or a
    DLedger member leading a group of one) answers every put of every pass PUT_OK (the script
    fails otherwise), and reports one CPU figure a round; its store is removed."""
    report = tmp_path / "inprocess.json"
    done = subprocess.run([sys.executable, "scripts/dev/put_path_inprocess.py", "--mode", mode, "--passes", "20", "--rounds", "2",
                           "--requests", "16", "--dir", str(tmp_path), "--json", str(report)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert data["mode"] == mode and len(data["cpu_us_per_message"]) == 2, data
    assert all(value > 0 for value in data["cpu_us_per_message"]) and data["median"] > 0, data
    assert glob.glob(os.path.join(tmp_path, "hasvc-inprocess-*")) == [], "a store was left"
