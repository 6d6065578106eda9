"""The controller process's own lease rule, beside the tracker's: a new controller leader withholds
the lease from a master an earlier leader elected until master_lease_seconds after it applied
that election. Plain calls on a server that was never started (no store, no socket)."""

from hasvc.controller.server import ControllerConfig, ControllerServer


def _server(tmp_path) -> ControllerServer:
    return ControllerServer(ControllerConfig(store=str(tmp_path), listen=("127.0.0.1", 0)))


def test_an_election_applied_before_this_leader_took_office_holds_the_lease_back(tmp_path):
    server = _server(tmp_path)
    lease = server.config.timings.master_lease_seconds
    server._elected_at["g"] = 10.0  # applied as a follower
    server.tracker.became_leader(10.1)
    assert server.port.inherited_election("g", 10.1)
    assert server.port.inherited_election("g", 10.0 + lease - 0.01)
    assert not server.port.inherited_election("g", 10.0 + lease)


def test_an_election_this_leader_made_and_an_old_one_do_not(tmp_path):
    server = _server(tmp_path)
    server.tracker.became_leader(10.0)
    server._elected_at["g"] = 10.2  # applied while leading: the tracker's own grants rule covers it
    assert not server.port.inherited_election("g", 10.3)
    assert not server.port.inherited_election("other", 10.3)  # never elected here
    server._elected_at["h"] = 5.0  # long before: the previous master's lease ran out long ago
    assert not server.port.inherited_election("h", 10.0)


def test_the_controller_group_timings_are_checked(tmp_path):
    import dataclasses

    import pytest

    from hasvc.controller.server import CONTROLLER_RAFT

    with pytest.raises(ValueError, match="master_lease_seconds"):
        ControllerConfig(store=str(tmp_path), listen=("127.0.0.1", 0),
                         raft=dataclasses.replace(CONTROLLER_RAFT, election_timeout_min_seconds=0.3)).validate()  # fmt: skip
    with pytest.raises(ValueError, match="1, 3 or 5"):
        ControllerConfig(store=str(tmp_path), listen=("127.0.0.1", 0), self_id="a",
                         peers={"a": ("127.0.0.1", 1), "b": ("127.0.0.1", 2)}).validate()  # fmt: skip


async def test_an_operators_elect_of_a_restarted_member_is_refused_and_another_is_picked(tmp_path):
    """A member that restarted since it entered the SyncStateSet may have lost acknowledged writes
    (a power loss): not elected by hand; any other member of the set holds them all."""
    import trio

    from hasvc.protocol import controller as cp
    from hasvc.state.controller import state as cs

    server = _server(tmp_path)
    for number in (1, 2, 3):
        server.state.apply(cs.Register("g", f"store-{number}", f"h{number}:1", f"h{number}:2"))
    server.state.apply(cs.Elect("g", 1, 0, "first"))
    server.state.apply(cs.AlterSyncStateSet("g", 1, 1, 1, frozenset({1, 2, 3})))
    server.state.apply(cs.Register("g", "store-2", "h2:1", "h2:2"))  # broker 2's process started again
    now = trio.current_time()
    server.tracker.became_leader(now)
    for broker_id, end in ((1, 100), (2, 900), (3, 300)):  # 2's longest log does not make it electable by hand
        server.tracker.heartbeat("g", broker_id, 1, end, now)
    refused = server.port._switchover(cp.ElectRequest("g", 2))
    assert isinstance(refused, cp.Answer) and "restarted" in refused.reason
    assert server.port._switchover(cp.ElectRequest("g", None)).new_master_id == 3


async def test_with_unclean_elections_on_an_operator_may_elect_a_set_of_one_that_lost_its_tail_logged_unclean(tmp_path):
    """The set of one lost the tail of its epoch and no member covering it comes back: only an
    operator's unclean election names a master, and says what it may cost."""
    import dataclasses

    import trio

    from hasvc.protocol import controller as cp
    from hasvc.state.controller import state as cs

    server = _server(tmp_path)
    for number in (1, 2):
        server.state.apply(cs.Register("g", f"store-{number}", f"h{number}:1", f"h{number}:2"))
    server.state.apply(cs.Elect("g", 1, 0, "first"))
    server.state.apply(cs.Register("g", "store-1", "h1:1", "h1:2"))  # the set of one restarted
    now = trio.current_time()
    server.tracker.became_leader(now)
    server.tracker.heartbeat("g", 1, 1, 1696, now, lost_tail=2120)
    server.tracker.heartbeat("g", 2, 0, 0, now)
    refused = server.port._switchover(cp.ElectRequest("g", 1))
    assert isinstance(refused, cp.Answer) and "restarted" in refused.reason
    timings = dataclasses.replace(server.config.timings, allow_unclean_election=True)
    server.config = dataclasses.replace(server.config, timings=timings)
    elect = server.port._switchover(cp.ElectRequest("g", 1))
    assert elect.new_master_id == 1 and "UNCLEAN" in elect.reason and "2120" in elect.reason
    elect = server.port._switchover(cp.ElectRequest("g", 2))
    assert elect.new_master_id == 2 and "UNCLEAN" in elect.reason and "outside the SyncStateSet" in elect.reason


def _serving_leader(tmp_path, now: float) -> ControllerServer:
    """A server that leads (a group of one, so it holds its lease) and serves since ``now``."""
    from types import SimpleNamespace

    from hasvc.state.raft.ready import Role

    server = _server(tmp_path)
    server.driver = SimpleNamespace(node=SimpleNamespace(role=Role.LEADER))
    server._serving = True
    server.tracker.became_leader(now)
    return server


def test_an_idle_leader_looks_for_elections_when_the_first_master_would_lapse(tmp_path):
    """While every group has a master that heartbeats, nothing but a lapse can call for an
    election: the timer sleeps to the earliest lapse, never past it, instead of every interval."""
    from hasvc.controller.config import ELECTION_CHECK_INTERVAL_SECONDS
    from hasvc.state.controller import state as cs

    server = _serving_leader(tmp_path, 100.0)
    timeout = server.config.timings.broker_heartbeat_timeout_seconds
    for name in ("g", "h"):
        for number in (1, 2):
            server.state.apply(cs.Register(name, f"{name}-store-{number}", f"{name}{number}:1", f"{name}{number}:2"))
        server.state.apply(cs.Elect(name, 1, 0, "first"))
    assert server.next_election_check(100.0) == 100.0 + timeout  # nobody heard yet: silence counted from office
    server.tracker.heartbeat("g", 1, 1, 0, 100.3)
    server.tracker.heartbeat("h", 1, 1, 0, 100.2)
    assert server.next_election_check(100.3) == 100.2 + timeout  # h's master lapses first
    assert not server.tracker.lapsed("h", 1, 100.2 + timeout - 1e-6)  # not before that moment
    assert server.next_election_check(100.2 + timeout) == 100.2 + timeout + ELECTION_CHECK_INTERVAL_SECONDS  # lapsing
    server.tracker.heartbeat("h", 1, 1, 0, 100.5)
    assert server.next_election_check(100.5) == 100.3 + timeout  # now g's


def test_a_group_that_may_need_an_election_is_looked_at_every_interval(tmp_path):
    from hasvc.controller.config import ELECTION_CHECK_INTERVAL_SECONDS
    from hasvc.controller.server import _Proposal
    from hasvc.state.controller import state as cs

    soon = 100.0 + ELECTION_CHECK_INTERVAL_SECONDS
    server = _serving_leader(tmp_path, 100.0)
    for number in (1, 2):
        server.state.apply(cs.Register("g", f"store-{number}", f"h{number}:1", f"h{number}:2"))
    assert server.next_election_check(100.0) == soon  # no master yet
    server.state.apply(cs.Elect("g", 1, 0, "first"))
    assert server.next_election_check(100.0) > soon
    server._electing["g"] = _Proposal(5, 1)  # an Elect in flight: its end is looked for
    assert server.next_election_check(100.0) == soon
    server._electing.clear()
    server.state.apply(cs.Register("g", "store-1", "h1:1", "h1:2"))  # the master's process started again
    assert server.next_election_check(100.0) == soon
    server._serving = False
    assert server.next_election_check(100.0) == soon


def test_a_group_of_one_heartbeats_nobody_every_50_ms_a_group_of_three_does(tmp_path):
    from hasvc.controller.server import CONTROLLER_RAFT

    alone = ControllerConfig(store=str(tmp_path), listen=("127.0.0.1", 0)).validate().group_config().raft
    assert alone.heartbeat_interval_seconds == CONTROLLER_RAFT.election_timeout_min_seconds / 2
    peers = {name: ("127.0.0.1", 1 + number) for number, name in enumerate(("a", "b", "c"))}
    three = ControllerConfig(store=str(tmp_path), listen=("127.0.0.1", 0), self_id="a", peers=peers).validate().group_config().raft
    assert three.heartbeat_interval_seconds == CONTROLLER_RAFT.heartbeat_interval_seconds == 0.05
