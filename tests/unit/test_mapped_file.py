import os

import pytest

from commitlog import mapped_file as mapped_file_module
from commitlog import mapped_file_queue, native
from commitlog.mapped_file import MappedFile, StoreError, segment_name
from commitlog.mapped_file_queue import MappedFileQueue
from commitlog.pagecache import resident_pages
from tests.smaps import mappings_of

SIZE = 16 * 4096


def new_file(tmp_path, start=0, write_buffer=None) -> MappedFile:
    return MappedFile(str(tmp_path / segment_name(start)), file_size=SIZE, create=True, write_buffer=write_buffer)


def test_segment_is_preallocated_and_named_by_its_offset(tmp_path):
    mapped_file = new_file(tmp_path, start=SIZE * 3)
    assert os.path.basename(mapped_file.path) == "00000000000000196608"
    assert os.path.getsize(mapped_file.path) == SIZE
    assert os.stat(mapped_file.path).st_blocks * 512 >= SIZE  # blocks reserved, not sparse
    mapped_file.close()


def test_append_is_whole_or_nothing_and_slices_are_zero_copy(tmp_path):
    mapped_file = new_file(tmp_path)
    assert mapped_file.append(b"abc")
    assert not mapped_file.append(b"x" * SIZE)
    assert mapped_file.wrote_position == 3
    view = mapped_file.slice(1, 100)
    assert isinstance(view, memoryview) and bytes(view) == b"bc"  # bounded by the read position
    mapped_file.append(b"d")
    assert bytes(mapped_file.slice(0, 10)) == b"abcd"
    del view
    mapped_file.close()


def test_write_through_is_seen_through_the_mapping_and_on_disk(tmp_path):
    mapped_file = new_file(tmp_path)
    mapped_file.append(b"head")
    data = bytes(range(256)) * 40  # crosses pages, ends inside one
    mapped_file.write_through(memoryview(data))
    assert mapped_file.wrote_position == 4 + len(data)
    assert bytes(mapped_file.slice(0, 4 + len(data))) == b"head" + data  # readers use the mapping
    mapped_file.flush()
    mapped_file.close()
    with open(mapped_file.path, "rb") as file:
        assert file.read(4 + len(data)) == b"head" + data


def piped(data: bytes) -> int:
    """A pipe's read end holding ``data`` (the write end is closed)."""
    read_fd, write_fd = os.pipe()
    assert os.write(write_fd, data) == len(data)
    os.close(write_fd)
    return read_fd


@pytest.mark.parametrize("write_buffer", [False, True])
def test_write_from_pipe_moves_exactly_size_bytes_and_advances(tmp_path, write_buffer):
    mapped_file = new_file(tmp_path, write_buffer=bytearray(SIZE) if write_buffer else None)
    mapped_file.append(b"head")
    data = bytes(range(256)) * 40  # crosses pages, ends inside one
    read_fd = piped(data + b"next")
    try:
        mapped_file.write_from_pipe(read_fd, len(data))
        assert os.read(read_fd, 100) == b"next"  # what follows stays in the pipe
    finally:
        os.close(read_fd)
    assert mapped_file.wrote_position == 4 + len(data)
    mapped_file.commit()
    assert bytes(mapped_file.slice(0, 4 + len(data))) == b"head" + data
    mapped_file.flush()
    mapped_file.close()
    with open(mapped_file.path, "rb") as file:
        assert file.read(4 + len(data) + 1) == b"head" + data + b"\x00"


@pytest.mark.parametrize("write_buffer", [False, True])
def test_write_from_a_pipe_that_runs_dry_raises_and_leaves_the_end_where_it_was(tmp_path, write_buffer):
    mapped_file = new_file(tmp_path, write_buffer=bytearray(SIZE) if write_buffer else None)
    mapped_file.append(b"head")
    read_fd = piped(b"short")
    try:
        with pytest.raises(EOFError, match="held 5 of 10 bytes"):
            mapped_file.write_from_pipe(read_fd, 10)
    finally:
        os.close(read_fd)
    assert mapped_file.wrote_position == 4
    mapped_file.close()


def test_flush_honours_least_pages(tmp_path):
    mapped_file = new_file(tmp_path)
    mapped_file.append(b"x" * 4096 * 2)
    assert mapped_file.flush(least_pages=4) == 0
    mapped_file.append(b"x" * 4096 * 2)
    assert mapped_file.flush(least_pages=4) == 4096 * 4
    mapped_file.append(b"y")
    assert mapped_file.flush(least_pages=0) == 4096 * 4 + 1
    mapped_file.close()


def test_write_buffer_moves_three_positions_independently(tmp_path):
    buffer = bytearray(SIZE)
    mapped_file = new_file(tmp_path, write_buffer=buffer)
    mapped_file.append(b"a" * 5000)
    assert (mapped_file.wrote_position, mapped_file.committed_position, mapped_file.flushed_position) == (5000, 0, 0)
    assert mapped_file.read_position == 0  # readers see only committed bytes
    assert bytes(mapped_file.view()[:1]) == b"\x00"
    mapped_file.commit(least_pages=0)
    assert (mapped_file.wrote_position, mapped_file.committed_position, mapped_file.flushed_position) == (5000, 5000, 0)
    assert bytes(mapped_file.view()[:5000]) == b"a" * 5000
    mapped_file.append(b"b")
    mapped_file.flush(0)
    assert (mapped_file.wrote_position, mapped_file.committed_position, mapped_file.flushed_position) == (5001, 5000, 5000)
    mapped_file.close()


def test_truncate_zeroes_the_tail_on_disk(tmp_path):
    mapped_file = new_file(tmp_path)
    mapped_file.append(b"k" * 100 + b"DROP" * 100)
    mapped_file.truncate(100)
    assert mapped_file.wrote_position == mapped_file.flushed_position == 100
    mapped_file.close()
    with open(mapped_file.path, "rb") as file:
        data = file.read()
    assert data[:100] == b"k" * 100 and data[100:] == bytes(SIZE - 100)


def test_positions_are_checked(tmp_path):
    mapped_file = new_file(tmp_path)
    with pytest.raises(AssertionError):
        mapped_file.advance(SIZE + 1)
    mapped_file.close()


def test_wrong_size_or_name_is_refused_naming_the_file(tmp_path):
    path = tmp_path / segment_name(0)
    path.write_bytes(b"short")
    with pytest.raises(StoreError, match=str(path)):
        MappedFile(str(path), file_size=SIZE, create=False)
    with pytest.raises(StoreError, match="multiple"):
        MappedFile(str(tmp_path / segment_name(100)), file_size=SIZE, create=True)


def test_queue_rolls_finds_by_offset_and_truncates(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    for _ in range(3):
        mapped_file = queue.get_last_mapped_file(0)
        assert mapped_file.append(b"z" * SIZE)
    assert [f.file_from_offset for f in queue.mapped_files] == [0, SIZE, 2 * SIZE]
    assert queue.find_mapped_file_by_offset(SIZE + 5) is queue.mapped_files[1]
    assert queue.find_mapped_file_by_offset(3 * SIZE) is None
    assert queue.max_offset == 3 * SIZE
    queue.truncate_dirty_files(SIZE + 10)
    assert queue.max_offset == SIZE + 10 and len(queue.mapped_files) == 2
    assert not os.path.exists(tmp_path / segment_name(2 * SIZE))
    assert queue.delete_first_files(5) == [str(tmp_path / segment_name(0))]  # never the last
    assert queue.min_offset == SIZE
    queue.close()


def test_queue_load_refuses_gaps_and_foreign_files(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    for _ in range(3):
        queue.get_last_mapped_file(0).append(b"z" * SIZE)
    queue.close()
    os.unlink(tmp_path / segment_name(SIZE))
    with pytest.raises(StoreError, match=segment_name(2 * SIZE)):
        MappedFileQueue(str(tmp_path), file_size=SIZE).load()
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(StoreError, match="notes.txt"):
        MappedFileQueue(str(tmp_path), file_size=SIZE).load()


def test_zero_length_last_file_is_dropped_on_load(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    queue.get_last_mapped_file(0).append(b"a")
    queue.close()
    (tmp_path / segment_name(SIZE)).write_bytes(b"")
    loaded = MappedFileQueue(str(tmp_path), file_size=SIZE)
    loaded.load()
    assert len(loaded.mapped_files) == 1
    assert not os.path.exists(tmp_path / segment_name(SIZE))
    loaded.close()


def test_warm_ahead_prepares_the_next_segment_which_the_roll_then_uses(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    queue.get_last_mapped_file(0).append(b"a" * (SIZE - 100))
    queue.warm_ahead(4096)
    spare_path = tmp_path / segment_name(SIZE)
    assert spare_path.exists()
    queue.last.append(b"a" * 100)
    rolled = queue.get_last_mapped_file(0)
    assert rolled.path == str(spare_path) and rolled.wrote_position == 0
    queue.close()


@pytest.mark.skipif(not native.AVAILABLE, reason="the warm-up faults nothing in without the native module")
def test_the_next_segment_is_due_once_the_last_is_half_full(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    assert not queue.needs_warming(4096)  # no segment yet: nothing to warm
    last = queue.get_last_mapped_file(0)
    assert queue.needs_warming(4096)  # nothing faulted in ahead of the writer yet
    queue.warm_ahead(4096)
    assert not queue.needs_warming(4096) and not (tmp_path / segment_name(SIZE)).exists()
    last.append(b"a" * (SIZE // 2 - 4096))  # not yet half full
    queue.warm_ahead(4096)
    assert not queue.needs_warming(4096) and not (tmp_path / segment_name(SIZE)).exists()
    last.append(b"a" * 4096)  # half full: the spare is due
    assert queue.needs_warming(4096)
    queue.warm_ahead(4096)
    assert (tmp_path / segment_name(SIZE)).exists()
    assert not queue.needs_warming(4096)
    last.append(b"a" * (SIZE // 2 - 100))  # near the end: the spare's start is due to be warmed
    assert queue.needs_warming(4096)
    queue.warm_ahead(4096)
    assert not queue.needs_warming(4096)
    queue.close()


def test_warming_nothing_ahead_only_makes_the_next_segment(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    last = queue.get_last_mapped_file(0)
    last.append(b"a" * 100)
    assert not queue.needs_warming(0)  # a slave keeping up: no pages faulted in ahead
    last.append(b"a" * (SIZE // 2))
    assert queue.needs_warming(0)  # but the next segment is still made ahead of the roll
    queue.warm_ahead(0)
    assert (tmp_path / segment_name(SIZE)).exists() and last.populated_position == 0
    assert not queue.needs_warming(0)
    queue.close()


def test_a_queue_that_defers_directory_syncs_makes_them_at_its_next_flush(tmp_path, monkeypatch):
    import commitlog.mapped_file as mapped_file_module
    import commitlog.mapped_file_queue as queue_module

    synced = []
    monkeypatch.setattr(mapped_file_module, "fsync_directory", synced.append)
    monkeypatch.setattr(queue_module, "fsync_directory", synced.append)
    eager = MappedFileQueue(str(tmp_path / "eager"), file_size=SIZE)
    eager.get_last_mapped_file(0)
    assert synced == [str(tmp_path / "eager")]  # at creation
    synced.clear()
    deferred = MappedFileQueue(str(tmp_path / "deferred"), file_size=SIZE, sync_directory_on_create=False)
    deferred.get_last_mapped_file(0).append(b"a" * SIZE)
    deferred.get_last_mapped_file(0)
    assert synced == []  # two segments created, no directory sync yet
    deferred.flush()
    assert synced == [str(tmp_path / "deferred")]  # one, before the segments' data
    deferred.flush()
    assert synced == [str(tmp_path / "deferred")]  # nothing created since
    eager.close()
    deferred.close()


@pytest.mark.skipif(native.sync_range is None, reason="native module not built")
def test_flush_syncs_the_range_since_the_last_flush(tmp_path, monkeypatch):
    import commitlog.mapped_file as mapped_file_module

    calls = []

    def spy(view, start, end):
        calls.append((start, end))
        native.sync_range(view, start, end)

    monkeypatch.setattr(mapped_file_module, "_native_sync_range", spy)
    mapped_file = new_file(tmp_path)
    mapped_file.populate(SIZE)  # warmed ahead: not part of any flush
    mapped_file.append(b"a" * 5000)
    assert mapped_file.flush() == 5000
    mapped_file.append(b"b" * 10)
    assert mapped_file.flush() == 5010
    assert mapped_file.flush() == 5010  # nothing new: no sync
    assert calls == [(0, 5000), (5000, 5010)]
    mapped_file.close()
    with open(mapped_file.path, "rb") as file:
        assert file.read(5010) == b"a" * 5000 + b"b" * 10




def test_flush_drops_the_page_cache_behind_the_kept_bytes_and_the_data_reads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(mapped_file_queue, "DROP_CACHED_STEP_MIN", 4096)  # these segments are 64 KiB
    monkeypatch.setattr(mapped_file_queue, "DROP_CACHED_ALIGN", 4096)
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    data = os.urandom(3 * SIZE - 4096)
    written = 0
    while written < len(data):
        mapped_file = queue.get_last_mapped_file(0)
        count = min(mapped_file.remaining, len(data) - written)
        assert mapped_file.append(data[written : written + count])
        written += count
    keep = SIZE + 2 * 4096
    assert queue.flush(keep_cached=keep) == len(data)
    below = len(data) - keep  # = 2 * SIZE - 3 pages: all of segment 0, segment 1 but its last 3 pages
    pages = [page for f in queue.mapped_files for page in resident_pages(f.path)]
    assert not any(pages[: below // 4096]), "pages behind the kept bytes are still cached"
    assert all(pages[below // 4096 : len(data) // 4096]), "pages within the kept bytes were dropped"
    assert b"".join(bytes(f.slice(0, SIZE)) for f in queue.mapped_files) == data  # faulted back from disk
    queue.flush(keep_cached=0)  # 0 drops nothing: what the read brought back stays
    assert all(page for f in queue.mapped_files for page in resident_pages(f.path)[:-1])


def test_a_page_cache_drop_ends_on_a_2_mib_boundary_so_large_folios_are_evicted_whole(tmp_path):
    """fadvise DONTNEED evicts only the folios its range covers whole, and the next drop starts
    where this one ended: an end inside a 2 MiB folio left that folio cached for good."""
    size = 8 * 1024 * 1024
    queue = MappedFileQueue(str(tmp_path), file_size=size)
    assert queue.get_last_mapped_file(0).append(os.urandom(size - 4096))
    keep = 1024 * 1024 + 3 * 4096  # the end of the drop, unrounded: 7 MiB - 4 pages
    queue.flush(keep_cached=keep)
    (mapped_file,) = queue.mapped_files
    assert mapped_file.dropped_position == 6 * 1024 * 1024  # rounded down to 2 MiB
    pages = resident_pages(mapped_file.path)
    assert not any(pages[: 6 * 256]) and all(pages[6 * 256 : (size - 4096) // 4096])
    queue.close()


def test_the_page_cache_is_dropped_in_steps_not_per_flush(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE)
    assert queue.get_last_mapped_file(0).append(os.urandom(SIZE))
    queue.flush(keep_cached=4096)  # 60 KiB behind the kept bytes: under DROP_CACHED_STEP_MIN
    assert all(resident_pages(queue.mapped_files[0].path))
    queue.close()
    queue.close()


def test_resident_says_whether_the_page_cache_holds_every_page_of_a_range(tmp_path):
    mapped_file = MappedFile(str(tmp_path / segment_name(0)), file_size=SIZE, create=True)
    assert mapped_file.append(os.urandom(SIZE))
    mapped_file.flush(0)
    assert mapped_file.resident(0, SIZE)
    mapped_file.drop_cached(4 * 4096)  # the first four pages
    assert not mapped_file.resident(0, SIZE) and not mapped_file.resident(3 * 4096 + 100, 5 * 4096)
    assert mapped_file.resident(4 * 4096, SIZE)
    assert resident_pages(mapped_file.path)[:4] == [False] * 4  # as the page cache has it
    mapped_file.close()
    assert mapped_file.resident(0, SIZE)  # closed: cannot tell, and says so by True


def _read_ahead_off(mapped_file) -> list[tuple[int, int, bool]]:
    """(file offset start, end, read-ahead off) of each of this process's mappings of the file
    (VmFlags ``rr`` is MADV_RANDOM)."""
    return [(m["start"], m["end"], "rr" in m["flags"]) for m in mappings_of(mapped_file.path)]


def test_small_pages_turn_read_ahead_off_ahead_of_the_writer_and_on_again_behind_the_flushed_end(tmp_path, monkeypatch):
    """A store that syncs each put: pages faulted in ahead of the writer come one at a time (no
    read-ahead, so no large folio that a small write dirties whole and the next sync writes back);
    behind the flushed end, less a margin and in steps, the mapping reads ahead again for readers."""
    monkeypatch.setattr(mapped_file_module, "SMALL_PAGES_MARGIN", 2 * 4096)
    monkeypatch.setattr(mapped_file_module, "SMALL_PAGES_NORMAL_STEP", 4 * 4096)
    mapped_file = MappedFile(str(tmp_path / segment_name(0)), file_size=SIZE, create=True, small_pages=True)
    assert _read_ahead_off(mapped_file) == [(0, SIZE, True)]
    assert mapped_file.append(os.urandom(5 * 4096 + 100))
    mapped_file.flush(0)  # flushed 5 pages + 100 bytes: 3 pages behind the margin, under a step
    assert _read_ahead_off(mapped_file) == [(0, SIZE, True)]
    assert mapped_file.append(os.urandom(2 * 4096))
    mapped_file.flush(0)  # 7 pages + 100: 5 pages behind the margin, a step
    assert _read_ahead_off(mapped_file) == [(0, 5 * 4096, False), (5 * 4096, SIZE, True)]
    assert mapped_file.append(os.urandom(SIZE - mapped_file.wrote_position))
    mapped_file.flush(0)  # full: read-ahead everywhere
    assert _read_ahead_off(mapped_file) == [(0, SIZE, False)]
    mapped_file.close()


def test_without_small_pages_the_mapping_reads_ahead_everywhere(tmp_path):
    mapped_file = new_file(tmp_path)
    assert mapped_file.append(os.urandom(3 * 4096))
    mapped_file.flush(0)
    assert _read_ahead_off(mapped_file) == [(0, SIZE, False)]
    mapped_file.close()


def test_small_pages_after_recovery_start_at_the_end_of_the_data_and_after_a_truncation(tmp_path):
    queue = MappedFileQueue(str(tmp_path), file_size=SIZE, small_pages=True)
    assert queue.get_last_mapped_file(0).append(os.urandom(6 * 4096))
    queue.flush()
    queue.close()
    reopened = MappedFileQueue(str(tmp_path), file_size=SIZE, small_pages=True)
    reopened.load()
    (mapped_file,) = reopened.mapped_files
    assert _read_ahead_off(mapped_file) == [(0, SIZE, False)]  # opened whole, as recovery finds it
    mapped_file.set_positions(6 * 4096 + 10)  # recovery: the data ends here
    assert _read_ahead_off(mapped_file) == [(0, 6 * 4096, False), (6 * 4096, SIZE, True)]
    mapped_file.truncate(2 * 4096)
    assert _read_ahead_off(mapped_file) == [(0, 2 * 4096, False), (2 * 4096, SIZE, True)]
    reopened.close()
