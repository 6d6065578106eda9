"""One way to start a hasvc process and know it serves: the READY line.

Every long-running command (``hasvc master|slave|node|proxy|controller``) prints ``READY {json}``
on stdout once it serves, with the addresses it actually bound (``--listen 127.0.0.1:0`` picks
free ports). ``ReadyProcess`` starts one with stderr to a log file, waits for that line with a
deadline (a process that exits or stays silent is reported with the tail of its log), and stops
it by PID: SIGTERM and a bounded wait, then SIGKILL. Tests, drills and benchmarks all start their
processes here.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

READY_TIMEOUT_SECONDS = 30.0  # a process that prints nothing for this long did not start
STOP_TIMEOUT_SECONDS = 20.0  # SIGTERM, then SIGKILL after this long (a clean stop flushes the store)
LOG_TAIL_BYTES = 3000  # how much of a failed start's log the error quotes


def hasvc_command(*args: str) -> list[str]:
    """The command line of ``hasvc ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "hasvc.cli", *args]


class StartError(RuntimeError):
    """A process that exited, or printed something else, before its READY line."""


class ReadyProcess:
    """One process started from ``command`` (stdout a pipe for READY, stderr appended to
    ``log_path``); ``start()`` again runs the same command anew (a restart)."""

    def __init__(self, name: str, command: list[str], log_path: str, *, env: dict | None = None, start: bool = True,
                 ready_timeout_seconds: float = READY_TIMEOUT_SECONDS):  # fmt: skip
        self.name = name
        self.command = command
        self.log_path = log_path
        self.env = env
        self.ready_timeout_seconds = ready_timeout_seconds
        self.process: subprocess.Popen | None = None
        self.ready: dict = {}
        if start:
            self.start()

    def start(self) -> dict:
        assert not self.alive, f"{self.name} is running"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log, env=self.env)
        try:
            self.ready = self._read_ready()
        except BaseException:  # Ctrl-C included: not left running (one built by starting has no handle yet)
            self.kill()
            raise
        return self.ready

    def _read_ready(self) -> dict:
        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout_seconds
        line = b""
        # poll, not select: a caller holding many sockets (a test of 1,500 strangers) gets pipe
        # descriptors above select's 1024
        poller = select.poll()
        poller.register(self.process.stdout.fileno(), select.POLLIN)
        while time.monotonic() < deadline:
            readable = poller.poll(200)
            if readable:
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
                if b"\n" in line:
                    first = line.split(b"\n", 1)[0].decode(errors="replace")
                    if not first.startswith("READY "):
                        break
                    return json.loads(first[len("READY ") :])
            elif self.process.poll() is not None:
                break
        self.kill()
        raise StartError(f"{self.name} did not start (exit {self.process.returncode}); {self.log_path}:\n"
                         f"{self.log()[-LOG_TAIL_BYTES:]}")  # fmt: skip

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def address(self) -> str:
        return self.ready["listen"]

    @property
    def ha_address(self) -> str:
        return self.ready["ha_listen"]

    def kill(self) -> tuple[float, float]:
        """SIGKILL and reap; returns ``time.monotonic()`` just before the signal and once the
        process is gone."""
        signalled = time.monotonic()
        if self.process is not None:
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        return signalled, time.monotonic()

    def stop(self, timeout_seconds: float = STOP_TIMEOUT_SECONDS) -> int | None:
        """SIGTERM and wait for the exit (SIGKILL after ``timeout_seconds``); the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as file:
                return file.read()
        except FileNotFoundError:
            return ""
