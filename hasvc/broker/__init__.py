"""A broker process as trio drivers, one per concern: ``client_port`` (connections and requests),
``put_service`` (the put path: appends, waits, answers), ``outbox`` (a connection's responses),
``store_tasks`` (flushes, dispatch, warm-up, housekeeping), ``ha_master`` and ``ha_slave``
(replication), ``metrics``; ``broker.Broker`` composes them."""

from hasvc.broker.broker import Broker

__all__ = ["Broker"]
