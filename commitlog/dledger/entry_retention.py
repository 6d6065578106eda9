"""Cutting the entry store: truncate (a log's tail), reset (all of it, a RESET from the Raft
leader) and retention (whole data files from its head).

Theory of operation
-------------------
``truncate`` is durable when it returns: later files go first, newest first, and their names are
synced before the file holding the cut is cut (zeroed, synced) -- a crash part way leaves a
prefix of the log. When the checkpoint names a flushedIndex above the cut, it is lowered on disk
first: the checkpoint never names entries that are gone.

Reset: every data and index file goes and the log restarts empty at an index, its next entry at
a given data offset (a data-file boundary: the leader's first entry's pos, so the files end up
byte-identical from there). Durable and atomic for recovery: the checkpoint first records the new
begin with ``resetting=1`` (fsynced, renamed), then the files are deleted, then the flag is
cleared; a crash after the first step is finished by recovery (the files go), one before it
leaves the old log.

Retention (``deletable_head_files``, ``delete_head_files``; DLedger's ``deleteExpiredFiles``)
deletes whole data files from the head: never one holding the committed or flushed entry or any
after them, nor the file being written; the index files wholly below the new first entry follow.
Before it deletes, it records the new first entry in the checkpoint (``beginIndex``, its ``pos``,
and ``beginTerm``, the term of the entry before it: a leader needs it to RESET a follower); a
crash part way through a deletion is finished by recovery (data files below ``beginPos`` go).

``EntryRetention`` is a part of ``DLedgerMmapFileStore`` (its base class); the file operations
recovery shares (``cut_queue``, ``drop_all_files``, ``delete_data_files_below``) are functions.
"""

from __future__ import annotations

import os
from typing import Any

from commitlog.dledger import entry_codec as codec
from commitlog.dledger.state_files import EntryStateFiles
from commitlog.mapped_file import MappedFile, fsync_directory
from commitlog.mapped_file_queue import MappedFileQueue


def cut_queue(queue: MappedFileQueue, offset: int) -> None:
    """Cut ``queue`` at ``offset`` durably. Later files go first, newest first, and their names
    are synced before the file holding ``offset`` is cut (zeroed, synced): a crash part way
    leaves a shorter log or the old one, never a cut file followed by files it dropped."""
    later = [f for f in queue.mapped_files if f.file_from_offset > offset]
    for mapped_file in reversed(later):
        mapped_file.destroy()
    if later:
        queue.mapped_files = [f for f in queue.mapped_files if f.file_from_offset <= offset]
        fsync_directory(queue.directory)
    queue.truncate_dirty_files(offset)


def drop_all_files(data_queue: MappedFileQueue, index_queue: MappedFileQueue, *, first: int, offset: int) -> None:
    """Delete every data and index file (names synced); the next entry, ``first``, lands at data
    offset ``offset``."""
    for queue, start in ((data_queue, offset), (index_queue, first * codec.INDEX_UNIT_SIZE)):
        had_files = bool(queue.mapped_files)
        queue.reset_to(start)
        if had_files:
            fsync_directory(queue.directory)


def delete_data_files_below(queue: MappedFileQueue, offset: int) -> None:
    """Delete the data files below ``offset`` (a retention pass that crashed part way), names synced."""
    below = sum(1 for f in queue.mapped_files if f.file_from_offset < offset)
    if below:
        queue.delete_first_files(below)
        fsync_directory(queue.directory)


class EntryRetention:
    """Truncate, reset and retention of ``DLedgerMmapFileStore`` (see the module)."""

    config: Any  # DLedgerStoreConfig
    data_file_list: MappedFileQueue
    index_file_list: MappedFileQueue
    state_files: EntryStateFiles
    _data_start_offset: int
    _first_index: int
    _last_index: int
    _last_term: int
    _flushed_index: int
    _committed_index: int
    _term_before_first: int

    def truncate(self, *, after_index: int) -> None:
        """Drop every entry with index > ``after_index``; durable when it returns. Refuses
        (ValueError) to drop committed entries or to cut below the first entry."""
        if after_index >= self._last_index:
            return
        if after_index < self._first_index - 1:
            raise ValueError(f"cannot truncate after {after_index}: the log starts at {self._first_index}")
        if after_index < self._committed_index:
            raise ValueError(f"truncating after {after_index} would drop committed entries (committed {self._committed_index})")
        if after_index >= self._first_index:
            pos, size = self.entry_span(after_index)
            cut = pos + size
            term = self.term_at(after_index)
        else:
            cut, term = self.pos_at(self._first_index), self._term_before_first
        if self.state_files.checkpoint_flushed_index > after_index:
            self._flushed_index = min(self._flushed_index, after_index)
            self.persist_checkpoint()  # before the cut: the checkpoint never names entries that are gone
        cut_queue(self.data_file_list, cut)
        cut_queue(self.index_file_list, (after_index + 1) * codec.INDEX_UNIT_SIZE)
        self._last_index = after_index
        self._last_term = term
        self._flushed_index = min(self._flushed_index, after_index)
        self._check()

    def reset(self, reset: Any) -> None:
        """Drop every entry and start the log empty at ``reset.first_index``, its next entry at
        data offset ``reset.first_offset`` (a data-file boundary), the empty log's last term
        ``reset.term_before_first``; committed and flushed index ``first_index - 1``. Durable when
        it returns, and atomic for recovery (see the module). ValueError, nothing changed, for an
        index below 1, a negative term, an offset off a file boundary, or committed entries at or
        above the index (they are never dropped)."""
        first, term, offset = reset.first_index, reset.term_before_first, reset.first_offset
        if first < 1 or term < 0:
            raise ValueError(f"reset to index {first} after term {term}: need index >= 1 and term >= 0")
        if offset < 0 or offset % self.config.data_file_size:
            raise ValueError(f"reset offset {offset} is not a multiple of the data file size {self.config.data_file_size}")
        if self._committed_index >= first:
            raise ValueError(f"a reset to {first} would drop committed entries (committed {self._committed_index})")
        self.state_files.begin = (first, term, offset)
        self.state_files.write_checkpoint(end=first - 1, committed=first - 1, flushed=first - 1, resetting=True)
        drop_all_files(self.data_file_list, self.index_file_list, first=first, offset=offset)
        self._first_index, self._last_index, self._last_term = first, first - 1, term
        self._term_before_first = term
        self._flushed_index = self._committed_index = first - 1
        self._data_start_offset = offset
        self.persist_checkpoint()  # the reset is done: resetting goes
        self._check()

    def deletable_head_files(self, *, keep_from_index: int, count_max: int) -> list[tuple[MappedFile, int]]:
        """The oldest data files (at most ``count_max``) whose every entry is below
        ``keep_from_index``, the committed index and the flushed index, each with the index of
        the first entry after it. The committed entry itself stays (a leader's COMPARE walks down
        to a follower's committed index at the lowest, which must still be there to compare), and
        so does the flushed one (a power loss must leave the log an entry to start from: the
        first entry of the first file kept is durable). A file qualifies only when the next
        file's first entry is whole at its start (so neither the file being written nor a warmed
        empty file goes)."""
        limit = min(keep_from_index, self._committed_index, self._flushed_index)
        files = self.data_file_list.mapped_files
        found: list[tuple[MappedFile, int]] = []
        for number in range(min(count_max, len(files) - 1)):
            following = files[number + 1]
            if following.wrote_position < codec.BODY_OFFSET:
                break
            try:
                next_first = codec.decode_entry_header(following.view(), 0).index
            except codec.EntryFormatError:
                break
            if next_first > limit or next_first > self._last_index:
                break
            found.append((files[number], next_first))
        return found

    def delete_head_files(self, *, count: int, keep_from_index: int) -> list[str]:
        """Delete the ``count`` oldest data files (``deletable_head_files`` with the same
        ``keep_from_index`` chose them; ValueError, nothing deleted, when it would not) and the
        index files whose every unit is below the new first entry; ``first_index()`` moves up.
        Durable when it returns: data files go oldest first, their directory synced, then index
        files. A crash part way leaves a log that starts later (recovery reads the first entry of
        the first data file; index files below it are left over and go on the next pass)."""
        chosen = self.deletable_head_files(keep_from_index=keep_from_index, count_max=count)
        if len(chosen) < count:
            raise ValueError(f"only {len(chosen)} of {count} head data files lie below entry {keep_from_index} "
                             f"and the committed and flushed index")  # fmt: skip
        if not chosen:
            return []
        new_first = chosen[-1][1]
        # Recorded first (durably): the term of the entry before the new first one is gone after.
        begin = self.state_files.begin = (new_first, self.term_at(new_first - 1), self.pos_at(new_first))
        self.persist_checkpoint()
        deleted = self.data_file_list.delete_first_files(count)
        fsync_directory(self.data_file_list.directory)
        self._first_index = new_first
        self._term_before_first = begin[1]
        index_files = self.index_file_list.mapped_files
        unit_end = new_first * codec.INDEX_UNIT_SIZE
        below = sum(1 for f in index_files[:-1] if f.file_from_offset + f.file_size <= unit_end)
        deleted += self.index_file_list.delete_first_files(below)
        if below:
            fsync_directory(self.index_file_list.directory)
        self._check()
        return deleted

    def data_file_modified_ms(self, mapped_file: MappedFile) -> float:
        """When ``mapped_file`` was last written (its mtime, as DLedger's isTimeUp), in ms."""
        return os.path.getmtime(mapped_file.path) * 1000
