"""Opening the entry store: recovery as a plan, then its application (Kafka's ``LogLoader``).

Theory of operation
-------------------
As ``DLedgerMmapFileStore#recover``. First what the checkpoint says was begun is finished: a
reset (``resetting=1``: every file goes) or a retention pass (data files below ``beginPos`` go).

The plan (``EntryLogLoader.plan``) reads and changes nothing: start at data file
``max(0, n - 3)``, walking back to the first whose first entry is whole, lies at the file's start
and matches its index unit (none: file 0); scan forward entry by entry (``scan.scan_data_files``):
a blank record moves to the next file, zeros end the log; an entry must be whole (bodyCrc when
not 0), lie at its own ``pos``, follow the previous index by one and not lower the term. Anything
else ends the scan: that is where the log ends, and what follows is cut (zeroed) -- a torn tail.
Damage instead of a torn tail: a cut that would delete more than ``recovery_cut_segments_max``
later data files holding data (DLedger's "processOffset is too small" rule), a cut below the
checkpoint's ``flushedIndex`` (entries known durable are gone), and a whole entry that lowers the
term (``DataScan.damaged``: the term is under no CRC, so a damaged byte there would otherwise end
the log early and keep the damaged entry). Damage is refused, a StoreError naming the file and
offset and nothing changed, unless ``recovery_accept_lost_entries`` accepts it or
``recovery_repair_from_peers`` cuts it after saving the catch-up mark (the end the log had).
A damaged blank record the scan could tell for one (``scan``) is written again, not cut.

The application (``EntryLogLoader.apply``) saves the mark, cuts the data files where the log
ends, cuts the index after the last entry and rewrites the index units from the first that did
not match its entry, syncs what the scan read (it may have been only in the page cache), and
hands the store where its log begins and ends (``LoadedLog``).

The data end after recovery is where the last entry ends, never past it. A scan that moved
past a blank record and found nothing after it (zeros or a torn entry at the next file's start:
the entry the blank made room for was lost) ends at the next file's start; the blank is cut
too. Kept, it would put the next entry at the next file's start whatever its size, while
``entry_placement`` (and every member holding the same entries) puts a small one after the last
entry: a leader recovered so would push runs at a pos its followers refuse, forever.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from commitlog.damage import DamagedRange
from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_reader import index_unit_or_none
from commitlog.dledger.entry_retention import cut_queue, delete_data_files_below, drop_all_files
from commitlog.dledger.entry_types import HardState
from commitlog.dledger.entry_writer import append_index_units
from commitlog.dledger.scan import DataFile, DataScan, scan_data_files, unit_matches
from commitlog.dledger.state_files import EntryStateFiles
from commitlog.mapped_file import MappedFile, StoreError, fsync_directory
from commitlog.mapped_file_queue import MappedFileQueue


def _sync_file(path: str) -> None:
    """fdatasync ``path`` through a descriptor of its own (the same inode's pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    start_offset: int  # data offset the scan started at
    end_offset: int  # data offset the log ends at now
    first_index: int
    last_index: int
    entries_scanned: int
    reason: str  # why the scan stopped
    corrupt_offset: int | None  # where an invalid entry was cut (None: the log ended cleanly)
    deleted_data_files: tuple[str, ...]
    index_rebuilt_from: int | None  # first entry whose index unit was rewritten from the data
    lost_entries: int  # entries at or below the checkpoint's flushedIndex that were gone (accepted)
    blanks_rewritten: tuple[DamagedRange, ...] = ()  # damaged blank records written again (``scan``)


@dataclasses.dataclass
class RecoveryPlan:
    """What the scan found and what recovery will do about it (``EntryLogLoader.plan``)."""

    scan: DataScan
    start_number: int  # the data file the scan started in
    start_offset: int
    damage: tuple[str, str] | None  # (why the end found is damage, the setting that accepts it)
    lost: int  # entries at or below the checkpoint's flushedIndex that are gone
    committed_hint: int
    checkpoint_flushed: int
    resetting: bool


@dataclasses.dataclass(frozen=True)
class LoadedLog:
    """Where the recovered log begins and ends: what the store starts from."""

    first_index: int
    last_index: int
    last_term: int
    term_before_first: int
    data_start_offset: int
    committed_hint: int
    checkpoint_rewrite: bool  # the loss was accepted or a reset finished: write the checkpoint again
    report: RecoveryReport
    damaged: tuple[DamagedRange, ...]


class EntryLogLoader:
    """Recovery of one store directory's files (see the module); ``load`` runs it once."""

    def __init__(self, data_file_list: MappedFileQueue, index_file_list: MappedFileQueue, config: Any,
                 state_files: EntryStateFiles, *, data_start_offset: int) -> None:  # fmt: skip
        self.data_file_list = data_file_list
        self.index_file_list = index_file_list
        self.config = config  # DLedgerStoreConfig
        self.state_files = state_files
        self.data_start_offset = data_start_offset

    def load(self) -> LoadedLog:
        """Finish what the checkpoint says was begun, plan, apply."""
        committed_hint, checkpoint_flushed, resetting = self.state_files.load()
        begin = self.state_files.begin
        if begin is not None:
            self.data_start_offset = begin[2]
            if resetting:  # a reset was begun: finish it (the checkpoint says so durably)
                drop_all_files(self.data_file_list, self.index_file_list, first=begin[0], offset=begin[2])
            else:  # a retention pass that crashed part way: the files below the begin go
                delete_data_files_below(self.data_file_list, begin[2])
        return self.apply(self.plan(committed_hint, checkpoint_flushed, resetting))

    def plan(self, committed_hint: int, checkpoint_flushed: int, resetting: bool) -> RecoveryPlan:
        """Scan (reading only) and decide: StoreError, nothing changed, for damage no setting accepts."""
        files = self.data_file_list.mapped_files
        begin = self.state_files.begin
        start_number = 0
        if not files:
            scan = DataScan(end_offset=self.data_start_offset, reason="no data files")
            start_offset = self.data_start_offset
        else:
            start_number = self._recovery_start(files)
            start_offset = files[start_number].file_from_offset
            scan = self._scan(files, start_number)
        if scan.last_index < 0 and begin is not None:  # empty at the recorded begin (a reset)
            scan.last_index, scan.last_term = begin[0] - 1, begin[1]
        self._check_last_term(scan)
        damage = self._damage_found(scan, checkpoint_flushed)
        if damage is not None and not self.config.recovery_accept_lost_entries and not self.config.recovery_repair_from_peers:
            raise StoreError(self._refusal(scan, damage[0], damage[1]))
        lost = max(0, checkpoint_flushed - scan.last_index)
        return RecoveryPlan(scan, start_number, start_offset, damage, lost, committed_hint, checkpoint_flushed, resetting)

    def apply(self, plan: RecoveryPlan) -> LoadedLog:
        """Cut the log where the plan ends it (after saving the catch-up mark when repairing) and
        rebuild the index units that did not match; sync what the scan read."""
        scan, damage = plan.scan, plan.damage
        accept = self.config.recovery_accept_lost_entries
        damaged: list[DamagedRange] = []
        if damage is not None:
            if not accept:
                self._save_catch_up_mark(scan, plan.committed_hint, plan.checkpoint_flushed)
            if scan.damaged:  # the last entry kept has the damaged term: it goes too
                self._drop_last_scanned(scan)
            end = self.data_file_list.max_offset if self.data_file_list.mapped_files else scan.end_offset
            damaged.append(DamagedRange(scan.stop_path or self.data_file_list.directory, scan.end_offset,
                                        max(end, scan.end_offset), f"{scan.reason}: {damage[0]}",
                                        scan.last_index + 1))  # fmt: skip
        if accept and self.state_files.hard_state.catch_up_index >= 0:  # the operator accepts the loss: no mark
            saved = self.state_files.hard_state
            self.state_files.save_hard_state(HardState(saved.term, saved.voted_for, saved.committed_index))
        deleted = self._cut_data_after_scan(scan, cut_segments_max=None if damage is not None else
                                            self.config.recovery_cut_segments_max)  # fmt: skip
        self._cut_index_after_scan(scan)
        self._cut_trailing_blank(scan)
        blanks = self._rewrite_blanks(scan)
        # What the scan read may have been only in the page cache (the process was killed, the
        # machine was not): sync it before calling it flushed.
        for mapped_file in [*self.data_file_list.mapped_files[plan.start_number:], *self.index_file_list.mapped_files]:
            _sync_file(mapped_file.path)
        first_index = self._read_first_index(scan)
        begin = self.state_files.begin
        report = RecoveryReport(plan.start_offset, scan.end_offset, first_index, scan.last_index, scan.count,
                                scan.reason, None if scan.clean else scan.end_offset, deleted,
                                scan.index_mismatch_from, plan.lost, blanks)  # fmt: skip
        return LoadedLog(first_index, scan.last_index, scan.last_term,
                         begin[1] if begin is not None and begin[0] == first_index else -1, self.data_start_offset,
                         plan.committed_hint, bool(plan.lost or plan.resetting), report, tuple(damaged))  # fmt: skip

    def _cut_trailing_blank(self, scan: DataScan) -> None:
        """End the data where the last entry ends when the scan ended past a blank record (at the
        next file's start: the entry the blank made room for was lost or cut). The blank goes
        with it, so the next entry lands where ``entry_placement`` says for this log's prefix --
        where a follower holding the same entries expects it (it refuses a run at another pos)
        -- not at the next file's start whatever its size."""
        file_size = self.config.data_file_size
        if scan.last_index < 0 or scan.end_offset % file_size or not self.data_file_list.mapped_files:
            return
        unit = index_unit_or_none(self.index_file_list, scan.last_index)
        if unit is None or unit.index != scan.last_index or unit.term != scan.last_term:
            return
        end = unit.pos + unit.size
        if not scan.end_offset - file_size < end < scan.end_offset:
            return
        cut_queue(self.data_file_list, end)
        self.data_file_list.flushed_where = self.data_file_list.committed_where = end
        scan.end_offset = end

    def _rewrite_blanks(self, scan: DataScan) -> tuple[DamagedRange, ...]:
        """Write again each damaged blank record the scan passed (``scan``: the next data file
        starts with the entry that follows, so a blank is all those bytes can have been);
        durable when this returns (``MappedFile.rewrite``)."""
        rewritten = []
        for path, offset, reason in scan.blanks_damaged:
            if offset >= scan.end_offset:
                continue
            mapped_file = self.data_file_list.find_mapped_file_by_offset(offset)
            assert mapped_file is not None and mapped_file.path == path, (path, offset)
            position = offset - mapped_file.file_from_offset
            remaining = mapped_file.file_size - position
            mapped_file.rewrite(position, codec.encode_blank(remaining) + bytes(remaining - codec.MIN_BLANK_SIZE))
            rewritten.append(DamagedRange(path, offset, offset + remaining, f"blank record: {reason}"))
        return tuple(rewritten)

    def _refusal(self, scan: DataScan, why: str, setting: str) -> str:
        where = scan.stop_path or self.data_file_list.directory
        value = "true" if setting == "recovery_accept_lost_entries" else "N"
        return (f"recovery refuses to end the log at offset {scan.end_offset} ({where}: {scan.reason}; the log "
                f"would end at entry {scan.last_index}): {why}. Inspect the files; set {setting}={value} (hasvc node "
                f"--set) to accept the loss{self._repair_command()}.")  # fmt: skip

    def _repair_command(self) -> str:
        """The offline repair of this member's store, when its files lie where a node keeps them
        (``STORE/dledger-ID/data``)."""
        member_directory = os.path.dirname(os.path.abspath(self.data_file_list.directory))
        name = os.path.basename(member_directory)
        if not name.startswith("dledger-"):
            return ""
        store = os.path.dirname(member_directory)
        command = f"hasvc store repair {store} --member {name[len('dledger-'):]}"
        return f", or with the member stopped: {command} --from HOST:PORT (a live member's client port) or {command} --accept-loss"

    def _check_last_term(self, scan: DataScan) -> None:
        """The last entry kept is the one whose damaged term nothing after it can show (no entry
        follows to lower the term): its index unit, written with it, must say the same term.
        One that says another (hypothesis, two flips: a raised term, then a torn-looking entry
        after it) marks the entry damaged, as a lower term after it would."""
        if scan.damaged or scan.count == 0:
            return
        unit = index_unit_or_none(self.index_file_list, scan.last_index)
        if unit is not None and unit.term != scan.last_term:
            scan.damaged = True
            scan.reason = (f"entry {scan.last_index} has term {scan.last_term}, its index unit {unit.term} "
                           f"(then: {scan.reason})")  # fmt: skip

    def _damage_found(self, scan: DataScan, checkpoint_flushed: int) -> tuple[str, str] | None:
        """Why ending the log where the scan stopped is damage, not a torn tail, and the setting
        that would accept it (None: a torn tail, or no cut at all)."""
        if scan.damaged:
            return ("the last entry kept has a damaged term (a whole entry follows with a lower term, or its index "
                    "unit says another): the log is damaged in the middle (an entry's term is under no CRC), not "
                    "torn at its tail; ending it here would keep a damaged entry", "recovery_accept_lost_entries")  # fmt: skip
        lost = checkpoint_flushed - scan.last_index
        if lost > 0:
            return (f"the checkpoint says entries up to {checkpoint_flushed} were flushed; {lost} of them are gone",
                    "recovery_accept_lost_entries")  # fmt: skip
        later = [f for f in self.data_file_list.mapped_files if f.file_from_offset > scan.end_offset]
        holding_data = sum(1 for f in later if any(f.view()[: codec.MIN_BLANK_SIZE]))
        if holding_data > self.config.recovery_cut_segments_max:
            return (f"that would delete {holding_data} later data files holding data, more than "
                    f"recovery_cut_segments_max={self.config.recovery_cut_segments_max}", "recovery_cut_segments_max")
        return None

    def _save_catch_up_mark(self, scan: DataScan, committed_hint: int, checkpoint_flushed: int) -> None:
        """Before the cut: save the catch-up mark, the end the log had, as far as the index files,
        the checkpoint and the commit hint tell (its term from the index unit, else the saved
        term, an upper bound); an older mark stays if it is higher. Terms never decrease along a
        log, a mark past the kept end has at least the last kept entry's term, as the scan read it
        from its header: an index unit can be the damaged part, and a saved term below the log's
        is none a member writes but one a damaged file can give (hypothesis: a flip cut the log
        below entry 59, another zeroed that entry's unit's term, and the mark said term 0 below
        the kept entries' 5 -- a mark too low lets the member vote for a log that lacks what it
        had)."""
        former_index, former_term = self._former_end(scan.last_index + 1)
        hard_term = self.state_files.hard_state.term
        candidates = [(former_term, former_index)]
        for index in (committed_hint, checkpoint_flushed, scan.last_index):
            if index > former_index:
                candidates.append((hard_term, index))
        mark_term, mark_index = max(candidates)
        if mark_index > scan.last_index and (scan.count > 1 or (scan.count == 1 and not scan.damaged)):
            # the kept end's term floors it: the previous entry's when the last one's is the damaged part
            mark_term = max(mark_term, scan.previous_term if scan.damaged else scan.last_term)
        saved = self.state_files.hard_state
        if (saved.catch_up_term, saved.catch_up_index) > (mark_term, mark_index):
            mark_term, mark_index = saved.catch_up_term, saved.catch_up_index
        if mark_index > scan.last_index or saved.catch_up_index >= 0:
            self.state_files.save_hard_state(HardState(saved.term, saved.voted_for, saved.committed_index, mark_term, mark_index))

    def _drop_last_scanned(self, scan: DataScan) -> None:
        """End the scan before its last entry (whose term field is damaged), where the scan found
        it; the term is then the previous entry's, as the scan read it from its header (not from
        an index unit, which may be the damaged part)."""
        last = scan.last_index
        if scan.count == 0:
            raise StoreError(self._refusal(scan, f"entry {last} has a damaged term and nothing scanned to cut it by",
                                           "recovery_accept_lost_entries"))  # fmt: skip
        scan.end_offset, scan.last_index, scan.count = scan.last_pos, last - 1, scan.count - 1
        if scan.count == 0:
            scan.last_term = self.state_files.begin[1] if self.state_files.begin is not None and self.state_files.begin[0] == last else -1
            scan.first_index = -1
        else:
            scan.last_term = scan.previous_term
        mapped_file = self.data_file_list.find_mapped_file_by_offset(scan.end_offset)
        scan.stop_path = mapped_file.path if mapped_file is not None else scan.stop_path
        scan.reason = f"entry {last}: term damaged ({scan.reason})"
        if scan.index_mismatch_from is not None and scan.index_mismatch_from > scan.last_index:
            scan.index_mismatch_from, scan.index_mismatch_offset = None, -1

    def _former_end(self, first_lost: int) -> tuple[int, int]:
        """(index, term) of the last index unit that follows on from ``first_lost`` (units
        index, index + 1, ... in order): where the log ended before the damage; (-1, -1): none."""
        queue = self.index_file_list
        found = (-1, -1)
        index = max(first_lost, 0)
        while True:
            offset = index * codec.INDEX_UNIT_SIZE
            mapped_file = queue.find_mapped_file_by_offset(offset)
            if mapped_file is None:
                return found
            try:
                unit = codec.decode_index_unit(mapped_file.view(), offset - mapped_file.file_from_offset)
            except codec.EntryFormatError:
                return found
            if unit.index != index or unit.term < found[1]:
                return found
            found = (index, unit.term)
            index += 1

    def _recovery_start(self, files: list[MappedFile]) -> int:
        """From file max(0, n - 3) back: the first whose first entry is whole, at the file's
        start and matching its index unit; none: 0."""
        for number in range(max(0, len(files) - 3), -1, -1):
            mapped_file = files[number]
            try:
                header, _ = codec.decode_entry(mapped_file.view())
            except codec.EntryFormatError:
                continue
            if header.pos == mapped_file.file_from_offset and self._unit_matches(header):
                return number
        return 0

    def _unit_matches(self, header: codec.EntryHeader) -> bool:
        offset = header.index * codec.INDEX_UNIT_SIZE
        mapped_file = self.index_file_list.find_mapped_file_by_offset(offset)
        if mapped_file is None or offset - mapped_file.file_from_offset >= mapped_file.wrote_position:
            return False
        try:
            unit = codec.decode_index_unit(mapped_file.view(), offset - mapped_file.file_from_offset)
        except codec.EntryFormatError:
            return False
        return unit_matches(unit, header)

    def _scan(self, files: list[MappedFile], start: int) -> DataScan:
        data_files = [DataFile(f.path, f.file_from_offset, f.view()) for f in files[start:]]
        first_index = None  # the log's first file: its first entry has the recorded begin's index, else 0
        if start == 0 and files[0].file_from_offset == self.data_start_offset:
            first_index = self.state_files.begin[0] if self.state_files.begin is not None else 0
        return scan_data_files(data_files, file_size=self.config.data_file_size, unit_matches=self._unit_matches,
                               first_index=first_index)  # fmt: skip

    def _cut_data_after_scan(self, scan: DataScan, *, cut_segments_max: int | None) -> tuple[str, ...]:
        """Cut the data files where the scan stopped (zeroing the rest of that file: bytes of a
        torn tail must not be read back after the next crash); refuse when that deletes more
        than ``cut_segments_max`` files holding data (None: damage being repaired, no limit)."""
        queue = self.data_file_list
        later = [f for f in queue.mapped_files if f.file_from_offset > scan.end_offset]
        holding_data = [f for f in later if any(f.view()[: codec.MIN_BLANK_SIZE])]
        if cut_segments_max is not None and len(holding_data) > cut_segments_max:
            raise StoreError(self._refusal(scan, f"that would delete {len(holding_data)} later data files holding data, "
                                                 f"more than recovery_cut_segments_max="
                                                 f"{self.config.recovery_cut_segments_max}",
                                           "recovery_cut_segments_max"))  # fmt: skip
        if queue.mapped_files:
            cut_queue(queue, scan.end_offset)
        queue.flushed_where = queue.committed_where = scan.end_offset
        return tuple(f.path for f in later)

    def _cut_index_after_scan(self, scan: DataScan) -> None:
        """Cut the index after the last entry; rewrite the units from the first that did not
        match; make it all durable."""
        queue = self.index_file_list
        if scan.last_index < 0:
            had_files = bool(queue.mapped_files)
            queue.destroy()
            if had_files:
                fsync_directory(queue.directory)
            return
        if scan.index_mismatch_from is not None:
            self._rewind_index(scan.index_mismatch_from * codec.INDEX_UNIT_SIZE)
            self._rebuild_index(scan.index_mismatch_offset, scan.end_offset)
        self._rewind_index((scan.last_index + 1) * codec.INDEX_UNIT_SIZE)
        queue.flush()

    def _rewind_index(self, offset: int) -> None:
        """Cut the index files at ``offset``; when no kept file can hold it, drop them all (the
        next unit then starts a file of its own)."""
        queue = self.index_file_list
        last = queue.last
        if last is not None and queue.min_offset <= offset <= last.file_from_offset + queue.file_size:
            cut_queue(queue, offset)
            return
        had_files = bool(queue.mapped_files)
        queue.reset_to(offset)
        if had_files:
            fsync_directory(queue.directory)

    def _rebuild_index(self, start_offset: int, end_offset: int) -> None:
        """Append the index unit of every entry in ``[start_offset, end_offset)`` of the data
        (already validated by the scan)."""
        offset = start_offset
        while offset < end_offset:
            mapped_file = self.data_file_list.find_mapped_file_by_offset(offset)
            assert mapped_file is not None, offset
            position = offset - mapped_file.file_from_offset
            if codec.peek_blank(mapped_file.view(), position) is not None:
                offset = mapped_file.file_from_offset + mapped_file.file_size
                continue
            header = codec.decode_entry_header(mapped_file.view(), position)
            append_index_units(self.index_file_list, [(header.index, header.pos, header.size, header.term)])
            offset += header.size

    def _read_first_index(self, scan: DataScan) -> int:
        """The index of the first entry kept (DLedger's reviseLedgerBeginIndex); when empty, the
        recorded begin (a reset), else 0."""
        if scan.count == 0 and self.state_files.begin is not None:
            return self.state_files.begin[0]
        if scan.last_index < 0:
            return 0
        first = self.data_file_list.first
        assert first is not None
        try:
            return codec.decode_entry_header(first.view(), 0).index
        except codec.EntryFormatError as error:
            raise StoreError(f"{first.path}: the first entry of the log: {error}") from None
