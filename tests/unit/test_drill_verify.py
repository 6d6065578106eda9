"""The corrupt drills' incremental checks (``hasvc.tools.drill_verify``) find what a full check
finds in what changed since the last one: a damaged byte below the verified end, a queue unit
wrong among the units appended since — and not what lies past the part they verified."""

import os

from commitlog import record as rec
from commitlog.consume_queue import CQ_UNIT_SIZE
from commitlog.inspect import check_consume_queues
from commitlog.store import MessageStore
from hasvc.tools.drill_verify import FileDigests, PrefixDigests, QueueRebuild, RoundClock, RoundTimeout, file_signature


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ 0x10]))


def _recorded(*files) -> PrefixDigests:
    """A ``PrefixDigests`` of ``files`` ((path, content) each) written and each recorded whole."""
    digests = PrefixDigests()
    for path, content in files:
        path.write_bytes(content)
        digests.record(str(path), len(content))
    return digests


def test_a_changed_byte_in_the_verified_part_is_named_and_bytes_appended_after_it_are_not(tmp_path):
    path = tmp_path / "segment"
    digests = _recorded((path, b"v" * 4096))
    with open(path, "ab") as file:
        file.write(b"appended")  # past the verified part: the next check's to read
    assert digests.changed() == []
    _flip(str(path), 1000)
    assert digests.changed() == [str(path)]


def test_a_damaged_file_and_the_newest_of_its_directory_are_re_read_even_when_no_signature_moved(tmp_path, monkeypatch):
    # Writes the files' signatures hide (a flip that kept the times; an append through a mapping
    # to a page already dirty): the damaged file is forced and the newest file of a directory
    # (the one being appended to) is always read again; an older one is trusted.
    older, newest = tmp_path / "00000000000000000000", tmp_path / "00000000000000004096"
    digests = _recorded((older, b"v" * 4096), (newest, b"w" * 4096))
    signatures = {path: held[0] for path, held in digests.files.items()}
    monkeypatch.setattr("hasvc.tools.drill_verify.file_signature", lambda path: signatures[path])
    _flip(str(older), 17)
    assert digests.changed() == []  # trusted: nothing moved
    assert digests.changed([str(older)]) == [str(older)]  # the round's damaged file: read again
    _flip(str(newest), 4000)
    assert digests.changed() == [str(newest)]


def test_the_newest_queue_file_is_hashed_again_even_when_its_signature_did_not_move(tmp_path, monkeypatch):
    directory = tmp_path / "consumequeue" / "T" / "0"
    directory.mkdir(parents=True)
    older, newest = directory / "00000000000000000000", directory / "00000000000000000600"
    older.write_bytes(b"u" * 600)
    newest.write_bytes(b"u" * 20 + bytes(580))
    files = FileDigests()
    before = files.digests(str(tmp_path))
    signatures = {str(path): file_signature(str(path)) for path in (older, newest)}
    monkeypatch.setattr("hasvc.tools.drill_verify.file_signature", lambda path: signatures[path])
    with open(newest, "r+b") as file:
        file.seek(20)
        file.write(b"u" * 20)  # a unit appended: the file's size and (here) times unchanged
    after = files.digests(str(tmp_path))
    assert after["T/0/00000000000000000600"] != before["T/0/00000000000000000600"]
    assert after["T/0/00000000000000000000"] == before["T/0/00000000000000000000"]


def test_a_shortened_or_deleted_file_is_named(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    digests = _recorded((first, b"x" * 100), (second, b"y" * 100))
    os.truncate(first, 50)
    second.unlink()
    assert digests.changed() == [str(first), str(second)]


def _send(store: MessageStore, count: int, *, first: int = 0) -> None:
    for number in range(first, first + count):
        result = store.append([rec.Message("T", b"%05d" % number + b"b" * 100, queue_id=number % 2)])
        assert result.status is rec.PutMessageStatus.PUT_OK, result


def _dispatch_all(store: MessageStore) -> None:
    while store.dispatch():
        pass


def _queue_file(root: str, queue_id: int) -> str:
    directory = os.path.join(root, "consumequeue", "T", str(queue_id))
    return os.path.join(directory, sorted(os.listdir(directory))[0])


def test_the_queue_units_appended_since_the_last_round_are_compared_with_a_rebuild(tmp_path, small_config):
    root = str(tmp_path)
    rebuild = QueueRebuild()
    with MessageStore.open(root, small_config) as store:
        _send(store, 40)
        _dispatch_all(store)
        first_end = store.commit_log.max_offset
    assert rebuild.advance(root, 0, first_end).ok
    with MessageStore.open(root, small_config) as store:
        _send(store, 40, first=40)
        _dispatch_all(store)
        second_end = store.commit_log.max_offset
    _flip(_queue_file(root, 1), 25 * CQ_UNIT_SIZE + 3)  # queue 1's unit 25: appended in the second part
    assert not check_consume_queues(root).ok  # what the full check says
    check = rebuild.advance(root, first_end, second_end)
    assert [(d.queue_id, d.index) for d in check.differences] == [(1, 25)]
    assert rebuild.advance(root, second_end, second_end).ok  # nothing appended since: nothing re-read


def test_the_queue_prefix_guard_names_a_unit_changed_below_the_compared_end(tmp_path, small_config):
    root = str(tmp_path)
    rebuild, prefixes = QueueRebuild(), PrefixDigests()
    with MessageStore.open(root, small_config) as store:
        _send(store, 40)
        _dispatch_all(store)
        end = store.commit_log.max_offset
    assert rebuild.advance(root, 0, end).ok
    for path, length in rebuild.queue_ends(root).items():
        assert length == 20 * CQ_UNIT_SIZE
        prefixes.record(path, length)
    _flip(_queue_file(root, 0), 3 * CQ_UNIT_SIZE + 1)
    assert prefixes.changed() == [_queue_file(root, 0)]


def test_a_round_past_its_bound_says_what_it_was_waiting_for():
    clock = RoundClock(0.0)
    try:
        clock.check("the replicas to converge")
    except RoundTimeout as error:
        assert str(error) == "the round took over 0 s: still waiting for the replicas to converge"
    else:
        raise AssertionError("no RoundTimeout past the deadline")


def test_a_file_holds_data_exactly_when_it_has_a_nonzero_byte_however_far_in(tmp_path):
    from hasvc.tools.faults import HOLDS_DATA_CHUNK_SIZE, data_extent, holds_data

    cases = {"empty": b"", "zeros": bytes(3 * HOLDS_DATA_CHUNK_SIZE), "first": b"\x01" + bytes(100),
             "far": bytes(2 * HOLDS_DATA_CHUNK_SIZE + 5) + b"\x01" + bytes(7)}  # fmt: skip
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        assert holds_data(str(tmp_path / name)) == (data_extent(str(tmp_path / name)) > 0), name
    assert [holds_data(str(tmp_path / name)) for name in cases] == [False, False, True, True]
