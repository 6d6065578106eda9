"""The settings table (hasvc/settings.py): every setting has its reason, the table is what --set
takes, and docs/configuration.md is generated from it."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from click.testing import CliRunner

from hasvc import settings
from commitlog.setting import SettingError, setting
from commitlog.config import StoreConfig
from hasvc.config import BrokerConfig
from hasvc.controller.config import ControllerConfig
from hasvc.proxy.limits import ProxyLimits
from hasvc.state.controller.config import ControllerTimings
from hasvc.state.raft.config import RaftConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "configuration.md")


def test_every_setting_has_a_reason_and_known_processes():
    assert settings.undocumented(settings.all_settings()) == []


def test_a_field_without_a_reason_is_found():
    @dataclasses.dataclass(frozen=True)
    class Example:
        documented_ms: int = setting(5, "Why five milliseconds: a reason long enough.")
        bare_seconds: float = 1.0
        empty_size: int = setting(4096)

    problems = settings.undocumented(settings.settings_of(Example, ("master",)))
    assert [problem.split(":")[0].rsplit(".", 1)[-1] for problem in problems] == ["bare_seconds", "empty_size"]
    assert "documented_ms: processes ('spark',)" in "\n".join(settings.undocumented(settings.settings_of(Example, ("spark",))))


def test_the_table_holds_every_field_of_every_configuration_once():
    names = [s.name for s in settings.all_settings()]
    for process in settings.PROCESSES:  # a name two processes read as two settings (min_in_sync_replicas) is fine
        read = [s.name for s in settings.for_process(process)]
        assert len(read) == len(set(read)), f"a name in two dataclasses {process} reads: --set NAME would be ambiguous"
    assert [name for name in set(names) if names.count(name) > 1] == ["min_in_sync_replicas"]
    for cls in (BrokerConfig, StoreConfig, RaftConfig, ProxyLimits, ControllerTimings, ControllerConfig):
        assert {field.name for field in dataclasses.fields(cls) if "internal" not in field.metadata} <= set(names)
    assert "raft_preset" in names and "store_overrides" not in names and "store_host" not in names


def test_types_units_and_defaults_are_read_from_the_fields():
    table = settings.by_name()
    assert (table["slave_timeout_ms"].type, table["slave_timeout_ms"].default, table["slave_timeout_ms"].unit) == ("integer", 3000, "ms")
    assert table["commitlog_segment_size"].default_text() == "1 GiB" and table["commitlog_segment_size"].unit == "bytes"
    assert table["scrub_bytes_per_second"].unit == "bytes/s"
    assert table["role"].type == "SYNC_MASTER|ASYNC_MASTER|SLAVE" and table["role"].default == "ASYNC_MASTER"
    assert table["small_write_pages"].type == "auto|on|off"
    assert table["listen"].default == "127.0.0.1:10911" and table["listen"].type == "HOST:PORT"
    assert table["ha_listen"].default_text() == "listen port + 1"
    assert table["tls_cert"].type == "file"
    assert table["heartbeat_interval_seconds"].processes == ("node",)
    assert table["calls_max"].processes == ("proxy",)
    json.dumps([s.to_json() for s in settings.all_settings()])  # every default as JSON has it


def test_each_default_given_back_with_set_parses_to_the_default():
    """The type the table shows is the one --set parses: each number and flag, given its default
    as text, comes back as the default."""
    for cls in (BrokerConfig, StoreConfig, RaftConfig, ProxyLimits):
        for field in dataclasses.fields(cls):
            shown = settings.by_name().get(field.name)
            if shown is not None and shown.type in ("integer", "number", "boolean"):
                text = str(field.default).lower() if shown.type == "boolean" else str(field.default)
                assert settings.parse_text(field.name, text) == field.default, field.name


def _instance(cls, **values):
    if cls is ControllerConfig:
        return cls(store="data", listen=("127.0.0.1", 0), **values)
    return cls(store="data", **values) if cls is BrokerConfig else cls(**values)


def test_each_range_shown_is_the_one_validate_enforces():
    """A value just past each bound the table shows is refused by its class's validate(), naming
    the setting; a value on an included bound is taken."""
    classes = {f"{cls.__module__}.{cls.__qualname__}": cls
               for cls in (BrokerConfig, StoreConfig, RaftConfig, ProxyLimits, ControllerTimings, ControllerConfig)}
    checked = 0
    for shown in settings.all_settings():
        if not shown.range_text():
            continue
        cls = classes[shown.source]
        step = 1 if shown.type == "integer" else 0.001
        past = [value for value in (None if shown.minimum is None else shown.minimum - step, shown.above,
                                    None if shown.maximum is None else shown.maximum + step) if value is not None]  # fmt: skip
        for value in past:
            with pytest.raises(SettingError, match=f"^{shown.name}=") as refused:
                _instance(cls, **{shown.name: value}).validate()
            assert refused.value.name == shown.name
            assert f"{shown.range_text()} (default " in settings.error_line(refused.value, {}, shown.source)
        for value in (shown.minimum, shown.maximum):
            if value is not None:
                _instance(cls, **{shown.name: value}).validate()
        checked += 1
    assert checked >= 40


def test_a_dledger_member_refuses_only_settings_the_table_says_it_does_not_read():
    from hasvc.cli.node import NODE_UNAPPLIED_SETTINGS

    table = settings.by_name()
    read_by_node = [name for name in NODE_UNAPPLIED_SETTINGS if "node" in table[name].processes]
    assert read_by_node == []


def test_the_configuration_document_is_generated_from_the_table():
    with open(DOC, encoding="utf-8") as file:
        current = file.read()
    assert settings.render_document(current) == current, (
        "docs/configuration.md is out of date with hasvc/settings.py: run "
        ".venv/bin/python scripts/dev/gen_configuration.py"
    )
    for name in settings.by_name():
        assert f"| `{name}` |" in current


def test_the_document_check_finds_a_changed_reason():
    with open(DOC, encoding="utf-8") as file:
        current = file.read()
    stale = current.replace("RocketMQ's slaveTimeout:", "RocketMQ's slaveTimeout (old text):", 1)
    assert stale != current and settings.render_document(stale) == current


def _hasvc(*arguments):
    from hasvc.cli import main

    return CliRunner().invoke(main, list(arguments))


def test_config_list_prints_every_setting_with_type_and_default():
    result = _hasvc("config", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "DEFAULT", "UNIT", "RANGE", "PROCESSES"]
    assert {line.split()[0] for line in lines[1:]} == set(settings.by_name())
    row = next(line for line in lines if line.startswith("slave_timeout_ms "))
    assert row.split()[1:6] == ["integer", "3,000", "ms", ">0", "master,slave,node,broker"]


def test_controller_mode_settings_are_in_the_table_and_one_name_of_two_modes_shows_both():
    """The controllers' and controller-mode brokers' settings (their timings, a controller's own)
    are listed with the processes that read them; min_in_sync_replicas, a classic pair's (slaves,
    0: off) and controller mode's (the SyncStateSet's size), is shown whole twice."""
    result = _hasvc("config", "list", "--mode", "controller", "--format", "json")
    assert result.exit_code == 0, result.output
    shown = {(item["name"], tuple(item["processes"])) for item in json.loads(result.output)}
    assert ("broker_heartbeat_timeout_seconds", ("broker", "controller")) in shown
    assert ("snapshot_interval_entries", ("controller",)) in shown
    assert ("min_in_sync_replicas", ("broker", "controller")) in shown
    assert ("slave_timeout_ms", ("master", "slave", "node", "broker")) in shown
    assert not any(name in ("master_ha", "in_sync_replicas") or processes == ("node",) for name, processes in shown)
    assert "controller" not in _hasvc("config", "list", "--process", "master").output.split()
    both = _hasvc("config", "show", "min_in_sync_replicas")
    assert both.exit_code == 0 and both.output.count("min_in_sync_replicas\n") == 2, both.output
    assert "processes  master, slave, node" in both.output and "processes  broker, controller" in both.output


def test_config_list_for_one_process_and_as_json():
    result = _hasvc("config", "list", "--process", "proxy", "--format", "json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert {item["name"] for item in shown} == {field.name for field in dataclasses.fields(ProxyLimits)}
    assert all(item["reason"] and item["processes"] == ["proxy"] for item in shown)
    node = {line.split()[0] for line in _hasvc("config", "list", "--process", "node").output.splitlines()[1:]}
    assert "heartbeat_interval_seconds" in node and "ha_listen" not in node and "slave_timeout_ms" in node


def test_config_show_prints_one_setting_whole_and_suggests_for_a_misspelt_name():
    result = _hasvc("config", "show", "ha_transfer_readahead_size")
    assert result.exit_code == 0, result.output
    assert "default    256 MiB" in result.output and "fadvise WILLNEED" in result.output
    wrong = _hasvc("config", "show", "slave_timeout")
    assert wrong.exit_code == 2
    assert "did you mean slave_timeout_ms" in wrong.output and "Traceback" not in wrong.output


def test_a_setting_of_another_process_given_to_a_broker_says_which_reads_it(tmp_path):
    store = tmp_path / "never-created"
    result = _hasvc("master", "--store", str(store), "--set", "heartbeat_interval_seconds=1")
    assert result.exit_code == 2
    assert "only hasvc node reads it" in result.output
    result = _hasvc("master", "--store", str(store), "--set", "slave_timeout=1")
    assert result.exit_code == 2 and "did you mean slave_timeout_ms" in result.output
    assert not store.exists()


def test_config_check_takes_a_good_file_and_says_what_is_wrong_with_a_bad_one(tmp_path):
    def check(text, *extra):
        path = tmp_path / "broker.toml"
        path.write_text(text)
        return _hasvc("config", "check", str(path), *extra)

    good = check('[broker]\nstore = "data/m"\nrole = "sync"\nslave_timeout_ms = 2000\n')
    assert good.exit_code == 0 and "OK for hasvc master" in good.output, good.output
    assert check("[broker]\nslave_timeout_ms = 2000\n", "--process", "slave").exit_code == 0  # --store, --master-ha assumed
    for text, process, said in [
        ("[broker]\nslave_timout_ms = 1\n", "master", "did you mean slave_timeout_ms"),
        ("[broker]\nslave_timeout_ms = 'soon'\n", "master", "expected an integer"),
        ("[broker]\nslave_timeout_ms = -1\n", "master", "slave_timeout_ms=-1 (from "),
        ("[broker]\nslave_timeout_ms = -1\n", "master", "broker.toml key [broker].slave_timeout_ms): must be >0 (default 3,000 ms)"),
        ("[broker]\ndisk_clean_ratio = 1.5\n", "master", "disk_clean_ratio=1.5 (from"),
        ("[broker]\ndisk_clean_ratio = 1.5\n", "master", "must be in (0,1] (default 0.75"),
        ("[broker]\nha_transfer_batch_size = 8388608\n", "master",
         "ha_transfer_batch_size=8388608 (from "),
        ("[broker]\nha_transfer_batch_size = 8388608\n", "master",
         ": must not exceed ha_frame_size_max=4194304 (from the default)"),
        ("[broker]\nflush_interval_commitlog_ms = 0\n", "master", "flush_interval_commitlog_ms=0 (from"),
        ("[broker]\nflush_interval_commitlog_ms = 10\n", "node", "flush_interval_commitlog_ms is not used by a DLedger member"),
        ("[brokr]\nstore = 'x'\n", "master", "unknown table or key [brokr] outside [broker] (did you mean [broker]?)"),
        ("[broker]\nlisten = 10911\n", "master", "listen=10911 (from"),
        ("[broker]\nha_listen = '127.0.0.1:5'\n", "node", "ha_listen is not used by a DLedger member"),
        ("[broker]\nlisten = '10.1.2.3:10911'\n", "master", "without a secret"),
        ("[broker\n", "master", "not valid TOML"),
    ]:  # fmt: skip
        result = check(text, "--process", process)
        assert result.exit_code == 2, (text, result.output)
        assert said in result.output and "Traceback" not in result.output, (text, result.output)


def test_the_stores_own_settings_reach_the_store_from_set_and_toml(tmp_path):
    """StoreConfig's settings that BrokerConfig has no field for are set by name on every command
    that opens a store, from --set and from the [broker] table, and reach store_config()."""
    from hasvc.cli.broker import _build_config

    path = tmp_path / "broker.toml"
    path.write_text("[broker]\nwarm_ahead_size = 0\ndelete_segments_per_pass_max = 3\n")
    for role in ("ASYNC_MASTER", "SLAVE", "SYNC_MASTER"):  # master, slave; node and broker (controller mode)
        config = _build_config(role, {"store": str(tmp_path / "s"), "master_ha": "127.0.0.1:10912"}, str(path), None,
                               ("flush_interval_commitlog_ms=100", "crc=crc32", "dispatch_batch_size_max=65536"))  # fmt: skip
        store = config.store_config()
        assert (store.flush_interval_commitlog_ms, store.crc, store.dispatch_batch_size_max) == (100, "crc32", 65536)
        assert (store.warm_ahead_size, store.delete_segments_per_pass_max) == (0, 3)
        assert config.describe()["flush_interval_commitlog_ms"] == 100
    assert StoreConfig().flush_interval_commitlog_ms == 500


def test_a_store_setting_a_dledger_member_does_not_read_is_refused_by_the_node(tmp_path):
    result = _hasvc("node", "--store", str(tmp_path / "n"), "--group", "g", "--peers", "n0-127.0.0.1:0", "--self", "n0",
                    "--set", "sync_flush_timeout_ms=100")  # fmt: skip
    assert result.exit_code == 2 and "sync_flush_timeout_ms is not used by a DLedger member" in result.output
    assert not (tmp_path / "n").exists()


def test_config_list_by_mode_shows_the_stores_settings():
    classic = {line.split()[0] for line in _hasvc("config", "list", "--mode", "classic").output.splitlines()[1:]}
    dledger = {line.split()[0] for line in _hasvc("config", "list", "--mode", "dledger").output.splitlines()[1:]}
    assert {"flush_interval_commitlog_ms", "group_commit_waiters_max", "warm_ahead_size", "ha_listen"} <= classic
    assert "heartbeat_interval_seconds" not in classic and "calls_max" not in classic
    assert {"warm_ahead_size", "dispatch_batch_size_max", "heartbeat_interval_seconds"} <= dledger
    assert not {"flush_interval_commitlog_ms", "ha_listen"} & dledger
    shown = _hasvc("config", "show", "flush_interval_commitlog_ms").output
    assert "default    500" in shown and "commitlog.config.StoreConfig" in shown and "flushIntervalCommitLog" in shown


def test_a_rule_between_settings_is_stated_once_and_names_both_values_and_their_origins():
    names = [rule.names for rule in settings.all_rules()]
    assert ("ha_transfer_batch_size", "ha_frame_size_max") in names and len(names) == len(set(names))
    with pytest.raises(SettingError) as refused:
        BrokerConfig(store="s", ha_transfer_batch_size=8 << 20).validate()
    line = settings.error_line(refused.value, {"ha_transfer_batch_size": "--set"})
    assert line.startswith("ha_transfer_batch_size=8388608 (from --set): must not exceed ha_frame_size_max=4194304 "
                           "(from the default)")  # fmt: skip
    shown = _hasvc("config", "show", "ha_frame_size_max").output
    assert "rule       ha_transfer_batch_size must not exceed ha_frame_size_max" in shown
    with open(DOC, encoding="utf-8") as file:
        assert "- heartbeat_interval_seconds must be below election_timeout_min_seconds" in file.read()


def test_a_controller_mode_broker_refuses_the_classic_settings_it_would_not_use(tmp_path):
    """master_ha and in_sync_replicas: the controllers decide those; one line, nothing started."""
    config = tmp_path / "broker.toml"
    config.write_text("[broker]\nmin_in_sync_replicas = 1\n")
    for extra in (["--set", "in_sync_replicas=2"], ["--config", str(config)]):
        result = _hasvc("broker", "--controllers", "127.0.0.1:1", "--group", "g", "--store", str(tmp_path / "b"),
                        "--listen", "127.0.0.1:0", *extra)  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "is not used by a controller-mode broker" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "b").exists()
