"""The controller client a broker uses: finds the controller leader among a list of controllers and
asks it (REGISTER, HEARTBEAT, ALTER_SYNC_STATE_SET, ELECT, STATUS).

Theory of operation
-------------------
``ControllerClient`` knows every controller's address and which one it believes leads. A call
goes to that one first; an answer NOT_LEADER naming a leader sends the call there next (an
address the list lacked is added: a controller names its leader by its controller port), one
naming none, a refused connection or a request that timed out sends it to the next address in
the list. After a round of the whole list without a leader's answer it pauses
``leader_retry_pause_seconds`` (an election in the controller group takes a few hundred
milliseconds) and goes round again, until ``call_timeout_seconds`` after the call began: then
``ControllerUnavailable``, one line naming what each controller said. An answer OK or REFUSED is
the leader's, returned as it is (a refusal is the caller's to read: a stale epoch, an unknown
member).

Connections are kept, at most ``connections_per_controller_max`` idle ones a controller, and a
connection carries one request at a time: concurrent calls (a heartbeat beside a SyncStateSet
change) take a connection each, so a slow commit never holds a heartbeat back. A connection that
failed or timed out is closed, never reused.

``heartbeat`` returns the answer with the time its request was *sent* (``trio.current_time()``
just before the write to the controller that answered): a master's lease counts from then,
never from the answer's arrival (docs/design/controller.md, the master's lease).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

import trio

from hasvc import transport
from hasvc.config import format_address, parse_address
from hasvc.protocol import controller as cp
from hasvc.protocol import wire

LOGGER = logging.getLogger(__name__)

# One request to one controller: a heartbeat is answered at once, a register or a SyncStateSet
# change once the controller group committed it (a Raft round trip on a LAN, milliseconds; the
# controller group's election timeout is 0.4-0.6 s, beyond which the leader is in doubt anyway).
REQUEST_TIMEOUT_SECONDS = 0.5
# Connecting (TCP and the preface) to one controller: a dead host costs at most this per round.
CONNECT_TIMEOUT_SECONDS = 0.5
# A whole call, over every controller and every retry: a controller election fits several times.
CALL_TIMEOUT_SECONDS = 3.0
# Between two rounds of the whole list that found no leader (an election in progress).
LEADER_RETRY_PAUSE_SECONDS = 0.05
# Idle connections kept per controller (one request at a time on each; concurrent calls take one each).
CONNECTIONS_PER_CONTROLLER_MAX = 4
# A NOT_LEADER answer may name a controller the list lacks; at most this many are added.
ADDRESSES_MAX = 16


class ControllerUnavailable(Exception):
    """No controller answered as the leader within the call's time."""


@dataclasses.dataclass(frozen=True)
class ControllerClientConfig:
    request_timeout_seconds: float = REQUEST_TIMEOUT_SECONDS
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS
    call_timeout_seconds: float = CALL_TIMEOUT_SECONDS
    leader_retry_pause_seconds: float = LEADER_RETRY_PAUSE_SECONDS
    connections_per_controller_max: int = CONNECTIONS_PER_CONTROLLER_MAX

    def validate(self) -> ControllerClientConfig:
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"{field.name} must be > 0, not {getattr(self, field.name)!r}")
        if self.call_timeout_seconds < self.request_timeout_seconds:
            raise ValueError(f"call_timeout_seconds ({self.call_timeout_seconds}) is below request_timeout_seconds "
                             f"({self.request_timeout_seconds}): a call could not wait for one answer")  # fmt: skip
        return self


class _Link:
    """One connection to one controller, one request at a time."""

    def __init__(self, connection: transport.Connection) -> None:
        self.connection = connection
        self.decoder = cp.ControllerDecoder(answers=True)

    async def call(self, request_id: int, request: cp.Request) -> cp.Answer:
        await self.connection.send_all(cp.encode_request(request_id, request))
        while True:
            frame = self.decoder.next_event()
            if frame is not None:
                if frame.request_id != request_id or frame.message.kind != request.KIND:
                    raise wire.ProtocolError(f"answer {frame.request_id} ({cp.KIND_NAMES[frame.message.kind]}) to "
                                             f"request {request_id} ({cp.KIND_NAMES[request.KIND]})")  # fmt: skip
                return frame.message
            data = await self.connection.receive_some()
            if not data:
                raise EOFError(f"{self.connection.peer} closed the connection")
            self.decoder.receive_data(data)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.connection.stream)


class ControllerClient:
    """See the module. ``addresses``: the controllers, HOST:PORT strings or (host, port)."""

    def __init__(self, addresses, *, secret: bytes | None = None, ssl_context=None,
                 config: ControllerClientConfig | None = None) -> None:  # fmt: skip
        self.addresses: list[str] = [a if isinstance(a, str) else format_address(a) for a in addresses]
        if not self.addresses:
            raise ValueError("no controller address given")
        for address in self.addresses:
            parse_address(address)
        self.secret = secret
        self.ssl_context = ssl_context
        self.config = (config or ControllerClientConfig()).validate()
        self.leader: str | None = None  # the controller believed to lead (None: unknown)
        self._idle: dict[str, list[_Link]] = {}
        self._request_ids = itertools.count(1)
        self.calls_failed = 0  # ControllerUnavailable raised (STATUS)
        self.leader_changes = 0  # times a call found the leader elsewhere than believed

    # -- the calls -----------------------------------------------------------------------

    async def register(self, *, group: str, identity: str, client_address: str, ha_address: str) -> cp.Answer:
        return (await self.call(cp.RegisterRequest(group, identity, client_address, ha_address)))[0]

    async def heartbeat(self, *, group: str, broker_id: int, epoch: int, max_offset: int,
                        lost_tail: int | None = None) -> tuple[cp.Answer, float]:  # fmt: skip
        """(the leader's answer, ``trio.current_time()`` when its request was sent)."""
        return await self.call(cp.HeartbeatRequest(group, broker_id, epoch, max_offset, lost_tail))

    async def alter_sync_state_set(self, *, group: str, master_id: int, epoch: int, sync_state_set_epoch: int,
                                   sync_state_set) -> cp.Answer:  # fmt: skip
        request = cp.AlterSyncStateSetRequest(group, master_id, epoch, sync_state_set_epoch, tuple(sorted(sync_state_set)))
        return (await self.call(request))[0]

    async def elect(self, *, group: str, broker_id: int | None = None) -> cp.Answer:
        return (await self.call(cp.ElectRequest(group, broker_id)))[0]

    async def status(self) -> cp.Answer:
        """The controller leader's STATUS."""
        return (await self.call(cp.StatusRequest()))[0]

    async def status_of(self, address: str) -> cp.Answer:
        """STATUS of the controller at ``address``, leader or not (``hasvc status ADDRESS``)."""
        with trio.fail_after(self.config.connect_timeout_seconds + self.config.request_timeout_seconds):
            answer, _ = await self._ask(address, cp.StatusRequest())
        return answer

    async def ask(self, address: str, request: cp.Request) -> cp.Answer:
        """``request`` answered by the controller at ``address``, leader or not (a controller
        fetching another's snapshot: SNAPSHOT); no timeout of its own (the caller's)."""
        answer, _sent_at = await self._ask(address, request)
        return answer

    async def call(self, request: cp.Request) -> tuple[cp.Answer, float]:
        """``request`` answered by the controller leader: (answer, when the request was sent).
        Raises ControllerUnavailable (see the module)."""
        config = self.config
        heard: dict[str, str] = {}  # address -> what it said last (for the error)
        with trio.move_on_after(config.call_timeout_seconds):
            while True:
                target = self.leader or self.addresses[0]
                tried: set[str] = set()
                while target is not None and target not in tried:
                    tried.add(target)
                    try:
                        with trio.fail_after(config.connect_timeout_seconds + config.request_timeout_seconds):
                            answer, sent_at = await self._ask(target, request)
                    except (OSError, EOFError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                            transport.AuthenticationError, wire.ProtocolError) as error:  # fmt: skip
                        heard[target] = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                        target = self._next_after(target, tried)
                        continue
                    if answer.status != cp.STATUS_NOT_LEADER:
                        if self.leader != target:
                            self.leader_changes += int(self.leader is not None)
                            LOGGER.info("controller leader: %s (was %s)", target, self.leader or "unknown")
                            self.leader = target
                        return answer, sent_at
                    heard[target] = f"not the leader ({answer.reason})"
                    hint = answer.leader
                    if hint is not None and hint not in self.addresses and len(self.addresses) < ADDRESSES_MAX:
                        self.addresses.append(hint)
                    target = hint if hint is not None and hint not in tried else self._next_after(target, tried)
                self.leader = None
                await trio.sleep(config.leader_retry_pause_seconds)
        self.calls_failed += 1
        said = "; ".join(f"{address}: {what}" for address, what in heard.items()) or "no answer"
        raise ControllerUnavailable(f"no controller leader answered {cp.KIND_NAMES[request.KIND]} within "
                                    f"{config.call_timeout_seconds} s (call_timeout_seconds): {said}")  # fmt: skip

    def _next_after(self, address: str, tried: set[str]) -> str | None:
        """The next address in the list after ``address`` not tried in this round (None: all were)."""
        start = self.addresses.index(address) + 1 if address in self.addresses else 0
        for candidate in self.addresses[start:] + self.addresses[:start]:
            if candidate not in tried:
                return candidate
        return None

    async def _ask(self, address: str, request: cp.Request) -> tuple[cp.Answer, float]:
        """One request on a connection to ``address`` (an idle one, or a new one); the
        connection goes back to the idle ones only after a whole answer."""
        link = await self._take_link(address)
        request_id = next(self._request_ids) & cp.REQUEST_ID_MAX
        try:
            sent_at = trio.current_time()
            answer = await link.call(request_id, request)
        except BaseException:
            with trio.CancelScope(shield=True):
                await link.aclose()
            raise
        idle = self._idle.setdefault(address, [])
        if len(idle) < self.config.connections_per_controller_max:
            idle.append(link)
        else:
            await link.aclose()
        return answer, sent_at

    async def _take_link(self, address: str) -> _Link:
        idle = self._idle.get(address)
        if idle:
            return idle.pop()
        connection = await transport.connect(parse_address(address), ssl_context=self.ssl_context)
        try:
            await transport.client_preface(connection, port_kind=wire.PORT_KIND_CONTROLLER, secret=self.secret)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(connection.stream)
            raise
        return _Link(connection)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for links in idle.values():
            for link in links:
                await link.aclose()


def parse_controllers(text: str) -> list[str]:
    """``H:P,H:P,H:P`` (``--controllers``) -> the addresses, each checked; ValueError naming a bad one."""
    addresses = [part.strip() for part in text.split(",") if part.strip()]
    if not addresses:
        raise ValueError("--controllers names no controller")
    for address in addresses:
        parse_address(address)
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"--controllers names a controller twice: {text!r}")
    return addresses

