"""Recovery fed damaged files: random bytes written anywhere in the data, index, checkpoint or
currterm files. Reopening either refuses with a StoreError or recovers a prefix of what was
written, every entry read back byte for byte; never another exception, never a changed entry."""

import dataclasses
import os
import shutil
import tempfile

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from commitlog.dledger import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from commitlog.mapped_file import StoreError

CONFIG = DLedgerStoreConfig(data_file_size=4096, index_file_size=32 * 32)
# A member of a group: damage is cut (the catch-up mark saved) instead of refused.
REPAIR = dataclasses.replace(CONFIG, recovery_repair_from_peers=True)
ENTRIES = [Entry(i, i // 10, bytes([i]) * (i * 53 % 300)) for i in range(60)]


def build(path: str, *, checkpoint: bool) -> None:
    store = DLedgerMmapFileStore.open(path, CONFIG)
    store.append(ENTRIES)
    store.flush()
    if checkpoint:
        store.persist_checkpoint()
    store.abandon()


@settings(max_examples=int(os.environ.get("HASVC_DAMAGE_EXAMPLES", "60")))
@given(
    checkpoint=st.booleans(),
    damages=st.lists(
        st.tuples(st.sampled_from(["data", "index", "checkpoint", "currterm"]), st.integers(0, 1 << 20),
                  st.binary(min_size=1, max_size=64)),
        min_size=1, max_size=3,
    ),
)  # fmt: skip
# Found by this test (stop 30): one byte raises entry 23's term (under no CRC) to 2**32 + 2; the
# scan ended the log at entry 24 (a lower term) and kept the damaged entry. Now refused.
@example(checkpoint=False, damages=[("data", 1000, b"\x01")])
def test_recovery_from_damaged_files_refuses_or_keeps_a_prefix(checkpoint, damages):
    recover_damaged(checkpoint, damages, CONFIG)


@settings(max_examples=int(os.environ.get("HASVC_DAMAGE_EXAMPLES", "60")))
@given(
    checkpoint=st.booleans(),
    damages=st.lists(
        st.tuples(st.sampled_from(["data", "index", "checkpoint", "currterm"]), st.integers(0, 1 << 20),
                  st.binary(min_size=1, max_size=64)),
        min_size=1, max_size=3,
    ),
)  # fmt: skip
@example(checkpoint=False, damages=[("data", 1000, b"\x01")])  # a term raised: that entry goes too
@example(checkpoint=True, damages=[("data", 2000, b"\x55")])
def test_recovery_for_repair_from_peers_keeps_a_prefix_below_its_mark(checkpoint, damages):
    last, state = recover_damaged(checkpoint, damages, REPAIR)
    if last is not None and state is not None and state.catch_up_index >= 0:
        assert state.catch_up_index > last  # above what was kept, as far as the files tell
        assert state.catch_up_term >= (ENTRIES[last].term if last >= 0 else 0)


def recover_damaged(checkpoint, damages, config):
    """Build, damage, reopen with ``config``: (last index kept, hard state) or (None, None) refused."""
    path = tempfile.mkdtemp(prefix="hasvc-dledger-damage-")
    try:
        build(path, checkpoint=checkpoint)
        for where, at, data in damages:
            if where in ("data", "index"):
                names = sorted(os.listdir(os.path.join(path, where)))
                size = CONFIG.data_file_size if where == "data" else CONFIG.index_file_size
                name = names[at % len(names)]
                target, offset = os.path.join(path, where, name), at // len(names) % (size - len(data))
            else:
                target, offset = os.path.join(path, where), at % 64
            with open(target, "r+b" if os.path.exists(target) else "wb") as file:
                file.seek(offset)
                file.write(data)
        try:
            store = DLedgerMmapFileStore.open(path, config)
        except StoreError:
            event("refused")
            return None, None
        try:
            state = store.load_hard_state()
            last = store.last_index()
            event("all entries" if last == len(ENTRIES) - 1 else "a shorter prefix")
            assert store.first_index() == 0
            assert store.read(0, last + 1, size_max=1 << 30) == ENTRIES[: last + 1]
            store.append([Entry(last + 1, 9, b"after recovery")])
        finally:
            store.close()
        store = DLedgerMmapFileStore.open(path, CONFIG)  # what recovery left opens again, unchanged
        assert store.read(0, last + 2, size_max=1 << 30) == [*ENTRIES[: last + 1], Entry(last + 1, 9, b"after recovery")]
        store.close()
        return last, state
    finally:
        shutil.rmtree(path, ignore_errors=True)
