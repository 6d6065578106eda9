"""``BlockingClient``: the connection's methods, blocking, for scripts."""

from __future__ import annotations

import threading

import trio

from commitlog import record as rec
from hasvc.client.connection import Client, connect
from hasvc.client.results import PullResult, SendResult, TransferResult


class BlockingClient:
    """The same methods, blocking, for scripts: a trio loop runs on a private thread."""

    def __init__(self, address: str, secret: bytes | str | None = None, *, tls_ca: str | None = None):
        self._ready = threading.Event()
        self._token = None
        self._client: Client | None = None
        self._error: BaseException | None = None
        self._done: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main, address, secret, tls_ca), daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _main(self, address, secret, tls_ca) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._done = trio.Event()
        try:
            async with connect(address, secret, tls_ca=tls_ca) as client:
                self._client = client
                self._ready.set()
                await self._done.wait()
        except BaseException as error:  # reported to the caller's thread
            self._error = error
            self._ready.set()

    def _call(self, name: str, *args, **kwargs):
        method = getattr(self._client, name)
        return trio.from_thread.run(lambda: method(*args, **kwargs), trio_token=self._token)

    def send(self, *args, **kwargs) -> SendResult:
        return self._call("send", *args, **kwargs)

    def send_batch(self, *args, **kwargs) -> list[SendResult]:
        return self._call("send_batch", *args, **kwargs)

    def pull(self, *args, **kwargs) -> PullResult:
        return self._call("pull", *args, **kwargs)

    def read(self, *args, **kwargs) -> bytes:
        return self._call("read", *args, **kwargs)

    def read_record(self, *args, **kwargs) -> rec.Record:
        return self._call("read_record", *args, **kwargs)

    def status(self) -> dict:
        return self._call("status")

    def promote(self, **kwargs) -> dict:
        return self._call("promote", **kwargs)

    def demote(self, master_ha: str) -> dict:
        return self._call("demote", master_ha)

    def fence(self, reason: str, *, fence: bool = True) -> dict:
        return self._call("fence", reason, fence=fence)

    def transfer_leader(self, target: str) -> TransferResult:
        return self._call("transfer_leader", target)

    def close(self) -> None:
        if self._done is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._done.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
