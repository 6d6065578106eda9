"""``setting()``: a configuration dataclass's field that carries its own description.

Every configuration dataclass a user can set (``hasvc.config.BrokerConfig``, the Raft core's
``RaftConfig``, the proxy's ``ProxyLimits``) writes its fields with it, so that the settings table
(``hasvc/settings.py``; ``hasvc config list``, docs/configuration.md) is read from the fields
themselves. Here, at the bottom of the layers and importing only ``dataclasses``, so that the
pure packages can use it without importing the store's codecs.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def setting(default: Any = dataclasses.MISSING, reason: str = "", *, unit: str | None = None,
            processes: tuple[str, ...] | None = None, choices: tuple[str, ...] | None = None,
            shown_default: str | None = None, minimum: float | None = None, above: float | None = None,
            maximum: float | None = None, repr: bool = True) -> Any:  # fmt: skip
    """A field with what ``hasvc config list`` shows of it: ``reason``, why it has its default and
    what it does; ``unit`` where the name's suffix does not say it; ``processes`` where not every
    process of its dataclass reads it; ``choices`` for a text field; ``shown_default`` for a
    default computed at start; its range, as its class's ``validate()`` enforces it (``minimum``
    and ``maximum`` included, ``above`` excluded: a test tries a value past each bound)."""
    metadata: dict[str, Any] = {"reason": reason}
    for key, value in (("unit", unit), ("processes", processes), ("choices", choices), ("shown_default", shown_default),
                       ("minimum", minimum), ("above", above), ("maximum", maximum)):  # fmt: skip
        if value is not None:
            metadata[key] = value
    return dataclasses.field(default=default, metadata=metadata, repr=repr)
