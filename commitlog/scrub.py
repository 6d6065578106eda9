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
"""

from __future__ import annotations

import dataclasses

from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.consume_queue import CQ_UNIT, CQ_UNIT_SIZE
from commitlog.damage import DamagedRange
from commitlog.scan import REASONS, ScanCode, scan_segment


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


class EntryQueueScrubber:
    """The consume-queue half of the scrub for a DLedger member's store
    (``commitlog.dledger.message_store.DLedgerMessageStore``): the units its dispatched entries
    must have, built again as its dispatcher builds them (``dispatch_entries``), compared with the
    stored ones, and rewritten from their records where they differ. The entries themselves carry
    a CRC over their whole record, checked by the member's recovery and by its reads; damage there
    is the Raft repair's business (cut and caught up from the leader)."""

    def __init__(self, store):
        self.store = store
        self.next_index = store.entries.first_index()
        self.statistics = ScrubStatistics()

    def step(self, bytes_max: int) -> ScrubStep:
        from commitlog.dledger.entry_codec import BODY_OFFSET  # noqa: PLC0415 (no DLedger import for a classic store)
        from commitlog.dledger.message_store import dispatch_entries  # noqa: PLC0415

        assert bytes_max > 0
        store, statistics = self.store, self.statistics
        entries = store.entries
        first = max(self.next_index, entries.first_index())
        last = min(store.dispatched_index, entries.last_index())
        if first > last:
            statistics.passes += 1
            self.next_index = entries.first_index()
            statistics.offset = self.next_index
            return ScrubStep(first, first, (), (), True)
        fitting, _, pos, end = entries.run_extent(first, last + 1, size_max=bytes_max)
        mapped_file = entries.data_file_list.find_mapped_file_by_offset(pos)
        base = mapped_file.file_from_offset
        start, limit = pos - base, min(end - base, mapped_file.wrote_position)
        repaired: list[tuple[str, int, int]] = []
        position, stop, walked, found = dispatch_entries(mapped_file.view(), start, limit, base, fitting, BODY_OFFSET)
        for topic, queue_id, first_queue_offset, _count, units, *_rest in found:
            repaired += _rewrite_differing(store, _topic_name_of(topic), queue_id, first_queue_offset, bytes(units))
        self.next_index = first + max(walked, 1)  # an entry the native walk defers, or a bad one: passed over
        statistics.offset = self.next_index
        statistics.checked_bytes += max(position - start, 0)
        statistics.units_repaired += len(repaired)
        return ScrubStep(base + start, base + max(position, start), (), tuple(repaired), False)


def _topic_name_of(topic: bytes) -> str | None:
    from commitlog.store import _topic_name  # noqa: PLC0415

    return _topic_name(topic)


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
    from commitlog import store as message_store  # noqa: PLC0415 (the store may import this module)

    position = start
    while position < limit:
        position_before = position
        position, stop, _records, runs = message_store.dispatch_units(view, position, limit, base,
                                                                      message_store.DISPATCH_RECORDS_PER_CALL)  # fmt: skip
        if stop == message_store._STOP_SLOW:
            yield from _named(runs)
            position, stop, _records, runs = message_store._dispatch_units_python(view, position, limit, base, records_max=1)
        yield from _named(runs)
        if stop != message_store._STOP_LIMIT or position == position_before:
            return


def _named(runs):
    from commitlog.store import _topic_name  # noqa: PLC0415

    for topic, queue_id, first, _count, units, _first_offset, _last_end, _store_ts in runs:
        name = _topic_name(topic)
        if name is not None:
            yield name, queue_id, first, bytes(units)


__all__ = ["CQ_UNIT", "EntryQueueScrubber", "ScrubStatistics", "ScrubStep", "Scrubber"]
