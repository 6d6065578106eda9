"""Where entries land in the data files: pure position planning (no files, no state).

Theory of operation
-------------------
An entry of ``size`` bytes (header included) goes at the data files' end when ``size + 8`` fits
the rest of that file (8: ``MIN_BLANK_SIZE``, the blank record a file's end must keep room for);
otherwise a blank record fills the rest of the file and the entry starts the next one
(DLedger's ``MmapFileList.preAppend``). So ``pos`` is a function of the log's prefix and the
data-file size alone: two stores holding the same entries hold the same bytes at the same
offsets. (That needs the data files to end where the last entry ends: recovery cuts a blank
record whose entry was lost, ``entry_recovery``; truncation cuts at an entry's end.) The entry
store's ``pre_append`` does this on the files; ``plan_positions`` answers it ahead, for a
follower checking a leader's ``pos`` and for the message store planning a leader's proposal
(``DLedgerMessageStore`` plans through ``DLedgerMmapFileStore.plan_positions``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from commitlog.dledger import entry_codec as codec


def plan_positions(sizes: Sequence[int], *, offset: int, file_size: int) -> list[int]:
    """Where entries of these sizes (header included), appended in this order from data offset
    ``offset`` (where the written data files end, or a planned entry's end), land."""
    positions = []
    for size in sizes:
        remaining = file_size - offset % file_size
        if size + codec.MIN_BLANK_SIZE > remaining:
            offset += remaining  # a blank record fills the rest; the entry starts the next file
        positions.append(offset)
        offset += size
    return positions


def data_size(*, wrote_position: int | None, file_size: int, size_total: int, size_max: int) -> int:
    """The data-file bytes entries of ``size_total`` bytes (the largest ``size_max``) take from
    the log's end, the last data file written to ``wrote_position`` (None: no file): themselves
    when they fit it (leaving room for a blank record), else at most one entry's worth of blank
    padding more."""
    if wrote_position is not None and wrote_position + size_total <= file_size - codec.MIN_BLANK_SIZE:
        return size_total
    return size_total + size_max + codec.MIN_BLANK_SIZE


def check_appendable(entries: Sequence[Any], *, last_index: int, last_term: int, file_size: int) -> tuple[int, int]:
    """ValueError unless ``entries`` may follow a log ending at ``(last_index, last_term)``
    (consecutive indexes, terms not decreasing, each fitting a data file with its blank record);
    their total and largest size. Checked with builtins over the whole list (a leader's pass of
    64 entries: a loop step an entry was ~25 us of the ~110 its append took); the loop
    (``_first_unappendable``) only finds which entry fails."""
    if not entries:
        return 0, 0
    count = len(entries)
    fit_max = min(file_size - codec.MIN_BLANK_SIZE, codec.ENTRY_SIZE_MAX)
    terms = list(map(_TERM, entries))
    sizes = list(map(len, map(_BODY, entries)))
    body_max = max(sizes)
    if (entries[0].index != last_index + 1 or entries[-1].index != last_index + count or terms[0] < max(last_term, 0)
            or codec.BODY_OFFSET + body_max > fit_max or list(map(_INDEX, entries)) != list(range(last_index + 1, last_index + 1 + count))
            or terms != sorted(terms)):  # fmt: skip
        _first_unappendable(entries, last_index=last_index, last_term=last_term, file_size=file_size, fit_max=fit_max)
    return codec.BODY_OFFSET * count + sum(sizes), codec.BODY_OFFSET + body_max


_INDEX, _TERM, _BODY = (operator.itemgetter(field) for field in range(3))  # Entry's (index, term, body)


def _first_unappendable(entries: Sequence[Any], *, last_index: int, last_term: int, file_size: int, fit_max: int) -> None:
    """Raise the ValueError that names the first entry ``check_appendable`` refuses."""
    index, term = last_index, max(last_term, 0)
    for entry in entries:
        if entry.index != index + 1:
            raise ValueError(f"entry index {entry.index} does not follow {index}")
        if entry.term < term:
            raise ValueError(f"entry {entry.index} has term {entry.term}, below the previous {term}")
        size = codec.BODY_OFFSET + len(entry.body)  # codec.entry_size
        if size > fit_max:
            raise ValueError(f"entry {entry.index} of {size} bytes is larger than ENTRY_SIZE_MAX="
                             f"{codec.ENTRY_SIZE_MAX} or a data file of {file_size} less 8")  # fmt: skip
        index, term = entry.index, entry.term
    raise AssertionError("check_appendable found a fault that no entry has")


def run_pos_limit(first_pos: int, *, file_size: int) -> int:
    """The end a run of entries starting at ``first_pos`` must not pass: its data file's end
    less a blank record (a run lies in one data file)."""
    return first_pos - first_pos % file_size + file_size - codec.MIN_BLANK_SIZE
