"""A pytest plugin: a fault-injecting proxy in front of your Agent, controlled from your test.

Installed with the package and registered by its ``pytest11`` entry point (``acp_proxy``), so the
fixtures are there in every project that has ``acp-fault-proxy`` installed (``-p no:acp_proxy``
turns it off). Usage, in your own ``conftest.py`` and tests::

    import sys
    import pytest

    @pytest.fixture
    def acp_proxy_agent():
        return [sys.executable, "my_agent.py"]   # the Agent the proxy spawns (stdio)

    @pytest.mark.asyncio  # a synchronous fixture: an async test needs pytest-asyncio
    async def test_a_lost_prompt_answer_is_survived(acp_proxy):
        # acp_proxy.url: ws://127.0.0.1:PORT/acp; connect your Client to it.
        with acp_proxy.fault(do="drop", when={"kind": "response", "method": "session/prompt"}):
            ...  # the answer to this prompt is lost
        assert acp_proxy.control.metric("acp_proxy_faults_injected_total", action="drop") == 1

Fixtures:

- ``acp_proxy_agent``: override it to return the Agent's argv (a list of strings). Not needed
  when ``acp_proxy_options`` names a network ``upstream``.
- ``acp_proxy_options``: override it to return a dict of extra settings (fields of
  :class:`proxy.shell.app.RunOptions`): ``listen`` (``"ws"``, the default, ``"http"`` or a URL),
  ``upstream`` (``"stdio"`` or a URL), ``faults`` (fault file paths), ``seed``, ``trace`` (a
  path), ``strict``, ``keep_upstream``, ``admin_token``, ``max_message_bytes``, ...
- ``acp_proxy``: a proxy running in this process (a thread of its own) on 127.0.0.1 with a free
  port, its control API on another; a :class:`RunningProxy` with ``url``, ``admin_url``,
  ``control`` (a :class:`proxy.control.ControlClient`), ``fault(...)``, a context manager that
  applies one rule for one ``with`` block, and the client's calls on messages ``hold`` rules
  hold (``held``, ``held_message``, ``wait_held``, ``release_held``, ``drop_held``,
  ``edit_held``). Stopped (Agents too) when the test ends.

:func:`running_proxy` is the same thing for scripts and other test frameworks. The proxy's log
lines go to the current ``sys.stderr`` (pytest shows them with a failing test); the Agent's
stderr is the process's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import pytest

from proxy.control import ControlClient

if TYPE_CHECKING:
    from proxy.embedded import BackgroundProxy
    from proxy.shell.app import RunOptions

__all__ = [
    "RunningProxy",
    "acp_proxy",
    "acp_proxy_agent",
    "acp_proxy_options",
    "run_options",
    "running_proxy",
]

AGENT_MISSING = (
    "the acp_proxy fixture needs the Agent to start: override the acp_proxy_agent fixture to "
    "return its argv, e.g.\n\n"
    "    @pytest.fixture\n"
    "    def acp_proxy_agent():\n"
    '        return [sys.executable, "my_agent.py"]\n\n'
    "(or give acp_proxy_options a network 'upstream')"
)


class RunningProxy:
    """A proxy serving in the background: where to connect, and its control API."""

    def __init__(self, background: BackgroundProxy, token: str | None = None) -> None:
        self.background = background
        """The :class:`proxy.embedded.BackgroundProxy` that runs it."""
        self.control = ControlClient(background.admin_url, token=token)
        """A client of its control API (rules, actions, metrics, events)."""

    @property
    def url(self) -> str:
        """Where Clients connect (``ws://127.0.0.1:PORT/acp`` or ``http://...``)."""
        return self.background.url

    @property
    def admin_url(self) -> str:
        """The control API's base URL (``http://127.0.0.1:PORT``)."""
        return self.background.admin_url

    @property
    def options(self) -> RunOptions:
        """What the proxy was started with (ports as asked: 0)."""
        return self.background.options

    def fault(
        self,
        rule: Mapping[str, Any] | None = None,
        /,
        *,
        name: str | None = None,
        when: Mapping[str, Any] | None = None,
        schedule: Mapping[str, Any] | None = None,
        do: str | Mapping[str, Any] | None = None,
        continue_: bool = False,
    ) -> contextlib.AbstractContextManager[str]:
        """A rule in force for one ``with`` block (see :meth:`ControlClient.fault`)."""
        return self.control.fault(
            rule, name=name, when=when, schedule=schedule, do=do, continue_=continue_
        )

    def held(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The messages ``hold`` rules hold now (see :meth:`ControlClient.held`)."""
        return self.control.held(limit)

    def held_message(self, held_id: int) -> dict[str, Any]:
        """One held message, whole (see :meth:`ControlClient.held_message`)."""
        return self.control.held_message(held_id)

    def release_held(self, held_id: int) -> dict[str, Any]:
        """Let a held message go on (see :meth:`ControlClient.release_held`)."""
        return self.control.release_held(held_id)

    def drop_held(self, held_id: int) -> dict[str, Any]:
        """Drop a held message (see :meth:`ControlClient.drop_held`)."""
        return self.control.drop_held(held_id)

    def edit_held(self, held_id: int, body: Any) -> dict[str, Any]:
        """Let a held message go on as ``body`` (see :meth:`ControlClient.edit_held`)."""
        return self.control.edit_held(held_id, body)

    def wait_held(self, timeout: float | None = None, **match: Any) -> dict[str, Any]:
        """Wait for a message to be held (see :meth:`ControlClient.wait_held`)."""
        return self.control.wait_held(timeout, **match)

    def __repr__(self) -> str:
        return f"RunningProxy(url={self.url!r}, admin_url={self.admin_url!r})"


def run_options(agent: Sequence[str | os.PathLike[str]], **settings: Any) -> RunOptions:
    """:class:`proxy.shell.app.RunOptions` for a background proxy from plain settings.

    ``listen`` is ``"ws"`` (default) or ``"http"`` (on 127.0.0.1, a free port) or a URL;
    ``upstream`` ``"stdio"`` (default) or a URL; paths (``faults``, ``trace``, ``state``) may be
    strings; any other key must be a field of ``RunOptions``.
    """
    # Imported here, not at the top: the plugin loads in every pytest run of the environment.
    from proxy.embedded import loopback  # noqa: PLC0415
    from proxy.shell.app import RunOptions  # noqa: PLC0415
    from proxy.shell.server import parse_address  # noqa: PLC0415

    fields = {field.name for field in dataclasses.fields(RunOptions)} - {"agent_argv"}
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise TypeError(f"unknown proxy options {unknown}; known: {sorted(fields)}")
    listen = settings.pop("listen", "ws")
    if isinstance(listen, str):
        listen = (
            loopback(listen) if listen in ("ws", "http") else parse_address(listen, option="listen")
        )
    settings["listen"] = listen
    upstream = settings.get("upstream")
    if isinstance(upstream, str):
        settings["upstream"] = parse_address(upstream, option="upstream")
    faults = settings.get("faults")
    if isinstance(faults, str | os.PathLike):
        settings["faults"] = (Path(faults),)
    elif faults is not None:
        settings["faults"] = tuple(Path(path) for path in faults)
    for key in ("trace", "state"):
        if isinstance(settings.get(key), str | os.PathLike):
            settings[key] = Path(settings[key])
    return RunOptions(agent_argv=tuple(str(part) for part in agent), **settings)


@contextlib.contextmanager
def running_proxy(
    agent: Sequence[str | os.PathLike[str]] = (), **settings: Any
) -> Iterator[RunningProxy]:
    """A proxy in front of ``agent`` in a background thread (settings: :func:`run_options`).

    Yields once it listens and its control API is bound; stops it (and its Agents) on exit.
    """
    from proxy.embedded import BackgroundProxy  # noqa: PLC0415 (see run_options)
    from proxy.shell.log import configure_logging  # noqa: PLC0415

    options = run_options(agent, **settings)
    configure_logging("console", "info", stream=cast(TextIO, _CurrentStderr()))
    background = BackgroundProxy(options).start()
    try:
        yield RunningProxy(background, token=options.admin_token)
    finally:
        background.stop()


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (pytest swaps it for each test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture
def acp_proxy_agent() -> Sequence[str]:
    """The argv of the Agent the proxy spawns: override this fixture to give yours."""
    pytest.fail(AGENT_MISSING, pytrace=False)


@pytest.fixture
def acp_proxy_options() -> dict[str, Any]:
    """Extra settings of the proxy (see :func:`run_options`): override this fixture to set some."""
    return {}


@pytest.fixture
def acp_proxy(
    request: pytest.FixtureRequest, acp_proxy_options: dict[str, Any]
) -> Iterator[RunningProxy]:
    """A proxy in front of ``acp_proxy_agent``, in this process, on a free port of 127.0.0.1."""
    settings = dict(acp_proxy_options)
    upstream = settings.get("upstream", "stdio")
    agent: Sequence[str] = ()
    if upstream == "stdio" or getattr(upstream, "scheme", None) == "stdio":
        agent = request.getfixturevalue("acp_proxy_agent")
    with running_proxy(agent, **settings) as proxy:
        yield proxy
