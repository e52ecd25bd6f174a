"""Fixtures every test folder shares (helpers live in ``tests/support``, on pytest's path)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Controlled, ProxyProcess, Start
from tool_runs import command, session_run

from proxy.control import ControlClient


@pytest.fixture
async def proxies() -> AsyncIterator[list[ProxyProcess]]:
    """Proxy processes a test starts (it appends them); killed at the end if still running."""
    started: list[ProxyProcess] = []
    try:
        yield started
    finally:
        for proxy in started:
            await proxy.stop()


@pytest.fixture
def start(proxies: list[ProxyProcess]) -> Start:
    """Start proxies (JSON logs, for ``ProxyProcess.logged``) in front of Agents; each is
    stopped at the end of the test."""

    async def _start(agent: list[str], *options: str) -> ProxyProcess:
        proxy = await ProxyProcess.start(agent, "--log-format", "json", *options)
        proxies.append(proxy)
        return proxy

    return _start


@pytest.fixture
def controlled(start: Start) -> Controlled:
    """Start proxies with a control API on a free port: each, and a client of its API."""

    async def _start(
        agent: list[str], *options: str, token: str | None = None
    ) -> tuple[ProxyProcess, ControlClient]:
        proxy = await start(agent, "--admin", "127.0.0.1:0", *options)
        url = (await proxy.logged("control API listening"))["url"]
        return proxy, ControlClient(url, token=token)

    return _start


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """The file the scripted raw Agent (``harness.raw_agent``) records every line it reads into."""
    return tmp_path / "agent-saw.jsonl"


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session of the reference Client and Agent, recorded through the proxy (gzip), for the
    replay tests (``tests/tools/replay``)."""
    path = tmp_path_factory.mktemp("record") / "session.jsonl.gz"
    done = session_run(
        "client", "--", *command("run", "--record", str(path), "--", *command("agent"))
    )
    assert done.returncode == 0, done.stderr
    return path
