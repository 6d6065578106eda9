"""Scrub: re-check a classic store's log and consume queues while it serves, a chunk at a time.

Theory of operation
-------------------
Recovery checks only the newest segments (what a crash can have torn); reads check the records
they hand out. Damage anywhere else -- a flipped bit in an old segment, a consume queue unit that
no longer points at its record -- would wait, silent, until someone reads it. The scrubber walks
the whole log in the background, as a RAID or Ceph scrub walks its disks, and then starts again:

* **The log**: every record's checks (size, magic, field lengths, PHYSICALOFFSET, body CRC, record CRC) by the
  same walk recovery uses (``commitlog.scan``). A record that fails is damage: a ``DamagedRange``
  (segment, byte range, reason) is returned for the broker to report and repair from a healthy
  copy; the scrubber never cuts or rewrites log bytes. The rest of that segment is left for the
  next pass (the next record boundary is not known past a broken size word).
* **The consume queues**: they are a pure function of the log (the dispatcher builds them), so the
  units the checked records must have are built again (``dispatch_units``, as the dispatcher does)
  and compared with the stored ones. A unit that differs is rewritten in place from its record --
  derived data repaired locally, no peer needed -- and counted. Except where the log repeats a
  queue offset (two records carry it): dispatch indexes the first, so a unit that is exactly the
  earlier record's is right and stays (a queue always equals what a full dispatch builds).

Each ``step(bytes_max)`` checks at most ``bytes_max`` bytes of the log below what the dispatcher
has indexed (a record the dispatcher has not reached has no units to compare), from where the
last step stopped; a record larger than the budget is checked whole. The walk is synchronous and
pure storage: the broker calls it from a worker thread at a bounded rate.

A DLedger member's store has its own walk, ``EntryScrubber``: every entry of every data file up to
the last one dispatched, checked whole (the entry, its index unit, the message in it) with its
consume-queue units; a damaged entry is returned for the broker to rewrite from another member's
copy (``DLedgerMessageStore.repair_entry``), and the walk checks it again.
"""

from __future__ import annotations

import dataclasses
import struct

from commitlog import dispatch
from commitlog import native
from commitlog import read_check
from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.consume_queue import CQ_UNIT, CQ_UNIT_SIZE
from commitlog.damage import DamagedRange
from commitlog.scan import REASONS, ScanCode, scan_segment

_SIZE_WORD = struct.Struct(">i")  # a DLedger entry's size, at 4
_TERM = struct.Struct(">q")  # an entry's term at 16 of its header, at 24 of its index unit


@dataclasses.dataclass(frozen=True, slots=True)
class ScrubStep:
    checked_from: int
    checked_to: int  # the log offsets this step walked
    damaged: tuple[DamagedRange, ...]  # log damage found (never repaired here)
    units_repaired: tuple[tuple[str, int, int], ...]  # (topic, queue id, queue offset) rewritten from their records
    pass_completed: bool  # the walk reached the indexed end and starts again from the log's head


@dataclasses.dataclass
class ScrubStatistics:
    offset: int = 0  # where the next step starts
    passes: int = 0  # whole walks of the log completed
    checked_bytes: int = 0
    damaged_found: int = 0
    units_repaired: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Scrubber:
    def __init__(self, store, *, crc_function: rec.CrcFunction | None):
        """``store``: an open ``commitlog.store.MessageStore``."""
        self.store = store
        self.crc_function = crc_function
        self.statistics = ScrubStatistics(offset=store.commit_log.min_offset)

    def step(self, bytes_max: int) -> ScrubStep:
        assert bytes_max > 0
        statistics = self.statistics
        queue = self.store.commit_log.mapped_file_queue
        end = min(self.store.reput_from_offset, queue.max_offset)
        statistics.offset = max(statistics.offset, queue.min_offset)
        start_offset = statistics.offset
        if start_offset >= end:
            return self._pass_done(start_offset)
        mapped_file = queue.find_mapped_file_by_offset(start_offset)
        if mapped_file is None:
            return self._pass_done(start_offset)
        base = mapped_file.file_from_offset
        start = start_offset - base
        readable = min(mapped_file.read_position, end - base)
        limit = min(readable, start + bytes_max)
        view = mapped_file.view()
        result = scan_segment(view[:limit], start=start, end=limit, file_from_offset=base, crc_function=self.crc_function)
        position, code = result.position, result.code
        if limit < readable and position < limit and not _damage(code) and self._record_fits(view, position, readable):
            # The walk stopped at the chunk's end, inside a record that goes on past it.
            if position == start:  # a record larger than the budget: check that one whole
                size = self._record_size(view, position, mapped_file.file_size)
                result = scan_segment(view[: start + size], start=start, end=start + size, file_from_offset=base,
                                      crc_function=self.crc_function)  # fmt: skip
                position, code = result.position, result.code
                if position == start:  # a blank that ends the segment, or damage
                    return self._finish(mapped_file, start, position, code, readable)
            return self._advance(mapped_file, start, position, base + position)
        return self._finish(mapped_file, start, position, code, readable)

    def _finish(self, mapped_file, start: int, position: int, code: ScanCode, readable: int) -> ScrubStep:
        """The walk stopped at the end of the segment, of the indexed data, or on damage."""
        base = mapped_file.file_from_offset
        view = mapped_file.view()
        if code is ScanCode.END_OF_SEGMENT or (code is ScanCode.BAD_BLANK and self._blank_ends_file(view, position, mapped_file.file_size)):
            return self._advance(mapped_file, start, position, base + mapped_file.file_size)
        if position >= readable:
            return self._advance(mapped_file, start, position, base + position)
        # Damage: a record that fails its checks, or zeros, below the indexed end.
        size = rec.BLANK.unpack_from(view, position)[0] if readable - position >= 8 else 0
        to = base + position + size if 0 < size <= readable - position else base + readable
        reason = REASONS[code] if code is not ScanCode.END_OF_DATA else "zeros where records were written"
        damaged = (DamagedRange(mapped_file.path, base + position, to, reason),)
        self.statistics.damaged_found += 1
        step = self._advance(mapped_file, start, position, base + mapped_file.file_size)  # next boundary unknown
        return dataclasses.replace(step, damaged=damaged)

    def _advance(self, mapped_file, start: int, position: int, next_offset: int) -> ScrubStep:
        """Compare the queue units of the records checked, ``[start, position)``, and move on."""
        base = mapped_file.file_from_offset
        units = self._check_queue_units(mapped_file.view(), start, position, base)
        self.statistics.checked_bytes += next_offset - (base + start)
        self.statistics.offset = next_offset
        return ScrubStep(base + start, next_offset, (), units, False)

    @staticmethod
    def _record_size(view, position: int, file_size: int) -> int:
        size, magic = rec.BLANK.unpack_from(view, position)
        return file_size - position if magic == rec.BLANK_MAGIC else size

    def _pass_done(self, offset: int) -> ScrubStep:
        self.statistics.passes += 1
        self.statistics.offset = self.store.commit_log.mapped_file_queue.min_offset
        return ScrubStep(offset, offset, (), (), True)

    @staticmethod
    def _blank_ends_file(view, position: int, file_size: int) -> bool:
        return rec.peek_blank(view, position) == file_size - position

    @staticmethod
    def _record_fits(view, position: int, readable: int) -> bool:
        if readable - position < 8:
            return False
        size, magic = rec.BLANK.unpack_from(view, position)
        if magic == rec.BLANK_MAGIC:
            return True
        return magic in (rec.MAGIC_V1, rec.MAGIC_V2) and 0 < size <= readable - position

    def _check_queue_units(self, view, start: int, position: int, base: int) -> tuple[tuple[str, int, int], ...]:
        """Rebuild the units of the records in ``view[start:position]`` and rewrite the stored
        ones that differ."""
        if position <= start:
            return ()
        repaired = []
        for topic, queue_id, first, units in _expected_units(view, start, position, base):
            repaired += _rewrite_differing(self.store, topic, queue_id, first, units)
        self.statistics.units_repaired += len(repaired)
        return tuple(repaired)


# Entries one step of the DLedger scrub checks at most (their index units read in one slice: 128 KiB).
ENTRY_SCRUB_COUNT_MAX = 4096


@dataclasses.dataclass
class EntryScrubStatistics(ScrubStatistics):
    """ScrubStatistics with the entries': ``offset`` is the next entry's index here."""

    entries_checked: int = 0
    entries_repaired: int = 0  # damaged entries rewritten from a healthy member's copy (the broker's repair)
    blanks_rewritten: int = 0  # damaged blank records (a data file's padding) written again where they lie


class EntryScrubber:
    """The scrub of a DLedger member's store (``commitlog.dledger.dispatch.DLedgerMessageStore``):
    every data file, entry by entry, from the log's first entry to the last one dispatched, at the
    broker's rate, then again. Each entry is checked whole, as nothing else re-checks an old one
    (recovery scans the newest data files only, a read checks only the record it serves):

    * the entry (``entry_run.check_run``, native when built): magic, size = bodySize + 48, the
      index following the previous one, a term never going down, ``pos`` where the walk found it,
      channel and chainCrc 0, bodyCrc;
    * its index unit: equal to the one built from the entry (``index_units``), so a damaged
      index, term or pos -- fields under no CRC -- shows as a unit and a header that disagree;
    * the message in it (``read_check.read_records``, the read path's check): size, magic, fields
      that add up, PHYSICALOFFSET = pos + 48, the body CRC and the record CRC tail when present;
    * the consume-queue units of its message, built again as the dispatcher builds them and
      rewritten where they differ (derived data, repaired locally, as the classic scrub does).

    The walk trusts only what it checked: it starts at the log's first entry (where the log's
    first data file starts, or its recorded begin), follows sizes, and moves to the next data
    file at a blank record. An entry that fails is returned as a ``DamagedRange`` (its data file,
    ``[pos, pos + size)``, ``entry N: reason``, its index) and the walk stays on it: the caller
    repairs it from a healthy member (``DLedgerMessageStore.repair_entry``) and calls ``step``
    again, which checks it anew, or gives up on it for this pass (``skip``). Nothing here cuts or
    writes entry bytes."""

    def __init__(self, store):
        self.store = store
        self.statistics = EntryScrubStatistics()
        self._restart()

    def _restart(self) -> None:
        entries = self.store.entries
        self.next_index = entries.first_index()
        self.next_pos = entries.first_offset()
        self.prev_term = entries.term_before_first()
        self.statistics.offset = self.next_index

    def _pass_done(self) -> ScrubStep:
        self.statistics.passes += 1
        index = self.next_index
        self._restart()
        return ScrubStep(index, index, (), (), True)

    def step(self, bytes_max: int) -> ScrubStep:
        from commitlog.dledger import entry_codec as codec  # noqa: PLC0415 (no DLedger import for a classic store)
        from commitlog.dledger import entry_run  # noqa: PLC0415

        assert bytes_max > 0
        store = self.store
        entries = store.entries
        if self.next_index < entries.first_index():  # retention or a reset moved the head meanwhile
            self._restart()
        last = min(store.dispatched_index, entries.committed_index, entries.last_index())
        if self.next_index > last:
            return self._pass_done()
        mapped_file = entries.data_file_list.find_mapped_file_by_offset(self.next_pos)
        if mapped_file is None:  # a truncate or reset since the walk's last step: start over
            return self._pass_done()
        base, file_size = mapped_file.file_from_offset, mapped_file.file_size
        view, start, limit = mapped_file.view(), self.next_pos - mapped_file.file_from_offset, mapped_file.wrote_position
        if file_size - start < codec.MIN_BLANK_SIZE or self._blank_here(entries, view, start, base, file_size):
            self.next_pos = base + file_size  # the end of this data file: the next entry starts the next one
            return ScrubStep(base + start, base + file_size, (), (), False)
        # How far this step goes: the entries whose stored units follow on from the walk's place.
        units = entries.index_unit_bytes(self.next_index, min(last - self.next_index + 1, ENTRY_SCRUB_COUNT_MAX))
        ends, end = [], start
        for _magic, pos, size, _index, _term in codec.INDEX_UNIT.iter_unpack(units):
            if pos != base + end or not codec.BODY_OFFSET <= size <= limit - end or (ends and end + size - start > bytes_max):
                break
            end += size
            ends.append(end)
        if not ends:  # the unit disagrees with the walk: the entry's own header says how long it is
            size = _SIZE_WORD.unpack_from(view, start + 4)[0] if limit - start >= 8 else 0
            if not codec.BODY_OFFSET <= size <= limit - start:
                return self._damaged(mapped_file, start, self._believed_size(units, view, start, limit),
                                     "neither its index unit nor its header gives a size that fits its data file")
            ends, end = [start + size], start + size
        count = len(ends)
        check = native.check_entries if native.check_entries is not None else entry_run.check_run_python
        last_term = _TERM.unpack_from(units, (count - 1) * codec.INDEX_UNIT_SIZE + 24)[0] if len(units) >= count * 32 else -1
        code, good = check(view[start:end], count, self.next_index, self.prev_term, last_term, base + start, base + file_size)
        reason = None if code == entry_run.RUN_OK else entry_run.RUN_REASONS.get(code, f"check code {code}")
        if code == entry_run.RUN_TRAILING:  # the last entry is shorter than its unit says
            good, reason = count - 1, "its size and its index unit's differ"
        if code == entry_run.RUN_BAD_TERM and good == count - 1 and len(units) >= count * 32:
            reason = "its term and its index unit's differ"  # the run's last term is the unit's
        good_end = ends[good - 1] if good else start
        built = entry_run.index_units(view[start:good_end], good) if good else b""
        if built != units[: len(built)]:
            good = next(k for k in range(good) if built[k * 32 : k * 32 + 32] != units[k * 32 : k * 32 + 32])
            good_end, reason = (ends[good - 1] if good else start), "its index unit does not match it"
        spans, numbers = [], []
        for k in range(good):
            entry_start = ends[k - 1] if k else start
            if ends[k] - entry_start > codec.BODY_OFFSET:
                spans.append((base + entry_start + codec.BODY_OFFSET, ends[k] - entry_start - codec.BODY_OFFSET))
                numbers.append(k)
        if spans:
            checked = read_check.read_records(lambda _offset: (view[:good_end], base, mapped_file.path), spans,
                                              crc_function=store.crc_function)  # fmt: skip
            if checked.damage is not None:
                good = numbers[len(checked.views)]
                good_end, reason = (ends[good - 1] if good else start), f"its message: {checked.damage.reason}"
        repaired = self._check_queue_units(view, start, good_end, base, good, ends)
        statistics = self.statistics
        if good:
            self.prev_term = _TERM.unpack_from(view, (ends[good - 2] if good > 1 else start) + 16)[0]
            self.next_index += good
            self.next_pos = base + good_end
            statistics.entries_checked += good
            statistics.checked_bytes += good_end - start
            statistics.offset = self.next_index
        if reason is None:
            return ScrubStep(base + start, base + good_end, (), repaired, False)
        size = self._believed_size(units[good * 32 :], view, good_end, limit)
        step = self._damaged(mapped_file, good_end, size, reason)
        return dataclasses.replace(step, checked_from=base + start, units_repaired=repaired)

    def _blank_here(self, entries, view, start: int, base: int, file_size: int) -> bool:
        """Whether the rest of this data file is a blank record: its header says so, or the next
        entry is the next data file's first (its header there, whole, says this index and pos).
        A damaged one (size, magic or padding: ``scan.blank_damage``) is written again: a blank
        is fully determined by where it lies, no other copy is needed."""
        from commitlog.dledger import entry_codec as codec  # noqa: PLC0415
        from commitlog.dledger.scan import blank_damage  # noqa: PLC0415

        if codec.peek_blank(view, start) != file_size - start:
            following = entries.data_file_list.find_mapped_file_by_offset(base + file_size)
            if following is None or start == 0:
                return False
            try:
                header = codec.decode_entry_header(following.view(), 0)
                codec.check_body(header, following.view(), 0)
            except codec.EntryFormatError:
                return False
            if (header.index, header.pos) != (self.next_index, base + file_size):
                return False
        if blank_damage(view, start, file_size) is not None:
            entries.rewrite_blank(base + start)
            self.statistics.blanks_rewritten += 1
        return True

    def _believed_size(self, units: bytes, view, position: int, limit: int) -> int:
        """The size of the damaged entry at ``position``: its header's when its bodyCrc confirms
        it, else its unit's when it fits, else its header's, else a header's worth."""
        from commitlog.dledger import entry_codec as codec  # noqa: PLC0415

        try:
            header = codec.decode_entry_header(view[:limit], position)
            codec.check_body(header, view[:limit], position)
            if header.body_crc:
                return header.size
        except codec.EntryFormatError:
            pass
        sizes = []
        if len(units) >= codec.INDEX_UNIT_SIZE:
            sizes.append(codec.INDEX_UNIT.unpack_from(units, 0)[2])
        if limit - position >= 8:
            sizes.append(_SIZE_WORD.unpack_from(view, position + 4)[0])
        return next((size for size in sizes if codec.BODY_OFFSET <= size <= limit - position), min(codec.BODY_OFFSET, limit - position))

    def _damaged(self, mapped_file, position: int, size: int, reason: str) -> ScrubStep:
        """The entry the walk stands on failed: say where; the walk stays there."""
        base = mapped_file.file_from_offset
        index = self.next_index
        damage = DamagedRange(mapped_file.path, base + position, base + position + size, f"entry {index}: {reason}", index)
        self.statistics.damaged_found += 1
        return ScrubStep(base + position, base + position, (damage,), (), False)

    def repaired(self, damage: DamagedRange) -> None:
        """``damage`` was rewritten from a healthy copy: the next step checks it again."""
        assert damage.index == self.next_index, (damage, self.next_index)
        self.statistics.entries_repaired += 1

    def skip(self, damage: DamagedRange) -> None:
        """Give up on ``damage`` for this pass: go on after it when its index unit and its header
        agree on its size (then the next entry lies there; the unit's term is taken), else end the
        pass (the next one finds it again)."""
        from commitlog.dledger import entry_codec as codec  # noqa: PLC0415

        entries = self.store.entries
        units = entries.index_unit_bytes(damage.index, 1)
        mapped_file = entries.data_file_list.find_mapped_file_by_offset(damage.from_offset)
        if damage.index == self.next_index and len(units) == codec.INDEX_UNIT_SIZE and mapped_file is not None:
            magic, pos, size, index, term = codec.INDEX_UNIT.unpack(units)
            position = pos - mapped_file.file_from_offset
            header_size = _SIZE_WORD.unpack_from(mapped_file.view(), position + 4)[0] if 0 <= position <= mapped_file.wrote_position - 8 else -1
            if (magic, pos, index, size) == (codec.MAGIC_1, damage.from_offset, damage.index, header_size) and size == damage.to_offset - pos:
                self.next_index, self.next_pos, self.prev_term = index + 1, pos + size, max(term, self.prev_term)
                self.statistics.offset = self.next_index
                return
        self.next_index = 1 << 62  # the next step ends the pass

    def _check_queue_units(self, view, start: int, end: int, base: int, count: int, ends: list[int]) -> tuple[tuple[str, int, int], ...]:
        """Rebuild the consume-queue units of the ``count`` entries in ``view[start:end]`` as the
        dispatcher does and rewrite the stored ones that differ (an entry the native walk defers
        to Python is passed over)."""
        from commitlog.dledger.entry_codec import BODY_OFFSET  # noqa: PLC0415
        from commitlog.dledger.message_dispatch import dispatch_entries  # noqa: PLC0415

        repaired: list[tuple[str, int, int]] = []
        done, position = 0, start
        while done < count:
            position, _stop, walked, found = dispatch_entries(view, position, end, base, count - done, BODY_OFFSET)
            for topic, queue_id, first_queue_offset, _count, units, *_rest in found:
                repaired += _rewrite_differing(self.store, _topic_name_of(topic), queue_id, first_queue_offset, bytes(units))
            done += walked
            if done < count:  # passed over
                position = ends[done]
                done += 1
        self.statistics.units_repaired += len(repaired)
        return tuple(repaired)


def _topic_name_of(topic: bytes) -> str | None:
    return dispatch._topic_name(topic)


def _rewrite_differing(store, topic: str | None, queue_id: int, first: int, units: bytes) -> list[tuple[str, int, int]]:
    """Rewrite the stored units of ``topic``/``queue_id`` from ``first`` that differ from
    ``units`` (what the records say); the (topic, queue, queue offset) rewritten."""
    if topic is None:
        return []
    consume_queue = store.consume_queues.find(topic, queue_id)
    if consume_queue is None:
        return []
    stored = consume_queue.units_at(first, len(units) // CQ_UNIT_SIZE)
    if stored == units[: len(stored)]:
        return []
    rewritten = []
    for index in range(len(stored) // CQ_UNIT_SIZE):
        unit = units[index * CQ_UNIT_SIZE : (index + 1) * CQ_UNIT_SIZE]
        held = stored[index * CQ_UNIT_SIZE : (index + 1) * CQ_UNIT_SIZE]
        if held != unit and not _an_earlier_record_holds(store, topic, queue_id, first + index, held, unit):
            consume_queue.rewrite_unit(first + index, unit)
            rewritten.append((topic, queue_id, first + index))
    return rewritten


def _an_earlier_record_holds(store, topic: str, queue_id: int, queue_offset: int, held: bytes, unit: bytes) -> bool:
    """Whether the stored unit ``held`` is right although the record the scrub walks (``unit``)
    says otherwise: the log repeats the queue offset, and ``held`` is exactly the unit of the
    earlier record that carries it. Dispatch indexes the first of two such records (``put_run``
    skips a queue offset it holds); rewriting the unit to the later one made a restarted master's
    queue differ from its slave's and from any rebuild (found by the corrupt drill)."""
    held_offset, held_size, held_tags = CQ_UNIT.unpack(held)
    if held_offset >= CQ_UNIT.unpack(unit)[0]:
        return False
    try:
        record = store.get_record(held_offset)
    except (ReadError, rec.RecordError):
        return False
    return (record.physical_offset, record.topic, record.queue_id, record.queue_offset, record.size, record.tags_code) == (
        held_offset, topic, queue_id, queue_offset, held_size, held_tags)  # fmt: skip


def _damage(code: ScanCode) -> bool:
    """Codes that mean the bytes are wrong whatever follows (not a walk cut short by its end)."""
    return code in (ScanCode.BAD_MAGIC, ScanCode.FIELDS_DO_NOT_ADD_UP, ScanCode.BODY_CRC_MISMATCH,
                    ScanCode.PHYSICAL_OFFSET_MISMATCH, ScanCode.RECORD_CRC_MISMATCH)  # fmt: skip


def _expected_units(view, start: int, limit: int, base: int):
    """(topic, queue id, first queue offset, packed units) of the records in ``view[start:limit]``,
    built as the dispatcher builds them (the native walk, one record in Python where it defers)."""
    position = start
    while position < limit:
        position_before = position
        position, stop, _records, runs = dispatch.dispatch_units(view, position, limit, base,
                                                                 dispatch.DISPATCH_RECORDS_PER_CALL)  # fmt: skip
        if stop == dispatch._STOP_SLOW:
            yield from _named(runs)
            position, stop, _records, runs = dispatch._dispatch_units_python(view, position, limit, base, records_max=1)
        yield from _named(runs)
        if stop != dispatch._STOP_LIMIT or position == position_before:
            return


def _named(runs):
    for topic, queue_id, first, _count, units, _first_offset, _last_end, _store_ts in runs:
        name = dispatch._topic_name(topic)
        if name is not None:
            yield name, queue_id, first, bytes(units)


__all__ = ["CQ_UNIT", "EntryScrubStatistics", "EntryScrubber", "ScrubStatistics", "ScrubStep", "Scrubber"]
