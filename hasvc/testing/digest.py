"""A canonical form of what the Raft simulators see, for one digest per seed (``--digest``).

``python -m hasvc.testing.sim raft --seeds N --digest`` prints a hash per seed of every message
delivered, every ``Ready`` (with the core's deadline and status after it) and the final logs and
hard states. Two versions of the core that behave alike print the same lines: a refactor that
means to change no behaviour is checked by comparing them (``diff``) over thousands of seeds.
``canonical`` turns dataclasses, named tuples, enums and bytes-like values (a run's bytes may be
a memoryview, whose repr names an address) into plain tuples whose ``repr`` is stable.
"""

from __future__ import annotations

import dataclasses
import enum


def canonical(value):
    """``value`` as nested tuples of ints, floats, strings, bytes and None (stable ``repr``)."""
    if isinstance(value, (int, float, str, type(None))):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return (type(value).__name__, *(canonical(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, dict):
        return tuple(sorted((canonical(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *(canonical(item) for item in value))
    raise TypeError(f"no canonical form for {type(value).__name__}")
