"""Controller mode's pure cores (docs/design/controller.md): the replicated controller state
(``state``), the controller leader's elections (``elect``), the master's SyncStateSet tracker and
lease (``sync_set``), the broker's agent (``agent``) and their timings (``config``). Nothing here
does I/O, reads a clock or imports trio: every ``now`` is an argument."""
