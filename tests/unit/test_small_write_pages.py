"""small_write_pages (commitlog/mapped_file.py SMALL_PAGES_MARGIN): which stores get it. A store
that syncs each put (SYNC_FLUSH; a DLedger member with --flush sync) faults single pages ahead of
its writer, so that a sync writes back the few KiB a put wrote, not a read-ahead folio of up to
2 MiB around them; a store that syncs every 10 or 500 ms keeps read-ahead (its warm-up thread
would fault ~512 times more often for nothing)."""

import pytest

from commitlog import record as rec
from commitlog.config import FlushDiskType, StoreConfig
from commitlog.dledger.message_store import DLedgerMessageStore
from commitlog.store import MessageStore
from hasvc.config import BrokerConfig

SEGMENT = 1024 * 1024


@pytest.mark.parametrize(
    ("setting", "flush", "expected"),
    [("auto", FlushDiskType.SYNC_FLUSH, True), ("auto", FlushDiskType.ASYNC_FLUSH, False),
     ("on", FlushDiskType.ASYNC_FLUSH, True), ("off", FlushDiskType.SYNC_FLUSH, False)],
)  # fmt: skip
def test_a_broker_gives_its_store_small_write_pages_when_it_syncs_each_put_unless_told(tmp_path, setting, flush, expected):
    config = BrokerConfig(store=str(tmp_path), flush=flush, small_write_pages=setting).validate()
    assert config.store_config().small_write_pages is expected


def test_small_write_pages_takes_auto_on_or_off(tmp_path):
    with pytest.raises(ValueError, match="small_write_pages='yes': must be one of auto, on, off"):
        BrokerConfig(store=str(tmp_path), small_write_pages="yes").validate()


@pytest.mark.parametrize("small", [True, False])
def test_the_commit_log_segments_follow_the_store_setting(tmp_path, small):
    store = MessageStore.open(str(tmp_path), StoreConfig(commitlog_segment_size=SEGMENT, small_write_pages=small))
    store.append([rec.Message("T", b"x")])
    assert [f.small_pages for f in store.commit_log.mapped_file_queue.mapped_files] == [small]
    store.close()


@pytest.mark.parametrize("small", [True, False])
def test_a_dledger_members_data_files_follow_the_store_setting_and_its_index_files_never_do(tmp_path, small):
    store = DLedgerMessageStore.open(str(tmp_path), StoreConfig(commitlog_segment_size=SEGMENT, small_write_pages=small), self_id="n0")
    assert store.dledger_config.small_write_pages is small
    assert store.entries.data_file_list._small_pages is small
    assert store.entries.index_file_list._small_pages is False  # 32-byte units, synced once a second
    store.close()
