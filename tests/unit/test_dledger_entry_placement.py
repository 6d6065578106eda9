"""``entry_placement.check_appendable``: what it accepts, totals and refuses (with the message
naming the first entry at fault), against the entry-by-entry walk it replaced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog.dledger import entry_codec as codec
from commitlog.dledger.entry_placement import check_appendable
from commitlog.dledger.entry_types import Entry

FILE_SIZE = 4096


def walk(entries, *, last_index: int, last_term: int, file_size: int) -> tuple[int, int]:
    """The reference: one step an entry."""
    index, term = last_index, max(last_term, 0)
    size_total = size_max = 0
    fit_max = min(file_size - codec.MIN_BLANK_SIZE, codec.ENTRY_SIZE_MAX)
    for entry in entries:
        if entry.index != index + 1:
            raise ValueError(f"entry index {entry.index} does not follow {index}")
        if entry.term < term:
            raise ValueError(f"entry {entry.index} has term {entry.term}, below the previous {term}")
        size = codec.BODY_OFFSET + len(entry.body)
        if size > fit_max:
            raise ValueError(f"entry {entry.index} of {size} bytes is larger than ENTRY_SIZE_MAX="
                             f"{codec.ENTRY_SIZE_MAX} or a data file of {file_size} less 8")  # fmt: skip
        index, term = entry.index, entry.term
        size_total += size
        size_max = max(size_max, size)
    return size_total, size_max


@st.composite
def entry_lists(draw):
    """Entries after a log ending at (last_index, last_term): mostly appendable, with one fault
    (an index skipped or repeated, a term that goes down, a body too large) often enough."""
    last_index = draw(st.integers(-1, 50))
    last_term = draw(st.integers(-1, 5))
    count = draw(st.integers(0, 12))
    index, term = last_index + 1, max(last_term, 0)
    entries = []
    for _ in range(count):
        term += draw(st.sampled_from([0, 0, 0, 1]))
        size = draw(st.sampled_from([0, 10, 100, FILE_SIZE - codec.MIN_BLANK_SIZE - codec.BODY_OFFSET]))
        entries.append(Entry(index, term, b"b" * size))
        index += 1
    if entries and draw(st.booleans()):
        at = draw(st.integers(0, len(entries) - 1))
        index, term, body = entries[at]
        fault = draw(st.sampled_from(["skip", "repeat", "term", "size", "first"]))
        if fault == "skip":
            entries[at] = Entry(index + 1, term, body)
        elif fault == "repeat":
            entries[at] = Entry(index - 1, term, body)
        elif fault == "term":
            entries[at] = Entry(index, term - 1, body)
        elif fault == "size":
            entries[at] = Entry(index, term, body + b"x" * (FILE_SIZE - codec.MIN_BLANK_SIZE - codec.BODY_OFFSET - len(body) + 1))
        else:
            entries[at] = Entry(index + draw(st.sampled_from([-3, 2, 7])), term, body)
    return entries, last_index, last_term


@settings(max_examples=400, deadline=None)
@given(entry_lists())
def test_check_appendable_agrees_with_the_walk(case) -> None:
    entries, last_index, last_term = case
    try:
        expected = walk(entries, last_index=last_index, last_term=last_term, file_size=FILE_SIZE)
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            check_appendable(entries, last_index=last_index, last_term=last_term, file_size=FILE_SIZE)
        assert str(raised.value) == str(error)
    else:
        assert check_appendable(entries, last_index=last_index, last_term=last_term, file_size=FILE_SIZE) == expected


def test_a_term_that_goes_down_and_back_up_is_refused() -> None:
    """First and last terms equal says nothing of the ones between."""
    entries = [Entry(0, 2, b""), Entry(1, 1, b""), Entry(2, 2, b"")]
    with pytest.raises(ValueError, match="entry 1 has term 1, below the previous 2"):
        check_appendable(entries, last_index=-1, last_term=-1, file_size=FILE_SIZE)
