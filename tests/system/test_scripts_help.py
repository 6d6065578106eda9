"""Every script in scripts/ and scripts/dev/ answers --help with its usage, exit 0, and starts,
installs and writes nothing (run from an empty directory, which stays empty)."""

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
