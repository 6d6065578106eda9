"""Recovery fed damaged files: random bytes written anywhere in the data, index, checkpoint or
currterm files. Reopening either refuses with a StoreError or recovers a prefix of what was
written, every entry read back byte for byte; never another exception, never a changed entry."""

import dataclasses
import os
import shutil
import tempfile

import pytest
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
# Found by this test: two flips, a raised term in entry 43's header and then (a) a flip in entry
# 42's index unit: the cut took entry 42's term from that unit, or (b) a flip that made entry 44
# look torn: entry 43 ended the log, kept with its damaged term. Now the last entry's term is
# checked against its index unit, and a cut takes the previous term from the scanned header.
@example(checkpoint=False, damages=[("data", 65, b"\x01"), ("index", 689, b"\x01")])
@example(checkpoint=False, damages=[("data", 65, b"\x01"), ("data", 689, b"\x01")])
# Found by this test: a flip cuts the log below entry 59 and another zeroes entry 59's index
# unit's term: the mark took term 0 from that unit, below the kept entries' 5. Now the kept
# end's term (read from its header) is the mark's floor.
@example(checkpoint=True, damages=[("data", 20000, b"\x00"), ("index", 19667, b"\x00" * 11 + b"\x01")])
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


# -- checkpoint and currterm: a CRC line and a copy -------------------------------------------------

def test_a_damaged_state_file_is_read_from_its_copy_and_both_damaged_refused_naming_both(tmp_path):
    from commitlog.dledger import state_files

    path = str(tmp_path / "currterm")
    state_files.write_properties(path, {"currTerm": 7, "voteLeader": "n1"})
    assert state_files.read_properties(path) == {"currTerm": "7", "voteLeader": "n1"}
    with open(path, "r+b") as file:  # the vote's member id damaged: still text, still key=value
        file.seek(len(b"currTerm=7\nvoteLeader=n"))
        file.write(b"2")
    assert state_files.read_properties(path) == {"currTerm": "7", "voteLeader": "n1"}  # from the copy
    with open(path + ".bak", "r+b") as file:
        file.seek(len(b"currTerm="))
        file.write(b"\xf4")
    with pytest.raises(StoreError) as caught:
        state_files.read_properties(path)
    assert "crc32c line does not match" in str(caught.value) and "its copy too" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("joined_by", [b"*", b"=", b" "])
def test_a_state_file_whose_crc_line_was_joined_to_the_line_above_is_read_from_its_copy(tmp_path, joined_by):
    """The line ending before ``crc32c=`` flipped (a corrupt drill's round: ``0x0a -> 0x2a``): the
    file no longer has a crc32c line of its own and was read unchecked as a DLedger file, its last
    value ``committedIndex='103407*crc32c=...'`` refused as not an integer and the member with it."""
    from commitlog.dledger import state_files

    path = str(tmp_path / "currterm")
    state_files.write_properties(path, {"currTerm": 7, "voteLeader": "n1", "committedIndex": 103407})
    with open(path, "rb") as file:
        data = file.read()
    cut = data.index(b"\ncrc32c=")
    with open(path, "r+b") as file:
        file.seek(cut)
        file.write(joined_by)
    assert state_files.read_properties(path) == {"currTerm": "7", "voteLeader": "n1", "committedIndex": "103407"}  # the copy's


def test_a_state_file_without_a_crc_line_reads_as_before(tmp_path):
    """DLedger's, or an older hasvc's."""
    from commitlog.dledger import state_files

    path = tmp_path / "checkpoint"
    path.write_text("endIndex=5\ncommittedIndex=4\n")
    assert state_files.read_properties(str(path)) == {"endIndex": "5", "committedIndex": "4"}
