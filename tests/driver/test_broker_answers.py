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

        def gone(offset, size):
            raise ReadError(f"offset {offset} outside the log [4096, 4096)")

        monkeypatch.setattr(broker.store, "read", gone)
        reader = cp.Reader(broker.client_port.answer(pull))
        assert (reader.text(), reader.text()) == ("ERROR", "read failed: offset 0 outside the log [4096, 4096)")
        reader.done()
    finally:
        broker.store.close()
