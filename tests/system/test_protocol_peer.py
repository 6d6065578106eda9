"""docs/PROTOCOL.md against a peer written from it (issue 21): each rule it states, on the wire,
against real broker processes (raw sockets play the peer where a hasvc client would hide the
bytes)."""

import hashlib
import hmac
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from hasvc import client as hc
from hasvc.broker.client_port import CLIENT_RECEIVE_SIZE
from hasvc.protocol import client as cp
from hasvc.protocol import ha, wire
from tests.cluster import Cluster, wait_until

SEGMENT = 1024 * 1024


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, segment_size=SEGMENT)
    yield c
    c.close()


def status(broker, secret=None) -> dict:
    with hc.BlockingClient(broker.address, secret) as client:
        return client.status()


def raw_connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += piece
    return data


def preface(sock: socket.socket, key: bytes | None = None) -> None:
    """The client side of §1, from the document: the proof is HMAC-SHA256 keyed with ``key``."""
    magic, version, _kind, auth_required, server_nonce = wire.HELLO.unpack(receive_exactly(sock, wire.HELLO.size))
    assert (magic, version, auth_required) == (b"HSVC", 1, key is not None)
    client_nonce = os.urandom(32)
    proof = bytes(32) if key is None else hmac.new(key, b"hasvc-client" + server_nonce + client_nonce, hashlib.sha256).digest()
    sock.sendall(b"HSVC" + bytes([1]) + client_nonce + proof)
    auth_status, server_proof = wire.AUTH_OK.unpack(receive_exactly(sock, wire.AUTH_OK.size))
    assert auth_status == 0
    if key is not None:
        assert server_proof == hmac.new(key, b"hasvc-server" + client_nonce + server_nonce, hashlib.sha256).digest()


def closed_by_peer(sock: socket.socket) -> bool:
    """True when the broker closes the connection (within the socket's 10 s timeout)."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def request(sock: socket.socket, kind: int, payload: bytes, request_id: int = 7) -> bytes:
    sock.sendall(cp.encode_frame(kind, request_id, payload))
    length, response_kind, response_id = cp.FRAME_HEADER.unpack(receive_exactly(sock, cp.FRAME_HEADER.size))
    assert (response_kind, response_id) == (kind | 0x80, request_id)
    return receive_exactly(sock, length - 5)


def send_raw(sock: socket.socket, topic: str, queue_id: int, body: bytes = b"m") -> cp.SendResponse:
    payload = cp.encode_send(cp.SendRequest(topic, queue_id, [body], [b""]))
    return cp.decode_send_response(request(sock, cp.SEND, payload))


def read_master_hello(sock: socket.socket) -> ha.MasterHello:
    (size,) = ha.LENGTH.unpack(receive_exactly(sock, 4))
    return ha.decode_master_hello(receive_exactly(sock, size))


# -- §1 preface ---------------------------------------------------------------------------------


def test_the_hmac_key_is_the_secret_files_bytes_stripped_of_surrounding_whitespace(tmp_path):
    cluster = Cluster(tmp_path, segment_size=SEGMENT, secret=b" \t k\xc3\xa9y \r\n")
    try:
        master = cluster.start_master(role="async")
        for address in (master.address, master.ha_address):
            sock = raw_connect(address)
            preface(sock, key=b"k\xc3\xa9y")  # the bytes as stored, whitespace cut, nothing decoded
            sock.close()
    finally:
        cluster.close()


@pytest.mark.parametrize("content", [b"", b" \n\t\r\n"], ids=["empty", "whitespace"])
def test_an_empty_secret_file_makes_the_broker_exit_with_a_message(tmp_path, content):
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(content)
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "master", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0",
                           "--ha-listen", "127.0.0.1:0", "--secret-file", str(secret_file)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2  # a configuration error (docs/operations.md, exit codes)
    assert done.stderr.strip() == f"Error: the secret file {secret_file} is empty (or only whitespace); refusing to start"
    assert not done.stdout


def test_hasvc_secret_is_stripped_as_the_file_is_and_a_blank_one_exits(tmp_path):
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        slave = cluster.start_slave("127.0.0.1:1", env={"HASVC_SECRET": "\t k\u00e9y \n"})  # a broker with a secret
        sock = raw_connect(slave.address)
        preface(sock, key="k\u00e9y".encode())
        sock.close()
    finally:
        cluster.close()
    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "master", "--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0",
                           "--ha-listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HASVC_SECRET": " \n"})  # fmt: skip
    assert (done.returncode, done.stderr.strip()) == (2, "Error: HASVC_SECRET is only whitespace; refusing to start")


class FakeMaster:
    """An HA port that greets as a server without a secret (HELLO auth required 0) and records
    every byte the peer sends after the greeting, until the peer closes."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sessions: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(wire.encode_hello(port_kind=wire.PORT_KIND_HA, auth_required=False, server_nonce=wire.new_nonce()))
                received = b""
                try:
                    while piece := connection.recv(65536):
                        received += piece
                except OSError:
                    pass
                self.sessions.append(received)

    def close(self) -> None:
        self.listener.close()


def test_a_slave_with_a_secret_refuses_a_master_that_requires_none_and_sends_it_nothing(tmp_path):
    fake = FakeMaster()
    cluster = Cluster(tmp_path, segment_size=SEGMENT, secret=b"cluster secret")
    try:
        slave = cluster.start_slave(fake.address, ha_reconnect_backoff_max_ms=200)
        wait_until(lambda: len(fake.sessions) >= 2, message="the slave tried twice")
        assert fake.sessions[:2] == [b"", b""]  # no AUTH: not even a proof to replay elsewhere
        assert "requires no secret but we have one" in slave.log()
        assert status(slave, b"cluster secret")["max_offset"] == 0
    finally:
        cluster.close()
        fake.close()


def test_a_client_with_a_secret_refuses_a_broker_that_requires_none(cluster):
    master = cluster.start_master(role="async")
    with pytest.raises(hc.ClientError, match="requires no secret but we have one"):
        hc.BlockingClient(master.address, b"a secret")
    assert "authentication failed" not in master.log()  # refused before any AUTH was sent


def test_a_client_on_the_wrong_port_kind_stops_at_hello(cluster):
    """AUTH_OK status 2 is never sent: the client reads the port kind from HELLO and stops."""
    master = cluster.start_master(role="async")
    with pytest.raises(hc.ClientError, match="wrong port"):
        hc.BlockingClient(master.ha_address)
    sock = raw_connect(master.address)
    _, _, kind, _, _ = wire.HELLO.unpack(receive_exactly(sock, wire.HELLO.size))
    assert kind == wire.PORT_KIND_CLIENT
    sock.close()


# -- §2 client protocol -------------------------------------------------------------------------


def test_a_send_response_names_the_queue_only_when_something_was_stored(cluster):
    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    sock = raw_connect(master.address)
    preface(sock)
    stored = send_raw(sock, "T", 3)
    assert (stored.status, stored.queue_id, len(stored.offsets)) == ("PUT_OK", 3, 1)
    for topic, queue_id, expected in (("bad topic!", 3, "MESSAGE_ILLEGAL"), ("T", -5, "MESSAGE_ILLEGAL")):
        refused = send_raw(sock, topic, queue_id)
        assert (refused.status, refused.queue_id, refused.offsets) == (expected, -1, []), refused
    garbled = cp.decode_send_response(request(sock, cp.SEND, b"\x00\x01T"))  # cannot be decoded
    assert (garbled.status, garbled.queue_id, garbled.offsets) == ("MESSAGE_ILLEGAL", -1, [])
    sock.close()
    sock = raw_connect(slave.address)
    preface(sock)
    refused = send_raw(sock, "T", 3)
    assert (refused.status, refused.queue_id, refused.offsets) == ("SERVICE_NOT_AVAILABLE", -1, [])
    sock.close()
    with hc.BlockingClient(slave.address) as client:  # the client library reports the wire's -1 too
        result = client.send("T", b"m", queue_id=3)
    assert (result.status, result.offset, result.queue_id, result.queue_offset) == ("SERVICE_NOT_AVAILABLE", -1, -1, -1)


def test_slave_not_available_names_the_in_sync_slaves_needed_and_present(cluster):
    master = cluster.start_master(role="sync", in_sync_replicas=2)
    cluster.start_slave(master.ha_address)
    wait_until(lambda: [s["ack_offset"] for s in status(master)["slaves"]] == [0], message="the slave reported")
    with hc.BlockingClient(master.address) as client:
        result = client.send("T", b"x" * 100)
    assert result.status == "SLAVE_NOT_AVAILABLE" and result.offset == 0  # stored on the master
    assert result.reason == (f"stored on the master only: in_sync_replicas 2 slave(s) needed within ha_max_gap_not_in_sync "
                             f"{256 * 1024 * 1024} bytes of the put's end {status(master)['max_offset']}, 1 there (1 connected)")  # fmt: skip


def test_status_lag_seconds_counts_from_the_connection_for_a_slave_never_caught_up(cluster):
    master = cluster.start_master(role="async")
    with hc.BlockingClient(master.address) as client:
        end = client.send("T", b"x" * 100).offset + 1
    before = time.monotonic()
    sock = raw_connect(master.ha_address)
    preface(sock)
    sock.sendall(ha.encode_slave_hello(ha.SlaveHello("laggard", "127.0.0.1:1", 0)))
    assert read_master_hello(sock).status == ha.STATUS_OK
    sock.sendall(ha.REPORT.pack(0))  # and never another: it stays behind
    state = wait_until(lambda: (s := status(master))["slaves"] and s["slaves"][0]["ack_offset"] == 0 and s, message="report seen")
    elapsed = time.monotonic() - before
    (slave,) = state["slaves"]
    assert slave["lag_bytes"] == state["max_offset"] >= end
    assert 0 < slave["lag_seconds"] <= elapsed + 0.001  # not the host's uptime
    assert slave["connected_since"].endswith("Z")
    sock.close()


@pytest.mark.parametrize(
    ("head", "message"),
    [(b"\xff\xff\xff\xff", "frame of 4294967295 bytes, outside 5..16777216"), (b"\x00\x00\x00\x04", "frame of 4 bytes, outside 5..16777216"),
     (b"\x00\x00\x00\x05\x63", "unknown frame kind 99")],
    ids=["huge", "short", "kind"],
)  # fmt: skip
def test_a_bad_length_or_kind_alone_is_refused_without_waiting_for_the_rest_of_the_header(cluster, head, message):
    master = cluster.start_master(role="async")
    sock = raw_connect(master.address)
    preface(sock)
    sock.sendall(head)  # and nothing more: the request id never comes
    assert closed_by_peer(sock)
    assert message in master.log()
    sock.close()


# -- §3 HA handshake ----------------------------------------------------------------------------


def slave_hello_with_entries(count: int) -> bytes:
    body = (struct.pack(">H", 0) + struct.pack(">H", 1) + b"s" + struct.pack(">H", 0) + struct.pack(">q", 0)
            + struct.pack(">I", count) + b"".join(ha.EPOCH_ENTRY.pack(i + 1, 0) for i in range(count)))  # fmt: skip
    return ha.LENGTH.pack(len(body)) + body


@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        (ha.LENGTH.pack(ha.HANDSHAKE_SIZE_MAX + 1), f"bad SLAVE_HELLO: handshake frame of {ha.HANDSHAKE_SIZE_MAX + 1} bytes, more than {ha.HANDSHAKE_SIZE_MAX}"),
        (slave_hello_with_entries(1001), "bad SLAVE_HELLO: 1001 epoch entries, more than 1000"),
        (ha.LENGTH.pack(3) + b"abc", "bad SLAVE_HELLO: handshake frame ends in the middle of a field"),
    ],
    ids=["oversize", "too-many-epochs", "truncated"],
)  # fmt: skip
def test_an_unreadable_slave_hello_gets_a_refusal_with_the_reason(cluster, hello, reason):
    master = cluster.start_master(role="async")
    sock = raw_connect(master.ha_address)
    preface(sock)
    sock.sendall(hello)  # the oversize one: its length only, the master answers at once
    answer = read_master_hello(sock)
    assert (answer.status, answer.reason, answer.segment_size) == (ha.STATUS_REFUSED, reason, SEGMENT)
    assert closed_by_peer(sock)
    sock.close()
    with hc.BlockingClient(master.address) as client:
        assert client.send("T", b"still serving").ok


# -- not yet covered by the peer: PULL, PROMOTE/DEMOTE, SEND_IDEMPOTENT, a slave below the oldest byte


def pull_raw(sock: socket.socket, topic: str, queue_id: int, offset: int, count: int) -> cp.PullResponse:
    return cp.decode_pull_response(request(sock, cp.PULL, cp.encode_pull(cp.PullRequest(topic, queue_id, offset, count))))


def test_pull_statuses_offsets_and_the_byte_bound(cluster):
    master = cluster.start_master(role="async")
    sock = raw_connect(master.address)
    preface(sock)
    for _ in range(15):
        assert send_raw(sock, "Big", 1, b"b" * 300_000).status == "PUT_OK"
    wait_until(lambda: status(master)["dispatched_offset"] == status(master)["max_offset"], message="dispatched")
    first = pull_raw(sock, "Big", 1, 0, 100)
    sizes = [len(r) for r in first.records]
    assert first.status == "OK" and first.max_queue_offset == 15
    assert sum(sizes) <= 4 * 1024 * 1024 < sum(sizes) + sizes[0] and first.next_queue_offset == len(sizes) < 15
    rest = pull_raw(sock, "Big", 1, first.next_queue_offset, 100)
    assert (rest.status, rest.next_queue_offset, len(rest.records)) == ("OK", 15, 15 - len(sizes))
    at_end = pull_raw(sock, "Big", 1, 15, 100)
    assert (at_end.status, at_end.next_queue_offset, at_end.max_queue_offset, at_end.records) == ("OK", 15, 15, [])
    beyond = pull_raw(sock, "Big", 1, 16, 100)
    assert (beyond.status, beyond.next_queue_offset, beyond.max_queue_offset, beyond.records) == ("OFFSET_ILLEGAL", 16, 15, [])
    missing = pull_raw(sock, "Big", 2, 0, 100)
    assert (missing.status, missing.next_queue_offset, missing.max_queue_offset, missing.records) == ("NOT_FOUND", 0, 0, [])
    garbled = request(sock, cp.PULL, b"\x00")
    assert cp.Reader(garbled).text() == "ERROR" and len(garbled) == 2 + 5 + 2 + len("payload ends in the middle of a field")
    sock.close()


def test_requests_cut_across_reads_together_in_one_and_larger_than_a_receive_are_each_stored_whole(tmp_path):
    """The client port reads into one reused buffer and hands the decoder a copy: a frame whose
    pieces came in three reads, one larger than a read (CLIENT_RECEIVE_SIZE) and two in one
    write each store their own bytes, answered in order."""
    cluster = Cluster(tmp_path, segment_size=4 * CLIENT_RECEIVE_SIZE)  # a segment holds the large one
    try:
        master = cluster.start_master(role="async")
        sock = raw_connect(master.address)
        preface(sock)
        bodies = [os.urandom(1024), os.urandom(CLIENT_RECEIVE_SIZE + 300 * 1024), os.urandom(2000), os.urandom(10)]
        frames = b"".join(cp.encode_frame(cp.SEND, 1 + i, cp.encode_send(cp.SendRequest("Cut", 0, [body], [b""])))
                          for i, body in enumerate(bodies))  # fmt: skip
        for start, end in ((0, 3), (3, 700), (700, 200_000), (200_000, len(frames))):
            sock.sendall(frames[start:end])
            time.sleep(0.05)  # each piece its own read at the broker
        for i in range(len(bodies)):
            length, kind, request_id = cp.FRAME_HEADER.unpack(receive_exactly(sock, cp.FRAME_HEADER.size))
            assert (kind, request_id) == (cp.SEND | 0x80, 1 + i)
            assert cp.decode_send_response(receive_exactly(sock, length - 5)).status == "PUT_OK"
        sock.close()
        wait_until(lambda: status(master)["dispatched_offset"] == status(master)["max_offset"], message="dispatched")
        with hc.BlockingClient(master.address) as client:
            pulled = client.pull("Cut", 0, 0, count_max=10)
        assert [record.body for record in pulled.records] == bodies
    finally:
        cluster.close()


def role_request(sock: socket.socket, kind: int, payload: bytes) -> tuple[str, str, bytes]:
    return cp.decode_status_response(request(sock, kind, payload))


def test_promote_and_demote_refusals_change_nothing(cluster):
    master = cluster.start_master(role="async")
    slave = cluster.start_slave(master.ha_address)
    to_slave, to_master = raw_connect(slave.address), raw_connect(master.address)
    preface(to_slave)
    preface(to_master)
    for payload in (b"", b"\x02", b"\x01\x00"):
        state, reason, blob = role_request(to_slave, cp.PROMOTE, payload)
        assert (state, blob) == ("ERROR", b"") and reason.startswith("PROMOTE payload"), reason
    assert role_request(to_master, cp.PROMOTE, b"\x01") == ("ERROR", "already ASYNC_MASTER", b"")
    assert role_request(to_slave, cp.DEMOTE, cp.encode_demote(master.ha_address)) == ("ERROR", "already a slave", b"")
    assert role_request(to_master, cp.DEMOTE, cp.encode_demote("nowhere")) == ("ERROR", "address 'nowhere' is not HOST:PORT", b"")
    assert (status(master)["role"], status(slave)["role"]) == ("ASYNC_MASTER", "SLAVE")
    wait_until(lambda: status(slave)["master_connected"], message="the slave still replicates")
    to_slave.close()
    to_master.close()


def send_idempotent_raw(sock, producer_id: str, first: int, bodies: list[bytes], queue_id: int = 2, properties: bytes = b"") -> cp.SendResponse:
    payload = cp.encode_send(cp.SendRequest("Idem", queue_id, bodies, [properties] * len(bodies), 0, 0, producer_id, first))
    return cp.decode_send_response(request(sock, cp.SEND_IDEMPOTENT, payload))


def test_send_idempotent_on_the_wire(cluster):
    master = cluster.start_master(role="async")
    sock = raw_connect(master.address)
    preface(sock)
    stored = send_idempotent_raw(sock, "p1", 0, [b"a", b"b"], properties=b"TAGS\x01t\x02")
    assert (stored.status, stored.queue_id, len(stored.offsets)) == ("PUT_OK", 2, 2)
    state, _, _, record = cp.decode_read_response(request(sock, cp.READ, struct.pack(">qI", stored.offsets[1], 4096)))
    assert state == "OK" and b"TAGS\x01t\x02HASVC_PRODUCER_ID\x01p1\x02HASVC_PRODUCER_SEQ\x011\x02" in record
    retry = send_idempotent_raw(sock, "p1", 0, [b"other", b"bodies"], queue_id=3)  # not compared: a retry
    assert (retry.status, retry.queue_id, retry.offsets, retry.queue_offsets) == ("PUT_OK", 2, stored.offsets, stored.queue_offsets)
    partial = send_idempotent_raw(sock, "p1", 1, [b"b", b"c"])
    assert (partial.status, partial.queue_id, partial.offsets) == ("MESSAGE_ILLEGAL", -1, [])
    assert "overlap an earlier send only in part" in partial.reason
    assert send_idempotent_raw(sock, "p1", 5000, [b"far"]).status == "PUT_OK"  # a gap is allowed
    old = send_idempotent_raw(sock, "p1", 900, [b"old"])  # 900 < 5000 - 4096 + 1
    assert (old.status, old.queue_id) == ("MESSAGE_ILLEGAL", -1) and "cannot tell a retry from a new message" in old.reason
    assert status(master)["duplicate_sends"] == 1
    sock.close()


def test_a_slave_whose_log_ends_below_the_masters_oldest_byte_is_refused_and_an_empty_one_starts_there(cluster):
    from commitlog.config import StoreConfig
    from commitlog.store import MessageStore
    from commitlog import record as rec

    with MessageStore.open(cluster.store("master"), StoreConfig(commitlog_segment_size=SEGMENT)) as store:
        for i in range(40):
            store.append_batch(rec.MessageBatch("T", [b"%d" % i + b"x" * 100_000], queue_id=0))
    segments = sorted(os.listdir(os.path.join(cluster.store("master"), "commitlog")))
    assert len(segments) >= 3
    os.remove(os.path.join(cluster.store("master"), "commitlog", segments[0]))  # as retention would
    master = cluster.start_master(role="async")
    oldest = status(master)["min_offset"]
    assert oldest == SEGMENT
    sock = raw_connect(master.ha_address)
    preface(sock)
    sock.sendall(ha.encode_slave_hello(ha.SlaveHello("behind", "127.0.0.1:1", 1000)))
    answer = read_master_hello(sock)
    assert (answer.status, answer.min_offset) == (ha.STATUS_REFUSED, SEGMENT)
    assert answer.reason == f"the slave's log ends at 1000 but the master's oldest retained offset is {SEGMENT}: clear the slave's store to resynchronise"
    sock.close()
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: status(slave)["max_offset"] == status(master)["max_offset"], message="the empty slave caught up")
    assert status(slave)["min_offset"] == SEGMENT
