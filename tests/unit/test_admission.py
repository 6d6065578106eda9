"""Admission: strangers capped apart from known peers, the oldest stranger evicted for a new one
(those still in their preface first), known peers without a deadline."""

import math

import pytest
import trio

from hasvc.admission import Admission, AdmissionLimits


def _admission(strangers_max=2, known_max=2) -> Admission:
    return Admission(AdmissionLimits(strangers_max, 3.0, known_max), "raft")


async def test_a_new_connection_evicts_the_oldest_stranger_still_in_its_preface_first():
    admission = _admission(strangers_max=2)
    first, second = trio.CancelScope(), trio.CancelScope()
    a = admission.arrive(first, now=0.0)
    b = admission.arrive(second, now=1.0)
    admission.authenticated(a)  # past the preface: evicted after those still in theirs
    assert first.deadline == 3.0 and second.deadline == 4.0
    c = admission.arrive(trio.CancelScope(), now=2.0)
    assert b.evicted and second.cancel_called and not a.evicted
    admission.authenticated(c)  # none left in its preface: the oldest past it goes
    admission.arrive(trio.CancelScope(), now=2.0)
    assert a.evicted and first.cancel_called and not c.evicted
    assert admission.strangers == 2 and admission.evicted == 2
    admission.leave(a)  # the evicted connection's task ends: nothing counted twice
    assert admission.strangers == 2


async def test_a_known_peer_has_no_deadline_and_never_counts_as_a_stranger():
    admission = _admission(strangers_max=1, known_max=1)
    scope = trio.CancelScope()
    member = admission.arrive(scope, now=0.0)
    admission.authenticated(member)
    assert admission.identified(member) and admission.identified(member)  # a second HELLO changes nothing
    assert scope.deadline == math.inf and admission.known == 1 and admission.strangers == 0
    for _ in range(5):  # strangers come and go; the member's slot is not theirs to take
        admission.arrive(trio.CancelScope(), now=1.0)
    assert not member.evicted and not scope.cancel_called
    late = admission.arrive(trio.CancelScope(), now=2.0)
    assert not admission.identified(late)  # known_max reached: refused, counted
    assert admission.refused == 1 and admission.known == 1 and admission.strangers == 0
    admission.leave(late)
    admission.leave(member)
    assert admission.known == 0
    assert admission.statistics() == {"raft_connections_known": 0, "raft_connections_strangers": 0, "raft_strangers_evicted": 5,
                                      "raft_strangers_timed_out": 0, "raft_connections_refused_full": 1}  # fmt: skip


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        AdmissionLimits(0, 3.0, 2)
    with pytest.raises(ValueError):
        AdmissionLimits(2, 0.0, 2)
