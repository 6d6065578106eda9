"""``ClassicChecker``: the safety properties a simulated classic cluster must keep, checked after
every delivery and every tick of ``ClassicCluster`` (see the class)."""

from __future__ import annotations

from commitlog.epoch import validate
from hasvc.protocol import ha
from hasvc.testing.classic_broker import Broker, Damage, SafetyViolation, _holds, _read


class ClassicChecker:
    """Safety after every step.

    * acknowledged, when it is: ``in_sync_replicas`` other brokers hold the bytes (SYNC_MASTER's promise);
    * acknowledged, ever after: a put answered PUT_OK by a SYNC_MASTER after its slave ack is in the current
      (unfenced, running) master's log, same bytes at the same offset -- unless a crash destroyed
      every copy: right after each crash, puts that no log (running or not) holds any more are
      ``forgiven`` (counted). With flush before ack on both ends no put may ever be forgiven.
    * a slave in an established session of the running master holds the master's bytes, byte for
      byte, up to its own end (so a rejoined log matches);
    * the highest acknowledged end never decreases within one master epoch;
    * no put is stored while its master is fenced or a slave;
    * every epoch table strictly increases (a promotion reusing an epoch is counted: ``epoch_reuses``);
    * storage damage: a repair writes back exactly the bytes that were there (``repaired``); a loss
      is accepted only when no other log holds the damaged bytes, and the acknowledged puts no log
      holds after it are counted apart as ``accepted`` (``accepted_loss``), never silently; a slave
      is never cut inside its master's current epoch to match a master whose log ends shorter
      there (``slave_cut``: a healthy copy is never cut to match a damaged or shorter one).

    Incremental: a ``MemoryLog`` only grows between two changes of its ``generation`` (a
    truncation or a lossy crash), so the checker remembers what it has compared -- the acknowledged
    puts verified in the master's log, and how far each slave's session has been compared -- under
    a key of who is master, which session and which generations, and compares only what is new.
    A new key starts over with a full comparison. (A full comparison after every step cost about
    0.4 s of CPU per seed; see ``full_checks``.)
    """

    def __init__(self) -> None:
        self.acked: dict[int, tuple[int, bytes]] = {}  # put id -> (offset, bytes), in ack order
        self.forgiven: set[int] = set()
        self.accepted: set[int] = set()  # lost to a loss the operator accepted (no healthy copy)
        self.acked_to: dict[tuple[str, int], int] = {}
        self.highest_epoch = 0
        self.epoch_reuses = 0
        self.in_sync_replicas = 1  # how many other brokers must hold an acknowledged put
        self.full_checks = 0  # how often the key changed and everything was compared again
        self._acked_key: tuple | None = None
        self._acked_order: list[int] = []
        self._acked_checked = 0  # the first this many of ``_acked_order`` hold under _acked_key
        self._slave_checked: dict[str, tuple[tuple, int]] = {}  # slave -> (key, compared up to)

    def stored(self, broker: Broker) -> None:
        if broker.role.write_refusal() is not None:
            raise SafetyViolation(f"{broker.name} stored a put while refusing writes: {broker.role.write_refusal()}")

    def acknowledged(self, broker: Broker, put_id: int, offset: int, data: bytes, epoch: int, brokers: list[Broker],
                     *, excused: bool = False) -> None:  # fmt: skip
        """SYNC_MASTER's promise, checked as it is made: the bytes are on another broker. ``excused``:
        a slave acknowledged them from its page cache and has lost bytes since (a power loss; without
        flush before ack that is allowed, as in RocketMQ: the ack was already on its way)."""
        holders = sum(1 for b in brokers if b is not broker and _held(b, offset, data))
        if not excused and holders < self.in_sync_replicas:
            raise SafetyViolation(f"{broker.name} acknowledged put {put_id} at {offset} under SYNC_MASTER, "
                                  f"but {holders} other broker(s) hold it, in_sync_replicas is {self.in_sync_replicas}")  # fmt: skip
        self.acked[put_id] = (offset, data)
        self._acked_order.append(put_id)
        key = (broker.name, epoch)
        end = offset + len(data)
        self.acked_to[key] = max(self.acked_to.get(key, 0), end)

    def promoted(self, epoch: int) -> None:
        # A slave that never heard of the newest master's epoch opens it again (``highest_epoch``
        # knows only its log and its peers): counted, not failed; the byte checks judge the result.
        if epoch <= self.highest_epoch:
            self.epoch_reuses += 1
        self.highest_epoch = max(self.highest_epoch, epoch)

    def after_crash(self, brokers: list[Broker]) -> None:
        """Also after flushed bytes were lost: what went past the flushed offset with them went
        as a power loss takes it (what went below it is in the damage, repaired or accepted)."""
        for put_id, (offset, data) in self.acked.items():
            if put_id not in self.forgiven and not any(_held(b, offset, data) for b in brokers):
                self.forgiven.add(put_id)

    def repaired(self, broker: Broker, damage: Damage) -> None:
        if _read(broker.log, damage.start, damage.end) != damage.truth:
            raise SafetyViolation(f"{broker.name}'s repair of [{damage.start}, {damage.end}) ({damage.reason}) "
                                  f"wrote other bytes than it had held")  # fmt: skip

    def accepted_loss(self, broker: Broker, damage: Damage, brokers: list[Broker]) -> None:
        """The operator cut ``broker``'s log at ``damage.start``: no other log may hold the damaged
        bytes (a healthy copy existed); the acknowledged puts now held nowhere are counted apart."""
        for other in brokers:
            if other is not broker and _holds(other.log, damage.start, damage.truth):
                raise SafetyViolation(f"{broker.name} accepted the loss of [{damage.start}, {damage.end}) "
                                      f"({damage.reason}) while {other.name} holds those bytes")  # fmt: skip
        for put_id, (offset, data) in self.acked.items():
            if put_id not in self.forgiven and put_id not in self.accepted \
                    and not any(_holds(b.log, offset, data) for b in brokers):  # fmt: skip
                self.accepted.add(put_id)

    def slave_cut(self, slave: Broker, truncate_to: int, hello: ha.MasterHello) -> None:
        """A slave cuts its log to ``truncate_to`` to follow the master that answered ``hello``
        (judged by what that answer said: a master may have died since it sent it): never bytes
        of the master's current epoch that the master's log no longer reaches."""
        if not hello.epochs or slave.log.max_offset <= hello.max_offset:
            return
        epoch, start = hello.epochs[-1]
        held = any(e.epoch == epoch and e.start_offset == start for e in slave.epochs)
        if held and truncate_to >= start:
            raise SafetyViolation(f"slave {slave.name} cut to {truncate_to}, inside master {slave.master}'s epoch "
                                  f"{epoch}, to match the master's shorter log (end {hello.max_offset}, "
                                  f"ours {slave.log.max_offset})")  # fmt: skip

    def check(self, brokers: list[Broker]) -> None:
        for broker in brokers:
            validate(broker.epochs)
            broker.log.check_invariants()
        masters = [b for b in brokers if b.up and not b.role.is_slave and b.role.fenced_by is None]
        if len(masters) > 1:
            raise SafetyViolation(f"two writable masters: {[m.name for m in masters]}")
        if not masters:
            return
        master = masters[0]
        key = (master.name, master.log.generation)
        if key != self._acked_key:
            self._acked_key, self._acked_checked = key, 0
            self.full_checks += 1
        for put_id in self._acked_order[self._acked_checked :]:
            offset, data = self.acked[put_id]
            if put_id not in self.forgiven and put_id not in self.accepted and not _holds(master.log, offset, data):
                raise SafetyViolation(f"put {put_id} acknowledged at {offset} under SYNC_MASTER is not in "
                                      f"master {master.name}'s log (end {master.log.max_offset})")  # fmt: skip
        self._acked_checked = len(self._acked_order)
        for slave in brokers:
            if slave.up and slave.role.is_slave and slave.master == master.name and slave.session \
                    and slave.session.established and master.session_of.get(slave.name) == slave.session.number:  # fmt: skip
                self._check_slave(master, slave)

    def _check_slave(self, master: Broker, slave: Broker) -> None:
        end = slave.log.max_offset
        if end > master.log.max_offset:
            raise SafetyViolation(f"slave {slave.name}'s log ends at {end}, past master {master.name}'s "
                                  f"end {master.log.max_offset}")  # fmt: skip
        key = (master.name, slave.session.number, master.log.generation, slave.log.generation, slave.log.min_offset)
        known_key, compared = self._slave_checked.get(slave.name, (None, 0))
        start = compared if known_key == key else slave.log.min_offset
        if _read(slave.log, start, end) != _read(master.log, start, end):
            raise SafetyViolation(f"slave {slave.name}'s log [{start}, {end}) differs from master "
                                  f"{master.name}'s (end {master.log.max_offset})")  # fmt: skip
        self._slave_checked[slave.name] = (key, end)


def _held(broker: Broker, offset: int, data: bytes) -> bool:
    """``broker`` held these bytes before its disk damaged them (a stopped broker's report still in
    flight acknowledges them: damage done later is a fault of its own, judged at repair)."""
    if _holds(broker.log, offset, data):
        return True
    damage = broker.damage
    if damage is None or not damage.start <= offset < damage.end:
        return False
    if offset + len(data) <= damage.end:
        return damage.truth[offset - damage.start : offset - damage.start + len(data)] == data
    head = damage.end - offset  # a record that runs past the damaged range: the rest is on the log
    return damage.truth[offset - damage.start :] == data[:head] and _holds(broker.log, damage.end, data[head:])
