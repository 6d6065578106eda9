"""Storage faults for drills: one flipped bit in one file of a stopped replica's store.

``flip_random_byte(store, rng)`` picks a file kind at random among those the store has (commit
log segments, consume queue files, the checkpoint, the epoch files; for a DLedger member its data
and index files and its checkpoint/currterm files), a file of that kind, and a byte inside the
part of the file that holds data (up to its last nonzero byte: flipping a byte of a preallocated
zero tail tests nothing), and XORs one bit of it. The choice is a function of ``rng`` alone, so
a drill's seed replays it. Nothing here runs while the store is open.
"""

from __future__ import annotations

import dataclasses
import os
import random

from commitlog.mapped_file import nonzero_extent

# Kinds and where their files live, relative to the store directory (a DLedger member's files
# are under dledger/<group>/<member>/ or similar: found by walking, by these names).
CLASSIC_KINDS = ("segment", "consume-queue", "checkpoint", "epoch")
DLEDGER_KINDS = ("data", "index", "checkpoint", "currterm")


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    path: str
    position: int  # byte inside the file
    before: int
    after: int

    def describe(self, root: str = "") -> str:
        where = os.path.relpath(self.path, root) if root else self.path
        return f"{self.kind} {where} byte {self.position}: {self.before:#04x} -> {self.after:#04x}"


def store_files(store: str) -> dict[str, list[str]]:
    """The files of ``store`` by kind (kinds with no file are left out)."""
    found: dict[str, list[str]] = {}
    for directory, _dirs, names in os.walk(store):
        relative = os.path.relpath(directory, store).split(os.sep)
        for name in sorted(names):
            kind = _kind(relative, name)
            if kind is not None:
                found.setdefault(kind, []).append(os.path.join(directory, name))
    return {kind: sorted(paths) for kind, paths in sorted(found.items())}


def _kind(relative: list[str], name: str) -> str | None:
    if relative[0] == "commitlog" and name.isdigit():
        return "segment"
    if relative[0] == "consumequeue" and name.isdigit():
        return "consume-queue"
    if "data" in relative and name.isdigit():
        return "data"
    if "index" in relative and name.isdigit():
        return "index"
    if relative == ["."] and name == "checkpoint":
        return "checkpoint"
    if relative != ["."] and name == "checkpoint":
        return "checkpoint"
    if name == "currterm":
        return "currterm"
    if name in ("epoch", "epoch.bak"):
        return "epoch"
    return None


def data_extent(path: str) -> int:
    """Bytes of ``path`` up to its last nonzero byte."""
    with open(path, "rb") as file:
        data = file.read()
    return nonzero_extent(memoryview(data), 0, len(data))


HOLDS_DATA_CHUNK_SIZE = 1 << 16  # bytes read at a time looking for a nonzero one (a data file's first holds one)


def holds_data(path: str) -> bool:
    """Whether ``path`` has a nonzero byte (``data_extent(path) > 0``), read only as far as the
    first one: choosing a file must not read every file of a store whole."""
    with open(path, "rb") as file:
        while data := file.read(HOLDS_DATA_CHUNK_SIZE):
            if data.count(0) != len(data):
                return True
    return False


def flip_random_byte(store: str, rng: random.Random, *, kinds: tuple[str, ...] | None = None) -> Fault | None:
    """Flip one bit of one random data byte of one random file; None when no file holds data."""
    files = store_files(store)
    candidates = {kind: [p for p in paths if holds_data(p)] for kind, paths in files.items()
                  if kinds is None or kind in kinds}  # fmt: skip
    candidates = {kind: paths for kind, paths in candidates.items() if paths}
    if not candidates:
        return None
    kind = rng.choice(sorted(candidates))
    path = rng.choice(candidates[kind])
    position = rng.randrange(data_extent(path))
    bit = 1 << rng.randrange(8)
    with open(path, "r+b") as file:
        file.seek(position)
        before = file.read(1)[0]
        file.seek(position)
        file.write(bytes([before ^ bit]))
        file.flush()
        os.fsync(file.fileno())
    return Fault(kind, path, position, before, before ^ bit)
