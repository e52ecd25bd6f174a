"""A failing trace, recording or state file degrades the proxy, never stops it.

Real failures, in a real proxy process: the trace (or the recording) meets a file size limit (``RLIMIT_FSIZE`` set
in the proxy's process, ``SIGXFSZ`` ignored, so that a write past it fails with ``EFBIG``), and
the state file's directory is moved away in the middle of the run (and back). Each time: the
failure is logged once, counted in ``acp_proxy_write_failures_total{file}``, ``/healthz`` says
what is degraded (still 200), and messages go on flowing both ways.
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pytest
from harness import TIMEOUT, ProxyProcess, log_events, request

from proxy.control import ControlClient

P = ParamSpec("P")
T = TypeVar("T")

TRACE_LIMIT = 16 * 1024
"""Bytes the proxy's process may write to one file: the trace's end."""
ECHO_AGENT = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    message = json.loads(line)\n"
    "    if 'id' in message:\n"
    "        print(json.dumps({'jsonrpc': '2.0', 'id': message['id'], 'result': {}}), flush=True)\n"
)
"""An Agent that answers every request and writes no file (the size limit is its too)."""
TRACE_FAILED = "writing the trace failed; tracing stopped"
RECORD_FAILED = "writing the recording failed; recording stopped"
STATE_FAILED = "saving the state failed"


async def off(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """A blocking control call in a thread (the proxy's output keeps being read)."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kwargs), TIMEOUT)


def limit_file_size() -> None:
    """In the proxy's process before exec: files end at TRACE_LIMIT bytes, and writing past
    that is an error (EFBIG), not a signal."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (TRACE_LIMIT, TRACE_LIMIT))


async def exchange(proxy: ProxyProcess, number: int) -> None:
    """A request through the proxy and its answer back."""
    await proxy.send(request(number, "_x/count"))
    answer: dict[str, Any] = await proxy.recv_json()
    assert answer == {"jsonrpc": "2.0", "id": number, "result": {}}


@pytest.mark.parametrize("file", ["trace", "record"])
async def test_a_file_that_cannot_grow_stops_and_the_relay_goes_on(
    proxies: list[ProxyProcess], tmp_path: Path, file: str
) -> None:
    """The trace, or the recording: past the size limit its writes fail; it stops (logged once,
    counted, /healthz degraded), the relay goes on."""
    path = tmp_path / f"{file}.jsonl"
    failed, first = {"trace": (TRACE_FAILED, "event"), "record": (RECORD_FAILED, "format")}[file]
    proxy = await ProxyProcess.start(
        [sys.executable, "-c", ECHO_AGENT],
        *("--log-format", "json", "--admin", "127.0.0.1:0", f"--{file}", str(path)),
        preexec_fn=limit_file_size,
    )
    proxies.append(proxy)
    control = ControlClient((await proxy.logged("control API listening"))["url"])
    assert await off(control.health) == {"status": "ok", "links": 1}
    number = 0
    while not log_events(proxy.stderr, failed):
        number += 1
        assert number < TRACE_LIMIT, f"the {file} never reached its limit"
        await exchange(proxy, number)
    for after in range(number + 1, number + 21):  # messages still flow, both ways
        await exchange(proxy, after)
    [logged] = log_events(proxy.stderr, failed)
    assert logged["level"] == "error"
    assert logged["error"] == "file too large"
    assert logged["path"] == str(path)
    assert await off(control.metric, "acp_proxy_write_failures_total", file=file) == 1
    assert await off(control.metric, "acp_proxy_write_failures_total", file="state") == 0
    assert await off(control.health) == {
        "status": "degraded",
        "links": 1,
        "degraded": {file: "file too large"},
    }
    assert path.stat().st_size <= TRACE_LIMIT
    lines = path.read_bytes().split(b"\n")
    assert first in json.loads(lines[0])
    assert all(json.loads(line) for line in lines[1:-1])  # complete lines; the last may be cut
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    assert "Traceback" not in proxy.stderr


async def test_a_state_file_that_cannot_be_saved_degrades_until_it_can(
    proxies: list[ProxyProcess], tmp_path: Path
) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    state = directory / "state.json"
    faults = tmp_path / "faults.json"
    when = {"direction": "to_agent", "method": "_x/count"}
    rule = {"name": "count", "when": when, "do": {"action": "delay", "ms": 0}}
    faults.write_text(json.dumps({"version": 1, "rules": [rule]}))
    proxy = await ProxyProcess.start(
        [sys.executable, "-c", ECHO_AGENT],
        *("--log-format", "json", "--admin", "127.0.0.1:0"),
        *("--state", str(state), "--faults", str(faults)),
    )
    proxies.append(proxy)
    control = ControlClient((await proxy.logged("control API listening"))["url"])
    await exchange(proxy, 1)
    assert json.loads(state.read_text())["engine"]["rules"]["count"][0] == 1  # matched once
    moved = tmp_path / "moved"
    directory.rename(moved)  # every save fails now: its directory is gone
    for number in (2, 3, 4):
        await exchange(proxy, number)
    [failed] = log_events(proxy.stderr, STATE_FAILED)
    assert failed["error"] == "no such file or directory"
    assert await off(control.metric, "acp_proxy_write_failures_total", file="state") >= 3
    health = await off(control.health)
    assert health["status"] == "degraded"
    assert health["degraded"] == {"state": "no such file or directory"}
    moved.rename(directory)
    await exchange(proxy, 5)
    await proxy.logged("saving the state works again")
    assert await off(control.health) == {"status": "ok", "links": 1}
    assert json.loads(state.read_text())["engine"]["rules"]["count"][0] == 5
    assert len(log_events(proxy.stderr, STATE_FAILED)) == 1
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    assert "Traceback" not in proxy.stderr
