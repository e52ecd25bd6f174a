"""Every nasty input of the fuzz corpus thrown at a running proxy, from both peers, on every
transport: the proxy stays up, logs no internal error, and a link (the same one over stdio,
another one on a network listener) still relays a request and its answer. And every nasty fault
file given to ``acp-proxy validate``: located errors, exit status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import invariants
import pytest
from harness import TIMEOUT, ProxyProcess, raw_agent, request, say
from listener_client import serving, ws_initialize, ws_probe
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from proxy.core.faultfile import FaultFileError, parse_fault_file

NASTY = [
    line for message in invariants.nasty_messages() for line in message.split(b"\n") if line.strip()
]
"""Each seed message (and the giants: 100,000 brackets, 600 kB of escapes) as stdio lines."""


AGENT_SAYS_ALL = [say(line) for line in NASTY]
"""Notifications that make the raw Agent write every nasty line to its Client."""


async def answer_among(frames: Callable[[], Awaitable[bytes | str]], id_: str) -> dict[str, Any]:
    """Read past other frames (answers to nasty requests, relayed garbage) to the answer."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            try:
                answer = json.loads(await frames())
            except (ValueError, RecursionError):
                continue
            if isinstance(answer, dict) and answer.get("id") == id_:
                return answer


def assert_no_internal_error(proxy: ProxyProcess) -> None:
    """The proxy is running and never logged an exception."""
    assert proxy.process.returncode is None, proxy.stderr[-3000:]
    assert "Traceback" not in proxy.stderr, proxy.stderr[-3000:]
    assert "internal error" not in proxy.stderr


async def test_stdio_link_survives_every_nasty_line(tmp_path: Path) -> None:
    """Both peers send every nasty line (with a trace written); the link still relays."""
    proxy = await ProxyProcess.start(
        raw_agent(tmp_path / "capture"),
        "--log-format",
        "json",
        "--trace",
        str(tmp_path / "trace.jsonl"),
    )
    try:
        await proxy.send(*NASTY)
        await proxy.send(*AGENT_SAYS_ALL)
        await proxy.send(request("alive", "_test/probe"))
        answer = await answer_among(proxy.recv, "alive")
        assert answer["result"]["method"] == "_test/probe"
        assert_no_internal_error(proxy)
        await proxy.close_stdin()
        assert await proxy.wait() == 0
    finally:
        await proxy.stop()
    assert "Traceback" not in proxy.stderr
    trace = (tmp_path / "trace.jsonl").read_bytes().splitlines()
    assert len(trace) > len(NASTY)
    assert all(isinstance(json.loads(line), dict) for line in trace)


@pytest.mark.parametrize("listen", ["http://127.0.0.1:0/acp", "ws://127.0.0.1:0/acp"])
async def test_a_network_listener_survives_every_nasty_message(tmp_path: Path, listen: str) -> None:
    """Nasty text and binary frames on one WebSocket, nasty POST bodies on one HTTP connection,
    nasty messages from their Agents: the listener answers each POST as documented (never a
    500), stays up, and a new link initializes and relays."""
    async with serving(tmp_path, listen=listen) as s:
        ws_url = s.ws_url() if listen.startswith("http") else s.url
        async with ws_connect(ws_url, proxy=None, max_size=None) as ws:
            await ws_initialize(ws)
            for data in invariants.nasty_messages():
                await ws.send(data, text=True)
                await ws.send(data, text=False)
            for line in AGENT_SAYS_ALL:
                await ws.send(line, text=True)
            await ws.send(request("first-link", "_test/probe"), text=True)
            # The socket may have ended: a Client may refuse a text frame of invalid UTF-8.
            with contextlib.suppress(ConnectionClosed):
                await answer_among(ws.recv, "first-link")
        if listen.startswith("http"):
            connection = await s.http.initialize()
            for data in invariants.nasty_messages():
                reply = await s.http.post(data, connection=connection)
                assert reply.status in (202, 400, 501), reply  # taken, refused, a batch
            for line in AGENT_SAYS_ALL:
                assert (await s.http.post(line, connection=connection)).status == 202
            await s.http.initialize()  # a new HTTP connection
        async with ws_connect(ws_url, proxy=None) as fresh:
            await ws_initialize(fresh)
            await ws_probe(fresh, "second-link")
        assert_no_internal_error(s.proxy)


def test_validate_locates_the_errors_of_every_nasty_fault_file(tmp_path: Path) -> None:
    """``acp-proxy validate`` over every seed fault file: exit 2 with each bad file located,
    never a traceback (deep nesting, 5000 digits, .inf, YAML sets, lone surrogates...)."""
    paths = []
    for name, data in invariants.corpus("faultfiles").items():
        paths.append(tmp_path / name)
        paths[-1].write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "validate", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    for path in paths:
        try:
            parse_fault_file(path.read_text(encoding="utf-8"), str(path))
        except (FaultFileError, UnicodeDecodeError):
            assert f"error: {path}" in done.stderr, path
