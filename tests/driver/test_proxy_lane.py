"""The proxy's send lane (hasvc/proxy/lane.py) against a scripted broker on loopback: it answers
with the broker's results when the broker stored the message, and hands the send back (None: the
caller sends through the failover client) whenever it cannot tell -- not the master, a lost
connection, a garbage frame, no answer in time, a preface it cannot pass -- and it reconnects when
the failover client moves on."""

import asyncio
import os

import pytest

pytest.importorskip("grpc")

from hasvc.proxy import lane as lane_module  # noqa: E402
from hasvc.proxy.lane import SendLane  # noqa: E402
from hasvc.protocol import client as cp  # noqa: E402
from hasvc.protocol import wire  # noqa: E402

SECRET = b"lane-test-secret"


class FakeBroker:
    """A client port that runs the preface and answers each SEND_IDEMPOTENT as ``behaviour`` says:
    ("ok"), ("close"), ("garbage"), ("bad payload"), ("silent"); "ok" answers ``status``."""

    def __init__(self, behaviour: str = "ok", *, secret: bytes | None = None, status: str = "PUT_OK"):
        self.behaviour, self.secret, self.status = behaviour, secret, status
        self.requests: list[cp.SendRequest] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        nonce = os.urandom(32)
        writer.write(
            wire.encode_hello(
                port_kind=wire.PORT_KIND_CLIENT, auth_required=self.secret is not None, server_nonce=nonce
            )
        )
        try:
            status, client_nonce = wire.check_auth(
                await reader.readexactly(wire.AUTH.size), secret=self.secret, server_nonce=nonce
            )
        except (asyncio.IncompleteReadError, ConnectionError, wire.ProtocolError):
            writer.close()
            return
        proof = (
            wire.server_proof(self.secret, client_nonce, nonce) if status == wire.AUTH_STATUS_OK else wire.ZERO_PROOF
        )
        writer.write(wire.AUTH_OK.pack(status, proof))
        decoder = cp.FrameDecoder(responses=False)
        try:
            while data := await reader.read(65536):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    request = cp.decode_send(bytes(frame.payload), idempotent=True)
                    self.requests.append(request)
                    if self.behaviour == "close":
                        writer.close()
                        return
                    if self.behaviour == "garbage":
                        writer.write(b"\xff" * 16)
                    elif self.behaviour == "bad payload":  # a well-framed response that is no SEND response
                        writer.write(cp.encode_frame(cp.SEND_IDEMPOTENT | cp.RESPONSE_BIT, frame.request_id, b"\x00\x07PUT"))
                    elif self.behaviour == "ok":
                        offset = 1000 * len(self.requests)
                        payload = cp.encode_send_response_fields(
                            self.status, "", request.queue_id, [offset], [len(self.requests) - 1]
                        )
                        writer.write(cp.encode_frame(cp.SEND_IDEMPOTENT | cp.RESPONSE_BIT, frame.request_id, payload))
        except ConnectionError:
            pass
        writer.close()

    async def stop(self) -> None:
        self.server.close()


class FakeCluster:
    """What the lane reads of the failover client: the master in use and its generation."""

    def __init__(self, address: str):
        self.address, self.generation = address, 1


def request(sequence: int = 0) -> cp.SendRequest:
    return cp.SendRequest("T", 2, [b"body"], [b""], 0, 0, "proxy-producer", sequence)


async def send_when_connected(lane: SendLane, sequence: int = 0, *, tries: int = 200):
    """The first send only starts the connection (and is handed back); send until one goes out."""
    for _ in range(tries):
        if lane._ready() is not None:
            return await lane.send(request(sequence))
        await asyncio.sleep(0.01)
    raise AssertionError("the lane never connected")


def run(scenario):
    async def main():
        return await asyncio.wait_for(scenario(), 20)

    return asyncio.run(main())


def test_a_stored_send_is_answered_with_the_brokers_results():
    async def scenario():
        broker = FakeBroker("ok", secret=SECRET)
        await broker.start()
        lane = SendLane(FakeCluster(broker.address), secret=SECRET, tls_ca=None)
        assert await lane.send(request()) is None  # not connected yet: the failover client sends this one
        results = await send_when_connected(lane, 7)
        assert [(r.status, r.offset, r.queue_id, r.queue_offset) for r in results] == [("PUT_OK", 1000, 2, 0)]
        sent = broker.requests[-1]
        assert (sent.producer_id, sent.first_sequence, sent.topic, sent.bodies) == ("proxy-producer", 7, "T", [b"body"])
        many = await asyncio.gather(*(lane.send(request(i)) for i in range(8, 40)))
        assert sorted(r[0].offset for r in many) == [1000 * n for n in range(2, 34)]
        assert lane.stats["sent"] == 33 and broker.connections == 1
        lane.close()
        await broker.stop()

    run(scenario)


@pytest.mark.parametrize("status", ["FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE", "MESSAGE_ILLEGAL"])
def test_a_brokers_refusal_that_is_not_a_failover_is_the_answer(status):
    async def scenario():
        broker = FakeBroker("ok", status=status)
        await broker.start()
        lane = SendLane(FakeCluster(broker.address), secret=None, tls_ca=None)
        results = await send_when_connected(lane)
        assert results[0].status == status
        lane.close()
        await broker.stop()

    run(scenario)


def test_not_the_master_hands_the_send_back():
    async def scenario():
        broker = FakeBroker("ok", status="SERVICE_NOT_AVAILABLE")
        await broker.start()
        lane = SendLane(FakeCluster(broker.address), secret=None, tls_ca=None)
        assert await send_when_connected(lane) is None
        assert len(broker.requests) == 1
        lane.close()
        await broker.stop()

    run(scenario)


@pytest.mark.parametrize("behaviour", ["close", "garbage", "bad payload"])
def test_a_lost_connection_or_a_garbage_frame_hands_every_send_back_and_a_new_master_is_connected(behaviour):
    async def scenario():
        broken = FakeBroker(behaviour)
        await broken.start()
        cluster = FakeCluster(broken.address)
        lane = SendLane(cluster, secret=None, tls_ca=None)
        assert await send_when_connected(lane) is None
        assert lane._ready() is None and lane._connecting is None  # the same master waits out the pause
        assert lane.stats["breaks"] == 1 and broken.connections == 1
        good = FakeBroker("ok")
        await good.start()
        cluster.address, cluster.generation = good.address, 2  # the failover client found a new master
        results = await send_when_connected(lane, 1)
        assert results[0].status == "PUT_OK" and good.connections == 1
        lane.close()
        await broken.stop()
        await good.stop()

    run(scenario)


def test_no_answer_in_time_hands_the_send_back(monkeypatch):
    monkeypatch.setattr(lane_module, "REQUEST_TIMEOUT_SECONDS", 0.2)
    monkeypatch.setattr(lane_module, "TIMEOUT_CHECK_SECONDS", 0.05)

    async def scenario():
        broker = FakeBroker("silent")
        await broker.start()
        lane = SendLane(FakeCluster(broker.address), secret=None, tls_ca=None)
        assert await send_when_connected(lane) is None
        assert lane.stats["breaks"] == 1 and len(broker.requests) == 1
        lane.close()
        await broker.stop()

    run(scenario)


@pytest.mark.parametrize("ours, theirs", [(b"wrong", SECRET), (None, SECRET), (SECRET, None)])
def test_a_preface_the_lane_cannot_pass_leaves_sends_to_the_failover_client(ours, theirs):
    async def scenario():
        broker = FakeBroker("ok", secret=theirs)
        await broker.start()
        lane = SendLane(FakeCluster(broker.address), secret=ours, tls_ca=None)
        for _ in range(20):
            assert await lane.send(request()) is None
            await asyncio.sleep(0.01)
        assert broker.requests == [] and lane.stats["connects"] == 0
        assert broker.connections == 1  # a failed connect waits RECONNECT_PAUSE_SECONDS before the next
        lane.close()
        await broker.stop()

    run(scenario)


def test_without_a_master_yet_nothing_is_tried():
    async def scenario():
        cluster = FakeCluster("")
        cluster.address = None
        lane = SendLane(cluster, secret=None, tls_ca=None)
        assert await lane.send(request()) is None
        assert lane._connecting is None
        lane.close()

    run(scenario)
