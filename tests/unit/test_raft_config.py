"""RaftConfig: DLedger's defaults, the etcd-like preset, and validate() naming what is wrong."""

import dataclasses
import random

import pytest

from hasvc.state.raft import DLEDGER_DEFAULTS, ETCD_LIKE, RaftConfig, RaftNode
from hasvc.testing.log import SimLog


def test_defaults_are_dledgers():
    config = DLEDGER_DEFAULTS
    assert config.heartbeat_interval_seconds == 2.0
    assert (config.election_timeout_min_seconds, config.election_timeout_max_seconds) == (6.3, 7.0)
    assert config.pending_max == 10_000 and config.quorum_ack_timeout_seconds == 2.5
    assert config.push_batch_size_max == 1024 * 1024 and config.push_in_flight_max == 1000  # 4 KiB in DLedger: see config.py
    assert config.push_timeout_seconds == 1.0 and config.leadership_transfer_wait_index_max == 1000
    assert config.flush_sync is False and config.pre_vote and config.check_quorum


def test_etcd_like_preset():
    assert (ETCD_LIKE.heartbeat_interval_seconds, ETCD_LIKE.election_timeout_min_seconds) == (0.1, 1.0)
    ETCD_LIKE.validate()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"heartbeat_interval_seconds": 0}, "heartbeat_interval_seconds=0: must be >0"),
        ({"pending_max": 0}, "pending_max=0: must be >0"),
        ({"push_batch_size_max": -1}, "push_batch_size_max=-1: must be >0"),
        ({"election_timeout_max_seconds": 1.0}, "election_timeout_max_seconds=1.0: must not be below election_timeout_min_seconds=6.3"),
        ({"heartbeat_interval_seconds": 7.0}, "heartbeat_interval_seconds=7.0: must be below election_timeout_min_seconds=6.3"),
        ({"leadership_transfer_wait_index_max": -1}, "leadership_transfer_wait_index_max"),
    ],
)
def test_validate_names_the_setting(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(RaftConfig(), **change).validate()


def test_a_node_refuses_a_bad_membership():
    with pytest.raises(ValueError, match="not among the members"):
        RaftNode(self_id="n3", members=("n0", "n1"), log=SimLog(), config=RaftConfig(), rng=random.Random(0), now=0)
    with pytest.raises(ValueError, match="repeat"):
        RaftNode(self_id="n0", members=("n0", "n0"), log=SimLog(), config=RaftConfig(), rng=random.Random(0), now=0)
