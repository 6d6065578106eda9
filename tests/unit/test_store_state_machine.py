"""Random appends of random sizes across tiny segments, reopen, crash, truncate, recover.
The model is the list of records the store acknowledged."""

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from commitlog import record as rec
from commitlog.config import StoreConfig
from commitlog.store import MessageStore

CONFIG = StoreConfig(commitlog_segment_size=8192, consume_queue_units_per_file=8)


class StoreMachine(RuleBasedStateMachine):
    @initialize()
    def open_store(self):
        self.path = tempfile.mkdtemp(prefix="hasvc-sm-")
        self.store = MessageStore.open(self.path, CONFIG)
        self.model: list[tuple[int, bytes, int, int]] = []  # (offset, body, queue id, queue offset)

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    @rule(bodies=st.lists(st.binary(max_size=3000), min_size=1, max_size=4), queue_id=st.integers(0, 2), batch=st.booleans())
    def append(self, bodies, queue_id, batch):
        if batch:
            result = self.store.append_batch(rec.MessageBatch("SM", bodies, queue_id=queue_id))
        else:
            result = self.store.append([rec.Message("SM", body, queue_id=queue_id) for body in bodies])
        if sum(len(b) for b in bodies) + 91 * len(bodies) + 8 > CONFIG.commitlog_segment_size:
            assert result.status is rec.PutMessageStatus.MESSAGE_ILLEGAL
            return
        assert result.status is rec.PutMessageStatus.PUT_OK, result
        for offset, body, queue_offset in zip(result.offsets, bodies, result.queue_offsets):
            self.model.append((offset, body, queue_id, queue_offset))

    @rule()
    def reopen_cleanly(self):
        self.store.close()
        self.store = MessageStore.open(self.path, CONFIG)
        assert not self.store.recovery.abnormal

    @rule()
    def crash_and_recover(self):
        self.store.dispatch()
        self.store.close(clean=False)
        self.store = MessageStore.open(self.path, CONFIG)
        assert self.store.recovery.abnormal
        assert self.store.recovery.corrupt_offset is None

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def truncate(self, data):
        index = data.draw(st.integers(0, len(self.model) - 1))
        self.store.truncate(self.model[index][0])
        del self.model[index:]

    @invariant()
    def log_matches_model(self):
        if not hasattr(self, "store"):
            return
        expected_end = self.model[-1][0] + self.store.get_record(self.model[-1][0]).size if self.model else None
        if expected_end is not None:
            assert self.store.commit_log.max_offset == expected_end
        for offset, body, queue_id, queue_offset in self.model:
            record = self.store.get_record(offset, check_crc=True)
            assert bytes(record.body) == body
            assert (record.queue_id, record.queue_offset) == (queue_id, queue_offset)

    @invariant()
    def consume_queues_match_model(self):
        if not hasattr(self, "store"):
            return
        self.store.dispatch()
        for queue_id in range(3):
            expected = [(o, q) for o, _, qid, q in self.model if qid == queue_id]
            queue = self.store.consume_queues.find("SM", queue_id)
            units = queue.all_units() if queue else []
            assert [u[0] for u in units] == [o for o, _ in expected]


StoreMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestStoreMachine = StoreMachine.TestCase
