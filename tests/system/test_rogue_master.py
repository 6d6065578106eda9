"""A real slave process against a master that breaks the data phase's rules: each bad frame is
refused with a message that names it, nothing of it is stored, and the slave reconnects."""

import socket
import threading

import pytest

from commitlog import record as rec
from commitlog.commit_log import CommitLog
from commitlog.config import StoreConfig
from commitlog.store import MessageStore
from hasvc.protocol import ha, wire
from tests.cluster import Cluster, status, wait_until

SEGMENT = 1024 * 1024


def receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = connection.recv(size - len(data))
        if not piece:
            raise EOFError("the slave closed the connection")
        data += piece
    return data


class RogueMaster:
    """An HA port that runs the preface and the handshake as a master does (log [0, max_offset),
    epoch 1 from 0), waits for the slave's first report, then sends ``data`` as it is."""

    def __init__(self, data: bytes, *, max_offset: int):
        self.data = data
        self.max_offset = max_offset
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sessions = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            with connection:
                try:
                    self._session(connection)
                except (OSError, EOFError):
                    pass

    def _session(self, connection: socket.socket) -> None:
        nonce = wire.new_nonce()
        connection.sendall(wire.encode_hello(port_kind=wire.PORT_KIND_HA, auth_required=False, server_nonce=nonce))
        auth_status, _ = wire.check_auth(receive_exactly(connection, wire.AUTH.size), secret=None, server_nonce=nonce)
        connection.sendall(wire.AUTH_OK.pack(auth_status, wire.ZERO_PROOF))
        (size,) = ha.LENGTH.unpack(receive_exactly(connection, ha.LENGTH.size))
        receive_exactly(connection, size)  # the slave's hello
        connection.sendall(ha.encode_master_hello(ha.MasterHello(ha.STATUS_OK, self.max_offset, 0, SEGMENT, ((1, 0),))))
        receive_exactly(connection, ha.REPORT.size)
        self.sessions += 1
        connection.sendall(self.data)
        while connection.recv(65536):  # until the slave hangs up
            pass

    def close(self) -> None:
        self.listener.close()


def log_bytes(tmp_path, count: int) -> bytes:
    """The first bytes of a real log: ``count`` records a slave can dispatch."""
    log = CommitLog(str(tmp_path / "source"), segment_size=SEGMENT)
    log.load()
    log.append([rec.prepare_message(rec.Message("T", b"r%d" % i)) for i in range(count)])
    data = bytes(log.read(0, log.max_offset))
    log.close()
    return data


def frame(offset: int, body: bytes, size: int | None = None) -> bytes:
    return ha.encode_transfer_header(offset, len(body) if size is None else size) + body


GOOD_SIZE = 3  # records in the valid frame some cases send first


@pytest.mark.parametrize(
    "case",
    ["crosses_segment", "empty_log_mid_segment", "oversize", "not_at_local_end", "large_frame_not_at_local_end"],
)
def test_a_bad_frame_is_refused_by_name_nothing_of_it_is_stored_and_the_slave_reconnects(tmp_path, case):
    good = log_bytes(tmp_path, GOOD_SIZE)
    expected_end = 0
    if case == "crosses_segment":
        data, message = frame(0, b"", size=SEGMENT + 1), f"frame of {SEGMENT + 1} bytes at 0 crosses a segment boundary"
    elif case == "empty_log_mid_segment":
        data, message = frame(100, good), "an empty log can only start at a segment boundary, master sent 100"
    elif case == "oversize":
        size = 4 * 1024 * 1024 + 1  # one past the slave's ha_frame_size_max
        data, message = frame(0, b"", size=size), f"transfer frame of {size} bytes, outside 0..{size - 1} (the slave's ha_frame_size_max"
    else:  # a good frame, then one that skips a byte: refused before its bytes are read (splice or pwrite)
        skipped = b"\0" * (128 * 1024 if case.startswith("large") else 10)
        data = frame(0, good) + frame(len(good) + 1, skipped)
        message = f"master pushed offset {len(good) + 1} but the local log ends at {len(good)}"
        expected_end = len(good)
    rogue = RogueMaster(data, max_offset=len(good) + 200 * 1024)
    cluster = Cluster(tmp_path, segment_size=SEGMENT)
    try:
        slave = cluster.start_slave(rogue.address, ha_reconnect_backoff_max_ms=200)
        wait_until(lambda: rogue.sessions >= 2, message="the slave reconnected after the bad frame")
        assert message in slave.log()
        assert slave.alive
        state = status(slave)
        assert state["max_offset"] == expected_end
        if expected_end:  # the good frame's records were dispatched, the refused frame's bytes never seen
            wait_until(lambda: status(slave)["dispatched_offset"] == expected_end, message="good frame dispatched")
            assert "dispatch_error" not in status(slave)
        assert slave.stop() == 0
    finally:
        cluster.close()
        rogue.close()
    # Reopened (recovery as at a restart): the store holds exactly the good frame's bytes.
    with MessageStore.open(cluster.store("slave"), StoreConfig(commitlog_segment_size=SEGMENT)) as store:
        assert store.commit_log.max_offset == expected_end
        if expected_end:
            assert bytes(store.commit_log.read(0, expected_end)) == good
