"""A controller-mode broker group on loopback: a ``ControllerGroup`` and ``hasvc broker`` processes
(``--controllers``, ``--group``), for tests and drills.

``ControlledGroup(directory, controllers=1)`` starts the controllers; ``start_broker(name)``
starts a broker on ``directory/name`` (free client and HA ports, kept across restarts: the
controller hands the HA address to slaves) and ``restart(name)`` starts it again on the same
store and ports. ``status(name)`` is the broker's STATUS (None when it does not answer),
``master()`` waits for the one broker serving as an unfenced master, ``wait(predicate, what)``
for anything else. Every process is stopped by its PID (``close``); ``kill`` is a SIGKILL.
"""

from __future__ import annotations

import os
import time

from hasvc import client as hc
from hasvc.testing.controller_group import ControllerGroup
from hasvc.testing.launch import ReadyProcess, hasvc_command
from hasvc.tools.partition import LOOPBACK, free_port

WAIT_SECONDS = 60.0  # a condition a test or a drill waits for (an election takes about a second)
GROUP = "g"


class ControlledGroup:
    def __init__(self, directory: str, *, controllers: int = 1, segment_size: int = 1024 * 1024,
                 settings: dict | None = None, group: str = GROUP, secret: bytes | None = None,
                 controller_args: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.directory = str(directory)
        self.group = group
        self.segment_size = segment_size
        self.settings = dict(settings or {})  # --set NAME=VALUE for every broker (controller timings included)
        self.secret = secret
        self.secret_file = None
        if secret is not None:  # every controller, broker and client of the group then needs it
            self.secret_file = os.path.join(self.directory, "secret")
            with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
                file.write(secret)
        self.controllers = ControllerGroup(self.directory, controllers, secret_file=self.secret_file,
                                           extra_args=controller_args)  # fmt: skip
        self.brokers: dict[str, ReadyProcess] = {}
        self.stores: dict[str, str] = {}

    def store(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _command(self, name: str, listen: str, ha_listen: str, controllers: list[str] | None) -> list[str]:
        args = ["broker", "--controllers", ",".join(controllers or self.controllers.addresses), "--group", self.group,
                "--store", self.store(name), "--listen", listen, "--ha-listen", ha_listen,
                "--set", f"commitlog_segment_size={self.segment_size}",
                # the stores are throwaway: how full the host's disk is is not what is tested
                "--set", "disk_max_used_space_ratio=1.0", "--set", "disk_clean_ratio=1.0"]  # fmt: skip
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        if self.secret_file is not None:
            args += ["--secret-file", self.secret_file]
        return hasvc_command(*args)

    def start_broker(self, name: str, *, controllers: list[str] | None = None) -> ReadyProcess:
        """``controllers``: the addresses this broker calls the controllers at (a partition relay's), else theirs."""
        command = self._command(name, f"{LOOPBACK}:{free_port()}", f"{LOOPBACK}:{free_port()}", controllers)
        process = ReadyProcess(f"broker {name}", command, os.path.join(self.directory, f"{name}.log"))
        self.brokers[name] = process
        self.stores[name] = self.store(name)
        return process

    def restart(self, name: str) -> dict:
        return self.brokers[name].start()

    def kill(self, name: str) -> tuple[float, float]:
        return self.brokers[name].kill()

    def address(self, name: str) -> str:
        return self.brokers[name].address

    def status(self, name: str) -> dict | None:
        process = self.brokers[name]
        if not process.alive:
            return None
        try:
            with hc.BlockingClient(process.address, self.secret) as client:
                return client.status()
        except (hc.ClientError, OSError):
            return None

    def wait(self, predicate, what: str, timeout: float = WAIT_SECONDS):
        deadline = time.monotonic() + timeout
        while True:
            found = predicate()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)

    def master(self, *, excluding: str | None = None, timeout: float = WAIT_SECONDS) -> str:
        """The name of the one broker serving as master with its lease (waits for it)."""

        def serving() -> str | None:
            found = [name for name in self.brokers if name != excluding
                     and (s := self.status(name)) is not None and s["role"] != "SLAVE" and not s.get("fenced_by")]  # fmt: skip
            return found[0] if len(found) == 1 else None

        return self.wait(serving, "one master with its lease", timeout)

    def in_set(self, master: str, names) -> bool:
        """Whether ``master``'s SyncStateSet holds every broker of ``names`` (writes may go on)."""
        status = self.status(master)
        others = [self.status(name) for name in names]
        if status is None or any(other is None for other in others):
            return False
        ids = {other["broker_id"] for other in others}
        return ids <= set(status["sync_state_set"]) and status.get("sync_state_set_proposed") is None

    def in_sync(self, master: str, names) -> bool:
        """Whether ``master``'s SyncStateSet holds every broker of ``names`` and each has its log's end."""
        status = self.status(master)
        if status is None:
            return False
        ids = set()
        for name in names:
            other = self.status(name)
            if other is None or other["max_offset"] != status["max_offset"]:
                return False
            ids.add(other["broker_id"])
        return ids <= set(status["sync_state_set"]) and status.get("sync_state_set_proposed") is None

    def close(self) -> None:
        for process in self.brokers.values():
            process.stop()
        self.controllers.close()
