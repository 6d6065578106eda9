"""hasvc: RocketMQ's store and master/slave replication, rebuilt in Python on trio.

The layers, lowest first. A module imports only from its own layer or a lower one; nothing imports
upward. ``tests/unit/test_layering.py`` reads every import (``ast``) and enforces this rule:

L0  ``commitlog``         synchronous storage (segments, records, consume queues, epochs). Imports no
                          trio, no hasvc, no sockets; it reads the clock only where that test lists.
L1  ``hasvc.protocol``    sans-IO codecs: bytes in, events out.
    ``hasvc.state``       pure decisions (replication progress, handshake, puts, roles, failover).
    Both import no trio, no sockets or threads, and no clock or entropy (``time``, ``random``,
    ``secrets``, ``datetime``): ``now`` and randomness are arguments. Besides the standard library
    they import only ``commitlog`` and each other.
    ``hasvc.config``      the broker's configuration (frozen dataclasses, TOML loading).
L2  drivers (trio)        ``hasvc.transport``, ``hasvc.admission`` (who holds a connection on the
                          Raft and HA ports), ``hasvc.metrics_http`` (the bounded metrics server),
                          ``hasvc.broker`` (client port, put service, outbox,
                          store tasks, HA master and slave, metrics; ``hasvc.broker.raft``, the
                          Raft member, beside the classic drivers and importing none of them),
                          ``hasvc.replicator`` (what the put path needs of replication),
                          ``hasvc.client``: they feed the L1
                          cores bytes and time and carry out what those return.
L3  ``hasvc.tools``       benchmarks, drills, demos, the crash writer: library code the CLI runs.
    ``hasvc.spark``       the Spark data source and jobs (imports ``commitlog`` only, no trio).
    ``hasvc.testing``     simulators and doubles for tests.
L4  ``hasvc.cli``         the ``hasvc`` command line; imports anything, and nothing imports it.

So no product module (L0-L2) imports ``hasvc.tools``, ``hasvc.testing`` or ``hasvc.cli``.
"""
