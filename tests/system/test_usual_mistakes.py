"""The usual mistakes, made as a new user makes them: each ends in at most three lines of stderr,
no traceback, and the exit code docs/operations.md documents (0 done, 1 failed or refused, 2 usage
or configuration, 3 unreachable or cannot start).

Every case is a real ``python -m hasvc.cli`` process; they run a few at a time against one
running classic pair."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from hasvc.tools.partition import free_port
from tests.cluster import SEGMENT, Cluster, slave_acking, wait_until

STDERR_LINES_MAX = 3
CASES_AT_ONCE = 4  # processes run together (the machine's cores are shared)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    cluster = Cluster(root, segment_size=SEGMENT)
    master = cluster.start_master()
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="the slave's first report")
    yield cluster, master, slave, root
    cluster.close()


def _write(root, name: str, text: str) -> str:
    path = os.path.join(root, name)
    with open(path, "w") as file:
        file.write(text)
    return path


def _cases(cluster, master, slave, root) -> list[tuple[str, list[str], int, str]]:
    """(what, arguments, exit code, text the one line must hold)."""
    nowhere = f"127.0.0.1:{free_port()}"
    unknown_key = _write(root, "unknown.toml", "[broker]\nslave_timout_ms = 100\n")
    bad_toml = _write(root, "bad.toml", "[broker\nstore = 'x'\n")
    wrong_type = _write(root, "type.toml", "[broker]\nslave_timeout_ms = 'soon'\n")
    empty_secret = _write(root, "empty-secret", "  \n")
    secret = _write(root, "secret", "s3cret")
    unknown_table = _write(root, "table.toml", "[brokr]\nslave_timeout_ms = 100\n")
    number_address = _write(root, "address.toml", "[broker]\nlisten = 10911\n")
    small_frames = _write(root, "frames.toml", "[broker]\nha_frame_size_max = 1048576\n")
    out_of_range = _write(root, "range.toml", "[broker]\nslave_timeout_ms = -1\n")
    fraction = _write(root, "fraction.toml", "[broker]\nslave_timeout_ms = 1.5\n")
    unknown_role = _write(root, "role.toml", "[broker]\nrole = 'primary'\n")
    raft_in_toml = _write(root, "raft.toml", "[broker]\nheartbeat_interval_seconds = 0.5\n")
    fresh = os.path.join(root, "never-created")
    node = ["node", "--store", fresh, "--group", "g", "--peers", "n0-127.0.0.1:0", "--self", "n0"]
    return [
        ("a second master on a locked store", ["master", "--store", cluster.store("master"), "--listen", "127.0.0.1:0"], 3, "already open in another process"),
        ("a port in use", ["master", "--store", fresh, "--listen", master.address], 3, f"cannot listen on {master.address}"),
        ("an HA port in use", ["master", "--store", fresh, "--listen", "127.0.0.1:0", "--ha-listen", master.ha_address], 3, master.ha_address),
        ("--listen without a host", ["master", "--store", fresh, "--listen", "10971"], 2, "127.0.0.1:10971"),
        ("a port out of range", ["master", "--store", fresh, "--listen", "127.0.0.1:99999"], 2, "out of range"),
        ("an unknown key in the TOML file", ["master", "--config", unknown_key, "--store", fresh], 2, "did you mean slave_timeout_ms"),
        ("a TOML file that is not TOML", ["master", "--config", bad_toml], 2, "not valid TOML"),
        ("a TOML value of the wrong type", ["master", "--config", wrong_type, "--store", fresh], 2, "expected an integer"),
        ("a Raft setting that is not a number", ["node", "--store", fresh, "--group", "g", "--peers", "n0-127.0.0.1:0", "--self", "n0",
                                                 "--set", "heartbeat_interval_seconds=fast"], 2, "expected a number"),
        ("a misspelt Raft setting", ["node", "--store", fresh, "--group", "g", "--peers", "n0-127.0.0.1:0", "--self", "n0",
                                     "--set", "heartbeat_interval=1"], 2, "did you mean heartbeat_interval_seconds"),
        ("an integer setting given letters", ["master", "--store", fresh, "--set", "slave_timeout_ms=abc"], 2, "expected an integer"),
        ("a misspelt setting", ["master", "--store", fresh, "--set", "slave_timeout=1000"], 2, "did you mean slave_timeout_ms"),
        ("a negative timeout", ["master", "--store", fresh, "--set", "slave_timeout_ms=-5"], 2,
         "slave_timeout_ms=-5 (from --set): must be >0 (default 3,000 ms)"),
        ("a ratio above 1", ["master", "--store", fresh, "--set", "disk_clean_ratio=1.5"], 2,
         "disk_clean_ratio=1.5 (from --set): must be in (0,1]"),
        ("a value not among its choices", ["master", "--store", fresh, "--set", "small_write_pages=yes"], 2,
         "small_write_pages='yes' (from --set): must be one of auto, on, off"),
        ("a batch larger than the frame a slave reads", ["master", "--store", fresh, "--set", "ha_transfer_batch_size=8388608"], 2,
         "ha_transfer_batch_size=8388608 (from --set): must not exceed ha_frame_size_max=4194304 (from the default)"),
        ("a conflicting pair from a file and --set", ["master", "--store", fresh, "--config", small_frames, "--set",
                                                      "ha_transfer_batch_size=2097152"], 2,
         f"ha_frame_size_max=1048576 (from {small_frames} key [broker].ha_frame_size_max)"),
        ("Raft timeouts the wrong way round", [*node, "--set", "election_timeout_max_seconds=1"], 2,
         "election_timeout_max_seconds=1.0 (from --set): must not be below election_timeout_min_seconds=6.3 (from the default)"),
        ("a heartbeat slower than the etcd preset's election timeout", [*node, "--set", "raft_preset=etcd", "--set",
                                                                        "heartbeat_interval_seconds=1.5"], 2,
         "must be below election_timeout_min_seconds=1.0 (from raft_preset=etcd)"),
        ("a store setting out of range", ["master", "--store", fresh, "--set", "flush_interval_commitlog_ms=0"], 2,
         "flush_interval_commitlog_ms=0 (from --set): must be >0 (default 500 ms)"),
        ("a misspelt store setting", ["slave", "--store", fresh, "--master-ha", "127.0.0.1:1", "--set", "flush_intervl_commitlog_ms=1"], 2,
         "did you mean flush_interval_commitlog_ms"),
        ("a classic store's setting given to a DLedger member", [*node, "--set", "sync_flush_timeout_ms=100"], 2,
         "sync_flush_timeout_ms is not used by a DLedger member"),
        ("a TOML table that is not [broker]", ["master", "--config", unknown_table, "--store", fresh], 2, "did you mean [broker]?"),
        ("a TOML address given as a number", ["master", "--config", number_address, "--store", fresh], 2,
         f'listen=10911 (from {number_address} key [broker].listen): expected "HOST:PORT" text'),
        ("a TOML value out of range", ["master", "--config", out_of_range, "--store", fresh], 2,
         f"slave_timeout_ms=-1 (from {out_of_range} key [broker].slave_timeout_ms): must be >0"),
        ("a fraction where an integer goes", ["master", "--config", fraction, "--store", fresh], 2,
         "slave_timeout_ms=1.5 (from"),
        ("a role TOML does not know", ["master", "--config", unknown_role, "--store", fresh], 2, "expected sync or async"),
        ("a Raft setting in a broker's TOML table", [*node, "--config", raft_in_toml], 2,
         "heartbeat_interval_seconds (key [broker].heartbeat_interval_seconds) is not a broker setting: give it with --set"),
        ("a missing config file", ["master", "--config", os.path.join(root, "nope.toml"), "--store", fresh], 2, "does not exist"),
        ("config check of a file with a bad value", ["config", "check", out_of_range], 2, "must be >0 (default 3,000 ms)"),
        ("config show of a misspelt name", ["config", "show", "warm_ahead"], 2, "did you mean warm_ahead_size"),
        ("a boolean setting given a word", ["master", "--store", fresh, "--set", "flush_before_ack=maybe"], 2, "expected true or false"),
        ("--set without a value", ["master", "--store", fresh, "--set", "slave_timeout_ms"], 2, "NAME=VALUE"),
        ("a missing secret file", ["master", "--store", fresh, "--secret-file", os.path.join(root, "nope")], 2, "does not exist"),
        ("an empty secret file", ["status", master.address, "--secret-file", empty_secret], 2, "empty"),
        ("a secret the broker does not have", ["status", master.address, "--secret-file", secret], 3, master.address),
        ("a slave with no master address", ["slave", "--store", fresh, "--listen", "127.0.0.1:0"], 2, "--master-ha"),
        ("a client at the HA port", ["send", master.ha_address, "--topic", "T", "x"], 3, "wrong port"),
        ("an address nobody listens on", ["status", nowhere], 3, f"cannot connect to {nowhere}"),
        ("an address without a port", ["status", "localhost"], 2, "HOST:PORT"),
        ("a send to a slave", ["send", slave.address, "--topic", "T", "x"], 1, f"send to its master at {master.address}"),
        ("a read past the end of the log", ["read", master.address, "--offset", "999999999"], 1, "OFFSET_ILLEGAL"),
        ("a negative offset", ["read", master.address, "--offset", "-1"], 2, "--offset"),
        ("read without --topic", ["read", master.address], 2, "--topic"),
        ("promoting a master", ["promote", master.address], 1, "already SYNC_MASTER"),
        ("promoting while the master runs", ["promote", "--endpoints", f"{master.address},{slave.address}"], 1, "hasvc switchover"),
        ("demote without the new master", ["demote", master.address], 2, "--master-ha"),
        ("transfer-leader on a classic pair", ["transfer-leader", master.address, "--to", "n1"], 1, "hasvc switchover"),
        ("a switchover to the master itself", ["switchover", master.address, "--to", master.address], 1, "not a slave"),
        ("store verify of a missing directory", ["store", "verify", os.path.join(root, "does-not-exist")], 2, "no such directory"),
        ("a misspelt command", ["sned", master.address], 2, "send"),
    ]  # fmt: skip


def _run(arguments: list[str]) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("HASVC_DEBUG", "HASVC_SECRET")}
    return subprocess.run([sys.executable, "-m", "hasvc.cli", *arguments], capture_output=True, text=True, timeout=60, env=env)


def test_usual_mistakes_end_in_one_line_and_the_documented_exit_code(pair):
    cluster, master, slave, root = pair
    cases = _cases(cluster, master, slave, root)
    assert len(cases) >= 20
    with ThreadPoolExecutor(CASES_AT_ONCE) as pool:
        done = list(pool.map(lambda case: _run(case[1]), cases))
    failures = []
    for (what, arguments, code, text), result in zip(cases, done, strict=True):
        lines = [line for line in result.stderr.splitlines() if line.strip()]  # a broker's log line of its configuration counts
        problems = []
        if result.returncode != code:
            problems.append(f"exit {result.returncode}, documented {code}")
        if "Traceback" in result.stderr:
            problems.append("a traceback")
        if len(lines) > STDERR_LINES_MAX:
            problems.append(f"{len(lines)} lines of stderr")
        if text not in result.stderr + result.stdout:
            problems.append(f"no {text!r}")
        if problems:
            failures.append(f"{what} (hasvc {' '.join(arguments)}): {', '.join(problems)}:\n{result.stderr}{result.stdout}")
    assert not failures, "\n".join(failures)
    assert not os.path.exists(os.path.join(root, "never-created")), "a command that could not run created its store"


def test_debug_shows_the_traceback(pair):
    _, master, _, _ = pair
    result = _run(["--debug", "read", master.address, "--offset", "999999999"])
    assert result.returncode == 1 and "Traceback" in result.stderr and "OFFSET_ILLEGAL" in result.stderr
    env = {**os.environ, "HASVC_DEBUG": "1"}
    result = subprocess.run([sys.executable, "-m", "hasvc.cli", "read", master.address, "--offset", "999999999"],
                            capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert "Traceback" in result.stderr


def test_a_slave_pointed_at_a_client_port_says_so_in_one_log_line_and_keeps_trying(pair):
    cluster, master, _, _ = pair
    lost = cluster._start("slave", "lost", ["--master-ha", master.address], {})
    try:
        wait_until(lambda: "wrong port" in lost.log(), message="the refusal in the slave's log")
        assert lost.alive and "Traceback" not in lost.log()
        refusals = [line for line in lost.log().splitlines() if "wrong port" in line]
        assert refusals and master.address in refusals[0]
    finally:
        lost.stop()
