"""A broker process as trio drivers, one per concern: ``client_port`` (connections and requests),
``put_service`` (the put path: appends, waits, answers), ``outbox`` (a connection's responses),
``store_tasks`` (flushes, dispatch, warm-up, housekeeping), ``ha_master`` and ``ha_slave``
(classic replication), ``metrics``; ``broker.Broker`` composes them. Raft mode is the package
``raft`` (``raft.broker.RaftBroker``), on the same put path, client port and store tasks; the two
modes import nothing of each other (``tests/unit/test_layering.py``)."""

from hasvc.broker.broker import Broker

__all__ = ["Broker"]
