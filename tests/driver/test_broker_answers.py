"""A broker answers a read request that meets a store error with ERROR on that request alone
(before, the ReadError left the connection handler and ended the whole broker)."""

from commitlog import record as rec
from commitlog.commit_log import ReadError
from commitlog.store import MessageStore
from hasvc.broker import Broker
from hasvc.config import BrokerConfig, BrokerRole
from hasvc.protocol import client as cp


def test_a_pull_whose_record_cannot_be_read_is_answered_error(tmp_path, monkeypatch):
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.ASYNC_MASTER, commitlog_segment_size=64 * 1024)
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    try:
        broker.store.append_batch(rec.MessageBatch("T", [b"one", b"two"], queue_id=0))
        while broker.store.dispatch():
            pass
        pull = cp.Frame(cp.PULL, 1, cp.encode_pull(cp.PullRequest("T", 0, 0, 10)))
        assert len(cp.decode_pull_response(broker.client_port.answer(pull)).records) == 2

        def gone(units, **_):
            raise ReadError(f"offset {units[0][0]} outside the log [4096, 4096)")

        monkeypatch.setattr(broker.store, "read_records", gone)
        reader = cp.Reader(broker.client_port.answer(pull))
        assert (reader.text(), reader.text()) == ("ERROR", "read failed: offset 0 outside the log [4096, 4096)")
        reader.done()
    finally:
        broker.store.close()


def _flip_body_byte(store, offset: int) -> str:
    """One bit of the stored record at ``offset`` flipped in its segment file (the broker's mapping
    shares the page cache, as after a bad disk read); the segment's path."""
    mapped_file = store.commit_log.mapped_file_queue.find_mapped_file_by_offset(offset)
    with open(mapped_file.path, "r+b") as file:
        file.seek(offset - mapped_file.file_from_offset + 120)
        value = file.read(1)[0]
        file.seek(offset - mapped_file.file_from_offset + 120)
        file.write(bytes([value ^ 0x10]))
    return mapped_file.path


def test_a_damaged_record_is_answered_damaged_logged_once_and_kept_for_status(tmp_path, caplog):
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.ASYNC_MASTER, commitlog_segment_size=64 * 1024)
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    try:
        result = broker.store.append_batch(rec.MessageBatch("T", [b"message %d " % i * 20 for i in range(50)], queue_id=0))
        while broker.store.dispatch():
            pass
        offsets = list(result.offsets)
        damaged, size = offsets[20], offsets[21] - offsets[20]
        path = _flip_body_byte(broker.store, damaged)

        def pull(queue_offset):
            frame = cp.Frame(cp.PULL, 1, cp.encode_pull(cp.PullRequest("T", 0, queue_offset, 100)))
            return cp.decode_pull_response(broker.client_port.answer(frame))

        def read(offset):
            return cp.decode_read_response(broker.client_port.answer(cp.Frame(cp.READ, 2, cp.encode_read(offset, 1 << 20))))

        with caplog.at_level("ERROR", logger="hasvc.broker.client_port"):
            first = pull(0)
            assert (first.status, first.next_queue_offset, len(first.records)) == (cp.OK, 20, 20)  # up to the damage
            refused = pull(20)
            assert refused.status == cp.DAMAGED and refused.records == [] and refused.next_queue_offset == 20
            assert f"record at offset {damaged} is damaged (body CRC mismatch" in refused.reason and path in refused.reason
            status, reason, _, data = read(damaged)
            assert (status, data) == (cp.DAMAGED, b"") and f"offset {damaged}" in reason
            status, _, _, data = read(offsets[0])
            assert status == cp.OK and len(data) == damaged - offsets[0]  # the bytes before it
            assert pull(21).status == cp.OK  # what follows it is served
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1, [r.getMessage() for r in errors]  # found by four requests, logged once
        assert f"{path} bytes [{damaged}, {damaged + size}): body CRC mismatch" in errors[0].getMessage()
        assert [d.to_json() for d in broker.store.damaged] == [{"file": path, "from": damaged, "to": damaged + size, "reason": "body CRC mismatch"}]
    finally:
        broker.store.close()


def test_with_check_crc_on_read_off_a_damaged_record_is_served(tmp_path):
    """The setting the benchmark turns off: then nothing is checked (and the client library's own
    check is what catches it)."""
    config = BrokerConfig(store=str(tmp_path), role=BrokerRole.ASYNC_MASTER, commitlog_segment_size=64 * 1024,
                          check_crc_on_read=False)  # fmt: skip
    broker = Broker(config)
    broker.attach_store(MessageStore.open(str(tmp_path), config.store_config()))
    try:
        result = broker.store.append_batch(rec.MessageBatch("T", [b"x" * 300] * 3, queue_id=0))
        while broker.store.dispatch():
            pass
        _flip_body_byte(broker.store, result.offsets[1])
        frame = cp.Frame(cp.PULL, 1, cp.encode_pull(cp.PullRequest("T", 0, 0, 100)))
        response = cp.decode_pull_response(broker.client_port.answer(frame))
        assert response.status == cp.OK and len(response.records) == 3
        assert broker.store.damaged == []
    finally:
        broker.store.close()
