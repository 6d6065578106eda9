"""Every script in scripts/ and scripts/dev/ answers --help with its usage, exit 0, and starts,
installs and writes nothing (run from an empty directory, which stays empty); and what one of
them parses (scripts/dev/cycle_hops.py, ``perf script``'s lines)."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(
    os.path.join(folder, name)
    for folder in ("scripts", os.path.join("scripts", "dev"))
    for name in os.listdir(os.path.join(ROOT, folder))
    if name.endswith((".py", ".sh")) or name == "bench_peers"
)
LIBRARIES = {"scripts/dev/bench_pair.py", "scripts/dev/hooked_brokers.py", "scripts/dev/usage.py"}  # nothing to run


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help_without_side_effects(tmp_path, script):
    path = os.path.join(ROOT, script)
    command = [sys.executable, path] if script.endswith(".py") else ["bash", path]
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    done = subprocess.run([*command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    if script not in LIBRARIES:
        assert "usage" in done.stdout.lower() or script.split("/")[-1].split(".")[0] in done.stdout, done.stdout
    assert "installing" not in done.stdout
    assert os.listdir(tmp_path) == []


def test_a_positional_script_without_its_arguments_prints_usage_and_exits_2(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/dev/cpu_per_put.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "TREE CONNECTIONS PRODUCERS SECONDS" in done.stderr


def _cycle_hops():
    spec = importlib.util.spec_from_file_location("cycle_hops", os.path.join(ROOT, "scripts", "dev", "cycle_hops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("line", [
    # a host up for a few minutes: perf pads the timestamp with spaces
    "            perf  2729 [000]   310.764079: raw_syscalls:sys_enter: NR 16 (7, 2400, 0, 7fbbb722b5e0, 1, 0)",
    # up for days: no padding left
    "     hasvc_load 48211 [001] 912345.123456: raw_syscalls:sys_exit: NR 1 = 71680",
])  # fmt: skip
def test_cycle_hops_reads_perf_lines_whatever_the_hosts_uptime(line):
    """scripts/dev/cycle_hops.py found no cycle at all on a freshly started host: its pattern
    allowed one space before the timestamp."""
    match = _cycle_hops().PERF_LINE.match(line)
    assert match is not None
    command, tid, cpu, at, kind, rest = match.groups()
    assert command in ("perf", "hasvc_load") and int(tid) > 0 and cpu.startswith("00")
    assert float(at) > 0 and kind.startswith("raw_syscalls:") and rest.startswith("NR ")
