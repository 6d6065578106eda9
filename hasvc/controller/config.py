"""The controller process's configuration (``hasvc controller``): its limits and timings, each
with its reason, and ``ControllerConfig``."""

from __future__ import annotations

import dataclasses

from commitlog.dledger import entry_codec
from commitlog.setting import SettingError, check_value, setting
from hasvc.broker.raft.group import GroupConfig
from hasvc.config import Address
from hasvc.state.controller.config import ControllerTimings
from hasvc.state.raft.config import RaftConfig


# The topic of the records that carry controller commands (one queue).
CONTROLLER_TOPIC = "HASVC_CONTROLLER"
# The Raft group name every controller's HELLO carries.
CONTROLLER_RAFT_GROUP = "hasvc-controller"
# The controller group's Raft timings: a small group on a LAN. Heartbeat 50 ms and an election
# timeout of 0.4-0.6 s: a controller leader's death is noticed and replaced in about half a
# second, well inside a broker's call_timeout_seconds (3 s), and the masters' leases (0.4 s,
# renewed every 0.1 s by heartbeats to any leader) ride it out when the new leader comes quickly.
# flush_sync: an entry counts toward the quorum only once flushed.
CONTROLLER_RAFT = RaftConfig(heartbeat_interval_seconds=0.05, election_timeout_min_seconds=0.4,
                             election_timeout_max_seconds=0.6, quorum_ack_timeout_seconds=2.0, flush_sync=True,
                             push_batch_size_max=256 * 1024)  # fmt: skip
# The period of the entry files' sync ticker (``EntrySync.tick_seconds``; a DLedger member's is
# 10 ms, the data files' flush interval). With flush_sync every append starts its own sync, so the
# ticker only catches up the index files (synced at most once a second anyway) and the leader's
# warm-up: at 10 ms it was 100 wake-ups a second of a controller that appends a few entries a
# minute (a third of its idle CPU, py-spy). Without flush_sync the DLedger period stays.
CONTROLLER_SYNC_TICK_SECONDS = 0.5
# The entry files: commands are a few hundred bytes, so small files let retention cut the log
# soon after a snapshot (an entry file is deleted whole). 4 MiB holds ~10k commands.
CONTROLLER_DATA_FILE_SIZE = 4 * 1024 * 1024
# A data file must hold a command or two (a Register with long names is ~1.3 KiB as an entry).
LOG_FILE_SIZE_MIN = 16 * 1024
# An entry data file is mapped whole; the controller's log is small, so 1 GiB is far past need.
LOG_FILE_SIZE_MAX = 1 << 30
CONTROLLER_INDEX_FILE_SIZE = entry_codec.INDEX_UNIT_SIZE * 128 * 1024  # 128 Ki entries' units (4 MiB)
# A snapshot after this many applied entries: a restart replays at most this many.
SNAPSHOT_INTERVAL_ENTRIES = 1000
# How often the leader checks for lapsed masters (elect.py's decisions). Small against
# broker_heartbeat_timeout_seconds (0.7 s): an election starts at most this late.
ELECTION_CHECK_INTERVAL_SECONDS = 0.05
# A proposed command not committed within this is answered NOT_LEADER (the broker asks again,
# perhaps another controller): the group lost its quorum or its leader meanwhile.
COMMAND_COMMIT_TIMEOUT_SECONDS = 2.0
# The controller port's connections (hasvc/admission.py): brokers keep a few each
# (ControllerClient's connections_per_controller_max); strangers must finish the preface and
# send a request within the timeout.
CONTROLLER_STRANGERS_MAX = 64
CONTROLLER_STRANGER_TIMEOUT_SECONDS = 3.0
CONTROLLER_CONNECTIONS_MAX = 4096
SNAPSHOT_DIRECTORY = "controller"
SNAPSHOT_FILE = "snapshot"



_OPTION = "a command-line option of hasvc controller (see its --help)"


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    store: str = setting(internal=_OPTION)
    listen: Address = setting(internal=_OPTION)  # the controller port
    self_id: str = setting("c0", internal=_OPTION)
    peers: dict[str, Address] | None = setting(None, internal=_OPTION)  # every controller's Raft address (None: a group of 1)
    raft: RaftConfig = setting(CONTROLLER_RAFT, internal="the controller group's Raft timings: RaftConfig's settings (--set), "
                               "CONTROLLER_RAFT's defaults")  # fmt: skip
    timings: ControllerTimings = setting(ControllerTimings(), internal="ControllerTimings' settings (--set)")
    secret: bytes | None = setting(None, internal=_OPTION)
    tls_cert: str | None = setting(None, internal=_OPTION)
    tls_key: str | None = setting(None, internal=_OPTION)
    tls_ca: str | None = setting(None, internal=_OPTION)
    metrics_listen: Address | None = setting(None, internal=_OPTION)
    snapshot_interval_entries: int = setting(
        SNAPSHOT_INTERVAL_ENTRIES, "A controller snapshots its state after this many applied entries and lets retention "
        "delete the log files before it: a restart replays at most this many. 1000: a replay of a thousand commands "
        "takes well under a second, and snapshots stay rare.", unit="entries", minimum=1)  # fmt: skip
    log_file_size: int = setting(
        CONTROLLER_DATA_FILE_SIZE, "Each of the controller's Raft entry data files (retention deletes whole files). "
        "4 MiB holds ~10k commands of a few hundred bytes, so the log stays small soon after a snapshot.",
        unit="bytes", minimum=LOG_FILE_SIZE_MIN, maximum=LOG_FILE_SIZE_MAX)  # fmt: skip

    def group_config(self) -> GroupConfig:
        # A group of one: no peer connects, so its Raft port is any free port on loopback.
        peers = self.peers if self.peers is not None else {self.self_id: ("127.0.0.1", 0)}
        raft = self.raft
        if len(peers) == 1:
            # No follower to heartbeat: the leader's heartbeat tick has nobody to send to and its
            # quorum, transfer and disk checks nobody to look at (a group of one is its own
            # quorum), so it runs at half the election timeout (the core's rule: below it)
            # rather than every 50 ms, which woke an idle controller twenty times a second.
            raft = dataclasses.replace(raft, heartbeat_interval_seconds=max(raft.heartbeat_interval_seconds,
                                                                            raft.election_timeout_min_seconds / 2))  # fmt: skip
        return GroupConfig(group=CONTROLLER_RAFT_GROUP, self_id=self.self_id, peers=peers, raft=raft)

    def validate(self) -> ControllerConfig:
        group = self.group_config()
        if len(group.peers) not in (1, 3, 5):
            raise ValueError(f"a controller group has 1, 3 or 5 controllers, not {len(group.peers)}")
        group.validate()
        self.timings.validate()
        if self.raft.election_timeout_min_seconds < self.timings.master_lease_seconds:
            raise ValueError(f"election_timeout_min_seconds ({self.raft.election_timeout_min_seconds}) of the controller "
                             f"group must not be below master_lease_seconds ({self.timings.master_lease_seconds}): a lease "
                             "an old controller leader granted must have run out when a new leader answers")  # fmt: skip
        for field in dataclasses.fields(self):  # the settings of its own (the others are options and tables)
            if "internal" not in field.metadata and (problem := check_value(field, getattr(self, field.name))) is not None:
                raise SettingError(field.name, getattr(self, field.name), problem)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        return self

