"""A controller's snapshots: written after ``snapshot_interval_entries`` applied entries (then
retention cuts the log), served to another controller (SNAPSHOT), and fetched and installed when
this controller's log starts past its state (the leader RESET it: it was wiped, or down while the
group cut its log).

Theory of operation
-------------------
Writing: the state's bytes (``ControllerState.snapshot``: magic HCS1, CRC32C, the Raft index it
reflects) go to ``STORE/controller/snapshot.tmp``, fsynced, renamed over ``STORE/controller/snapshot``,
and the directory fsynced: the file on disk is always a whole snapshot. Retention then deletes whole
entry files below ``min(snapshot index + 1, the core's retention floor)``.

Installing (``hasvc.state.controller.snapshot_transfer``): while the log's first index is above the
applied index + 1, the controller applies nothing and serves no broker; ``run_fetcher`` asks the
other controllers (the leader first, then each peer whose controller port its Raft HELLO announced)
for a snapshot reflecting at least the first index - 1, chunk by chunk, restores it (CRC and fields
checked), writes it as above, and only then takes it as its state and applies the entries that
follow. A crash in between leaves either the old snapshot (the log still starts past it: fetched
again at the next start) or the new one (replayable). Nothing is asked of an operator.
"""

from __future__ import annotations

import logging
import os

import trio

from hasvc import transport
from hasvc.controller.client import ControllerClient
from hasvc.controller.config import SNAPSHOT_DIRECTORY, SNAPSHOT_FILE
from hasvc.protocol import controller as cp
from hasvc.protocol import wire
from hasvc.state.controller import state as cs
from hasvc.state.controller.snapshot_transfer import SnapshotAssembly, SnapshotSource, SnapshotTransferError
from commitlog.mapped_file import fsync_directory

LOGGER = logging.getLogger(__name__)

# A round of asking every other controller for a snapshot that found none usable (each may be
# electing, or behind as well) is tried again after this.
SNAPSHOT_FETCH_RETRY_SECONDS = 0.5
# One chunk's request and answer (512 KiB at most): on a LAN, far less.
SNAPSHOT_CHUNK_TIMEOUT_SECONDS = 5.0


class ControllerSnapshots:
    """The snapshots of one ``ControllerServer`` (``server``): see the module."""

    def __init__(self, server) -> None:
        self.server = server
        self.source = SnapshotSource(cp.SNAPSHOT_CHUNK_SIZE_MAX)
        self.due = trio.Event()  # snapshot_interval_entries applied since the last snapshot
        self.wanted = trio.Event()  # the log starts past the state: fetch one
        self.installed = 0  # snapshots fetched from another controller and installed (STATUS)
        self.fetching = False  # run_fetcher is at work (STATUS snapshot_needed)

    @property
    def path(self) -> str:
        return os.path.join(self.server.config.store, SNAPSHOT_DIRECTORY, SNAPSHOT_FILE)

    # -- writing and retention -------------------------------------------------------------

    async def run_snapshotter(self) -> None:
        server = self.server
        while True:
            await self.due.wait()
            self.due = trio.Event()
            if not server.replayable():
                continue  # the state waits for a fetched snapshot
            data, index = server.state.snapshot(), server.applied_index
            await trio.to_thread.run_sync(self.write_file, data)
            server.snapshot_index = max(server.snapshot_index, index)
            LOGGER.info("controller snapshot at entry %d (%d bytes)", index, len(data))
            async with server.driver.files_quiet():  # no sync of a file being deleted
                self.retain()
        raise AssertionError("unreachable")

    def write_now(self) -> None:
        self.write_file(self.server.state.snapshot())
        self.server.snapshot_index = self.server.applied_index

    def write_file(self, data: bytes) -> None:
        """Write to a temporary file, fsync, rename over the snapshot, fsync the directory: the
        snapshot on disk is always a whole one."""
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        fsync_directory(directory)

    def retain(self) -> list[str]:
        """Delete whole entry files below the snapshot and the core's floor (what no member may
        still need; never regardless of the floor), after each snapshot: entries the floor held
        back go after a later one."""
        server = self.server
        keep_from = min(server.snapshot_index + 1, server.driver.node.retention_floor())
        if keep_from <= server.store.entries.first_index():
            return []
        deleted = server.store.clean_expired(keep_from_index=keep_from, over_ratio=False)
        if deleted:
            LOGGER.info("retention deleted %d entry file(s); the log starts at entry %d (snapshot at %d)", len(deleted),
                        server.store.entries.first_index(), server.snapshot_index)  # fmt: skip
        return deleted

    # -- serving another controller ---------------------------------------------------------

    def answer(self, request: cp.SnapshotRequest) -> cp.Answer:
        """SNAPSHOT: a chunk of this controller's state (any controller answers, leader or not)."""
        if not self.server.replayable():
            return cp.refused(cp.SNAPSHOT, f"{self.server.group.self_id} waits for a snapshot itself")
        chunk = self.source.chunk(self.server.state, index=request.index, offset=request.offset)
        if isinstance(chunk, str):
            return cp.refused(cp.SNAPSHOT, f"{self.server.group.self_id}: {chunk}")
        index, size, data = chunk
        return cp.Answer(cp.SNAPSHOT, cp.STATUS_OK, snapshot=cp.SnapshotChunk(index, size, request.offset, data))

    # -- fetching and installing -------------------------------------------------------------

    async def run_fetcher(self) -> None:
        server = self.server
        while True:
            await self.wanted.wait()
            self.wanted = trio.Event()
            self.fetching = True
            while not server.replayable():
                if not await self._fetch_round():
                    await trio.sleep(SNAPSHOT_FETCH_RETRY_SECONDS)
            self.fetching = False
        raise AssertionError("unreachable")

    def _sources(self) -> list[str]:
        """The other controllers' ports: the leader's first, then each peer's announced one."""
        driver = self.server.driver
        addresses = []
        leader = driver.node.leader_id
        if leader is not None and leader != self.server.group.self_id:
            addresses.append(driver.client_address_of(leader))
        addresses += [address for _peer, address in sorted(driver.peer_client_addresses.items())]
        return list(dict.fromkeys(address for address in addresses if address))

    async def _fetch_round(self) -> bool:
        """Ask each other controller in turn; True once a snapshot was installed."""
        server = self.server
        sources = self._sources()
        if not sources:
            return False  # no other controller heard from yet
        client = ControllerClient(sources, secret=server.config.secret, ssl_context=server.driver.peer_ssl_context)
        try:
            for address in sources:
                min_index = server.store.entries.first_index() - 1
                try:
                    state = await self._fetch(client, address, min_index)
                except (OSError, EOFError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                        transport.AuthenticationError, wire.ProtocolError, SnapshotTransferError,
                        cs.StateFormatError) as error:  # fmt: skip
                    LOGGER.warning("snapshot from %s: %s", address, error)
                    continue
                if state is not None and await self._install(state, address):
                    return True
        finally:
            await client.aclose()
        return False

    async def _fetch(self, client: ControllerClient, address: str, min_index: int) -> cs.ControllerState | None:
        assembly = SnapshotAssembly(min_index)
        while not assembly.done:
            index, offset = assembly.request()
            with trio.fail_after(SNAPSHOT_CHUNK_TIMEOUT_SECONDS):
                answer = await client.ask(address, cp.SnapshotRequest(index, offset))
            if not answer.ok:
                LOGGER.info("snapshot from %s: %s", address, answer.reason)
                return None
            chunk = answer.snapshot
            assembly.receive(index=chunk.index, size=chunk.size, offset=chunk.offset, data=chunk.data)
        return assembly.state()

    async def _install(self, state: cs.ControllerState, address: str) -> bool:
        """Write ``state`` as the snapshot, then take it (if the log still continues it)."""
        server = self.server
        if state.applied_index + 1 < server.store.entries.first_index() or server.replayable():
            return server.replayable()
        await trio.to_thread.run_sync(self.write_file, state.snapshot())
        if state.applied_index + 1 < server.store.entries.first_index() or server.replayable():
            return server.replayable()  # reset further meanwhile: the snapshot on disk is fetched again
        server.install_state(state)
        self.installed += 1
        LOGGER.warning("installed the snapshot of entry %d from %s (the log starts at entry %d)", state.applied_index,
                       address, server.store.entries.first_index())  # fmt: skip
        return True
