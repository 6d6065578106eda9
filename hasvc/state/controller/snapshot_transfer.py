"""Moving a controller's state snapshot to a controller whose log starts past its state: the
answering side's chunks and the fetching side's assembly (etcd's MsgSnap, over the controller port).

Theory of operation
-------------------
The Raft core RESETs a follower that needs an entry the leader's retention deleted: its log then
starts empty at the leader's first index X (``hasvc.state.raft.replication``). In DLedger mode the
log is the state, so that is all; a controller's state is what the entries below X built, so it
must also get a snapshot reflecting at least entry X - 1 before it applies X. It asks another
controller (SNAPSHOT, kind 6 on the controller port) chunk by chunk:

* ``SnapshotSource`` (the answering side) keeps one snapshot of its state (``ControllerState.snapshot``:
  magic HCS1, CRC32C, the Raft index it reflects). The first chunk (offset 0) names the least
  index wanted: the kept snapshot if it reflects that much, else a fresh one of the current state
  (refused when even that is behind). A later chunk names the snapshot's index exactly: refused
  when the kept snapshot is another one by then (the fetcher starts again).
* ``SnapshotAssembly`` (the fetching side) asks offset 0, then the next offset of the same index,
  checks each chunk (same index and size, the offset asked, never past ``SNAPSHOT_SIZE_MAX``),
  and once whole restores the state: the CRC and every field are checked there, and the state
  must reflect the index the first chunk named, at least the one asked.

Any committed state is safe to install: a snapshot holds only applied, hence committed, entries,
and the fetcher goes on applying its log from the snapshot's index + 1, which its log holds when
that index + 1 is at least its first index (the driver checks that when it installs).
"""

from __future__ import annotations

from hasvc.state.controller.state import SNAPSHOT_SIZE_MAX, ControllerState, StateFormatError


class SnapshotTransferError(ValueError):
    """A chunk that does not continue the snapshot being fetched (one line)."""


class SnapshotSource:
    """The answering side: one kept snapshot, cut into chunks of at most ``chunk_size`` bytes."""

    def __init__(self, chunk_size: int) -> None:
        assert chunk_size >= 1
        self.chunk_size = chunk_size
        self.index = -1  # the Raft index the kept snapshot reflects (-1: none kept)
        self.data = b""

    def chunk(self, state: ControllerState, *, index: int, offset: int) -> tuple[int, int, bytes] | str:
        """(snapshot index, size, bytes from ``offset``) for a request, or why it is refused."""
        if offset == 0:
            if self.index < index or not self.data:
                if state.applied_index < index:
                    return f"the state here reflects entry {state.applied_index}, below the {index} asked"
                self.data, self.index = state.snapshot(), state.applied_index
        elif index != self.index:
            return f"the snapshot of entry {index} is no longer kept here (entry {self.index}'s is): start again"
        if offset > len(self.data):
            return f"offset {offset} is past the snapshot's {len(self.data)} bytes"
        return self.index, len(self.data), self.data[offset : offset + self.chunk_size]


class SnapshotAssembly:
    """The fetching side: ``request()`` says what to ask next, ``receive`` takes the answer's
    chunk, ``state()`` once ``done``."""

    def __init__(self, min_index: int) -> None:
        self.min_index = min_index  # the state must reflect at least this Raft index
        self.index: int | None = None  # the snapshot's, from the first chunk
        self.size: int | None = None
        self._parts: list[bytes] = []
        self._received = 0

    def request(self) -> tuple[int, int]:
        """(index, offset) of the next SNAPSHOT request."""
        if self.index is None:
            return self.min_index, 0
        return self.index, self._received

    @property
    def done(self) -> bool:
        return self.size is not None and self._received == self.size

    def receive(self, *, index: int, size: int, offset: int, data: bytes) -> None:
        if self.index is None:
            if index < self.min_index:
                raise SnapshotTransferError(f"a snapshot of entry {index} answered, below the {self.min_index} asked")
            if not 0 < size <= SNAPSHOT_SIZE_MAX:
                raise SnapshotTransferError(f"a snapshot of {size} bytes (1..{SNAPSHOT_SIZE_MAX}: SNAPSHOT_SIZE_MAX)")
            self.index, self.size = index, size
        elif (index, size) != (self.index, self.size):
            raise SnapshotTransferError(f"a chunk of the snapshot of entry {index} ({size} bytes) while fetching entry "
                                        f"{self.index}'s ({self.size} bytes)")  # fmt: skip
        if offset != self._received:
            raise SnapshotTransferError(f"a chunk at offset {offset}, {self._received} asked")
        if not data and not self.done:
            raise SnapshotTransferError(f"an empty chunk at offset {offset} of {size}")
        if offset + len(data) > size:
            raise SnapshotTransferError(f"a chunk of {len(data)} bytes at {offset} runs past the snapshot's {size}")
        self._parts.append(data)
        self._received += len(data)

    def state(self) -> ControllerState:
        """The state the whole snapshot holds; StateFormatError (its CRC, its fields) or
        SnapshotTransferError (not the index its first chunk named)."""
        assert self.done
        state = ControllerState.restore(b"".join(self._parts))
        if state.applied_index != self.index:
            raise SnapshotTransferError(f"the snapshot reflects entry {state.applied_index}, its chunks said {self.index}")
        return state


__all__ = ["SnapshotAssembly", "SnapshotSource", "SnapshotTransferError", "StateFormatError"]
