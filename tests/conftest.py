import os

import pytest
from hypothesis import HealthCheck, settings

from commitlog.config import StoreConfig
from tests.sizes import SEGMENT_SIZE

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.register_profile("ci", parent=settings.get_profile("default"), max_examples=60, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Parallel workers (pytest -n): each picks its fixed ports (hasvc.tools.partition.free_port) from
# its own part of the range, and so do the processes its tests start.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ["HASVC_FREE_PORT_SLICE"] = (
        f"{int(os.environ['PYTEST_XDIST_WORKER'][2:])}/{int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))}"
    )


@pytest.fixture
def small_config() -> StoreConfig:
    # Ratios of 1: the tests must not depend on how full the machine's disk is (tests of the disk
    # limits set their own).
    return StoreConfig(commitlog_segment_size=SEGMENT_SIZE, consume_queue_units_per_file=64,
                       disk_max_used_space_ratio=1.0, disk_clean_ratio=1.0)  # fmt: skip
