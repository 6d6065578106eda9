"""STORE/identity: written when a store is created, checked on every open before anything is
written; a refusal is one line naming the file and leaves every byte of the store as it was."""

import hashlib
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitlog import identity as store_identity
from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.dledger import DLedgerStoreConfig
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.identity import StoreKind
from commitlog.mapped_file import StoreError
from commitlog.store import MessageStore
from tests.unit.test_dledger_message_store import lead

SEGMENT_SIZE = 4096
CONFIG = StoreConfig(commitlog_segment_size=SEGMENT_SIZE, consume_queue_units_per_file=64,
                     disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip
DLEDGER = DLedgerStoreConfig(data_file_size=SEGMENT_SIZE, index_file_size=32 * 64)


def open_member(path, self_id="n0", group=None, **options):
    return DLedgerMessageStore.open(str(path), CONFIG, self_id=self_id, dledger=DLEDGER, group=group, **options)


def classic_store(path, count=5):
    with MessageStore.open(str(path), CONFIG) as store:
        for _ in range(count):
            assert store.append([rec.Message("T", b"x" * 700)]).status is rec.PutMessageStatus.PUT_OK


def member_store(path, self_id="n0", group="g", count=5):
    """A member's store with ``count`` committed, dispatched messages (planned as a leader plans)."""
    with open_member(path, self_id, group) as store:
        for _ in range(count):
            lead(store, [rec.Message("T", b"y" * 300)])


def store_bytes(path) -> dict[str, str]:
    """Every file and directory under ``path`` -> a digest of its content ("dir" for directories)."""
    found = {}
    for directory, directories, files in os.walk(path):
        for name in directories:
            found[os.path.relpath(os.path.join(directory, name), path)] = "dir"
        for name in files:
            full = os.path.join(directory, name)
            with open(full, "rb") as file:
                found[os.path.relpath(full, path)] = hashlib.sha256(file.read()).hexdigest()
    return found


def refused(path, opening, match) -> str:
    """``opening()`` raises a one-line StoreError matching ``match`` and no byte of ``path`` changes."""
    before = store_bytes(path)
    with pytest.raises(StoreError, match=match) as caught:
        opening()
    assert store_bytes(path) == before
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- created, read back, kept -----------------------------------------------------------------


def test_a_new_classic_store_gets_a_marker_that_later_opens_keep(tmp_path):
    classic_store(tmp_path)
    identity = store_identity.read_identity(str(tmp_path))
    assert identity.kind is StoreKind.CLASSIC and len(identity.store_id) == 32 and identity.created_ms > 0
    assert (identity.member, identity.group, identity.upgraded_ms) == (None, None, None)
    marker = (tmp_path / "identity").read_bytes()
    assert marker.startswith(b"version=1\nkind=classic\nstore_id=")
    with MessageStore.open(str(tmp_path), CONFIG) as store:
        assert store.identity == identity
    assert (tmp_path / "identity").read_bytes() == marker


def test_a_new_member_store_records_its_member_and_group(tmp_path):
    member_store(tmp_path, "n2", "g")
    identity = store_identity.read_identity(str(tmp_path))
    assert (identity.kind, identity.member, identity.group) == (StoreKind.DLEDGER, "n2", "g")
    with open_member(tmp_path, "n2", "g") as store:
        assert store.identity == identity


def test_the_marker_is_replaced_atomically(tmp_path, monkeypatch):
    """Written to identity.tmp, fsynced, renamed over: a crash before the rename leaves the old marker."""
    first = store_identity.StoreIdentity(StoreKind.CLASSIC, "a" * 32, 1)
    store_identity.write_identity(str(tmp_path), first)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    def crash(*args):
        raise OSError("crashed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    second = store_identity.StoreIdentity(StoreKind.DLEDGER, "b" * 32, 2, member="n0", group="g", upgraded_ms=2)
    with pytest.raises(OSError, match="before the rename"):
        store_identity.write_identity(str(tmp_path), second)
    assert synced, "the new content is fsynced before the rename"
    assert store_identity.read_identity(str(tmp_path)) == first
    monkeypatch.undo()
    store_identity.write_identity(str(tmp_path), second)
    assert store_identity.read_identity(str(tmp_path)) == second
    assert sorted(os.listdir(tmp_path)) == ["identity", "identity.bak"]  # the marker and its copy, no temporary left


# -- refusals: one line, nothing written --------------------------------------------------------


def test_a_classic_broker_on_a_members_store_is_refused_and_nothing_changes(tmp_path):
    member_store(tmp_path, "n2", "g")
    message = refused(tmp_path, lambda: MessageStore.open(str(tmp_path), CONFIG), "DLedger member n2's store")
    assert message.startswith(f"{tmp_path}/identity: ") and "hasvc node --self n2" in message


def test_a_node_with_another_self_or_group_is_refused_and_nothing_changes(tmp_path):
    member_store(tmp_path, "n2", "g")
    message = refused(tmp_path, lambda: open_member(tmp_path, "n1", "g"), "not member n1's")
    assert "--self n2" in message
    message = refused(tmp_path, lambda: open_member(tmp_path, "n2", "other"), "not of group other")
    assert "--group g" in message


def test_a_node_on_a_classic_store_is_refused_unless_it_upgrades_it(tmp_path):
    classic_store(tmp_path)
    classic = store_identity.read_identity(str(tmp_path))
    message = refused(tmp_path, lambda: open_member(tmp_path, "n0", "g"), "a classic broker's store")
    assert "--upgrade-from-classic" in message
    with open_member(tmp_path, "n0", "g", upgrade_classic=True) as store:
        assert store.divided_offset == SEGMENT_SIZE  # five 700-byte records: the first segment, sealed
    upgraded = store_identity.read_identity(str(tmp_path))
    assert (upgraded.kind, upgraded.member, upgraded.group) == (StoreKind.DLEDGER, "n0", "g")
    assert (upgraded.store_id, upgraded.created_ms) == (classic.store_id, classic.created_ms)
    assert upgraded.upgraded_ms >= classic.created_ms
    with open_member(tmp_path, "n0", "g") as store:  # a member's store now: no flag needed, the divide kept
        assert store.divided_offset == SEGMENT_SIZE
    refused(tmp_path, lambda: MessageStore.open(str(tmp_path), CONFIG), "DLedger member n0's store")


def test_an_upgrade_that_stopped_after_the_marker_finishes_on_the_next_open(tmp_path):
    """The marker is rewritten before the classic log is sealed: a crash in between leaves a
    member's store with an unsealed classic log and no data file, which the next open seals."""
    classic_store(tmp_path)
    classic = store_identity.read_identity(str(tmp_path))
    store_identity.write_identity(str(tmp_path), store_identity.StoreIdentity(
        StoreKind.DLEDGER, classic.store_id, classic.created_ms, member="n0", group="g", upgraded_ms=classic.created_ms))  # fmt: skip
    with open_member(tmp_path, "n0", "g") as store:
        assert store.divided_offset == SEGMENT_SIZE


def test_a_member_store_without_a_group_records_the_first_one_given(tmp_path):
    member_store(tmp_path, "n0", None)
    assert store_identity.read_identity(str(tmp_path)).group is None
    open_member(tmp_path, "n0", "g").close()
    assert store_identity.read_identity(str(tmp_path)).group == "g"
    refused(tmp_path, lambda: open_member(tmp_path, "n0", "h"), "not of group h")


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\xff\xfe garbage", "not UTF-8"),
        (b"version=1\nkind=classic\n", "no store_id= line"),
        (b"just some words\n", "not key=value"),
        (b"version=1\nkind=broker\nstore_id=" + b"a" * 32 + b"\ncreated_ms=1\n", "kind='broker'"),
        (b"version=2\nkind=classic\nstore_id=" + b"a" * 32 + b"\ncreated_ms=1\n", "version 2"),
        (b"version=1\nkind=classic\nstore_id=xyz\ncreated_ms=1\n", "32 lowercase hex"),
        (b"version=1\nkind=dledger\nstore_id=" + b"a" * 32 + b"\ncreated_ms=1\n", "no member= line"),
        (b"", "no version= line"),
    ],
)
def test_a_corrupt_marker_is_refused_in_one_line_naming_the_file(tmp_path, content, match):
    """The marker and its copy (``identity.bak``, written first) both corrupt."""
    classic_store(tmp_path)
    (tmp_path / "identity").write_bytes(content)
    (tmp_path / "identity.bak").write_bytes(content)
    message = refused(tmp_path, lambda: MessageStore.open(str(tmp_path), CONFIG), match)
    assert message.startswith(f"{tmp_path}/identity: ")
    refused(tmp_path, lambda: open_member(tmp_path, "n0", "g"), match)


def test_a_damaged_marker_is_read_from_its_copy(tmp_path):
    classic_store(tmp_path)
    whole = (tmp_path / "identity").read_bytes()
    (tmp_path / "identity").write_bytes(whole.replace(b"kind=classic", b"kind=classiC"))  # its CRC line no longer matches
    MessageStore.open(str(tmp_path), CONFIG).close()
    assert (tmp_path / "identity").read_bytes() == whole or (tmp_path / "identity.bak").read_bytes() == whole


@given(st.binary(max_size=300))
def test_any_marker_bytes_decode_or_raise_store_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("marker")
    (path / "identity").write_bytes(data)
    try:
        identity = store_identity.read_identity(str(path))
    except StoreError as error:
        assert "\n" not in str(error) and str(error).startswith(f"{path}/identity: ")
    else:
        assert identity is not None and identity.kind in StoreKind


NAMES = st.text(min_size=1, max_size=20).filter(lambda text: text.isprintable() and text == text.strip())


@given(st.sampled_from(list(StoreKind)), st.uuids(), st.integers(0, 1 << 62), NAMES, st.one_of(st.none(), NAMES))
def test_a_marker_reads_back_as_written(tmp_path_factory, kind, store_id, created_ms, member, group):
    path = str(tmp_path_factory.mktemp("marker"))
    dledger = kind is StoreKind.DLEDGER
    identity = store_identity.StoreIdentity(kind, store_id.hex, created_ms, member if dledger else None,
                                            group if dledger else None, created_ms if dledger else None)  # fmt: skip
    store_identity.write_identity(path, identity)
    assert store_identity.read_identity(path) == identity


# -- stores from before markers -----------------------------------------------------------------


def test_a_classic_store_without_a_marker_gets_one(tmp_path):
    classic_store(tmp_path)
    os.unlink(tmp_path / "identity")
    inferred = r"identity \(none: inferred from the files\): a classic"
    refused(tmp_path, lambda: open_member(tmp_path, "n0", "g"), inferred)
    MessageStore.open(str(tmp_path), CONFIG).close()
    assert store_identity.read_identity(str(tmp_path)).kind is StoreKind.CLASSIC


def test_a_member_store_without_a_marker_gets_one_and_a_master_is_refused(tmp_path):
    member_store(tmp_path, "n2", "g")
    os.unlink(tmp_path / "identity")
    refused(tmp_path, lambda: MessageStore.open(str(tmp_path), CONFIG), "inferred from the files.*DLedger member n2's")
    refused(tmp_path, lambda: open_member(tmp_path, "n1", "g"), "not member n1's")
    open_member(tmp_path, "n2", "g").close()
    identity = store_identity.read_identity(str(tmp_path))
    assert (identity.kind, identity.member, identity.group) == (StoreKind.DLEDGER, "n2", "g")


def test_an_upgraded_store_without_a_marker_is_a_members(tmp_path):
    classic_store(tmp_path)
    open_member(tmp_path, "n0", "g", upgrade_classic=True).close()
    os.unlink(tmp_path / "identity")
    assert store_identity.infer(str(tmp_path)) == store_identity.Inferred(StoreKind.DLEDGER, "n0")
    open_member(tmp_path, "n0", "g").close()


def test_a_store_with_both_kinds_of_log_overlapping_is_refused(tmp_path):
    """The issue's store: a master wrote a classic log over the offsets of n2's entries."""
    member_store(tmp_path / "n2", "n2", "g")
    classic_store(tmp_path / "other")
    os.rename(tmp_path / "other" / "commitlog", tmp_path / "n2" / "commitlog")
    os.unlink(tmp_path / "n2" / "identity")
    store = str(tmp_path / "n2")
    message = refused(store, lambda: MessageStore.open(store, CONFIG), "overlapping member n2's DLedger log")
    assert "hasvc store dump" in message
    refused(store, lambda: open_member(store, "n2", "g"), "overlapping")


def test_a_store_with_several_members_logs_is_refused(tmp_path):
    member_store(tmp_path, "n0", "g")
    os.unlink(tmp_path / "identity")
    os.mkdir(tmp_path / "dledger-n1")
    refused(tmp_path, lambda: open_member(tmp_path, "n0", "g"), "several DLedger members")
    refused(tmp_path, lambda: MessageStore.open(str(tmp_path), CONFIG), "several DLedger members")


def test_a_refused_open_creates_nothing_in_a_store_that_had_no_lock_file(tmp_path):
    """The check comes before the lock file, the abort file and the directories are made."""
    member_store(tmp_path, "n2", "g")
    for name in ("lock", "abort"):
        if os.path.exists(tmp_path / name):
            os.unlink(tmp_path / name)
    refused(tmp_path, lambda: MessageStore.open(str(tmp_path), CONFIG), "DLedger member n2's store")
    assert not os.path.exists(tmp_path / "lock") and not os.path.exists(tmp_path / "epoch")


def test_a_group_name_that_cannot_be_recorded_is_refused_before_anything_is_made(tmp_path):
    store = tmp_path / "new"
    with pytest.raises(StoreError, match="--group 'a\\\\nb' is not a name"):
        open_member(store, "n0", "a\nb")
    assert not store.exists()


def test_a_store_path_that_is_a_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "file").write_bytes(b"not a store")
    with pytest.raises(StoreError, match="file: not a directory"):
        MessageStore.open(str(tmp_path / "file"), CONFIG)
