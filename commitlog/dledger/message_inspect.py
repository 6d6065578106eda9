"""Read-only ``verify`` and message iteration (for ``dump``) of a DLedger member's store root: the
classic part below the divide (``commitlog/``) and the DLedger part (``dledger-<selfId>/``), each
message tagged with its part ("classic" or "dledger"), as ``DLedgerMessageStore`` sees the log.

Nothing here writes or locks (``commitlog.inspect`` and ``commitlog.dledger.inspect`` underneath):
it works on a live store and on a copy. The divide is read from the files: the first DLedger data
file's offset when a classic log precedes it. Entries are listed whether committed or not (the
checkpoint's committedIndex is only a hint; ``verify`` reports it). A DLedger message is checked as
dispatch checks it: the body is exactly one record whose PHYSICALOFFSET is its entry's pos + 48.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

from commitlog import record as rec
from commitlog import inspect as classic_inspect
from commitlog.dledger import entry_codec as codec
from commitlog.dledger import inspect as dledger_inspect
from commitlog.dledger.entry_store import DATA_DIRECTORY
from commitlog.dledger.upgrade import LogPart, dledger_directory
from commitlog.mapped_file import StoreError
from commitlog.mapped_file_queue import MappedFileQueue


@dataclasses.dataclass(frozen=True)
class MessageAt:
    part: LogPart
    offset: int  # commit log offset (PHYSICALOFFSET)
    record: rec.Record
    crc_ok: bool
    index: int | None  # DLedger entry index (None in the classic part)
    term: int | None


@dataclasses.dataclass
class MemberVerifyReport:
    path: str
    divided_offset: int  # -1: no classic part below DLedger (or no DLedger part yet)
    classic: classic_inspect.VerifyReport | None
    dledger: dledger_inspect.DLedgerVerifyReport | None
    dledger_messages: int  # entries holding a message, up to the first bad one
    dledger_noops: int  # entries with an empty body
    bad_message_offset: int | None  # the first entry whose body is not one record at pos + 48
    bad_message_reason: str | None
    overlap: str | None = None  # the classic part reaches past the divide: two logs claim the same offsets

    @property
    def ok(self) -> bool:
        parts_ok = all(part is None or part.corrupt_offset is None for part in (self.classic, self.dledger))
        return parts_ok and self.bad_message_offset is None and self.overlap is None

    def as_json(self) -> dict:
        parts = []
        if self.classic is not None:
            parts.append({"part": LogPart.CLASSIC.value, **self.classic.as_json()})
        if self.dledger is not None:
            parts.append({"part": LogPart.DLEDGER.value, **self.dledger.as_json(), "messages": self.dledger_messages,
                          "noops": self.dledger_noops, "bad_message_offset": self.bad_message_offset,
                          "bad_message_reason": self.bad_message_reason})  # fmt: skip
        return {"path": self.path, "divided_offset": self.divided_offset, "ok": self.ok, "overlap": self.overlap,
                "parts": parts}  # fmt: skip


def _parts(store_root: str, self_id: str) -> tuple[bool, str | None, int]:
    """(has a classic part, the DLedger directory or None, the divide)."""
    if not os.path.isdir(store_root):
        raise StoreError(f"{store_root}: no such directory")
    has_classic = bool(MappedFileQueue.segment_files(os.path.join(store_root, "commitlog")))
    directory = dledger_directory(store_root, self_id)
    data_files = MappedFileQueue.segment_files(os.path.join(directory, DATA_DIRECTORY))
    if not data_files:
        return has_classic, None, -1
    return has_classic, directory, data_files[0][0] if has_classic else -1


def verify_member(store_root: str, self_id: str, *, crc: str = "crc32c") -> MemberVerifyReport:
    """Verify both parts; then check every DLedger entry's body up to the valid end."""
    has_classic, directory, divided = _parts(store_root, self_id)
    classic = classic_inspect.verify(store_root, crc=crc) if has_classic else None
    dledger = dledger_inspect.verify(directory) if directory is not None else None
    messages = noops = 0
    bad_offset = bad_reason = None
    if dledger is not None:
        crc_function = rec.crc_function_by_name(crc)
        try:
            for header, body in dledger_inspect.iter_entries(directory):
                if header.pos >= dledger.end_offset:
                    break
                if not body:
                    noops += 1
                    continue
                offset = header.pos + codec.BODY_OFFSET
                reason = _message_problem(body, offset, crc_function)
                if reason is not None:
                    bad_offset, bad_reason = offset, f"entry {header.index}: {reason}"
                    break
                messages += 1
        except codec.EntryFormatError:
            pass  # the entry scan above names it (dledger.corrupt_offset)
    overlap = None
    if classic is not None and divided >= 0 and classic.max_offset > divided:
        overlap = (f"the classic log (commitlog/) has records up to offset {classic.max_offset}, past the divide "
                   f"{divided} where the DLedger data files begin: both claim those offsets")  # fmt: skip
    return MemberVerifyReport(store_root, divided, classic, dledger, messages, noops, bad_offset, bad_reason, overlap)


def _message_problem(body: bytes, offset: int, crc_function: rec.CrcFunction | None) -> str | None:
    """Why ``body`` is not one record at ``offset`` (CRC checked when a function is given); None if it is."""
    try:
        record = rec.decode_record(body, 0, crc_function=crc_function, limit=len(body))
    except rec.RecordError as error:
        return error.reason
    if record.size != len(body):
        return f"the record is {record.size} bytes, the body {len(body)}"
    if record.physical_offset != offset:
        return f"the record names offset {record.physical_offset}, not pos + 48 = {offset}"
    return None


def iter_messages(store_root: str, self_id: str, *, from_offset: int | None = None,
                  crc: str = "crc32c") -> Iterator[MessageAt]:  # fmt: skip
    """Every message in offset order from ``from_offset`` (a message's offset; default the first):
    classic records below the divide, then DLedger entry bodies (no-ops skipped). Raises
    RecordError / EntryFormatError at an invalid one, as ``iter_records`` / ``iter_entries``."""
    has_classic, directory, divided = _parts(store_root, self_id)
    if has_classic and (from_offset is None or directory is None or from_offset < divided):
        for offset, record, crc_ok in classic_inspect.iter_records(store_root, from_offset=from_offset, crc=crc):
            yield MessageAt(LogPart.CLASSIC, offset, record, crc_ok, None, None)
        from_offset = None
    if directory is None:
        return
    crc_function = rec.crc_function_by_name(crc)
    from_pos = None if from_offset is None else from_offset - codec.BODY_OFFSET
    for header, body in dledger_inspect.iter_entries(directory, from_pos=from_pos):
        if not body:
            continue
        offset = header.pos + codec.BODY_OFFSET
        reason = _message_problem(body, offset, None)
        if reason is not None:
            raise rec.RecordError(f"offset {offset} (entry {header.index}): {reason}")
        record = rec.decode_record(body, 0, crc_function=None, limit=len(body))
        crc_ok = rec.crcs_ok(body, 0, record, crc_function)
        yield MessageAt(LogPart.DLEDGER, offset, record, crc_ok, header.index, header.term)
