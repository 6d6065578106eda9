"""The generated ``apache.rocketmq.v2`` messages and servicer, from the official Python client.

``rocketmq-python-client`` ships them as ``rocketmq.grpc_protocol``, but its package ``__init__``
imports the whole client, which starts writing logs under ``~/logs`` on import. The gateway needs
only the generated modules, so it loads them under a bare stand-in for the ``rocketmq`` package
(no ``__init__`` run) and removes the stand-in afterwards: a later ``import rocketmq`` (a test that
also runs the official client) still gets the real package, and reuses these same modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _load_generated() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    names = ("rocketmq.grpc_protocol.definition_pb2", "rocketmq.grpc_protocol.service_pb2",
             "rocketmq.grpc_protocol.service_pb2_grpc")  # fmt: skip
    if "rocketmq" in sys.modules:
        return tuple(importlib.import_module(name) for name in names)  # type: ignore[return-value]
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("hasvc proxy needs the official RocketMQ client: pip install 'hasvc[proxy]'")
    parent = types.ModuleType("rocketmq")
    parent.__path__ = list(spec.submodule_search_locations)
    protocol = types.ModuleType("rocketmq.grpc_protocol")
    protocol.__path__ = [f"{parent.__path__[0]}/grpc_protocol"]
    sys.modules["rocketmq"] = parent
    sys.modules["rocketmq.grpc_protocol"] = protocol
    try:
        return tuple(importlib.import_module(name) for name in names)  # type: ignore[return-value]
    finally:
        # The real packages load (with their __init__) on a later import; the generated modules
        # stay in sys.modules and are reused by them.
        del sys.modules["rocketmq"], sys.modules["rocketmq.grpc_protocol"]


class _Codes:
    """``apache.rocketmq.v2.Code``'s numbers as plain int attributes: reading one off the generated
    enum wrapper (``definition.Code.OK``) costs ~1.8 us (a ``__getattr__`` into the descriptor),
    and a send read several."""

    def __init__(self, enum) -> None:
        self.__dict__.update(enum.items())


definition, service, service_grpc = _load_generated()
Code = _Codes(definition.Code)


def status(code: int, message: str = ""):
    """An ``apache.rocketmq.v2.Status``; without a message, the code's name."""
    return definition.Status(code=code, message=message or definition.Code.Name(code))
