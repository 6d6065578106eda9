"""``hasvc controller``'s usual mistakes: each ends in at most three lines of stderr, no traceback,
the documented exit code (2 usage, 3 cannot start), and no store created."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hasvc.testing.controller_group import ControllerGroup
from hasvc.tools.partition import free_port

STDERR_LINES_MAX = 3


def _run(arguments: list[str]) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("HASVC_DEBUG", "HASVC_SECRET")}
    return subprocess.run([sys.executable, "-m", "hasvc.cli", "controller", *arguments], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    group = ControllerGroup(tmp_path_factory.mktemp("running"), 1)
    yield group
    group.close()


def _cases(root, running: ControllerGroup) -> list[tuple[str, list[str], int, str]]:
    fresh = os.path.join(root, "never-created")
    two = f"c0-127.0.0.1:{free_port()};c1-127.0.0.1:{free_port()}"
    return [
        ("two controllers", ["--store", fresh, "--listen", "127.0.0.1:0", "--peers", two, "--self", "c0"], 2, "1, 3 or 5"),
        ("--peers without --self", ["--store", fresh, "--listen", "127.0.0.1:0", "--peers", two], 2, "--self"),
        ("--self without --peers", ["--store", fresh, "--listen", "127.0.0.1:0", "--self", "c0"], 2, "--peers"),
        ("a misspelt setting", ["--store", fresh, "--listen", "127.0.0.1:0", "--set", "master_lease=1"], 2,
         "did you mean master_lease_seconds"),
        ("a lease not below the heartbeat timeout", ["--store", fresh, "--listen", "127.0.0.1:0", "--set",
                                                     "master_lease_seconds=0.9"], 2, "broker_heartbeat_timeout_seconds"),
        ("an election timeout below the lease", ["--store", fresh, "--listen", "127.0.0.1:0", "--set",
                                                 "election_timeout_min_seconds=0.2", "--set", "heartbeat_interval_seconds=0.02"],
         2, "master_lease_seconds"),
        ("a setting that is not a number", ["--store", fresh, "--listen", "127.0.0.1:0", "--set", "log_file_size=big"], 2,
         "expected an integer"),
        ("a controller port in use", ["--store", fresh, "--listen", running.address("c0")], 3,
         f"cannot listen on {running.address('c0')}"),
        ("a second controller on a locked store", ["--store", os.path.join(running.directory, "c0"), "--listen",
                                                   "127.0.0.1:0"], 3, "already open in another process"),
        ("off loopback without a secret", ["--store", fresh, "--listen", "0.0.0.0:0"], 2, "without a secret"),
    ]  # fmt: skip


def test_controller_mistakes_end_in_one_line_and_the_documented_exit_code(tmp_path, running):
    failures = []
    for what, arguments, code, text in _cases(tmp_path, running):
        result = _run(arguments)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        problems = []
        if result.returncode != code:
            problems.append(f"exit {result.returncode}, documented {code}")
        if "Traceback" in result.stderr:
            problems.append("a traceback")
        if len(lines) > STDERR_LINES_MAX:
            problems.append(f"{len(lines)} lines of stderr")
        if text not in result.stderr:
            problems.append(f"no {text!r}")
        if problems:
            failures.append(f"{what}: {', '.join(problems)}:\n{result.stderr}")
    assert not failures, "\n".join(failures)
    assert not os.path.exists(os.path.join(tmp_path, "never-created")), "a command that could not run created its store"
