"""Fixtures of the system tests (real processes): ``cluster``, a harness stopped after the test."""

import pytest

from tests.cluster import SEGMENT, Cluster


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, segment_size=SEGMENT)
    yield c
    c.close()
