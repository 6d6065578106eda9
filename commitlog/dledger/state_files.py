"""DLedger's two small files, ``checkpoint`` and ``currterm``: Java properties text, replaced atomically.

Theory of operation
-------------------
Both files are ``java.util.Properties`` text, one ``key=value`` per line (DLedger's
``IOUtils.properties2String``; DLedger writes them in hash order, so a reader must not rely on
the order of the lines):

    checkpoint   endIndex=<int64>          (DLedgerMmapFileStore.END_INDEX_KEY)
                 committedIndex=<int64>    (COMMITTED_INDEX_KEY)
                 flushedIndex=<int64>      (hasvc only: every entry up to it was fsynced before this file
                                            was written; DLedger ignores it)
                 beginIndex=<int64>        (hasvc only, with the next two: the log starts at this index;
                 beginTerm=<int64>          the term of entry beginIndex - 1; where entry beginIndex
                 beginPos=<int64>           lies. Written before retention deletes head files and by a
                                            reset; absent: the log starts at its first data file's entry)
                 resetting=1               (hasvc only: a reset to beginIndex was begun: recovery finishes it)
    currterm     currTerm=<int64>          (MemberState.TERM_PERSIST_KEY_TERM)
                 voteLeader=<member id>    (TERM_PERSIST_KEY_VOTE_FOR; empty = voted for nobody)
                 committedIndex=<int64>    (hasvc only: the hard state's commit hint; DLedger ignores it)
                 catchUpTerm=<int64>       (hasvc only, with the next: the catch-up mark. Recovery cut
                 catchUpIndex=<int64>       entries this member may have acknowledged; its log ended at
                                            (catchUpTerm, catchUpIndex) before. Until a leader caught it
                                            up to there it votes as if its log still ended there and
                                            stands for no election. Absent or -1: none)

DLedger replaces them by writing ``<name>.tmp``, copying the old one to ``<name>.bak`` and
renaming, with no fsync. hasvc writes ``<name>.tmp``, fsyncs it, renames it over ``<name>``
(atomic) and fsyncs the directory: when ``write_properties`` returns the new content survives a
crash, and a reader finds either the old or the new file whole, never a mix. A left-over
``.tmp`` is ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from commitlog.mapped_file import StoreError, fsync_directory

CHECKPOINT_FILE = "checkpoint"  # DLedgerMmapFileStore.CHECK_POINT_FILE
END_INDEX_KEY = "endIndex"
COMMITTED_INDEX_KEY = "committedIndex"
FLUSHED_INDEX_KEY = "flushedIndex"  # hasvc only: entries <= it were flushed before the checkpoint was written
BEGIN_INDEX_KEY = "beginIndex"  # hasvc only: the log's first index (retention, reset)
BEGIN_TERM_KEY = "beginTerm"  # hasvc only: the term of entry beginIndex - 1
BEGIN_POS_KEY = "beginPos"  # hasvc only: the data offset of entry beginIndex
RESETTING_KEY = "resetting"  # hasvc only: 1 while a reset is under way
TERM_FILE = "currterm"  # MemberState.TERM_PERSIST_FILE
TERM_KEY = "currTerm"
VOTE_FOR_KEY = "voteLeader"
CATCH_UP_TERM_KEY = "catchUpTerm"  # hasvc only: the catch-up mark (see the module)
CATCH_UP_INDEX_KEY = "catchUpIndex"
# A properties file larger than this is not one of ours: a few keys and 64-bit numbers.
PROPERTIES_FILE_SIZE_MAX = 64 * 1024


def write_properties(path: str, values: Mapping[str, object]) -> None:
    """Replace ``path`` with ``key=value`` lines, durably (temp file, fsync, rename, directory fsync)."""
    text = "".join(f"{key}={'' if value is None else value}\n" for key, value in values.items())
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = text.encode("utf-8")
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_directory(os.path.dirname(path))


def read_properties(path: str) -> dict[str, str] | None:
    """The ``key=value`` pairs of ``path``; None when it does not exist. Lines starting with
    ``#`` or ``!`` are comments (Java Properties); ``:`` also separates. Anything else: StoreError."""
    try:
        with open(path, "rb") as file:
            data = file.read(PROPERTIES_FILE_SIZE_MAX + 1)
    except FileNotFoundError:
        return None
    if len(data) > PROPERTIES_FILE_SIZE_MAX:
        raise StoreError(f"{path}: larger than {PROPERTIES_FILE_SIZE_MAX} bytes, not a properties file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StoreError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    values = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise StoreError(f"{path}: line {number} is not key=value: {raw!r}")
        values[line[:cut].strip()] = line[cut + 1 :].strip()
    return values


def int_property(values: Mapping[str, str], key: str, *, path: str, default: int) -> int:
    """``values[key]`` as an integer >= -1 (DLedger's 'none' is -1); ``default`` when absent or empty."""
    text = values.get(key, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise StoreError(f"{path}: {key}={text!r} is not an integer") from None
    if value < -1 or value >= 1 << 63:
        raise StoreError(f"{path}: {key}={value} outside [-1, 2**63)")
    return value
