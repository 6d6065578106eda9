"""Ctrl-C stops ``hasvc drill``: a real drill process gets SIGINT once its first round is done
(it alone: the brokers it started get nothing from the test); it stops every process it started
(their PIDs are gone, and no process names its stores), says one line on stderr naming the round
and where the stores are kept, and exits 130, as Unix tools do."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time

import pytest

from hasvc.testing.launch import hasvc_command

FIRST_ROUND_SECONDS_MAX = 120.0  # a loaded host: starting the processes and one round (nothing here is timed)
EXIT_SECONDS_MAX = 300.0  # stopping what the drill started: SIGTERM and up to 20 s for a clean close each, on a loaded host
INTERRUPTED = 130  # 128 + SIGINT


def _children(pid: int) -> set[int]:
    """The PIDs whose parent is ``pid`` (from /proc)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(name))
    return found


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has: only its exit status is left)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _naming(text: str) -> list[int]:
    """The running processes whose command line holds ``text`` (the drill's directory)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as file:
                    command = file.read().decode(errors="replace")
            except OSError:
                continue
            if text in command and _running(int(name)):
                found.append(int(name))
    return found


def _read_until(process: subprocess.Popen, pattern: str, seconds: float) -> str:
    """Stdout up to the first line matching ``pattern``."""
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 0.5)[0]:
            chunk = os.read(process.stdout.fileno(), 65536).decode(errors="replace")
            if not chunk:
                break
            text += chunk
            if re.search(pattern, text, re.MULTILINE):
                return text
    raise AssertionError(f"no line matching {pattern!r} (exit {process.poll()}); stdout:\n{text[-3000:]}")


@pytest.mark.parametrize("mode", ["sync", "dledger", "controller"])
def test_ctrl_c_stops_the_drills_processes_says_one_line_and_exits_130(tmp_path, mode):
    environment = {**os.environ, "TMPDIR": str(tmp_path)}  # the drill's directory: under tmp_path
    drill = subprocess.Popen(hasvc_command("drill", "--mode", mode, "--rounds", "50", "--producers", "1"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)  # fmt: skip
    started: set[int] = set()
    try:
        shown = _read_until(drill, r"^\s+1\s", FIRST_ROUND_SECONDS_MAX)  # the first round's row
        root = re.search(r"under (\S+)", shown).group(1)
        started = _children(drill.pid)
        assert started and root.startswith(str(tmp_path)), (started, root)
        drill.send_signal(signal.SIGINT)
        _, stderr = drill.communicate(timeout=EXIT_SECONDS_MAX)  # both pipes read meanwhile: neither fills
        stderr = stderr.decode(errors="replace")
        assert drill.returncode == INTERRUPTED, (drill.returncode, stderr)
        lines = stderr.splitlines()
        assert len(lines) == 1, stderr
        assert re.fullmatch(rf"Error: drill interrupted in round \d+: the processes it started are stopped, the stores "
                            rf"and logs kept under {re.escape(root)}", lines[0]), lines[0]  # fmt: skip
        assert int(re.search(r"round (\d+)", lines[0]).group(1)) >= 2  # the first round was done
        assert [pid for pid in started if _running(pid)] == []
        assert _naming(root) == []  # nor any it started after the PIDs above were read (a rejoining broker)
        assert os.listdir(root)  # kept, as the line says
    finally:
        for pid in [*started, *_naming(str(tmp_path))]:  # a failed test leaves nothing running either
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        if drill.poll() is None:
            drill.kill()
        drill.wait()
