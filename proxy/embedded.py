"""A proxy running in the background of the current process (the pytest plugin, scripts).

:class:`BackgroundProxy` runs :func:`proxy.shell.app.run_network` on an event loop of its own in a
daemon thread, so that synchronous tests can use it; :meth:`BackgroundProxy.start` returns once
the listener and the control API are bound (port 0 resolved) and :meth:`BackgroundProxy.stop`
shuts everything down, agents included.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

from proxy.shell.app import Ready, RunOptions, run_network
from proxy.shell.server import Address

__all__ = ["BackgroundProxy"]

START_TIMEOUT = 30.0


class BackgroundProxy:
    """``acp-proxy run`` with a network listener, in a thread of this process."""

    def __init__(self, options: RunOptions) -> None:
        if options.listen.scheme == "stdio":
            raise ValueError("a background proxy needs a network listener (http:// or ws://)")
        if options.admin is None:
            options = replace(options, admin=("127.0.0.1", 0))
        self.options = options
        self.ready: Ready | None = None
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="acp-proxy", daemon=True)

    @property
    def url(self) -> str:
        """Where Clients connect."""
        assert self.ready is not None, "start() first"
        return self.ready.listen_url

    @property
    def admin_url(self) -> str:
        """The control API's base URL."""
        assert self.ready is not None, "start() first"
        assert self.ready.admin_url is not None
        return self.ready.admin_url

    def start(self) -> BackgroundProxy:
        """Start serving; returns once bound. Raises what stopped the proxy from starting."""
        self._thread.start()
        if not self._started.wait(START_TIMEOUT):
            raise TimeoutError("the proxy did not start in time")
        if self._error is not None:
            raise RuntimeError(f"the proxy failed to start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        """Close every connection and stop the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT)

    def __enter__(self) -> BackgroundProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def on_ready(ready: Ready) -> None:
            self.ready = ready
            self._started.set()

        await run_network(self.options, stop=self._stop, on_ready=on_ready)


def loopback(scheme: str = "ws") -> Address:
    """A listener address on loopback, port 0."""
    if scheme not in ("http", "ws"):
        raise ValueError("scheme is http or ws")
    return Address("http" if scheme == "http" else "ws", "127.0.0.1", 0, "/acp")
