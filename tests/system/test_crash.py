"""Crash tests: a writer process killed with SIGKILL, then the store reopened."""

import pytest

from hasvc.tools.store_demo import run_crash_round
from tests.sizes import SEGMENT_SIZE


@pytest.mark.parametrize(
    ("batch", "pool", "producers"),
    [(1, False, 4), (8, False, 2), (4, True, 2)],
    ids=["single", "batched", "transient-pool"],
)
def test_every_acknowledged_sync_flush_record_survives_sigkill(tmp_path, batch, pool, producers):
    report = run_crash_round(
        str(tmp_path), seconds=1.5, segment_size=SEGMENT_SIZE, flush="sync", producers=producers, batch=batch,
        body_size=700, pool=pool,
    )  # fmt: skip
    assert report.acked > 0
    assert report.abnormal
    assert report.missing == []
    # and a second crash on the recovered store
    again = run_crash_round(str(tmp_path), seconds=1.0, segment_size=SEGMENT_SIZE, flush="sync", body_size=700)
    assert again.missing == [] and again.acked > 0
