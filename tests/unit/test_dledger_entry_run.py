"""Runs of stored DLedger entries (commitlog/dledger/entry_run.py): the check of a pushed run (the
native ``check_entries`` against its Python twin on valid, corrupted and garbage runs), the index
units, and the store's ``read_runs`` / ``check_run`` / ``append_run``: a follower appending the
leader's runs ends with byte-identical data and index files; a refused run writes nothing."""

import os
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import native
from commitlog.dledger import entry_codec as codec
from commitlog.dledger import entry_run as er
from commitlog.dledger.entry_store import DLedgerMmapFileStore, DLedgerStoreConfig, Entry
from tests.smaps import mappings_of

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="the C module is not built")
POS_LIMIT = 1 << 62


def entries_strategy():
    bodies = st.lists(st.binary(max_size=80), min_size=1, max_size=6)
    return st.tuples(st.integers(0, 1000), st.integers(0, 5), bodies, st.lists(st.integers(0, 2), min_size=6, max_size=6))


def build(first_index, first_term, bodies, steps, first_pos=4096):
    term, entries = first_term, []
    for i, body in enumerate(bodies):
        term += steps[i]
        entries.append(Entry(first_index + i, term, body))
    data = er.encode_run(entries, first_pos=first_pos)
    return entries, er.EntryRun(first_index, len(entries), entries[-1].term, data)


def both(data, count, first_index, prev_term, last_term, first_pos, pos_limit):
    python = er.check_run_python(data, count, first_index, prev_term, last_term, first_pos, pos_limit)
    if native.check_entries is not None:
        assert native.check_entries(data, count, first_index, prev_term, last_term, first_pos, pos_limit) == python
    return python


@given(entries_strategy())
def test_a_run_as_the_leader_stored_it_passes(spec):
    entries, run = build(*spec)
    assert both(run.data, run.count, run.first_index, entries[0].term, run.last_term, 4096, POS_LIMIT) == (er.RUN_OK, run.count)
    assert er.check_run(run, prev_term=-1, first_pos=4096, pos_limit=POS_LIMIT) is None
    assert run.entries(Entry) == entries
    assert er.index_units_python(run.data, run.count) == b"".join(
        codec.encode_index_unit(pos=pos, size=size, index=index, term=term)
        for _magic, size, index, term, pos in run.headers())  # fmt: skip
    if native.index_units is not None:
        assert native.index_units(run.data, run.count) == er.index_units_python(run.data, run.count)


@given(entries_strategy(), st.data())
def test_a_corrupted_run_is_refused_the_same_way_by_both(spec, data):
    entries, run = build(*spec)
    corrupt = bytearray(run.data)
    for _ in range(data.draw(st.integers(1, 3))):
        corrupt[data.draw(st.integers(0, len(corrupt) - 1))] ^= data.draw(st.integers(1, 255))
    code, _ = both(bytes(corrupt), run.count, run.first_index, entries[0].term, run.last_term, 4096, POS_LIMIT)
    # A changed byte anywhere is caught: a header field or the body (CRC), unless a bodyCrc
    # turned 0 ("not computed", DLedger's own files).
    headers_at, position = [], 0
    for entry in entries:
        headers_at.append(position)
        position += codec.BODY_OFFSET + len(entry.body)
    crc_zeroed = any(corrupt[p + 40 : p + 44] == bytes(4) for p in headers_at)
    if not crc_zeroed and bytes(corrupt) != run.data:
        assert code != er.RUN_OK


@given(st.binary(max_size=400), st.integers(0, 5), st.integers(-1, 3), st.integers(-1, 3), st.integers(0, 4096))
def test_garbage_gives_the_same_verdict_from_both(data, count, prev_term, last_term, first_pos):
    both(data, count, 0, prev_term, last_term, first_pos, POS_LIMIT)


@given(entries_strategy(), st.sampled_from(["count+1", "count-1", "index", "last_term", "prev_term", "pos", "limit", "trailing", "cut"]))
def test_lies_in_the_push_header_are_refused(spec, lie):
    entries, run = build(*spec)
    args = dict(data=run.data, count=run.count, first_index=run.first_index, prev_term=entries[0].term,
                last_term=run.last_term, first_pos=4096, pos_limit=POS_LIMIT)  # fmt: skip
    if lie == "count+1":
        args["count"] += 1
    elif lie == "count-1":
        if run.count == 1:
            return
        args["count"] -= 1
    elif lie == "index":
        args["first_index"] += 1
    elif lie == "last_term":
        args["last_term"] += 1
    elif lie == "prev_term":
        args["prev_term"] = entries[0].term + 1
    elif lie == "pos":
        args["first_pos"] += 1
    elif lie == "limit":
        args["pos_limit"] = 4096 + len(run.data) - 1
    elif lie == "trailing":
        args["data"] = run.data + b"\0"
    else:
        args["data"] = run.data[:-1]
    code, _ = both(*args.values())
    assert code != er.RUN_OK


@needs_native
def test_the_native_crc32_is_zlibs():
    for size in (0, 1, 7, 8, 9, 63, 64, 1000, 4097):
        data = os.urandom(size)
        assert native.crc32(data) == zlib.crc32(data)
        assert native.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=3000), st.integers(0, 15))
def test_the_native_crc32_is_zlibs_at_every_length_and_alignment(data, skip):
    """The folding CRC32 (PCLMULQDQ, 64 then 16 bytes a step, the last 0-15 bytes by the table)
    on every length and start alignment, and the table alone below 64 bytes."""
    assert native.crc32(memoryview(data)[skip:]) == zlib.crc32(data[skip:])


CONFIG = DLedgerStoreConfig(data_file_size=1024, index_file_size=32 * 8)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_a_follower_appending_the_leaders_runs_holds_the_same_bytes(tmp_path_factory, seed):
    directory = tmp_path_factory.mktemp("runs")
    rng = random.Random(seed)
    leader = DLedgerMmapFileStore.open(str(directory / "leader"), CONFIG)
    follower = DLedgerMmapFileStore.open(str(directory / "follower"), CONFIG)
    try:
        index, term = 0, 1
        for _ in range(rng.randint(1, 30)):
            term += rng.random() < 0.1
            batch = [Entry(index + i, term, os.urandom(rng.randint(0, 300))) for i in range(rng.randint(1, 6))]
            leader.append(batch)
            index += len(batch)
            runs = leader.read_runs(batch[0].index, len(batch), term)
            for run in runs:  # one per data file: a run never passes a file's end
                assert len({leader.data_file_list.find_mapped_file_by_offset(p).file_from_offset
                            for *_, p in run.headers()}) == 1  # fmt: skip
            prev_term = follower.last_term()
            for run in runs:
                run = er.EntryRun(run.first_index, run.count, run.last_term, bytes(run.data))
                assert follower.check_run(run, prev_term=prev_term) is None
                follower.append_run(run)
                prev_term = run.last_term
        for queue in ("data_file_list", "index_file_list"):
            ours, theirs = getattr(leader, queue).mapped_files, getattr(follower, queue).mapped_files
            assert [f.file_from_offset for f in ours] == [f.file_from_offset for f in theirs]
            for a, b in zip(ours, theirs):
                assert bytes(a.view()[: a.wrote_position]) == bytes(b.view()[: b.wrote_position])
        count, size = leader.run_length(0, index, size_max=500)
        assert count >= 1 and (size <= 500 or count == 1)
        follower.close()
        follower = DLedgerMmapFileStore.open(str(directory / "follower"), CONFIG)
        assert follower.last_index() == index - 1 and follower.read(0, index, size_max=1 << 30) == leader.read(0, index, size_max=1 << 30)
    finally:
        leader.close()
        follower.close()


def test_a_refused_run_writes_nothing_and_says_why(tmp_path):
    leader = DLedgerMmapFileStore.open(str(tmp_path / "leader"), CONFIG)
    follower = DLedgerMmapFileStore.open(str(tmp_path / "follower"), CONFIG)
    leader.append([Entry(i, 1, b"x" * 100) for i in range(12)])  # more than one data file
    (first, *rest) = leader.read_runs(0, 3, 1)
    assert not rest
    bad = bytearray(first.data)
    bad[codec.BODY_OFFSET + 5] ^= 1
    run = er.EntryRun(0, 3, 1, bytes(bad))
    assert "entry 0 (number 0 of 3): bodyCrc mismatch" in follower.check_run(run, prev_term=-1)
    with pytest.raises(ValueError):
        follower.append_run(er.EntryRun(1, 2, 1, bytes(first.data)))  # not the next index
    assert follower.last_index() == -1 and not any(f.wrote_position for f in follower.data_file_list.mapped_files)
    across = leader.read_runs(4, 4, 1)  # 6 entries of 148 bytes fill a 1 KiB data file (less its blank)
    assert [(r.first_index, r.count) for r in across] == [(4, 2), (6, 2)]
    assert follower.check_run(er.EntryRun(6, 2, 1, bytes(across[1].data)), prev_term=1).startswith("run starts at entry 6")
    assert leader.read_runs(0, 3, 2) is None and leader.read_runs(10, 5, 1) is None  # another term; past the end
    leader.close()
    follower.close()


def random_batches(rng: random.Random, batches_max: int) -> tuple[list[list[Entry]], int]:
    """1..batches_max appends of 1-8 entries of 0-300 random bytes, from index 0, the term rising
    now and then; and the index after the last entry."""
    batches, index, term = [], 0, 1
    for _ in range(rng.randint(1, batches_max)):
        term += rng.random() < 0.1
        batches.append([Entry(index + i, term, os.urandom(rng.randint(0, 300))) for i in range(rng.randint(1, 8))])
        index += len(batches[-1])
    return batches, index


@pytest.mark.skipif(native.write_entries is None, reason="the C module is not built")
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_the_native_append_writes_what_the_python_loop_writes(tmp_path_factory, monkeypatch, seed):
    """A leader's ``append`` goes through ``write_entries`` (header, CRC32, body, index unit per
    entry in one call a data file); with it turned off the Python loop must write the same bytes."""
    from commitlog.dledger import entry_writer

    directory = tmp_path_factory.mktemp("append")
    batches, index = random_batches(random.Random(seed), 25)
    stores = []
    for name, writer in (("native", native.write_entries), ("python", None)):
        monkeypatch.setattr(entry_writer, "_native_write_entries", writer)
        store = DLedgerMmapFileStore.open(str(directory / name), CONFIG)
        for batch in batches:
            store.append(batch)
        stores.append(store)
    try:
        for queue in ("data_file_list", "index_file_list"):
            ours, theirs = (getattr(store, queue).mapped_files for store in stores)
            assert [f.file_from_offset for f in ours] == [f.file_from_offset for f in theirs]
            for a, b in zip(ours, theirs):
                assert bytes(a.view()[: a.wrote_position]) == bytes(b.view()[: b.wrote_position])
        assert stores[0].read(0, index, size_max=1 << 30) == [e for batch in batches for e in batch]
    finally:
        for store in stores:
            store.close()



@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_large_appends_written_with_pwrite_hold_the_bytes_the_mapping_holds(tmp_path_factory, monkeypatch, seed):
    """A leader's large appends (``entry_writer.WRITE_THROUGH_MIN``, lowered here) are written
    into a buffer and stored with ``pwrite``: the data and index files must hold the bytes the
    appends through the mapping write, natively and in Python, and reopen to the same entries."""
    from commitlog.dledger import entry_writer
    from commitlog.mapped_file import MappedFile

    directory = tmp_path_factory.mktemp("through")
    batches, index = random_batches(random.Random(seed), 20)
    pwrites = []
    real = MappedFile.write_through
    monkeypatch.setattr(MappedFile, "write_through", lambda self, data: (pwrites.append(len(data)), real(self, data)))
    stores, through = [], {}
    writers = [("native", native.write_entries)] if native.write_entries is not None else []
    for name, writer in [*writers, ("python", None)]:
        for minimum in (1 << 30, 600):  # every append through the mapping; those of 600 bytes or more by pwrite
            monkeypatch.setattr(entry_writer, "_native_write_entries", writer)
            monkeypatch.setattr(entry_writer, "WRITE_THROUGH_MIN", minimum)
            store = DLedgerMmapFileStore.open(str(directory / f"{name}-{minimum}"), CONFIG)
            pwrites.clear()
            for batch in batches:
                store.append(batch)
            through[(name, minimum)] = sum(pwrites)
            stores.append(store)
    try:
        for queue in ("data_file_list", "index_file_list"):
            ours = getattr(stores[0], queue).mapped_files
            for other in stores[1:]:
                theirs = getattr(other, queue).mapped_files
                assert [f.file_from_offset for f in ours] == [f.file_from_offset for f in theirs]
                for a, b in zip(ours, theirs):
                    assert a.wrote_position == b.wrote_position
                    assert bytes(a.view()[: a.wrote_position]) == bytes(b.view()[: b.wrote_position])
        large = any(sum(48 + len(e.body) for e in batch) >= 600 for batch in batches)
        for (name, minimum), written in through.items():
            assert (written > 0) == (minimum == 600 and large), (name, minimum, written)
    finally:
        for store in stores:
            store.close()
    expected = [e for batch in batches for e in batch]
    for store in stores:
        reopened = DLedgerMmapFileStore.open(store.directory, CONFIG)
        try:
            assert reopened.read(0, index, size_max=1 << 30) == expected
        finally:
            reopened.close()


def walked_extent(store, lo, hi, size_max):
    """run_extent's answer from a walk of every entry's span."""
    expected = (0, 0, -1, -1)
    for last in range(lo, min(hi, store.last_index() + 1)):
        start = store.pos_at(lo)
        pos, size = store.entry_span(last)
        body = pos + size - start - (last - lo + 1) * codec.BODY_OFFSET
        if body > size_max and last > lo:
            break
        expected = (last - lo + 1, body, start, pos + size)
    return expected


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 400), min_size=1, max_size=40), lo=st.integers(0, 45), hi=st.integers(0, 50),
       size_max=st.integers(0, 3000))  # fmt: skip
def test_run_extent_is_the_longest_run_that_fits(tmp_path_factory, sizes, lo, hi, size_max):
    """run_extent (and run_length) against a walk of every entry: the most entries from lo (below
    hi) whose bodies -- a blank record at a data file's end counted as body -- fit size_max, at
    least one; with where the first lies and the last ends. Mixed sizes, then equal ones (what
    the first guess of its search is for)."""
    store = DLedgerMmapFileStore.open(str(tmp_path_factory.mktemp("extent")), CONFIG)
    try:
        store.append([Entry(i, 1, bytes(size)) for i, size in enumerate(sizes)])
        expected = walked_extent(store, lo, hi, size_max)
        assert store.run_extent(lo, hi, size_max=size_max) == expected
        assert store.run_length(lo, hi, size_max=size_max) == expected[:2]
        first = len(sizes)
        store.append([Entry(first + i, 1, bytes(sizes[0])) for i in range(len(sizes))])
        for start in (first, first + lo % len(sizes)):
            assert store.run_extent(start, first + hi, size_max=size_max) == walked_extent(store, start, first + hi, size_max)
    finally:
        store.close()


def test_a_follower_stores_runs_with_pwrite_and_maps_none_of_their_pages(tmp_path):
    """A follower writes the leader's stored bytes with ``pwrite`` (``MappedFile.write_through``):
    pages the write covers whole are never faulted in zeroed first, so it needs no warm-up ahead
    of it. Its mapping holds none of those pages until something reads through it."""
    leader = DLedgerMmapFileStore.open(str(tmp_path / "leader"), CONFIG)
    follower = DLedgerMmapFileStore.open(str(tmp_path / "follower"), CONFIG)
    leader.append([Entry(i, 1, os.urandom(100)) for i in range(5)])
    (run,) = leader.read_runs(0, 5, 1)
    run = er.EntryRun(run.first_index, run.count, run.last_term, bytes(run.data))
    assert follower.check_run(run, prev_term=-1) is None
    follower.append_run(run)
    (data_file,) = follower.data_file_list.mapped_files
    assert [m["rss_kb"] for m in mappings_of(data_file.path)] == [0]
    with open(data_file.path, "rb") as file:
        assert file.read(len(run.data)) == run.data
    assert follower.read(0, 5, size_max=1 << 20) == leader.read(0, 5, size_max=1 << 20)  # through the mapping
    assert [m["rss_kb"] > 0 for m in mappings_of(data_file.path)] == [True]
    leader.close()
    follower.close()
