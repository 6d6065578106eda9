"""System tests: real master and slave processes on loopback, talking TCP."""

import os
import socket
import struct

import pytest
import trio

from commitlog.pagecache import resident_pages
from hasvc import client as hc
from hasvc.protocol import ha, wire
from tests.cluster import (
    SEGMENT,
    Cluster,
    caught_up,
    consume_queue_files,
    log_digest,
    send_many,
    slave_acking,
    status,
    wait_until,
)


def test_10000_sync_master_sends_give_byte_identical_logs_and_queues(cluster):
    master = cluster.start_master(role="sync")
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: status(slave)["master_connected"], message="slave connected")
    wait_until(lambda: slave_acking(master), message="slave acking")
    results = trio.run(send_many, master.address, 10_000)
    assert {r.status for r in results.values()} == {"PUT_OK"}
    wait_until(lambda: caught_up(master, slave), message="slave caught up and dispatched")
    m, s = status(master), status(slave)
    assert m["max_offset"] > 3 * SEGMENT  # several segments, rolled on both sides
    assert log_digest(cluster.store("master"), 0, m["max_offset"]) == log_digest(cluster.store("slave"), 0, s["max_offset"])
    wait_until(lambda: status(master)["dispatched_offset"] == m["max_offset"], message="master dispatched")
    assert consume_queue_files(cluster.store("master")) == consume_queue_files(cluster.store("slave"))
    with hc.BlockingClient(slave.address) as client:
        pulled = client.pull("Sys", 2, 100, count_max=5)
        assert [r.queue_offset for r in pulled.records] == [100, 101, 102, 103, 104]
        record = client.read_record(results[2].offset)
        assert bytes(record.body).startswith(b"m2:") and record.tags == "t2"
    assert master.stop() == 0 and slave.stop() == 0
    assert not os.path.exists(os.path.join(cluster.store("master"), "abort"))
    assert not os.path.exists(os.path.join(cluster.store("slave"), "abort"))


def test_slave_loss_then_restart_catches_up_from_its_offset(cluster):
    master = cluster.start_master(role="sync", slave_timeout_ms=1000)
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    first = trio.run(send_many, master.address, 200, 8)
    assert {r.status for r in first.values()} == {"PUT_OK"}
    slave.kill()
    after = trio.run(send_many, master.address, 20, 4)
    assert {r.status for r in after.values()} <= {"SLAVE_NOT_AVAILABLE", "FLUSH_SLAVE_TIMEOUT"}
    assert all(r.offset >= 0 for r in after.values())  # stored on the master all the same
    with hc.BlockingClient(master.address) as client:
        assert client.read_record(after[0].offset).queue_offset == after[0].queue_offset
    restarted = cluster.start_slave(master.ha_address, name="slave")
    wait_until(lambda: caught_up(master, restarted), message="restarted slave caught up")
    assert "from offset 0" not in master.log().split("transferring")[-1]  # resumed from its own offset
    end = status(master)["max_offset"]
    assert log_digest(cluster.store("master"), 0, end) == log_digest(cluster.store("slave"), 0, end)
    again = trio.run(send_many, master.address, 10, 2)
    assert {r.status for r in again.values()} == {"PUT_OK"}


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "pwrite"])
def test_a_new_slave_catches_up_in_large_frames_byte_for_byte(cluster, splice):
    """Catch-up frames are up to 2 MiB (``ha_transfer_batch_size``): on plain TCP they go
    socket -> pipe -> log by splice, with ``HASVC_NO_SPLICE=1`` through the frame buffer."""
    master = cluster.start_master(role="async")
    results = trio.run(send_many, master.address, 6000, 16)
    assert {r.status for r in results.values()} == {"PUT_OK"}
    assert status(master)["max_offset"] > 2 * SEGMENT
    slave = cluster.start_slave(master.ha_address, env=None if splice else {"HASVC_NO_SPLICE": "1"})
    wait_until(lambda: caught_up(master, slave), message="new slave caught up and dispatched")
    assert ("or more by splice" in slave.log()) is splice
    end = status(master)["max_offset"]
    assert log_digest(cluster.store("master"), 0, end) == log_digest(cluster.store("slave"), 0, end)
    wait_until(lambda: status(master)["dispatched_offset"] == end, message="master dispatched")
    assert consume_queue_files(cluster.store("master")) == consume_queue_files(cluster.store("slave"))
    assert master.stop() == 0 and slave.stop() == 0


def test_a_slave_whose_master_is_unreachable_keeps_retrying(cluster, tmp_path):
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))
    port = unused.getsockname()[1]
    unused.close()
    slave = cluster.start_slave(f"127.0.0.1:{port}", ha_reconnect_backoff_max_ms=200)
    state = status(slave)
    assert state["role"] == "SLAVE" and state["master_connected"] is False
    assert state["master_ha"] == f"127.0.0.1:{port}"
    with hc.BlockingClient(slave.address) as client:
        result = client.send("T", b"x")
    assert result.status == "SERVICE_NOT_AVAILABLE" and f"127.0.0.1:{port}" in result.reason
    assert slave.log().count("replication disconnected") == 1  # one line, not one per retry
    assert slave.alive


def test_min_in_sync_replicas_refuses_writes_without_storing_them(cluster):
    master = cluster.start_master(role="sync", min_in_sync_replicas=1)
    with hc.BlockingClient(master.address) as client:
        result = client.send("T", b"unreplicated")
        assert result.status == "IN_SYNC_REPLICAS_NOT_ENOUGH" and result.offset == -1
        assert client.status()["max_offset"] == 0


def test_async_master_does_not_wait_and_the_slave_still_converges(cluster):
    master = cluster.start_master(role="async")
    results = trio.run(send_many, master.address, 300, 8)
    assert {r.status for r in results.values()} == {"PUT_OK"}
    slave = cluster.start_slave(master.ha_address)
    wait_until(lambda: caught_up(master, slave), message="slave caught up")


def test_two_slaves_and_in_sync_replicas_two(cluster):
    master = cluster.start_master(role="sync", in_sync_replicas=2, slave_timeout_ms=1500)
    one = cluster.start_slave(master.ha_address, name="one")
    wait_until(lambda: len(status(master)["slaves"]) == 1, message="one slave")
    lonely = trio.run(send_many, master.address, 4, 2)
    assert {r.status for r in lonely.values()} == {"SLAVE_NOT_AVAILABLE"}
    two = cluster.start_slave(master.ha_address, name="two")
    wait_until(lambda: caught_up(master, two) and caught_up(master, one), message="both caught up")
    both = trio.run(send_many, master.address, 100, 8)
    assert {r.status for r in both.values()} == {"PUT_OK"}
    end = status(master)["max_offset"]
    assert log_digest(cluster.store("one"), 0, end) == log_digest(cluster.store("two"), 0, end)


def test_an_empty_slave_gets_the_whole_log_or_only_the_last_segment_if_asked(cluster):
    master = cluster.start_master(role="async")
    trio.run(send_many, master.address, 8000, 16)
    end = status(master)["max_offset"]
    assert end > 2 * SEGMENT
    full = cluster.start_slave(master.ha_address, name="full")
    wait_until(lambda: caught_up(master, full), message="full slave caught up")
    assert status(full)["min_offset"] == 0
    last = cluster.start_slave(master.ha_address, name="last", sync_from_last_file="true")
    wait_until(lambda: status(last)["max_offset"] == end, message="last-file slave caught up")
    assert status(last)["min_offset"] == end - end % SEGMENT


def test_flush_before_ack_makes_the_slave_flush_what_it_acknowledges(cluster):
    master = cluster.start_master(role="sync")
    slave = cluster.start_slave(master.ha_address, flush_before_ack="true")
    wait_until(lambda: slave_acking(master), message="slave acking")
    results = trio.run(send_many, master.address, 50, 4)
    assert {r.status for r in results.values()} == {"PUT_OK"}
    assert status(slave)["flushed_offset"] >= max(r.offset for r in results.values())


def test_sync_flush_and_sync_master_combine(cluster):
    master = cluster.start_master(role="sync", flush="sync")
    cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    results = trio.run(send_many, master.address, 100, 8)
    assert {r.status for r in results.values()} == {"PUT_OK"}
    assert status(master)["flushed_offset"] >= max(r.offset for r in results.values())


# -- bad input on either port: the broker keeps serving everyone else --------------------------


def raw_connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def preface(sock: socket.socket, secret=None) -> None:
    hello = sock.recv(wire.HELLO.size, socket.MSG_WAITALL)
    _, _, _, nonce = wire.decode_hello(hello)
    sock.sendall(wire.encode_auth(secret=secret, server_nonce=nonce, client_nonce=wire.new_nonce()))
    status_, _ = wire.AUTH_OK.unpack(sock.recv(wire.AUTH_OK.size, socket.MSG_WAITALL))
    assert status_ == wire.AUTH_STATUS_OK


def closed_by_peer(sock: socket.socket) -> bool:
    """True when the broker closes the connection (within the socket's 10 s timeout)."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\n\r\n", os.urandom(3000), b""], ids=["http", "random", "nothing"])
def test_garbage_on_both_ports_closes_only_that_connection(cluster, garbage):
    master = cluster.start_master(role="async", ha_housekeeping_interval_ms=2000)
    for address in (master.address, master.ha_address):
        sock = raw_connect(address)
        sock.recv(wire.HELLO.size, socket.MSG_WAITALL)
        sock.sendall(garbage)
        sock.shutdown(socket.SHUT_WR)
        assert closed_by_peer(sock)
        sock.close()
    with hc.BlockingClient(master.address) as client:
        assert client.send("T", b"still serving").ok


def test_oversize_and_unknown_client_frames_close_the_connection(cluster):
    master = cluster.start_master(role="async")
    for frame in (struct.pack(">IBI", 17 * 1024 * 1024, 1, 1), struct.pack(">IBI", 5, 99, 1)):
        sock = raw_connect(master.address)
        preface(sock)
        sock.sendall(frame)
        assert closed_by_peer(sock)
        sock.close()
    assert "unknown frame kind 99" in master.log() and "outside 5..16777216" in master.log()
    with hc.BlockingClient(master.address) as client:
        assert client.send("T", b"ok").ok


def test_a_slave_reporting_beyond_the_master_is_dropped_and_releases_nothing(cluster):
    master = cluster.start_master(role="sync", slave_timeout_ms=1500)
    sock = raw_connect(master.ha_address)
    preface(sock)
    sock.sendall(ha.encode_slave_hello(ha.SlaveHello("rogue", "127.0.0.1:1", 0)))
    length = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))[0]
    assert ha.decode_master_hello(sock.recv(length, socket.MSG_WAITALL)).status == ha.STATUS_OK
    sock.sendall(ha.REPORT.pack(0))
    wait_until(lambda: status(master)["slaves"], message="rogue registered")

    async def put_while_rogue_acks():
        async with hc.connect(master.address) as client:
            async with trio.open_nursery() as nursery:
                results = []

                async def put():
                    results.append(await client.send("T", b"must not be acked by a rogue"))

                nursery.start_soon(put)
                await trio.sleep(0.3)
                sock.sendall(ha.REPORT.pack(2**62))  # (#3015) an offset the master does not have
            return results[0]

    result = trio.run(put_while_rogue_acks)
    assert result.status in ("FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE")
    assert closed_by_peer(sock)
    assert "beyond the master's end" in master.log()
    sock.close()


def test_a_slave_acknowledging_backwards_is_dropped(cluster):
    master = cluster.start_master(role="async")
    with hc.BlockingClient(master.address) as client:
        end = client.send("T", b"x" * 100).offset + 100
    sock = raw_connect(master.ha_address)
    preface(sock)
    sock.sendall(ha.encode_slave_hello(ha.SlaveHello("confused", "127.0.0.1:1", 0)))
    length = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))[0]
    sock.recv(length, socket.MSG_WAITALL)
    sock.sendall(ha.REPORT.pack(0) + ha.REPORT.pack(end) + ha.REPORT.pack(10))
    assert closed_by_peer(sock)
    assert "went back" in master.log()


# -- security -----------------------------------------------------------------------------------


def test_wrong_or_missing_secret_is_refused_and_no_log_byte_is_sent(tmp_path):
    cluster = Cluster(tmp_path, segment_size=SEGMENT, secret=b"correct horse")
    try:
        master = cluster.start_master(role="async")
        with hc.BlockingClient(master.address, b"correct horse") as client:
            assert client.send("T", b"secret data").ok
        for secret in (None, b"wrong"):
            with pytest.raises(hc.ClientError, match="refused|requires a secret"):
                hc.BlockingClient(master.address, secret)
        sock = raw_connect(master.ha_address)
        hello = sock.recv(wire.HELLO.size, socket.MSG_WAITALL)
        _, _, auth_required, nonce = wire.decode_hello(hello)
        assert auth_required
        sock.sendall(wire.encode_auth(secret=b"wrong", server_nonce=nonce, client_nonce=wire.new_nonce()))
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest[:1] == bytes([wire.AUTH_STATUS_BAD_PROOF]) and len(rest) == wire.AUTH_OK.size
        assert b"secret data" not in rest
        bad_slave_dir = os.path.join(cluster.root, "bad-secret")
        with open(bad_slave_dir, "wb") as file:
            file.write(b"wrong")
        import sys

        from tests.cluster import BrokerProcess

        slave = BrokerProcess("badslave", [sys.executable, "-m", "hasvc.cli", "slave", "--store", cluster.store("badslave"),
                                           "--listen", "127.0.0.1:0", "--master-ha", master.ha_address,
                                           "--secret-file", bad_slave_dir, "--set", f"commitlog_segment_size={SEGMENT}"],
                              os.path.join(cluster.root, "badslave.log"))  # fmt: skip
        cluster.brokers.append(slave)
        wait_until(lambda: "replication refused" in slave.log(), message="slave refused")
        assert status(slave, b"wrong")["max_offset"] == 0
        assert "authentication failed" in master.log()
    finally:
        cluster.close()


def test_non_loopback_listen_without_secret_refuses_to_start(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hasvc.cli", "master", "--store", str(tmp_path / "s"), "--listen", "0.0.0.0:0",
                           "--ha-listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "without a secret" in done.stderr


def test_effective_configuration_from_toml_is_printed(tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nrole = "sync"\nslave_timeout_ms = 1234\ncommitlog_segment_size = 1048576\n')
    cluster = Cluster(tmp_path)
    try:
        import sys

        from tests.cluster import BrokerProcess

        master = BrokerProcess("m", [sys.executable, "-m", "hasvc.cli", "master", "--store", str(tmp_path / "m"),
                                     "--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:0", "--config", str(config)],
                               str(tmp_path / "m.log"))  # fmt: skip
        cluster.brokers.append(master)
        assert master.ready["role"] == "SYNC_MASTER"
        assert '"slave_timeout_ms": 1234' in master.log()
    finally:
        cluster.close()


def test_metrics_endpoint(cluster):
    import urllib.request

    port_socket = socket.socket()
    port_socket.bind(("127.0.0.1", 0))
    port = port_socket.getsockname()[1]
    port_socket.close()
    master = cluster.start_master(role="async", metrics_listen=f"127.0.0.1:{port}")
    with hc.BlockingClient(master.address) as client:
        client.send("T", b"counted")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "hasvc_appended_messages_total 1.0" in text
    assert "hasvc_max_offset" in text and 'hasvc_put_latency_seconds_count{status="PUT_OK"} 1.0' in text


def test_sends_from_many_connections_appended_together_keep_each_connections_order(cluster):
    """Several connections pipelining SENDs to one queue at once: the broker groups what they
    all sent into shared batches, and each connection's messages still land in its order."""
    from hasvc.protocol import client as cp

    master = cluster.start_master(role="sync")
    cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    sockets = [raw_connect(master.address) for _ in range(8)]
    for sock in sockets:
        preface(sock)
    for index, sock in enumerate(sockets):  # each connection's 40 SENDs in one write
        sock.sendall(b"".join(cp.encode_frame(cp.SEND, n, cp.encode_send(cp.SendRequest("Q", 0, [f"c{index}:{n}".encode()], [b""], 0, 0)))
                              for n in range(40)))  # fmt: skip
    offsets = {}
    for index, sock in enumerate(sockets):
        decoder, responses = cp.FrameDecoder(responses=True), {}
        while len(responses) < 40:
            decoder.receive_data(sock.recv(65536))
            while (frame := decoder.next_frame()) is not None:
                responses[frame.request_id] = cp.decode_send_response(frame.payload)
        sock.close()
        assert {r.status for r in responses.values()} == {"PUT_OK"}
        offsets[index] = [responses[n].queue_offsets[0] for n in range(40)]
        assert offsets[index] == sorted(offsets[index])  # in the order they were sent
    assert sorted(q for each in offsets.values() for q in each) == list(range(320))
    # An answer means stored and replicated; consume queue units follow from the dispatcher.
    wait_until(lambda: status(master)["dispatched_offset"] >= status(master)["max_offset"], message="queues built")
    with hc.BlockingClient(master.address) as client:
        bodies = [bytes(record.body).decode() for record in client.pull("Q", 0, 0, count_max=320).records]
    for index in range(8):
        assert [b for b in bodies if b.startswith(f"c{index}:")] == [f"c{index}:{n}" for n in range(40)]


@pytest.mark.parametrize("connections", [1, 2])
def test_more_sends_in_one_read_than_requests_in_flight_max_are_all_answered(cluster, connections):
    """A read holding more SENDs than the connection may have in flight: the broker must put the
    ones it has before it waits for room, or the room (freed by their responses) never comes."""
    from hasvc.protocol import client as cp

    master = cluster.start_master(role="sync", requests_in_flight_max=4)
    cluster.start_slave(master.ha_address)
    wait_until(lambda: slave_acking(master), message="slave acking")
    sockets = [raw_connect(master.address) for _ in range(connections)]
    for sock in sockets:
        preface(sock)
        sock.sendall(b"".join(cp.encode_frame(cp.SEND, n, cp.encode_send(cp.SendRequest("F", 0, [b"x"], [b""], 0, 0)))
                              for n in range(30)))  # fmt: skip
    for sock in sockets:
        decoder, responses = cp.FrameDecoder(responses=True), {}
        while len(responses) < 30:
            data = sock.recv(65536)  # the socket's 10 s timeout ends a stuck broker's test
            assert data, "the broker closed the connection"
            decoder.receive_data(data)
            while (frame := decoder.next_frame()) is not None:
                responses[frame.request_id] = cp.decode_send_response(frame.payload)
        sock.close()
        assert {r.status for r in responses.values()} == {"PUT_OK"}


def test_more_status_requests_in_one_read_than_requests_in_flight_max_are_all_answered(cluster):
    """Answers other than SENDs must be sent before a connection waits for room (they are what
    frees it); before, thirty STATUS requests in one read with four places waited forever."""
    from hasvc.protocol import client as cp

    master = cluster.start_master(role="sync", requests_in_flight_max=4)
    sock = raw_connect(master.address)
    preface(sock)
    sock.sendall(b"".join(cp.encode_frame(cp.STATUS, n, b"") for n in range(30)))
    decoder, answered = cp.FrameDecoder(responses=True), set()
    while len(answered) < 30:
        data = sock.recv(65536)  # the socket's 10 s timeout ends a stuck broker's test
        assert data, "the broker closed the connection"
        decoder.receive_data(data)
        while (frame := decoder.next_frame()) is not None:
            answered.add(frame.request_id)
    sock.close()
    assert answered == set(range(30))


def test_a_bad_send_coalesced_with_good_ones_fails_alone(cluster):
    from hasvc.protocol import client as cp

    master = cluster.start_master(role="async")
    sock = raw_connect(master.address)
    preface(sock)
    good = cp.SendRequest("T", 0, [b"good"], [b""], 0, 0)
    bad = cp.SendRequest("T", 0, [b"bad"], [b"K\x01" + b"v" * 40000 + b"\x02"], 0, 0)
    frames = b"".join(cp.encode_frame(cp.SEND, request_id, cp.encode_send(request))
                      for request_id, request in ((1, good), (2, bad), (3, good)))  # fmt: skip
    sock.sendall(frames)  # one write: the broker reads them together and coalesces them
    decoder = cp.FrameDecoder(responses=True)
    responses = {}
    while len(responses) < 3:
        decoder.receive_data(sock.recv(65536))
        while (frame := decoder.next_frame()) is not None:
            responses[frame.request_id] = cp.decode_send_response(frame.payload)
    sock.close()
    assert [responses[i].status for i in (1, 2, 3)] == ["PUT_OK", "PROPERTIES_SIZE_EXCEEDED", "PUT_OK"]
    assert responses[1].queue_offsets == [0] and responses[3].queue_offsets == [1]


def test_consumers_read_log_the_master_dropped_from_the_page_cache(cluster):
    """A master that keeps only the last 64 KiB of its log cached (``page_cache_keep_size``):
    PULLs and READs of the start of the log, faulted back in from the disk, get the bytes that
    were written."""
    master = cluster.start_master(role="async", page_cache_keep_size=64 * 1024)
    bodies = [bytes([i % 251]) * 1000 for i in range(8192)]
    with hc.BlockingClient(master.address) as client:
        for start in range(0, len(bodies), 256):
            client.send_batch("T", bodies[start : start + 256])
        segment = os.path.join(cluster.store("master"), "commitlog", "0" * 20)
        wait_until(lambda: not any(resident_pages(segment)[:256]), message="the master to drop the log's first pages")
        pulled = client.pull("T", 0, 0, count_max=64)
        assert [bytes(record.body) for record in pulled.records] == bodies[:64]
        with open(segment, "rb") as file:
            assert client.read(0, size_max=4096) == file.read(4096)


def test_a_busy_polling_pair_acknowledges_sync_puts_and_says_it_polls(cluster):
    """``busy_poll_us``: both brokers' loops poll before sleeping (hasvc/busy_poll.py); puts are
    stored and acknowledged as without it, and the logs say the setting took effect."""
    master = cluster.start_master(role="sync", busy_poll_us=50)
    slave = cluster.start_slave(master.ha_address, busy_poll_us=50)
    wait_until(lambda: slave_acking(master), message="slave acking")
    results = trio.run(send_many, master.address, 500, 1)
    assert {r.status for r in results.values()} == {"PUT_OK"}
    wait_until(lambda: caught_up(master, slave), message="slave caught up")
    end = status(master)["max_offset"]
    assert log_digest(cluster.store("master"), 0, end) == log_digest(cluster.store("slave"), 0, end)
    for broker in (master, slave):
        assert "busy polling: 50 us before each sleep" in broker.log()
    assert master.stop() == 0 and slave.stop() == 0
