"""``setting()``: a configuration dataclass's field that carries its own description, and
``check_settings()``: the one place a configuration's values are checked against it.

Every configuration dataclass a user can set (``hasvc.config.BrokerConfig``, the store's
``StoreConfig``, the Raft core's ``RaftConfig``, the proxy's ``ProxyLimits``) writes its fields
with it, so that the settings table (``hasvc/settings.py``; ``hasvc config list``,
docs/configuration.md) and the checks at start are read from the fields themselves: a field's
type (its annotation), its range (``minimum``, ``above``, ``maximum``) and its ``choices`` are
checked by ``check_settings()``, called first by each class's ``validate()``; a rule between two
settings is a ``Rule`` in the class's ``SETTING_RULES``, stated once, checked there too and
listed by the table. A value that breaks either is a ``SettingError``: which setting, the value,
what is allowed -- the command line adds where the value came from (``--set``, a TOML file's
key, the default). Here, at the bottom of the layers and importing only the standard library, so
that the pure packages can use it without importing the store's codecs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


def setting(default: Any = dataclasses.MISSING, reason: str = "", *, unit: str | None = None,
            processes: tuple[str, ...] | None = None, choices: tuple[str, ...] | None = None,
            shown_default: str | None = None, minimum: float | None = None, above: float | None = None,
            maximum: float | None = None, internal: str | None = None, repr: bool = True) -> Any:  # fmt: skip
    """A field with what ``hasvc config list`` shows of it: ``reason``, why it has its default and
    what it does; ``unit`` where the name's suffix does not say it; ``processes`` where not every
    process of its dataclass reads it; ``choices`` for a text field; ``shown_default`` for a
    default computed at start; its range (``minimum`` and ``maximum`` included, ``above``
    excluded), which ``check_settings()`` enforces. ``internal``: why a field is not a setting of
    its own (set from another one, or read by no process): the table leaves it out."""
    metadata: dict[str, Any] = {"reason": reason}
    for key, value in (("unit", unit), ("processes", processes), ("choices", choices), ("shown_default", shown_default),
                       ("minimum", minimum), ("above", above), ("maximum", maximum), ("internal", internal)):  # fmt: skip
        if value is not None:
            metadata[key] = value
    return dataclasses.field(default=default, metadata=metadata, repr=repr)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A rule between settings, stated once: ``holds(*values of names)``; ``problem`` says what the
    first name must be, with ``{1}``, ``{2}`` ... standing for the other names (and their values)."""

    names: tuple[str, ...]
    holds: Callable[..., bool]
    problem: str

    def text(self) -> str:
        """The rule as the table lists it: 'ha_transfer_batch_size must not exceed ha_frame_size_max'."""
        return f"{self.names[0]} {self.problem.format(*self.names)}"


class SettingError(ValueError):
    """A setting's value is not allowed: ``name``, ``value``, ``problem`` (what is allowed), and for
    a rule between settings the ``others`` ((name, value) pairs) ``problem`` refers to as {1}, {2}."""

    def __init__(self, name: str, value: Any, problem: str, others: tuple[tuple[str, Any], ...] = ()) -> None:
        self.name, self.value, self.problem, self.others = name, value, problem, others
        super().__init__(self.describe())

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *(name for name, _ in self.others))

    def describe(self, origins: Mapping[str, str] | None = None) -> str:
        """One line; ``origins`` (name -> where its value came from: '--set', 'FILE key [broker].NAME')
        adds where each value came from; a name not in it has its default."""

        def given(name: str, value: Any) -> str:
            where = "" if origins is None else f" (from {origins.get(name, 'the default')})"
            return f"{name}={shown_value(value)}{where}"

        slots = ["", *(given(name, value) for name, value in self.others)]
        return f"{given(self.name, self.value)}: {self.problem.format(*slots)}"


def shown_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return str(getattr(value, "value", value))


def range_text(minimum: float | None, above: float | None, maximum: float | None,
               shown: Callable[[float], str] | None = None) -> str:  # fmt: skip
    """A range as a person reads it, without spaces: >0, >=0, 0..1,000,000, (0,1]; "" for none."""
    shown = shown or (lambda bound: f"{bound:,}" if isinstance(bound, int) else f"{bound:g}")
    low = None
    if above is not None:
        low = f"({shown(above)},"
    elif minimum is not None:
        low = f"{shown(minimum)}.."
    if maximum is not None:
        return f"{low}{shown(maximum)}]" if above is not None else f"{low or '<='}{shown(maximum)}"
    if above is not None:
        return f">{shown(above)}"
    return f">={shown(minimum)}" if minimum is not None else ""


def range_problem(text: str) -> str:
    """'must be >0', 'must be in (0,1]', 'must be in 0..1,000,000' for a range_text()."""
    return f"must be in {text}" if ".." in text or text.startswith("(") else f"must be {text}"


_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "text"}


def field_kind(field: dataclasses.Field) -> str:
    """A field's plain type (int, float, bool, str, ...), ``| None`` dropped (annotations are strings here)."""
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    return kind.replace(" ", "").removesuffix("|None")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_text(field: dataclasses.Field, raw: str) -> Any:
    """A value given as text (``--set NAME=VALUE``) as ``field``'s type: an integer, a number, or a
    boolean (true/false, 1/0, yes/no, on/off); anything else stays text (choices and addresses
    are checked later). ValueError ('expected an integer, e.g. NAME=DEFAULT') when it is not one."""
    kind = field_kind(field)
    try:
        if kind == "bool":
            if raw.lower() not in _TRUE + _FALSE:
                raise ValueError
            return raw.lower() in _TRUE
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        example = "" if field.default in (None, dataclasses.MISSING) else f", e.g. {field.name}={shown_value(field.default)}"
        raise ValueError(f"expected {_KINDS[kind]}{example}") from None
    return raw


def check_value(field: dataclasses.Field, value: Any) -> str | None:
    """What is wrong with ``value`` for ``field`` (its type, choices, range), or None."""
    meta, kind = field.metadata, field_kind(field)
    if value is None:
        optional = isinstance(field.type, str) and field.type.replace(" ", "").endswith("|None")
        return None if optional or field.default is None else f"expected {_KINDS.get(kind, kind)}"
    wanted = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}.get(kind)
    if wanted is not None and (not isinstance(value, wanted) or (kind != "bool" and isinstance(value, bool))):
        return f"expected {_KINDS[kind]}"
    if "choices" in meta and value not in meta["choices"]:
        return f"must be one of {', '.join(meta['choices'])}"
    minimum, above, maximum = meta.get("minimum"), meta.get("above"), meta.get("maximum")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if ((minimum is not None and not value >= minimum) or (above is not None and not value > above)
                or (maximum is not None and not value <= maximum)):  # fmt: skip
            return range_problem(range_text(minimum, above, maximum))
    return None


def check_settings(config: Any, rules: tuple[Rule, ...] = ()) -> None:
    """Every ``setting()`` field of the dataclass ``config`` (``internal`` ones too) against its
    type, choices and range, then ``rules``; SettingError for the first that fails."""
    for field in dataclasses.fields(config):
        if "reason" not in field.metadata:  # not a setting() field
            continue
        value = getattr(config, field.name)
        problem = check_value(field, value)
        if problem is not None:
            raise SettingError(field.name, value, problem)
    for rule in rules:
        values = [getattr(config, name) for name in rule.names]
        if not rule.holds(*values):
            raise SettingError(rule.names[0], values[0], rule.problem, tuple(zip(rule.names[1:], values[1:], strict=True)))
