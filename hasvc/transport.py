"""trio plumbing shared by the broker, the HA client and the client library.

``Connection`` wraps a trio stream (TCP, or TLS over TCP) with a receive buffer: exact-size reads
for headers, and ``receive_into`` that lands bytes straight in a caller's buffer (the slave's
frame buffer) with ``readv`` when the stream is plain TCP. ``server_preface``/``client_preface``
run the connection preface of ``protocol.wire`` (version and HMAC challenge–response).
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import socket
import ssl

import trio

from hasvc.config import Address
from hasvc.protocol import wire

# TLS contexts and the check of their files live in hasvc/tls.py; named here too, where every
# caller that connects or listens found them.
from hasvc.tls import check_tls_files, client_ssl_context, server_ssl_context, unverified_client_ssl_context  # noqa: F401

LOGGER = logging.getLogger(__name__)
RECEIVE_SIZE = 256 * 1024  # bytes asked of the kernel per receive
# Parts per writev: Linux's IOV_MAX (1024); send_parts copies what lies beyond into one buffer.
WRITEV_PARTS_MAX = 1024
PREFACE_TIMEOUT_SECONDS = 10.0  # a peer that does not finish the preface in time is dropped
# os.splice (Linux): a slave moves frames from its socket to its log through a pipe. The socket
# end must not block (trio's sockets do not); SPLICE_F_MOVE is a hint the kernel may ignore.
SPLICE_AVAILABLE = hasattr(os, "splice") and os.environ.get("HASVC_NO_SPLICE") != "1"
SPLICE_PIPE_SIZE = 1024 * 1024  # pipe-max-size's default; a larger frame moves in pieces of it
SPLICE_FLAGS = (getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)) if SPLICE_AVAILABLE else 0


class AuthenticationError(Exception):
    """The peer refused us, or we refused it, during the preface."""


def is_expected(error: BaseException, expected: tuple[type[BaseException], ...]) -> bool:
    """True when ``error`` (or every leaf of an exception group) is one of ``expected``."""
    if isinstance(error, BaseExceptionGroup):
        return all(is_expected(inner, expected) for inner in error.exceptions)
    return isinstance(error, expected)


def first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def describe(error: BaseException) -> str:
    leaf = first_leaf(error)
    return str(leaf) or type(leaf).__name__


class Connection:
    def __init__(self, stream: trio.abc.Stream, peer: str):
        self.stream = stream
        self.peer = peer
        self._pending = bytearray()
        # The last read from the descriptor took less than it asked: the kernel had nothing more
        # then, so the next receive waits for bytes first instead of reading first. A read that
        # finds nothing (EAGAIN) was one of a master's 11 system calls a put at one writer, and
        # one of a slave's 7: a report, a request or a frame never follows its predecessor at
        # once there. A wait when bytes did arrive meanwhile costs no more than the read would
        # have (trio's registration is level-triggered: the wait returns at the next pass).
        self._drained = False
        self._send_lock = trio.Lock()
        self.bytes_waiting = 0  # what a send_all has yet to hand to the stream (metrics: the peer reads too slowly)
        raw = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._socket = raw
        # ``raw_fileno`` as a function: the standard socket's own fileno (C; trio's wrapper and
        # the property are Python calls, made for every answer with a connection per writer);
        # -1 once closed, as trio's. Call it at each use, never keep its result (``raw_fileno``).
        self.raw_fileno_function = getattr(raw, "_sock", raw).fileno if raw is not None else _no_fileno
        if raw is not None:
            try:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    async def send_all(self, *parts) -> None:
        """Send ``parts`` back to back; safe to call from several tasks."""
        async with self._send_lock:
            waiting = self.bytes_waiting = sum(len(part) for part in parts)
            try:
                for part in parts:
                    if len(part):
                        await self.stream.send_all(part)
                        waiting = self.bytes_waiting = waiting - len(part)
            finally:
                self.bytes_waiting = 0

    async def send_parts(self, parts: list) -> None:
        """Send ``parts`` (bytes or views) back to back, and empty the list: as much as the
        socket takes now with one ``writev`` (``write_now``), the rest copied and sent as
        ``send_all`` does. No part is held across a wait: a part may be a view of a data file's
        mapping, which a truncate may cut (or retention unmap) meanwhile."""
        rest = self.write_now(parts)
        if rest is None:
            rest = b"".join(parts)  # a copy (bytes of each view)
            parts.clear()
        if rest:
            await self.send_all(rest)

    async def send_small(self, data: bytes) -> None:
        """Send a small frame (a slave's report) with one non-blocking write when nothing else
        is being sent on plain TCP, else (or for what the kernel did not take) through
        ``send_all``: trio's send yields to the scheduler after every send, a pass per report."""
        fd = self.raw_fileno
        if fd >= 0 and not self._send_lock.locked():
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        await self.send_all(data)

    def write_now(self, parts: list) -> bytes | None:
        """One non-blocking ``writev`` of ``parts`` (at most WRITEV_PARTS_MAX of them) on plain TCP
        while nothing else is sending; returns a copy of what the socket did not take (b"" when
        it took everything) and empties ``parts``. None, ``parts`` untouched: it cannot write now
        (TLS, closed, or a send in progress). OSError (a broken connection) goes to the caller."""
        if not parts:
            return b"" if self.raw_fileno >= 0 and not self._send_lock.locked() else None
        try:
            sent = self.writev_now(parts)
        except OSError:
            parts.clear()
            raise
        if sent is None:
            return None
        try:
            remainder = []
            for part in parts:
                if sent >= len(part):
                    sent -= len(part)
                    continue
                remainder.append(part[sent:] if sent else part)
                sent = 0
            return b"".join(remainder)
        finally:
            parts.clear()

    def writev_now(self, parts: list) -> int | None:
        """``write_now`` without the copy: one non-blocking ``writev`` of ``parts`` (at most
        WRITEV_PARTS_MAX of them), the bytes it sent (0 when the socket took nothing); ``parts``
        untouched: what to do with the rest is the caller's. None: it cannot write now (TLS,
        closed, or a send in progress). OSError (a broken connection) goes to the caller."""
        fd = self.raw_fileno
        if fd < 0 or self._send_lock.locked():
            return None
        try:
            return os.writev(fd, parts[:WRITEV_PARTS_MAX])
        except BlockingIOError:
            return 0

    @property
    def sending(self) -> bool:
        """Whether a ``send_all`` (or ``send_file``) is in progress: a write from elsewhere now
        would land in the middle of its bytes."""
        return self._send_lock.locked()

    @property
    def raw_fileno(self) -> int:
        """The socket's descriptor on plain TCP (bytes written to it go out as they are), -1
        under TLS or once the connection is closed. Look it up at each use: a closed socket's
        number is soon given to the next one opened or accepted."""
        return self.raw_fileno_function()

    @property
    def can_send_file(self) -> bool:
        """Plain TCP: ``send_file`` can hand file bytes to the kernel (``os.sendfile``)."""
        return self._socket is not None

    def send_file_now(self, header: bytes, fd: int, position: int, size: int) -> tuple[bytes, int]:
        """``send_file`` as far as the socket takes it without waiting, while nothing else is
        sending (plain TCP only): one ``write`` of ``header``, then ``os.sendfile`` until done or
        the socket is full. Returns what is left to send with ``send_file``: the unsent end of the
        header (b"" once it went whole) and the file position to go on from (``position + size``
        when everything went). Nothing is sent, (header, position), while a send is in progress
        or the connection is closed. OSError (a broken connection) goes to the caller. The
        writer task's frames went through ``send_file``: its lock, trio's ``send_all`` for the
        header and a checkpoint, ~2x the Python of the send itself a frame."""
        sock = self._socket
        if sock is None or self._send_lock.locked() or sock.fileno() < 0:
            return header, position
        out = sock.fileno()
        try:
            sent = os.write(out, header)
        except BlockingIOError:
            return header, position
        if sent < len(header):
            return header[sent:], position
        end = position + size
        while position < end:
            try:
                sent = os.sendfile(out, fd, position, end - position)
            except BlockingIOError:
                break
            if sent == 0:
                raise EOFError(f"sendfile to {self.peer}: the file ended at {position}, expected {end}")
            position += sent
        return b"", position

    async def send_file(self, header: bytes, fd: int, position: int, size: int) -> None:
        """Send ``header``, then ``size`` bytes of the file ``fd`` from ``position`` with
        ``os.sendfile``: the bytes go from the page cache to the socket without passing through
        this process (no copy, no page faults on a mapping). Plain TCP only (``can_send_file``)."""
        sock = self._socket
        assert sock is not None
        end = position + size
        async with self._send_lock:
            if header:
                await self.stream.send_all(header)
            while position < end:
                try:
                    sent = os.sendfile(sock.fileno(), fd, position, end - position)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
                    continue
                if sent == 0:
                    raise EOFError(f"sendfile to {self.peer}: the file ended at {position}, expected {end}")
                position += sent

    async def receive_some(self, size_max: int = RECEIVE_SIZE) -> bytes:
        """What has arrived, up to ``size_max`` bytes (b"" at the end of the stream); bytes read
        ahead by an earlier receive first, all of them."""
        if self._pending:
            data, self._pending = bytes(self._pending), bytearray()
            return data
        return await self._receive(size_max)

    async def _receive(self, size_max: int) -> bytes:
        """One receive of at most ``size_max`` bytes. On plain TCP straight from the descriptor,
        waiting only when the kernel has nothing (or had nothing at the last read: ``_drained``):
        trio's stream and socket layers cost ~5-10 us a receive on this 2-core VM, and a master
        receives twice per put. A receive that needs no wait is still a checkpoint, as trio's is."""
        sock = self._socket
        if sock is None:
            return await self.stream.receive_some(size_max)
        # The number is looked up once: a close during a wait below (trio's notify_closing)
        # raises ClosedResourceError from that wait, and nothing else yields before the read.
        fd = sock.fileno()
        if fd < 0:  # closed: trio raises ClosedResourceError
            return await self.stream.receive_some(size_max)
        waited = self._drained
        if waited:
            await trio.lowlevel.wait_readable(fd)  # a checkpoint, before taking bytes
        else:
            await trio.lowlevel.checkpoint_if_cancelled()  # before taking bytes, never after
        while True:
            try:
                data = os.read(fd, size_max)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                waited = True
                continue
            except OSError as error:
                raise trio.BrokenResourceError(f"receive from {self.peer}: {error}") from error
            self._drained = len(data) < size_max
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()  # a yield that cannot lose them
            return data

    def take_buffered(self) -> bytes:
        """What an earlier receive read ahead and nobody took yet (b"" if nothing): a reader that
        goes on with ``receive_now`` must start from these bytes."""
        data, self._pending = bytes(self._pending), bytearray()
        return data

    def receive_now(self, size_max: int = RECEIVE_SIZE) -> bytes | None:
        """One non-blocking receive straight from the descriptor (plain TCP only: ``raw_fileno``
        >= 0 when the caller started): what has arrived, up to ``size_max`` bytes; b"" at the end
        of the stream; None when nothing has. Never waits and never yields: for a caller that
        learnt readiness elsewhere (``ReadinessGroup``)."""
        fd = self._socket.fileno()
        if fd < 0:
            raise trio.ClosedResourceError(f"connection to {self.peer} is closed")
        try:
            return os.read(fd, size_max)
        except BlockingIOError:
            return None
        except OSError as error:
            raise trio.BrokenResourceError(f"receive from {self.peer}: {error}") from error

    async def receive_exactly(self, size: int, *, read_ahead: bool = True) -> bytes:
        """``size`` bytes. Without ``read_ahead`` nothing past them is taken from the kernel: a
        slave reads a frame header so, and the frame's bytes then go straight into its frame
        buffer (reading ahead put a quarter of every 1 MiB frame through five copies)."""
        while len(self._pending) < size:
            wanted = size - len(self._pending)
            data = await self._receive(max(RECEIVE_SIZE, wanted) if read_ahead else wanted)
            if not data:
                raise EOFError(f"{self.peer} closed the connection")
            self._pending += data
        piece = bytes(self._pending[:size])
        del self._pending[:size]
        return piece

    async def receive_head(self, size: int, ahead: memoryview) -> tuple[bytes, int]:
        """``size`` bytes (a frame's header), and in ``ahead`` as many of the bytes that follow
        them as have arrived, up to ``len(ahead)``: returns (the header, how many landed in
        ``ahead``). On plain TCP one ``readv`` into both when the header has not arrived yet: a
        small frame's header and body in one system call, its body straight in the caller's
        buffer. Bytes of the next frame may land in ``ahead`` too: give them back with
        ``unread``. Nothing past ``size + len(ahead)`` bytes is taken from the kernel."""
        pending = self._pending
        if self._socket is None or len(pending) >= size:
            header = await self.receive_exactly(size, read_ahead=False)
            count = min(len(self._pending), len(ahead))
            if count:
                with memoryview(self._pending) as view:
                    ahead[:count] = view[:count]
                del self._pending[:count]
            return header, count
        head = bytearray(size)
        filled = len(pending)
        head[:filled] = pending
        pending.clear()
        with memoryview(head) as view:
            while True:
                rest = view[filled:]
                count = await self._when_readable(lambda fd, rest=rest: os.readv(fd, [rest, ahead]), len(rest) + len(ahead))
                if count >= len(rest):
                    return bytes(head), count - len(rest)
                filled += count

    def unread(self, data) -> None:
        """Give back bytes taken from this connection and not used (``receive_head``'s past the
        frame): the next receive returns them first, before anything still buffered."""
        self._pending[:0] = data

    async def receive_into(self, view: memoryview) -> None:
        """Fill ``view`` completely: buffered bytes first, then ``recv_into`` (plain TCP) or
        copies (TLS)."""
        filled = min(len(self._pending), len(view))
        if filled:
            with memoryview(self._pending) as pending:
                view[:filled] = pending[:filled]
            del self._pending[:filled]
        while filled < len(view):
            if self._socket is not None:
                # Straight from the descriptor, as ``_receive``, but with no yield after an
                # immediate read: the bytes usually came with the header, and the caller's next
                # receive (a header, ``_receive``) is where it yields.
                rest = view[filled:]
                filled += await self._when_readable(lambda fd, rest=rest: os.readv(fd, [rest]), len(rest))
            else:
                data = await self.stream.receive_some(len(view) - filled)
                if not data:
                    raise EOFError(f"{self.peer} closed the connection")
                view[filled : filled + len(data)] = data
                filled += len(data)

    @property
    def can_splice(self) -> bool:
        """``splice_into`` can move the next bytes: plain TCP on Linux with nothing buffered here."""
        return SPLICE_AVAILABLE and self._socket is not None and not self._pending

    async def splice_into(self, pipe_fd: int, size_max: int) -> int:
        """Move what has arrived, at least one byte and at most ``size_max``, from the socket
        into the pipe ``pipe_fd`` with ``os.splice`` (the kernel passes its buffers' pages: no copy
        into this process); waits only when the kernel has nothing. The pipe must have room for
        ``size_max`` bytes. Returns the count; EOFError at the end of the stream. Only when
        ``can_splice``. As ``receive_into``, no yield after an immediate move."""
        assert self.can_splice
        return await self._when_readable(lambda fd: os.splice(fd, pipe_fd, size_max, flags=SPLICE_FLAGS), size_max)

    async def _when_readable(self, move, size_max: int) -> int:
        """``move(fd)``: one non-blocking call that takes at most ``size_max`` bytes from the
        socket's descriptor (plain TCP) and returns how many; retried after ``wait_readable``
        while the kernel has none, and preceded by one when the last read was short
        (``_drained``). EOFError when it returns 0 (the end of the stream)."""
        fd = self._socket.fileno()  # once, as in _receive
        if fd < 0:
            raise trio.ClosedResourceError(f"connection to {self.peer} is closed")
        if self._drained:
            await trio.lowlevel.wait_readable(fd)
        while True:
            try:
                count = move(fd)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError as error:
                raise trio.BrokenResourceError(f"receive from {self.peer}: {error}") from error
            if count == 0:
                raise EOFError(f"{self.peer} closed the connection")
            self._drained = count < size_max
            return count

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def _no_fileno() -> int:
    return -1  # Connection.raw_fileno under TLS


class ReadinessGroup:
    """Many plain TCP sockets waited on by one task. The group is an epoll set of its own,
    level-triggered, each socket registered once (``add``) until it leaves (``discard``);
    ``wait`` asks the set which members are readable and, when none is, waits in trio for the
    set's descriptor alone. A task per socket instead cost a trio wait per receive: a ``read``
    that finds nothing, an ``epoll_ctl`` to arm trio's one-shot registration, a task switch and
    the coroutine chain resumed (~20 us a receive on this VM), where the group pays at most one
    wait per pass over every socket ready in it.

    Members are keyed by descriptor number: a member must be discarded before its socket is
    closed (the number is soon given to another socket). Level-triggered: a member whose bytes
    were not all taken is reported again; one that must not be (it cannot take more now) is
    discarded until it can."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._fileno = self._epoll.fileno()
        self._members: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self._members)

    def add(self, fd: int, member: object) -> None:
        assert fd >= 0 and fd not in self._members, f"descriptor {fd} is already in the group"
        self._epoll.register(fd, select.EPOLLIN)
        self._members[fd] = member

    def discard(self, fd: int) -> None:
        """Remove ``fd`` if it is a member (before its socket closes)."""
        if self._members.pop(fd, None) is None:
            return
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):  # the set is closed already (the port stopping)
            pass

    async def wait(self, *, look_first: bool = True) -> list:
        """The members readable now; a checkpoint. Can return an empty list, and a member
        reported may have nothing left by the time it is read.

        ``look_first``: ask the set before waiting in trio, and wait only when nothing is
        readable: a busy group (a connection streaming batches, many connections) is read again
        after one yield, as a receive that finds bytes is, not after a trio wait (an
        ``epoll_ctl``, trio's ``epoll_wait`` and a second look at the set per pass cost 10-15 %
        at 32-message batches on one connection). Without it (the caller's last pass read one
        request: a lone writer's next one cannot come before its answer) the look would find
        nothing, an ``epoll_wait`` a pass for nothing. With a single member the set is not asked
        at all: that member is the only one it could name (and its read finds out, as the
        look would have)."""
        members = self._members
        if look_first:
            if len(members) == 1:
                await trio.lowlevel.checkpoint()
                return list(members.values())
            events = self._epoll.poll(0, max(1, len(members)))
            if events:
                await trio.lowlevel.checkpoint()  # members may leave (or join) during the yield
                return [member for fd, _events in events if (member := members.get(fd)) is not None]
        await trio.lowlevel.wait_readable(self._fileno)
        if len(members) == 1:
            return list(members.values())
        events = self._epoll.poll(0, max(1, len(members)))
        return [member for fd, _events in events if (member := members.get(fd)) is not None]

    def close(self) -> None:
        self._members.clear()
        self._epoll.close()


class SplicePipe:
    """The pipe a slave's frames pass through between its socket and its log (``splice_into``,
    then ``CommitLog.append_replicated_from_pipe``), enlarged to ``SPLICE_PIPE_SIZE`` where the
    system allows (``/proc/sys/fs/pipe-max-size``, 1 MiB by default) so a 1 MiB frame needs one
    move each way. Empty between moves: each move's bytes are drained before the next."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        try:
            fcntl.fcntl(self.write_fd, fcntl.F_SETPIPE_SZ, SPLICE_PIPE_SIZE)
        except OSError:
            pass  # above pipe-max-size: the default (64 KiB) only costs more moves
        self.size = fcntl.fcntl(self.write_fd, fcntl.F_GETPIPE_SZ)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)

    def __enter__(self) -> SplicePipe:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def peer_name(stream: trio.abc.Stream) -> str:
    try:
        raw = stream.socket if isinstance(stream, trio.SocketStream) else stream.transport_stream.socket
        host, port = raw.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "?"


async def server_preface(connection: Connection, *, port_kind: int, secret: bytes | None) -> None:
    """Greet, check the client's proof, answer with ours. Raises AuthenticationError (after
    telling the client why) when the client is refused."""
    nonce = wire.new_nonce()
    with trio.fail_after(PREFACE_TIMEOUT_SECONDS):
        await connection.send_all(wire.encode_hello(port_kind=port_kind, auth_required=secret is not None, server_nonce=nonce))
        status, client_nonce = wire.check_auth(await connection.receive_exactly(wire.AUTH.size), secret=secret, server_nonce=nonce)
        proof = wire.server_proof(secret, client_nonce, nonce) if status == wire.AUTH_STATUS_OK else wire.ZERO_PROOF
        await connection.send_all(wire.AUTH_OK.pack(status, proof))
    if status != wire.AUTH_STATUS_OK:
        raise AuthenticationError(f"{connection.peer}: {wire.AUTH_STATUS_TEXT[status]}")


class ClientPreface:
    """The client's side of the preface without I/O: ``reply(hello)`` checks the server's HELLO
    and gives the AUTH to send; ``check(auth_ok)`` checks the answer. Both raise
    AuthenticationError. ``client_preface`` drives it on a trio Connection; the proxy's send lane
    on an asyncio transport."""

    def __init__(self, *, peer: str, port_kind: int, secret: bytes | None):
        self.peer, self.port_kind, self.secret = peer, port_kind, secret
        self._client_nonce = self._server_nonce = b""
        self._auth_required = False

    def reply(self, hello: bytes) -> bytes:
        version, server_kind, auth_required, server_nonce = wire.decode_hello(hello)
        if version != wire.PROTOCOL_VERSION:
            raise AuthenticationError(f"{self.peer} speaks protocol version {version}, we speak {wire.PROTOCOL_VERSION}")
        if server_kind != self.port_kind:
            raise AuthenticationError(f"{self.peer}: {wire.AUTH_STATUS_TEXT[wire.AUTH_STATUS_WRONG_PORT]}")
        if self.secret is not None and not auth_required:
            # A server without the secret cannot prove it is one of ours: whoever it is, a slave
            # must not take log bytes from it nor a client send to it (nothing is sent to it).
            raise AuthenticationError(f"{self.peer} requires no secret but we have one: refusing a server that cannot prove it knows the secret")
        self._auth_required, self._server_nonce = auth_required, server_nonce
        self._client_nonce = wire.new_nonce()
        return wire.encode_auth(secret=self.secret, server_nonce=server_nonce, client_nonce=self._client_nonce)

    def check(self, auth_ok: bytes) -> None:
        status, proof = wire.AUTH_OK.unpack(auth_ok)
        if status != wire.AUTH_STATUS_OK:
            raise AuthenticationError(f"{self.peer} refused us: {wire.AUTH_STATUS_TEXT.get(status, status)}")
        if self.secret is not None and proof != wire.server_proof(self.secret, self._client_nonce, self._server_nonce):
            raise AuthenticationError(f"{self.peer} did not prove it knows the secret")
        if self.secret is None and self._auth_required:
            raise AuthenticationError(f"{self.peer} requires a secret")


async def client_preface(connection: Connection, *, port_kind: int, secret: bytes | None) -> None:
    preface = ClientPreface(peer=connection.peer, port_kind=port_kind, secret=secret)
    with trio.fail_after(PREFACE_TIMEOUT_SECONDS):
        await connection.send_all(preface.reply(await connection.receive_exactly(wire.HELLO.size)))
        auth_ok = await connection.receive_exactly(wire.AUTH_OK.size)
    preface.check(auth_ok)


async def connect(address: Address, *, ssl_context: ssl.SSLContext | None = None) -> Connection:
    """A connection to ``address``; OSError if it cannot be made. Under TLS that includes the
    handshake: a peer that resets or closes during it (a member being killed, a listener that
    refused the certificate) raises ConnectionError naming it, as a refused TCP connect does,
    not trio's BrokenResourceError, which callers that connect treat as a failure mid-session."""
    stream = await trio.open_tcp_stream(*address)
    peer = f"{address[0]}:{address[1]}"
    if ssl_context is not None:
        stream = trio.SSLStream(stream, ssl_context, server_hostname=address[0])
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            reason = str(error) or str(error.__cause__ or "") or "the connection broke"
            raise ConnectionError(f"TLS handshake with {peer} failed: {reason}") from error
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise
    return Connection(stream, peer)


async def open_listener(address: Address, *, ssl_context: ssl.SSLContext | None = None):
    listeners = await trio.open_tcp_listeners(address[1], host=address[0])
    listener = listeners[0]
    for extra in listeners[1:]:
        await extra.aclose()
    if ssl_context is not None:
        return trio.SSLListener(listener, ssl_context, https_compatible=False), listener
    return listener, listener


def listener_address(listener: trio.SocketListener) -> Address:
    host, port = listener.socket.getsockname()[:2]
    return host, port


class Watchdog:
    """Ends a connection that has received nothing for ``seconds``: ``run``, a sibling task in
    the connection's nursery, raises TooSlowError, and the receiving task calls ``feed`` after
    each receive (a clock read). A ``fail_after`` per receive had cost a cancel scope, a
    generator and two deadline-heap operations per frame on the replication path."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        # trio's clock itself: its current_time() is trio.current_time(), one Python call where
        # that is three (a slave feeds twice a frame, a master once a report).
        self._clock = trio.lowlevel.current_clock()
        self.fed_at = self._clock.current_time()

    def feed(self) -> None:
        self.fed_at = self._clock.current_time()

    async def run(self) -> None:
        while True:
            await trio.sleep_until(self.fed_at + self.seconds)
            if trio.current_time() - self.fed_at >= self.seconds:
                raise trio.TooSlowError(f"{self.what} for {self.seconds:g} s")


class Notifier:
    """Wakes everyone waiting for "something new" (appended bytes, a moved watermark) at once,
    without polling: each ``notify`` sets the current event and starts a new one."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self, timeout: float) -> None:
        event = self._event
        with trio.move_on_after(timeout):
            await event.wait()
