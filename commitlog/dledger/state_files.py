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
``.tmp`` is ignored. hasvc also ends each file with ``crc32c=<CRC32C of the lines before it>``
(DLedger ignores a key it does not know) and writes the same content to ``<name>.bak`` first: a
file whose line does not match is damaged, and its copy is read instead. A damaged ``currterm``
read as if it were whole could forget a vote and let the member vote twice in one term: with
both copies damaged the member refuses to start, naming both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from commitlog.dledger.entry_types import HardState
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
CRC_KEY = "crc32c"  # hasvc only: the CRC32C of every line before it (DLedger ignores the key)
BACKUP_SUFFIX = ".bak"  # the second copy, written first (DLedger keeps a .bak too, of the previous content)
# A properties file larger than this is not one of ours: a few keys and 64-bit numbers.
PROPERTIES_FILE_SIZE_MAX = 64 * 1024
# A member id as currterm can hold it: no whitespace or properties syntax, bounded.
_MEMBER_ID = re.compile(r"[^\s=:#!\\]{1,255}")


class EntryStateFiles:
    """A store directory's ``checkpoint`` and ``currterm`` and what they hold now: the recorded
    begin (``beginIndex``, ``beginTerm``, ``beginPos``), the flushedIndex the checkpoint names,
    the saved hard state. The entry store's indexes are its own; it hands them in to be written."""

    def __init__(self, directory: str, *, data_file_size: int) -> None:
        self.checkpoint_path = os.path.join(directory, CHECKPOINT_FILE)
        self.term_path = os.path.join(directory, TERM_FILE)
        self.data_file_size = data_file_size
        self.begin: tuple[int, int, int] | None = None  # (beginIndex, beginTerm, beginPos) on record
        self.checkpoint_flushed_index = -1  # the flushedIndex the checkpoint file holds
        self.hard_state = HardState(0, None, -1)  # as saved in currterm

    def load(self) -> tuple[int, int, bool]:
        """Read currterm and checkpoint; return (committed index hint, checkpoint flushedIndex,
        whether a reset was under way); the recorded begin goes to ``begin``."""
        hint = -1
        values = read_properties(self.term_path)
        if values is not None:
            term = int_property(values, TERM_KEY, path=self.term_path, default=0)
            vote = values.get(VOTE_FOR_KEY, "") or None
            hint = int_property(values, COMMITTED_INDEX_KEY, path=self.term_path, default=-1)
            mark = [int_property(values, key, path=self.term_path, default=-1)
                    for key in (CATCH_UP_TERM_KEY, CATCH_UP_INDEX_KEY)]  # fmt: skip
            self.hard_state = HardState(max(term, 0), vote, hint, *mark)
        flushed = -1
        values = read_properties(self.checkpoint_path)
        if values is None:
            return hint, flushed, False
        path = self.checkpoint_path
        committed = int_property(values, COMMITTED_INDEX_KEY, path=path, default=-1)
        hint = max(hint, committed)
        flushed = self.checkpoint_flushed_index = int_property(values, FLUSHED_INDEX_KEY, path=path, default=-1)
        begin = [int_property(values, key, path=path, default=-1) for key in (BEGIN_INDEX_KEY, BEGIN_TERM_KEY, BEGIN_POS_KEY)]
        if begin[0] >= 1:
            if begin[1] < 0 or begin[2] < 0 or begin[2] % self.data_file_size:
                raise StoreError(f"{path}: begin index {begin[0]}, term {begin[1]}, pos {begin[2]}: "
                                 "not a term and a data-file boundary")  # fmt: skip
            self.begin = (begin[0], begin[1], begin[2])
        resetting = int_property(values, RESETTING_KEY, path=path, default=0) == 1
        if resetting and self.begin is None:
            raise StoreError(f"{path}: resetting without a begin index")
        return hint, flushed, resetting

    def write_checkpoint(self, *, end: int, committed: int, flushed: int, resetting: bool = False) -> None:
        """Replace ``checkpoint`` durably: endIndex, committedIndex (DLedger's), flushedIndex and,
        once retention or a reset moved the log's start, the recorded begin."""
        values: dict[str, object] = {END_INDEX_KEY: end, COMMITTED_INDEX_KEY: committed, FLUSHED_INDEX_KEY: flushed}
        if self.begin is not None:
            values.update({BEGIN_INDEX_KEY: self.begin[0], BEGIN_TERM_KEY: self.begin[1], BEGIN_POS_KEY: self.begin[2]})
        if resetting:
            values[RESETTING_KEY] = 1
        write_properties(self.checkpoint_path, values)
        self.checkpoint_flushed_index = flushed

    def save_hard_state(self, state: HardState) -> None:
        """Replace ``currterm`` durably (fsynced before this returns). The term never decreases."""
        if state.term < self.hard_state.term:
            raise ValueError(f"term {state.term} below the saved term {self.hard_state.term}")
        if state.voted_for is not None and not _MEMBER_ID.fullmatch(state.voted_for):
            raise ValueError(f"member id {state.voted_for!r} cannot be stored (whitespace, = : # ! \\ or too long)")
        if state.committed_index < -1:
            raise ValueError(f"committed_index {state.committed_index} < -1")
        values: dict[str, object] = {TERM_KEY: state.term, VOTE_FOR_KEY: state.voted_for or "",
                                     COMMITTED_INDEX_KEY: state.committed_index}  # fmt: skip
        mark = (state.catch_up_term, state.catch_up_index)
        if mark[1] >= 0:
            values[CATCH_UP_TERM_KEY], values[CATCH_UP_INDEX_KEY] = mark
        write_properties(self.term_path, values)
        self.hard_state = HardState(state.term, state.voted_for, state.committed_index, *mark)


def write_properties(path: str, values: Mapping[str, object]) -> None:
    """Replace ``path`` with ``key=value`` lines and a ``crc32c`` line over them, durably (temp
    file, fsync, rename, directory fsync): first its copy ``path.bak``, then ``path`` itself. A
    reader takes ``path`` when it checks, else the copy: one damaged file is survived, and a crash
    between the two writes leaves ``path`` at the last write that completed."""
    text = "".join(f"{key}={'' if value is None else value}\n" for key, value in values.items())
    data = text.encode("utf-8")
    data += f"{CRC_KEY}={_crc(data)}\n".encode()
    for target in (path + BACKUP_SUFFIX, path):
        temporary = target + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    fsync_directory(os.path.dirname(path))


def read_properties(path: str) -> dict[str, str] | None:
    """The ``key=value`` pairs of ``path`` (its ``crc32c`` line checked and left out), or of its
    copy ``path.bak`` when ``path`` is damaged or gone; None when neither exists. A file with no
    ``crc32c`` line (DLedger's, an older hasvc's) is read unchecked. Both unreadable: StoreError
    naming both."""
    try:
        return _read_checked(path)
    except StoreError as damage:
        try:
            copy = _read_checked(path + BACKUP_SUFFIX)
        except StoreError as also:
            raise StoreError(f"{damage}; its copy too: {also}") from None
        if copy is None:
            raise
        return copy


def _crc(data: bytes) -> int:
    """CRC32C, imported when first needed: the crc32c package pulls importlib.metadata (email,
    socket) in with it, which the Raft core's import-purity test keeps out of its imports."""
    import crc32c  # noqa: PLC0415

    return crc32c.crc32c(data)


def _read_checked(path: str) -> dict[str, str] | None:
    values = _read_plain(path)
    if values is None:
        return values
    with open(path, "rb") as file:
        data = file.read(PROPERTIES_FILE_SIZE_MAX + 1)
    if CRC_KEY not in values:
        # DLedger's files and an older hasvc's have no crc32c line. One of ours whose line ending
        # before it was flipped has it joined to the line above: damaged, not unchecked.
        if f"{CRC_KEY}=".encode() in data:
            raise StoreError(f"{path}: its crc32c line is not a line of its own (damaged)")
        return values
    body, _, _ = data.rpartition(f"{CRC_KEY}=".encode())
    if values.pop(CRC_KEY) != str(_crc(body)):
        raise StoreError(f"{path}: its crc32c line does not match its content (damaged)")
    return values


def _read_plain(path: str) -> dict[str, str] | None:
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
