"""A controller group of real ``hasvc controller`` processes on loopback, for tests, drills and demos.

``ControllerGroup(directory, size)`` picks free Raft ports (the peers list must name them before
any controller starts), starts each controller with ``--listen 127.0.0.1:0`` and keeps its READY
line; ``addresses`` are the controller ports to give brokers (``--controllers``). ``kill`` is a
SIGKILL, ``start`` restarts a controller on the same store and Raft port, ``status`` asks one
controller for its STATUS, ``leader`` waits until exactly one controller serves as leader.
"""

from __future__ import annotations

import os
import time

import trio

from hasvc.controller.client import ControllerClient
from hasvc.testing.launch import ReadyProcess, hasvc_command
from hasvc.tools.partition import LOOPBACK, free_port

LEADER_WAIT_SECONDS = 30.0  # a controller group elects in about half a second; room for a loaded host


class ControllerGroup:
    def __init__(self, directory: str, size: int, *, extra_args: tuple[str, ...] = (), secret_file: str | None = None,
                 member_args=None, tls_ca: str | None = None) -> None:  # fmt: skip
        """``member_args(member)``: more arguments for one controller (its TLS files); ``tls_ca``:
        the CA this harness's own client checks the controllers' certificates with."""
        self.directory = str(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.ids = [f"c{number}" for number in range(size)]
        self.raft_ports = {member: free_port() for member in self.ids}
        self.extra_args = tuple(extra_args)
        self.secret_file = secret_file
        self.member_args = member_args or (lambda member: [])
        self.tls_ca = tls_ca
        self.processes: dict[str, ReadyProcess] = {}
        for member in self.ids:
            self.processes[member] = ReadyProcess(f"controller {member}", self._command(member),
                                                  os.path.join(self.directory, f"{member}.log"))  # fmt: skip
        self._addresses = {member: process.address for member, process in self.processes.items()}

    def _command(self, member: str, listen: str | None = None) -> list[str]:
        args = ["controller", "--store", os.path.join(self.directory, member), "--listen", listen or f"{LOOPBACK}:0"]
        if len(self.ids) > 1:
            peers = ";".join(f"{m}-{LOOPBACK}:{port}" for m, port in self.raft_ports.items())
            args += ["--peers", peers, "--self", member]
        if self.secret_file is not None:
            args += ["--secret-file", self.secret_file]
        return hasvc_command(*args, *self.member_args(member), *self.extra_args)

    @property
    def addresses(self) -> list[str]:
        """The controller ports, in id order (a restarted controller keeps its port)."""
        return [self._addresses[member] for member in self.ids]

    def address(self, member: str) -> str:
        return self._addresses[member]

    def kill(self, member: str) -> None:
        self.processes[member].kill()

    def start(self, member: str) -> dict:
        """Start ``member`` again on its store, Raft port and controller port."""
        process = self.processes[member]
        process.command = self._command(member, listen=self._addresses[member])
        return process.start()

    def status(self, member: str) -> dict:
        async def ask() -> dict:
            client = ControllerClient([self._addresses[member]], secret=self._secret(), ssl_context=self.ssl_context())
            try:
                answer = await client.status_of(self._addresses[member])
            finally:
                await client.aclose()
            return answer.controller

        return trio.run(ask)

    def ssl_context(self):
        """The client TLS context for the controllers (None without ``tls_ca``)."""
        if self.tls_ca is None:
            return None
        from hasvc import transport

        return transport.client_ssl_context(ca=self.tls_ca)

    def _secret(self) -> bytes | None:
        if self.secret_file is None:
            return None
        with open(self.secret_file, "rb") as file:
            return file.read().strip()

    def leader(self, *, timeout: float = LEADER_WAIT_SECONDS) -> str:
        """The one controller serving as leader (waits for it)."""
        deadline = time.monotonic() + timeout
        while True:
            serving = [m for m, p in self.processes.items() if p.alive and self.status(m)["role"] == "LEADER"]
            if len(serving) == 1:
                return serving[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no single controller leader within {timeout} s: {serving}")
            time.sleep(0.05)

    def close(self) -> None:
        for process in self.processes.values():
            process.stop()
