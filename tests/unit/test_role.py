"""A broker's role as one state with effects (hasvc.state.role)."""

import pytest

from hasvc.config import BrokerRole
from hasvc.state.role import (
    ClearProducers,
    FailAckWaits,
    RoleState,
    StartHAService,
    StartReplicating,
    StopHAService,
    StopReplicating,
)

MASTER_HA = ("127.0.0.1", 10912)


def test_a_slave_refuses_writes_naming_its_masters_client_port_and_a_master_takes_them():
    role = RoleState(BrokerRole.SLAVE, MASTER_HA)
    assert "HA address is 127.0.0.1:10912" in role.write_refusal()  # before the MASTER_HELLO: only the HA address
    role.master_client_address = "127.0.0.1:10911"
    assert role.write_refusal() == "this broker is a slave; send to its master at 127.0.0.1:10911"
    assert RoleState(BrokerRole.SYNC_MASTER, None).write_refusal() is None


def test_a_fence_set_by_hand_is_lifted_only_with_its_reason():
    role = RoleState(BrokerRole.SYNC_MASTER, None)
    role.fence("switchover to B")
    assert role.write_refusal() == "this broker is fenced: switchover to B"
    with pytest.raises(ValueError, match="not fenced by 'other'"):
        role.lift_fence("other")
    role.lift_fence("switchover to B")
    assert role.write_refusal() is None
    role.fence("met epoch 9, newer than ours")
    with pytest.raises(ValueError):
        role.lift_fence("switchover to B")


def test_a_masters_configured_master_address_is_not_kept():
    assert RoleState(BrokerRole.ASYNC_MASTER, MASTER_HA).master_ha is None


def test_promotion_opens_an_epoch_above_every_epoch_known_and_serves_slaves_only_at_the_end():
    role = RoleState(BrokerRole.SLAVE, MASTER_HA)
    role.set_master_connected(True)
    role.epoch_seen(12)
    promotion, effects = role.begin_promotion(BrokerRole.SYNC_MASTER, local_epoch=9)
    assert promotion.epoch == 13 and effects == [StopReplicating()]
    assert role.write_refusal() is not None and not role.master_connected  # still refusing while the log is prepared
    assert role.finish_promotion(promotion) == [StartHAService()]
    assert (role.role, role.master_ha, role.write_refusal()) == (BrokerRole.SYNC_MASTER, None, None)


def test_promotion_epoch_follows_the_local_log_when_it_is_newer():
    promotion, _ = RoleState(BrokerRole.SLAVE, MASTER_HA).begin_promotion(BrokerRole.ASYNC_MASTER, local_epoch=20)
    assert promotion.epoch == 21


def test_only_a_slave_is_promoted_and_only_a_master_demoted():
    with pytest.raises(ValueError, match="already SYNC_MASTER"):
        RoleState(BrokerRole.SYNC_MASTER, None).begin_promotion(BrokerRole.SYNC_MASTER, local_epoch=1)
    with pytest.raises(ValueError, match="already a slave"):
        RoleState(BrokerRole.SLAVE, MASTER_HA).demote(MASTER_HA)


def test_demotion_stops_serving_fails_ack_waits_and_replicates_and_unfences():
    role = RoleState(BrokerRole.SYNC_MASTER, None)
    assert role.fence("slave s1 knows epoch 9") is True
    assert role.fence("again") is False  # logged once
    assert role.write_refusal() == "this broker is fenced: again"
    effects = role.demote(MASTER_HA)
    assert effects == [ClearProducers(), StopHAService(), FailAckWaits(), StartReplicating(MASTER_HA)]
    assert (role.role, role.master_ha, role.fenced_by) == (BrokerRole.SLAVE, MASTER_HA, None)


def test_the_peer_epoch_never_goes_back_and_a_master_is_never_connected_to_a_master():
    role = RoleState(BrokerRole.ASYNC_MASTER, None)
    role.epoch_seen(5)
    role.epoch_seen(3)
    assert role.peer_epoch == 5 and role.highest_epoch(4) == 5 and role.highest_epoch(8) == 8
    with pytest.raises(AssertionError):
        role.set_master_connected(True)
    with pytest.raises(AssertionError):
        RoleState(BrokerRole.SLAVE, MASTER_HA).fence("a slave takes no writes")


# -- controller mode ------------------------------------------------------------------------

OTHER_HA = ("127.0.0.1", 10922)


def test_a_controlled_broker_starts_as_a_slave_of_nobody_and_follows_the_named_master():
    role = RoleState(BrokerRole.SLAVE, None)
    assert "no master named yet" in role.write_refusal()
    assert role.follow(MASTER_HA) == [StopReplicating(), StartReplicating(MASTER_HA)]
    assert role.master_ha == MASTER_HA
    assert role.follow(MASTER_HA) == []  # already its slave
    role.set_master_connected(True)
    role.master_client_address = "127.0.0.1:10911"
    assert role.follow(OTHER_HA) == [StopReplicating(), StartReplicating(OTHER_HA)]  # another master elected
    assert not role.master_connected and role.master_client_address is None


def test_follow_demotes_a_master():
    role = RoleState(BrokerRole.SYNC_MASTER, None)
    role.fence("no controller lease")
    assert role.follow(OTHER_HA) == [ClearProducers(), StopHAService(), FailAckWaits(), StartReplicating(OTHER_HA)]
    assert role.is_slave and role.fenced_by is None


def test_a_promotion_opens_the_controllers_epoch_only_above_every_epoch_known():
    role = RoleState(BrokerRole.SLAVE, None)
    promotion, effects = role.begin_promotion(BrokerRole.SYNC_MASTER, local_epoch=3, epoch=7)
    assert promotion.epoch == 7 and effects == [StopReplicating()]
    role = RoleState(BrokerRole.SLAVE, MASTER_HA)
    role.epoch_seen(5)  # a master of epoch 5 was seen: epoch 5 is not ours to open, nor anything below
    for epoch in (4, 5):
        with pytest.raises(ValueError, match=f"cannot serve epoch {epoch}"):
            role.begin_promotion(BrokerRole.SYNC_MASTER, local_epoch=5, epoch=epoch)
    assert role.role is BrokerRole.SLAVE


def test_a_master_restarted_in_its_own_epoch_resumes_it():
    role = RoleState(BrokerRole.SLAVE, None)
    promotion, _ = role.begin_promotion(BrokerRole.SYNC_MASTER, local_epoch=4, epoch=4)
    assert promotion.epoch == 4  # the driver opens no new epoch: it is the log's last
    with pytest.raises(ValueError):
        RoleState(BrokerRole.SLAVE, None).begin_promotion(BrokerRole.SYNC_MASTER, local_epoch=4, epoch=3)
