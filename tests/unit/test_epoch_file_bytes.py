"""The epoch file's bytes are exactly those docs/FORMAT.md shows (a peer writes and reads them
from the document): the CRC covers every entry line with its newline."""

import zlib

import pytest

from commitlog.epoch import EpochFile
from commitlog.mapped_file import StoreError


def test_the_documented_example_is_what_is_written_and_read(tmp_path):
    epochs = EpochFile.open(str(tmp_path))
    epochs.replace([])
    assert (tmp_path / "epoch").read_bytes() == b"0\n0\n"
    epochs.append(7, 0)
    epochs.append(8, 1580)
    assert (tmp_path / "epoch").read_bytes() == b"2\n23442612\n7-0\n8-1580\n"
    assert zlib.crc32(b"7-0\n8-1580\n") & 0x7FFFFFFF == 23442612  # the newline of every line inside
    assert (tmp_path / "epoch.bak").read_bytes() == (tmp_path / "epoch").read_bytes()  # the same history, its copy
    assert [(e.epoch, e.start_offset) for e in EpochFile.open(str(tmp_path)).entries] == [(7, 0), (8, 1580)]


def test_a_crc_without_the_last_newline_is_damage_and_the_backup_is_read(tmp_path):
    (tmp_path / "epoch.bak").write_bytes(b"1\n%d\n7-0\n" % (zlib.crc32(b"7-0\n") & 0x7FFFFFFF))
    (tmp_path / "epoch").write_bytes(b"2\n%d\n7-0\n8-1580\n" % (zlib.crc32(b"7-0\n8-1580") & 0x7FFFFFFF))
    assert [(e.epoch, e.start_offset) for e in EpochFile.open(str(tmp_path)).entries] == [(7, 0)]
    (tmp_path / "epoch.bak").write_bytes(b"garbage")
    with pytest.raises(StoreError, match="checksum mismatch"):
        EpochFile.open(str(tmp_path))


def test_a_zero_crc_is_unchecked_and_lines_after_count_are_ignored(tmp_path):
    (tmp_path / "epoch").write_bytes(b"1\n0\n7-0\n8-1580\n")
    assert [(e.epoch, e.start_offset) for e in EpochFile.open(str(tmp_path)).entries] == [(7, 0)]
