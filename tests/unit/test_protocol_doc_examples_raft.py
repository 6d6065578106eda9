"""docs/PROTOCOL.md §4's byte examples are the codec's bytes, so the doc cannot drift from it.

Each example in the doc is a fenced block after a ``<!-- raft-example: NAME -->`` marker: one line
per field, the bytes in hex first, then (after two spaces or more) what they are. Here each NAME
is the message it shows: the doc's bytes must be what the codec encodes for it, and decode back
to it (after the example HELLO, as on a connection). Every frame kind has an example.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from commitlog.dledger.entry_codec import encode_entry
from hasvc.protocol import raft as rp
from hasvc.state.raft import Entry, EntryRun
from hasvc.state.raft.messages import (
    Heartbeat,
    HeartbeatResponse,
    HeartbeatResult,
    Push,
    PushResponse,
    PushResult,
    PushType,
    ResetPush,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    VoteResult,
)

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
EXAMPLE = re.compile(r"<!-- raft-example: (\S+) -->\n```text\n(.*?)```", re.S)

HELLO = rp.Hello("g1", "n0", "n1", client_address="127.0.0.1:10911", data_start_offset=0, data_file_size=1 << 30)
RUN = encode_entry(index=41, term=5, pos=4096, body=b"") + encode_entry(index=42, term=5, pos=4144, body=b"abc")
MESSAGES = {
    "vote-request": VoteRequest("n1", "n0", 6, 43, 4, pre_vote=True),
    "vote-response": VoteResponse("n0", "n1", 5, VoteResult.REJECT_EXPIRED_LEDGER_TERM, pre_vote=True),
    "heartbeat-16": Heartbeat("n0", "n1", 5, -1),
    "heartbeat-24": Heartbeat("n0", "n1", 5, 42, 40),
    "heartbeat-response": HeartbeatResponse("n1", "n0", 5, HeartbeatResult.SUCCESS),
    "heartbeat-response-disk-full": HeartbeatResponse("n1", "n0", 5, HeartbeatResult.SUCCESS, disk_full=True),
    "compare": Push("n0", "n1", 5, PushType.COMPARE, 41, -1, 40, (Entry(41, 5, b""),)),
    "truncate": Push("n0", "n1", 5, PushType.TRUNCATE, 40, -1, 40, (Entry(40, 4, b"ab"), Entry(41, 5, b""))),
    "append": Push("n0", "n1", 5, PushType.APPEND, 41, 4, 40, EntryRun(41, 2, 5, RUN)),
    "push-response-mismatch": PushResponse("n1", "n0", 5, PushType.COMPARE, PushResult.MISMATCH, 41, -1, 0, 43, 4),
    "push-response-success": PushResponse("n1", "n0", 5, PushType.APPEND, PushResult.SUCCESS, 41, 42, 0, 42, -1),
    "timeout-now": TimeoutNow("n0", "n1", 5),
    "reset": ResetPush("n0", "n1", 5, 1000, 3, 4, 1 << 30, 1200),
    "push-response-reset": PushResponse("n1", "n0", 5, PushType.RESET, PushResult.SUCCESS, 1000, 999, 1000, 999, -1),
}


def doc_examples() -> dict[str, bytes]:
    """NAME -> the bytes of its block: each line's hex, before the first run of two spaces. A
    first line that says "length N" must say the frame's length."""
    examples = {}
    for name, block in EXAMPLE.findall(DOC.read_text()):
        assert name not in examples, f"two examples named {name}"
        lines = [re.split(r" {2,}", line.strip(), maxsplit=1) for line in block.splitlines() if line.strip()]
        data = bytes.fromhex(" ".join(line[0] for line in lines))
        said = re.match(r"length (\d+)", lines[0][1]) if len(lines[0]) > 1 else None
        assert said is None or int(said.group(1)) == len(data) - 4, f"{name}: the doc says {said.group(0)}"
        examples[name] = data
    return examples


def _decode(data: bytes, source: str, target: str) -> list:
    """``data`` as received on a connection whose HELLO named ``source`` and ``target``."""
    decoder = rp.RaftDecoder()
    decoder.receive_data(rp.encode_hello(rp.Hello("g1", source, target)) + data)
    events = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    return events[1:]


def test_every_example_in_the_doc_is_checked_here_and_every_kind_has_one():
    examples = doc_examples()
    assert set(examples) == {"hello", *MESSAGES}
    assert {data[4] for data in examples.values()} == set(range(10))  # kinds 0..9


def test_the_hello_example_is_the_codecs():
    data = doc_examples()["hello"]
    assert data == rp.encode_hello(HELLO)
    decoder = rp.RaftDecoder()
    decoder.receive_data(data)
    assert decoder.next_event() == HELLO


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_each_message_example_is_the_codecs(name):
    message = MESSAGES[name]
    data = doc_examples()[name]
    assert data == rp.encode(message), f"{name}: the doc's bytes differ from the codec's"
    assert int.from_bytes(data[:4], "big") == len(data) - 4  # the length the doc states covers the rest
    assert _decode(data, message.source, message.target) == [message]
