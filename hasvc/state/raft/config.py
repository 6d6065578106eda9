"""The Raft core's configuration: one frozen dataclass, DLedger's defaults, and an etcd-like preset.

DLedger's numbers come from ``DLedgerConfig`` 0.3.1.2 (rocketmq-notes §8.5, §8.6). Its election is
"no heartbeat for maxHeartBeatLeak x heartBeatTimeIntervalMs, then a random minVoteIntervalMs ..
maxVoteIntervalMs before asking for votes"; here that is one randomised election timeout drawn
from ``[election_timeout_min_seconds, election_timeout_max_seconds]``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final

from commitlog.setting import Rule, check_settings, setting


@dataclasses.dataclass(frozen=True, slots=True)
class RaftConfig:
    heartbeat_interval_seconds: float = setting(
        2.0,
        "How often a leader sends a heartbeat (with its commit index) to every follower. DLedger "
        "heartBeatTimeIntervalMs = 2000.", above=0)
    election_timeout_min_seconds: float = setting(
        6.3,
        "A follower that heard nothing from a leader for a random time in [min, max] starts an election (pre-vote "
        "first). DLedger: maxHeartBeatLeak (3) x 2 s = 6 s, then 300..1000 ms "
        "(minVoteIntervalMs..maxVoteIntervalMs). The same window bounds a candidate's round, the leader lease "
        "that makes voters ignore a disruptive candidate, and check-quorum (a leader that heard from no quorum "
        "for election_timeout_min_seconds steps down; DLedger: 3 x 2 s).", above=0)
    election_timeout_max_seconds: float = setting(
        7.0,
        "The upper end of the random election timeout (election_timeout_min_seconds says what it bounds). DLedger: "
        "6 s, then up to maxVoteIntervalMs (1000 ms).")
    leader_lost_election_delay_max_seconds: float = setting(
        0.1,
        "A follower whose connection from its leader ends (EOF or reset: the leader's process died and its kernel "
        "closed the socket, or it shut down) forgets the leader's lease and starts its election after a random "
        "delay in [half, all] of this, instead of a whole election timeout after the last heartbeat. Safe and not "
        "disruptive: the pre-vote still needs a quorum of voters that lost the leader too (the others' leases "
        "refuse it). Needs pre_vote and check_quorum; 0 turns it off. Neither DLedger nor etcd has it (both wait "
        "for missed heartbeats).", minimum=0)
    pre_vote_granted_hold_seconds: float = setting(
        0.2,
        "A member that grants another's pre-vote lets that campaign run: as a follower it starts none of its own "
        "for this long (the candidate's vote request follows its pre-vote at once), and as a pre-candidate it "
        "gives its own up when the other's log is newer, or as new and its id lower (the order "
        "leader_lost_election_delay_max_seconds gives the survivors' slots). Without it two survivors whose "
        "pre-votes crossed -- a pre-vote round trip longer than a slot, 25 ms with 3 members at 0.1 s (a loaded "
        "host: drill rounds of 1.5-2 s) -- both passed the pre-vote and split the real vote, costing an election "
        "timeout (simulated, 2-30 ms links: 79 seeds of 300 with 3 members, 86 with 5). Liveness only: a pre-vote "
        "changes no term and no vote. 0: off; at most half of election_timeout_min_seconds is held (short test "
        "timings).", minimum=0)
    push_batch_size_max: int = setting(
        1024 * 1024,
        "Bytes of entry bodies per push (at least one entry always goes). DLedger maxBatchPushSize is 4 KiB; 1 "
        "MiB here: with 1 KiB messages a 4 KiB push carried 3 entries, and the per-push cost (a follower's step, "
        "append, Ready and answer; the leader's step of it, a wake-up each way) bounded the group. When entries "
        "were still encoded per push, 64 KiB was best (64 producers, acked/s: 4 KiB 10,895 / 9,240; 32 KiB 12,975 "
        "/ 10,781; 64 KiB 14,226 / 13,585 / 13,279; 256 KiB 11,867 / 10,431). Pushes are the stored bytes now (a "
        "view of the data file, one native check on the follower), and a pass of puts (a 256 KiB client read) "
        "made four 64 KiB pushes a follower: `scripts/dev/dledger_cpu.py TREE 64 3 1 32 --set "
        "push_batch_size_max=N`, the group's CPU a message 64 KiB 24.2/15.2/20.0/20.8 us -> 256 KiB "
        "13.8/13.1/18.8/19.6 (4 pairs), 256 KiB 19.9/15.5/17.2 -> 1 MiB 17.0/14.4/16.3 (3 pairs).", above=0)
    push_in_flight_max: int = setting(
        1000,
        "Entries pushed to one follower and not yet acknowledged (a push starts while fewer are, so one batch may "
        "go past it). DLedger maxPendingSize = 1000 per peer.", unit="entries", above=0)
    push_timeout_seconds: float = setting(
        1.0,
        "The entry after a follower's acknowledged index pending longer than this is pushed again. DLedger "
        "maxPushTimeOutMs = 1000.", above=0)
    pending_max: int = setting(
        10_000,
        "Proposals waiting for a quorum; one more is refused with LEADER_PENDING_FULL. DLedger "
        "maxPendingRequestsNum = 10 000.", unit="proposals", above=0)
    quorum_ack_timeout_seconds: float = setting(
        2.5,
        "A proposal not committed within this fails with WAIT_QUORUM_ACK_TIMEOUT (its entry stays in the log and "
        "may still commit: the client retries idempotently). DLedger maxWaitAckTimeMs = 2500.", above=0)
    flush_sync: bool = setting(
        False,
        "False (DLedger's default): a member counts an entry toward the quorum once it is in its log (page cache; "
        "flushed every 10 ms in the background). True: only once it is flushed (etcd's promise).")
    leadership_transfer_wait_index_max: int = setting(
        1000,
        "A leadership transfer is refused when the target is more entries behind than this. DLedger "
        "maxLeadershipTransferWaitIndex = 1000.", unit="entries", minimum=0)
    preferred_leader_id: str | None = setting(
        None,
        "The member that should lead when it is caught up (DLedger preferredLeaderId); None: any.")
    pre_vote: bool = setting(
        True,
        "What DLedger 0.3 lacks and etcd users expect: a candidate first asks whether it could win (pre-vote), so "
        "a member cut off and back does not disrupt a healthy leader; off only to show in tests what it prevents.")
    check_quorum: bool = setting(
        True,
        "What DLedger 0.3 lacks and etcd users expect: a leader that heard from no quorum for "
        "election_timeout_min_seconds steps down; off only to show in tests what it prevents.")

    # Rules between the timings, stated once: validate() checks them, the settings table lists them.
    SETTING_RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(("election_timeout_max_seconds", "election_timeout_min_seconds"), lambda high, low: high >= low,
             "must not be below {1}"),
        Rule(("heartbeat_interval_seconds", "election_timeout_min_seconds"), lambda beat, low: beat < low,
             "must be below {1}: followers would start elections between two heartbeats of a healthy leader"),
        Rule(("leader_lost_election_delay_max_seconds", "election_timeout_min_seconds"), lambda delay, low: delay < low,
             "must be below {1}"),
    )

    def validate(self) -> RaftConfig:
        """Raise ValueError (a SettingError) naming the first impossible setting; returns self."""
        check_settings(self, self.SETTING_RULES)
        return self


# DLedger 0.3.1.2's defaults (but push_batch_size_max: see its comment).
DLEDGER_DEFAULTS: Final = RaftConfig()

# Comparable with etcd's defaults (heartbeat 100 ms, election timeout 1000 ms randomised in
# [1000, 2000) ms as etcd-raft does), for failover measured beside etcd.
ETCD_LIKE: Final = RaftConfig(
    heartbeat_interval_seconds=0.1, election_timeout_min_seconds=1.0, election_timeout_max_seconds=2.0
)
