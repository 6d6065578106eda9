"""The settings table: every setting a user can give (``--set NAME=VALUE``, a TOML file's
``[broker]`` table), with its type, default, unit, range, the processes that read it and why it
has its default -- read from the configuration dataclasses themselves, so there is no second list to keep.

Each field of a dataclass in ``SOURCES`` is one setting. Its description is the field's metadata,
written next to the default with ``setting(default, reason, ...)`` (commitlog/setting.py): ``reason`` (why
the default, what the setting does), and where needed ``unit`` (else read from the name's suffix:
``_ms``, ``_seconds``, ``_size``, ``_bytes``, ``_ratio``, ...), ``processes`` (else those of the
dataclass), ``choices``, ``shown_default``, and its range (``minimum``, ``above``,
``maximum``), which ``check_settings()`` (commitlog/setting.py) enforces when the class's
``validate()`` runs; rules between two settings are each class's ``SETTING_RULES``, stated once
(``all_rules()``). A field of two classes (a broker's field the store also has) is one setting:
its range is stated in the class that checks it. A field marked ``internal`` is no setting of its
own. ``EXTRA`` holds the few settings that are not a field (a node's ``raft_preset``).
``error_line()`` says a SettingError in one line with where each value came from. ``tests/unit/test_settings.py`` fails for a field without a
reason, and for docs/configuration.md out of date (``scripts/dev/gen_configuration.py`` writes
its generated block from ``markdown_table()``).

To add a dataclass of settings (a new mode's, say): write its fields with ``setting(...)``, add
one line to ``SOURCES`` (module, class name, the processes that read it), make the command of
those processes take its names in ``--set`` (as ``hasvc/cli/node.py`` does for ``RaftConfig``),
and regenerate docs/configuration.md. ``hasvc config list`` and the tests pick it up from there.
A new kind of process (a controller, say) is one more name in ``PROCESSES``.

Imports: the dataclasses' modules are imported when the table is first asked for, so that they
can be imported by it without a cycle.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import json
from collections.abc import Mapping
from typing import Any

from commitlog import setting as setting_module
from commitlog.setting import Rule, SettingError, range_problem, range_text

PROCESSES = ("master", "slave", "node", "proxy", "broker", "controller")

# (module, dataclass, the processes that read its fields unless a field says otherwise)
SOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("hasvc.config", "BrokerConfig", ("master", "slave", "node", "broker")),
    ("commitlog.config", "StoreConfig", ("master", "slave", "node", "broker")),
    ("hasvc.state.raft.config", "RaftConfig", ("node",)),
    ("hasvc.proxy.limits", "ProxyLimits", ("proxy",)),
    # controller mode's timings: the brokers' and the controllers' must match
    ("hasvc.state.controller.config", "ControllerTimings", ("broker", "controller")),
    ("hasvc.controller.config", "ControllerConfig", ("controller",)),
)


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    type: str  # integer, number, boolean, text, HOST:PORT, file (a path), or the choices as "a|b|c"
    default: Any  # as JSON has it: an address as "HOST:PORT", an enum by its value, None when unset
    unit: str  # "" when none applies (a flag, a name, an address)
    processes: tuple[str, ...]
    reason: str
    source: str  # module.Class the field belongs to ("" for EXTRA)
    shown_default: str | None = None  # a default computed at start ("listen port + 1")
    minimum: float | None = None  # the range validate() enforces: minimum and maximum included,
    above: float | None = None  # above excluded (None: no bound on that side, or not a number)
    maximum: float | None = None

    def range_text(self) -> str:
        """The range as a person reads it, without spaces: >0, >=0, 0..1,000,000, (0,1]; "" for none."""

        def shown(bound: float) -> str:
            if isinstance(bound, int) and self.unit in ("bytes", "bytes/s"):
                return _bytes_text(bound).replace(" ", "")
            return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"

        return range_text(self.minimum, self.above, self.maximum, shown)

    def default_text(self) -> str:
        """The default as a person reads it: 1 GiB, 3,000, none, listen port + 1."""
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int) and self.unit in ("bytes", "bytes/s"):
            return _bytes_text(value)
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value) if value != "" else '""'

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "default": self.default, "unit": self.unit,
                "range": self.range_text(), "processes": list(self.processes), "reason": self.reason,
                "source": self.source}  # fmt: skip


EXTRA = (
    Setting("raft_preset", "dledger|etcd", "dledger", "", ("node",),
            "A node's Raft timings at once (its other Raft settings apply on top): dledger (DLedger's defaults: heartbeat 2 s, "
            "election timeout 6.3-7 s) or etcd (heartbeat 100 ms, election timeout 1-2 s, randomised as etcd-raft does: "
            "failover measured beside etcd).", ""),  # fmt: skip
)


@functools.cache
def all_settings() -> tuple[Setting, ...]:
    """Every setting, in the order of ``SOURCES`` and of each dataclass's fields, then ``EXTRA``."""
    found: dict[str, Setting] = {}
    for module, name, processes in SOURCES:
        for setting in settings_of(getattr(importlib.import_module(module), name), processes):
            first = found.setdefault(setting.name, setting)
            if first is not setting and first.default != setting.default:
                # one name, two settings: a classic pair's and controller mode's min_in_sync_replicas
                # (their processes tell them apart; --set goes to the one its process reads)
                found[f"{setting.name} {setting.source}"] = setting
            elif first is not setting and not first.range_text():  # one setting in two classes (the
                # broker's field copied into the store's): its range stated once, where it is checked
                found[setting.name] = dataclasses.replace(first, minimum=setting.minimum, above=setting.above,
                                                          maximum=setting.maximum)  # fmt: skip
    return (*found.values(), *EXTRA)


@functools.cache
def all_rules() -> tuple[Rule, ...]:
    """The rules between settings (each class's ``SETTING_RULES``), in the order of ``SOURCES``."""
    return tuple(rule for module, name, _ in SOURCES
                 for rule in getattr(getattr(importlib.import_module(module), name), "SETTING_RULES", ()))  # fmt: skip


def settings_of(cls: type, processes: tuple[str, ...]) -> list[Setting]:
    """The settings of one configuration dataclass, read by ``processes`` unless a field says otherwise."""
    return [_from_field(field, cls, processes) for field in dataclasses.fields(cls) if "internal" not in field.metadata]


def undocumented(settings: tuple[Setting, ...] | list[Setting]) -> list[str]:
    """Problems of settings whose description is incomplete: no reason, or a process no command is."""
    problems = [f"{s.source}.{s.name}: no reason (give it with setting(default, reason): commitlog/setting.py)"
                for s in settings if len(s.reason.strip()) < 10]  # fmt: skip
    problems += [f"{s.name}: processes {s.processes} (known: {', '.join(PROCESSES)})"
                 for s in settings if not s.processes or set(s.processes) - set(PROCESSES)]  # fmt: skip
    return problems


def by_name() -> dict[str, Setting]:
    """Each name's setting; of a name two processes read as two settings, the first source's."""
    table: dict[str, Setting] = {}
    for setting in all_settings():
        table.setdefault(setting.name, setting)
    return table


def named(name: str) -> tuple[Setting, ...]:
    """Every setting called ``name`` (two for a name a classic pair and controller mode both use)."""
    return tuple(setting for setting in all_settings() if setting.name == name)


def for_process(process: str) -> tuple[Setting, ...]:
    return tuple(setting for setting in all_settings() if process in setting.processes)


MODES = {"classic": ("master", "slave"), "dledger": ("node",), "controller": ("broker", "controller")}  # hasvc config list --mode


def for_mode(mode: str) -> tuple[Setting, ...]:
    """The settings of a classic pair's processes (master, slave), of a DLedger member (node) or of
    controller mode's processes (broker, controller)."""
    return tuple(setting for setting in all_settings() if set(MODES[mode]) & set(setting.processes))


def parse_text(name: str, raw: str) -> Any:
    """A value given as text (--set NAME=VALUE) as the setting's type (commitlog.setting.parse_text);
    ValueError ('expected an integer, e.g. NAME=DEFAULT') when it is not one; KeyError for no
    setting of that name."""
    return setting_module.parse_text(field_of(name), raw)


def field_of(name: str) -> dataclasses.Field:
    """The dataclass field of the setting ``name`` (the first source's, for a field of two)."""
    for module, cls_name, _ in SOURCES:
        for field in dataclasses.fields(getattr(importlib.import_module(module), cls_name)):
            if field.name == name and "internal" not in field.metadata:
                return field
    raise KeyError(f"no setting {name!r}{suggestion(name)}")


def error_line(error: SettingError, origins: Mapping[str, str], source: str | None = None) -> str:
    """A SettingError in one line: which setting, its value and where it came from (``origins``:
    name -> '--set', 'FILE key [broker].NAME'; else the default), what is allowed, the default.
    ``source`` ('module.Class'): whose setting, for a name two classes use (else the first's)."""
    found = named(error.name)
    setting = next((s for s in found if s.source == source), found[0] if found else None)
    if setting is not None and error.problem.startswith("must be") and not error.others and setting.range_text():
        error = SettingError(error.name, error.value, range_problem(setting.range_text()))  # as the table shows it
    if setting is None or error.others:
        return error.describe(origins)
    shown = setting.default_text()
    unit = f" {setting.unit}" if setting.unit and shown[-1:].isdigit() and setting.unit != "bytes" else ""
    default = f" (default {shown}{unit})"
    return error.describe(origins) + default


def lookup(name: str) -> Setting:
    """The setting called ``name``; KeyError with the nearest names as a hint otherwise."""
    table = by_name()
    if name in table:
        return table[name]
    raise KeyError(f"no setting {name!r}{suggestion(name)}")


def suggestion(name: str) -> str:
    """' (did you mean a or b?)' for the nearest names, else a pointer to the list."""
    import difflib

    close = difflib.get_close_matches(name, list(by_name()), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else " ('hasvc config list' shows every setting)"


def _from_field(field: dataclasses.Field, cls: type, processes: tuple[str, ...]) -> Setting:
    meta = field.metadata
    default = field.default if field.default is not dataclasses.MISSING else None
    kind = "file" if meta.get("unit") == "file" else _type_text(field, default)
    unit = "" if kind == "file" else meta.get("unit", _unit(field.name, kind))
    return Setting(name=field.name, type=kind, default=_json_value(default), unit=unit,
                   processes=tuple(meta.get("processes", processes)), reason=meta.get("reason", ""),
                   source=f"{cls.__module__}.{cls.__qualname__}", shown_default=meta.get("shown_default"),
                   minimum=meta.get("minimum"), above=meta.get("above"), maximum=meta.get("maximum"))  # fmt: skip


def _type_text(field: dataclasses.Field, default: Any) -> str:
    if "choices" in field.metadata:
        return "|".join(field.metadata["choices"])
    if isinstance(default, enum.Enum):
        return "|".join(member.value for member in type(default))
    annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    plain = annotation.replace(" ", "").removesuffix("|None")
    return {"int": "integer", "float": "number", "bool": "boolean", "str": "text", "bytes": "text",
            "Address": "HOST:PORT"}.get(plain, plain)  # fmt: skip


def _unit(name: str, kind: str) -> str:
    """The unit a name's suffix says (STYLE: names put the unit or qualifier last)."""
    if kind not in ("integer", "number"):
        return ""
    for marker, unit in (("bytes_per_second", "bytes/s"), ("_ms", "ms"), ("_seconds", "s"), ("_hours", "h"),
                         ("_us", "µs"), ("_ratio", "fraction of the disk"), ("size", "bytes"), ("bytes", "bytes")):  # fmt: skip
        if name.endswith(marker) or (marker in ("size", "bytes") and marker in name):
            return unit
    return ""


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
        from hasvc.config import format_address

        return format_address(value)
    return value


def _bytes_text(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value:,}"


# -- what ``hasvc config`` and docs/configuration.md print --------------------------------------


def text_table(settings: tuple[Setting, ...]) -> str:
    """One line a setting: name, type, default, unit, processes (``hasvc config list``)."""
    rows = [("NAME", "TYPE", "DEFAULT", "UNIT", "RANGE", "PROCESSES")]
    rows += [(s.name, s.type, s.default_text(), s.unit, s.range_text(), ",".join(s.processes)) for s in settings]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
                     for row in rows).rstrip() + "\n"  # fmt: skip


def text_whole(setting: Setting) -> str:
    """One setting whole (``hasvc config show NAME``)."""
    lines = [setting.name, f"  type       {setting.type}", f"  default    {setting.default_text()}"]
    if setting.unit:
        lines.append(f"  unit       {setting.unit}")
    if setting.range_text():
        lines.append(f"  range      {setting.range_text()}")
    lines.append(f"  processes  {', '.join(setting.processes)}")
    if setting.source:
        lines.append(f"  field of   {setting.source}")
    import textwrap

    lines += [f"  rule       {rule.text()}" for rule in all_rules() if setting.name in rule.names]
    lines += ["", textwrap.fill(setting.reason, width=100, initial_indent="  ", subsequent_indent="  ")]
    return "\n".join(lines) + "\n"


def json_text(settings: tuple[Setting, ...]) -> str:
    return json.dumps([setting.to_json() for setting in settings], indent=2) + "\n"


def markdown_table() -> str:
    """The settings reference of docs/configuration.md, one table for each process kind's
    settings as ``SOURCES`` groups them."""
    out = []
    titles = {"hasvc.config.BrokerConfig": "Brokers: `hasvc master`, `hasvc slave`, `hasvc broker`, `hasvc node`",
              "hasvc.state.controller.config.ControllerTimings": "Controller mode: `hasvc broker`, `hasvc controller`",
              "hasvc.controller.config.ControllerConfig": "Controllers: `hasvc controller`",
              "hasvc.state.raft.config.RaftConfig": "Raft: `hasvc node`",
              "commitlog.config.StoreConfig": "The store: `hasvc master`, `hasvc slave`, `hasvc broker`, `hasvc node`",
              "hasvc.proxy.limits.ProxyLimits": "Proxy: `hasvc proxy`", "": "Settings that are not a field"}  # fmt: skip
    intros = {"commitlog.config.StoreConfig": "The store's settings the broker has no field of its own for, set the same "
                                              "way (`--set`, a TOML `[broker]` table) wherever a store is opened; "
                                              "`hasvc broker` takes what `hasvc master` takes.",
              "hasvc.state.controller.config.ControllerTimings":
                  "Both the brokers and the controllers take these with `--set`, and a broker's must match its "
                  "controllers'. A controller's Raft timings are the Raft settings above with the controller group's "
                  "own defaults (heartbeat 50 ms, election timeout 0.4-0.6 s, `flush_sync` on: "
                  "`CONTROLLER_RAFT` in `hasvc/controller/config.py`)."}  # fmt: skip
    groups: dict[str, list[Setting]] = {}
    for setting in all_settings():
        groups.setdefault(setting.source, []).append(setting)
    for source, members in groups.items():
        out += [f"### {titles.get(source, f'`{source}`')}", ""]
        if source:
            out += [f"Fields of `{source}`.{' ' + intros[source] if source in intros else ''}", ""]
        out += ["| setting | type | default | unit | range | processes | what it does, and why this default |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for s in members:
            reason = s.reason.replace("|", "\\|")
            kind = s.type.replace("|", " \\| ")
            cells = (f"`{s.name}`", kind, s.default_text(), s.unit, s.range_text(), ", ".join(s.processes), reason)
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        rules = [rule for rule in all_rules() if rule.names[0] in {s.name for s in members}]
        if rules:
            out += ["Rules between these settings, checked at start:", ""]
            out += [f"- {rule.text()}" for rule in rules] + [""]
    return "\n".join(out)


BEGIN_MARKER = "<!-- BEGIN GENERATED SETTINGS: scripts/dev/gen_configuration.py writes this block from hasvc/settings.py -->"
END_MARKER = "<!-- END GENERATED SETTINGS -->"


def render_document(document: str) -> str:
    """``document`` (docs/configuration.md) with its generated block written anew; ValueError
    when the markers are missing."""
    start, end = document.find(BEGIN_MARKER), document.find(END_MARKER)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN_MARKER!r} and {END_MARKER!r} are missing or out of order")
    return document[: start + len(BEGIN_MARKER)] + "\n\n" + markdown_table() + "\n" + document[end:]
