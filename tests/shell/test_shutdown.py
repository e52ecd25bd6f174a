"""SIGTERM and SIGINT end the proxy cleanly in every mode, answer nothing falsely, orphan nothing.

Real signals go to a real ``acp-proxy run`` process, and the test waits for it to exit (within
``harness.TIMEOUT``). Then: its exit status is the documented one; a request the Agent had not
answered got no answer from the proxy (the Client sees its connection end: stdout EOF, WebSocket
close 1001, the end of its SSE stream; a pending HTTP ``initialize`` gets 503); and no process
of the Agent command is left (found by a marker in its argv, in ``/proc``), also for an Agent
that ignores SIGTERM and EOF, and for one that started a child of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from harness import RAW_AGENT, TIMEOUT, ProxyProcess, log_events, notification, raw_agent, request
from peers.sdk_remote_client import run_sdk_http_agent
from peers.stalling import ScriptedHttpAgent
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from proxy.control import ControlClient

SIGNALS = [signal.SIGTERM, signal.SIGINT]
READY = {"jsonrpc": "2.0", "method": "_x/ready"}
STUBBORN = (
    "import json, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    f"print(json.dumps({READY!r}), flush=True)\n"
    "for line in sys.stdin: pass\n"
    "time.sleep(600)\n"
)
"""An Agent that ignores SIGTERM, SIGINT and the end of its stdin; it says READY once it
ignores them."""
INITIALIZE = {"protocolVersion": 2, "capabilities": {}}


def processes_with(marker: str, *, but: int | None = None) -> list[int]:
    """Processes (not zombies, not ``but``) whose command line holds ``marker``, from ``/proc``
    (the proxy's own command line holds its Agent's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in argv and state != "Z" and int(entry.name) != but:
            found.append(int(entry.name))
    return found


@pytest.fixture
def marker() -> Iterator[str]:
    """A word put in the Agent's argv, to find its processes (killed at the end if any are
    left, so that a failing test leaves nothing running)."""
    word = f"agent-{uuid.uuid4().hex}"
    yield word
    for pid in processes_with(word):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def start(
    proxies: list[ProxyProcess], agent: list[str], *options: str
) -> tuple[ProxyProcess, str | None]:
    """Start a proxy (JSON logs); its listening URL, if it listens."""
    proxy = await ProxyProcess.start(agent, "--log-format", "json", *options)
    proxies.append(proxy)
    url = None
    if "--listen" in options:
        url = str((await proxy.logged("listening"))["url"])
    return proxy, url


def hanging_agent(tmp_path: Path, marker: str) -> list[str]:
    """The raw Agent, leaving ``_x/hang`` requests unanswered; ``marker`` in its argv."""
    return raw_agent(tmp_path / f"{marker}.jsonl", "--no-answer", "_x/hang")


async def ask(connection: ClientConnection, number: int) -> None:
    """A request the Agent answers."""
    await connection.send(request(number, "_x/ping").decode())
    async with asyncio.timeout(TIMEOUT):
        assert json.loads(await connection.recv())["id"] == number


async def rest_then_close_code(connection: ClientConnection) -> tuple[list[Any], int | None]:
    """What the proxy still sends, then the close code, once it closes ``connection``."""
    rest = []
    async with asyncio.timeout(TIMEOUT):
        try:
            while True:
                rest.append(json.loads(await connection.recv()))
        except websockets.ConnectionClosed as closed:
            return rest, closed.rcvd.code if closed.rcvd is not None else None


# -- stdio ---------------------------------------------------------------------------------------


def _ignore_signals() -> None:
    """In the proxy's process before it runs: SIGINT and SIGTERM ignored, as a shell's
    background job (``acp-proxy run ... &``) starts with SIGINT ignored."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
async def test_stdio_signal_reaches_the_agent_and_nothing_is_answered_falsely(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str, signum: int, inherited: str
) -> None:
    """The Agent gets the signal and dies of it; the proxy exits with its status (128+N), the
    pending request is left unanswered (stdout simply ends), and no Agent process is left. So
    too when the proxy was started with the signals ignored: the Agent does not inherit that."""
    preexec_fn = _ignore_signals if inherited == "ignored" else None
    agent = hanging_agent(tmp_path, marker)
    proxy = await ProxyProcess.start(agent, "--log-format", "json", preexec_fn=preexec_fn)
    proxies.append(proxy)
    await proxy.send(request("pending", "_x/hang"), request("ping", "_x/ping"))
    assert json.loads(await proxy.recv())["id"] == "ping"  # so "pending" reached the Agent
    proxy.process.send_signal(signum)
    assert await proxy.wait() == 128 + signum
    assert await proxy.at_eof()  # not one more line: no answer to "pending"
    assert processes_with(marker) == []
    [gone] = [e for e in log_events(proxy.stderr, "peer disconnected") if e["side"] == "agent"]
    assert gone["abandoned_requests"] == 1


SIGNALLED = (
    "import json, signal, sys\n"
    "def on_signal(signum, frame):\n"
    "    print(json.dumps({'jsonrpc': '2.0', 'method': '_x/signalled'}), flush=True)\n"
    "signal.signal(signal.SIGTERM, on_signal)\n"
    "print(json.dumps({'jsonrpc': '2.0', 'method': '_x/ready'}), flush=True)\n"
    "for line in sys.stdin:\n"
    "    message = json.loads(line)\n"
    "    print(json.dumps({'jsonrpc': '2.0', 'id': message['id'], 'result': {}}), flush=True)\n"
    "    sys.exit(3)\n"
    "sys.exit(0)\n"
)
"""An Agent that, signalled, says so and finishes its work: it answers the next request, then
exits 3 (0 at the end of its stdin)."""


async def test_stdio_agent_signalled_finishes_its_work_before_its_stdin_closes(
    proxies: list[ProxyProcess], marker: str
) -> None:
    """A signal passed to the Agent is not raced by the end of its stdin: an Agent that handles
    it still reads what the Client sends within its grace, answers, and its status is the
    proxy's."""
    agent = [sys.executable, "-c", SIGNALLED, marker]
    proxy, _ = await start(proxies, agent, "--agent-grace", str(TIMEOUT))
    assert await proxy.recv_json() == READY
    proxy.process.send_signal(signal.SIGTERM)
    assert await proxy.recv_json() == {"jsonrpc": "2.0", "method": "_x/signalled"}
    await proxy.send(request("last", "_x/work"))
    assert await proxy.recv_json() == {"jsonrpc": "2.0", "id": "last", "result": {}}
    assert await proxy.wait() == 3


async def test_stdio_agent_ignoring_signals_and_eof_is_killed(
    proxies: list[ProxyProcess], marker: str
) -> None:
    """An Agent that ignores SIGTERM, SIGINT and EOF: stdin closed, then SIGTERM after the
    grace period, then SIGKILL; the proxy exits 137 and the Agent is gone."""
    agent = [sys.executable, "-c", STUBBORN, marker]
    proxy, _ = await start(proxies, agent, "--agent-grace", "0.2")
    assert await proxy.recv_json() == READY
    await proxy.send(request(1, "_x/ping"))  # it reads, never answers
    proxy.process.send_signal(signal.SIGTERM)
    assert await proxy.wait() == 128 + signal.SIGKILL
    assert processes_with(marker) == []
    signalled = log_events(proxy.stderr, "agent did not exit in time; signalling it")
    assert [event["signal"] for event in signalled] == ["SIGTERM", "SIGKILL"]


def with_a_child(tmp_path: Path, marker: str) -> list[str]:
    """The raw Agent, started by a shell that first starts a long-lived child (``marker`` in
    its argv, and only there) that inherits the Agent's stdout, in the Agent's process group."""
    half = len(marker) // 2
    split = f"{marker[:half]}''{marker[half:]}"  # whole once the shell has joined it
    child = f"{sys.executable} -c 'import time; time.sleep(600)' {split} &"
    script = f'{child} exec "$0" "$@"'
    return ["sh", "-c", script, sys.executable, str(RAW_AGENT), str(tmp_path / "saw.jsonl")]


async def test_stdio_signal_stops_what_the_agent_started(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str
) -> None:
    """A child the Agent started (holding its stdout) is stopped with it: the proxy exits and
    leaves nothing behind."""
    proxy, _ = await start(proxies, with_a_child(tmp_path, marker))
    await proxy.send(request(1, "_x/ping"))
    assert json.loads(await proxy.recv())["id"] == 1
    assert len(processes_with(marker)) == 1  # the child
    proxy.process.send_signal(signal.SIGTERM)
    assert await proxy.wait() == 128 + signal.SIGTERM
    assert processes_with(marker) == []


async def test_an_agent_exiting_with_a_child_left_still_ends_the_proxy(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str
) -> None:
    """The Agent exits by itself, its child still holding its stdout: the child is stopped,
    the Client's stdout ends and the proxy exits with the Agent's status."""
    proxy, _ = await start(proxies, with_a_child(tmp_path, marker), "--agent-grace", "0.2")
    await proxy.send(request(1, "_x/ping"))
    assert json.loads(await proxy.recv())["id"] == 1
    await proxy.send(notification("_test/exit", {"code": 3}))
    assert await proxy.at_eof()
    assert await proxy.wait() == 3
    assert processes_with(marker) == []
    assert log_events(
        proxy.stderr, "the agent exited and left processes in its group; signalling them"
    )


async def test_stdio_with_a_network_agent_exits_0_on_a_signal(
    proxies: list[ProxyProcess],
) -> None:
    """A stdio Client in front of an HTTP Agent: SIGTERM closes the Agent's connection (DELETE),
    stdout ends, and the proxy exits 0 (a requested stop, not a lost connection)."""
    async with ScriptedHttpAgent() as agent:
        proxy, _ = await start(proxies, [], "--upstream", agent.url)
        await proxy.send(request("init", "initialize", INITIALIZE))
        assert (await proxy.recv_json())["id"] == "init"
        proxy.process.send_signal(signal.SIGTERM)
        assert await proxy.wait() == 0
        assert await proxy.at_eof()
        assert agent.deletes == 1


# -- network listeners ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def http_client(url: str, number: int) -> AsyncIterator[aiohttp.ClientResponse]:
    """A Streamable HTTP Client that initialized, opened its stream and POSTed ``_x/hang``."""
    async with aiohttp.ClientSession() as http:
        body = request(f"init-{number}", "initialize", INITIALIZE)
        json_type = {"Content-Type": "application/json"}
        async with http.post(url, data=body, headers=json_type) as answer:
            assert answer.status == 200
            connection = {"Acp-Connection-Id": answer.headers["Acp-Connection-Id"]}
        stream = {"Accept": "text/event-stream", **connection}
        async with http.get(url, headers=stream) as events:
            hang = request(f"pending-{number}", "_x/hang")
            async with http.post(url, data=hang, headers={**json_type, **connection}) as posted:
                assert posted.status == 202
            yield events


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
async def test_network_signal_ends_every_link_and_answers_nothing_falsely(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str, signum: int
) -> None:
    """WebSocket and HTTP Clients with requests pending: the proxy exits 0, each WebSocket is
    closed with 1001 (going away) and each SSE stream ends, without an answer to the pending
    requests; every Agent is stopped."""
    listen = "http://127.0.0.1:0/acp"
    proxy, url = await start(proxies, hanging_agent(tmp_path, marker), "--listen", listen)
    assert url is not None
    ws_url = url.replace("http://", "ws://", 1)
    async with contextlib.AsyncExitStack() as stack:
        sockets = [await stack.enter_async_context(ws_connect(ws_url)) for _ in range(5)]
        for number, connection in enumerate(sockets):
            await connection.send(request(f"pending-{number}", "_x/hang").decode())
            await ask(connection, number)  # answered after the pending one reached the Agent
        streams = [await stack.enter_async_context(http_client(url, n)) for n in range(2)]
        assert len(processes_with(marker, but=proxy.process.pid)) == 7
        proxy.process.send_signal(signum)
        assert await proxy.wait() == 0
        for connection in sockets:
            assert await rest_then_close_code(connection) == ([], 1001)
        for events in streams:
            async with asyncio.timeout(TIMEOUT):
                assert b"pending" not in await events.read()
    assert processes_with(marker) == []
    assert len(log_events(proxy.stderr, "link ended")) == 7


@pytest.mark.parametrize("upstream", ["ws", "http"])
async def test_network_agent_connections_are_closed_on_shutdown(
    proxies: list[ProxyProcess], upstream: str
) -> None:
    """With a network Agent: SIGTERM closes the Agent's connection (an HTTP Agent gets its
    DELETE), the Client's WebSocket is closed with 1001, and the proxy exits 0."""
    async with contextlib.AsyncExitStack() as stack:
        if upstream == "http":
            http_agent = await stack.enter_async_context(ScriptedHttpAgent())
            agent_url = http_agent.url
        else:
            agent_url = (await stack.enter_async_context(run_sdk_http_agent())).ws_url
        listen = "ws://127.0.0.1:0/acp"
        proxy, url = await start(proxies, [], "--listen", listen, "--upstream", agent_url)
        assert url is not None
        async with ws_connect(url) as connection:
            await connection.send(request("init", "initialize", INITIALIZE).decode())
            async with asyncio.timeout(TIMEOUT):
                assert json.loads(await connection.recv())["id"] == "init"  # a result or an error
            proxy.process.send_signal(signal.SIGTERM)
            assert await proxy.wait() == 0
            assert await rest_then_close_code(connection) == ([], 1001)
        if upstream == "http":
            assert http_agent.deletes == 1


async def test_conductor_mode_shutdown_stops_the_kept_agent(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str
) -> None:
    """--keep-upstream: the Agent kept for the next Client is stopped at SIGTERM."""
    listen = "ws://127.0.0.1:0/acp"
    agent = hanging_agent(tmp_path, marker)
    proxy, url = await start(proxies, agent, "--listen", listen, "--keep-upstream")
    assert url is not None
    async with ws_connect(url) as connection:
        await ask(connection, 1)
    await proxy.logged("client gone; keeping the agent connection for the next client")
    assert len(processes_with(marker, but=proxy.process.pid)) == 1
    proxy.process.send_signal(signal.SIGTERM)
    assert await proxy.wait() == 0
    assert processes_with(marker) == []
    assert log_events(proxy.stderr, "link ended")


async def test_a_pending_http_initialize_gets_503_at_shutdown(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str
) -> None:
    """An initialize POST the Agent has not answered: 503 with a JSON-RPC error for its id,
    "the proxy is shutting down", never a made-up answer."""
    agent = raw_agent(tmp_path / f"{marker}.jsonl", "--no-answer", "initialize")
    listen = "http://127.0.0.1:0/acp"
    proxy, url = await start(proxies, agent, "--listen", listen, "--log-level", "debug")
    assert url is not None
    async with aiohttp.ClientSession() as http:
        body = request("init", "initialize", INITIALIZE)
        posted = asyncio.get_running_loop().create_task(
            http.post(url, data=body, headers={"Content-Type": "application/json"})
        )
        await proxy.logged("relayed")  # the initialize reached the Agent
        proxy.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            answer = await posted
            assert answer.status == 503
            error = await answer.json()
        assert error["id"] == "init"
        assert error["error"]["message"] == "the proxy is shutting down"
    assert await proxy.wait() == 0
    assert processes_with(marker) == []


async def test_a_signal_during_a_restart_downtime_ends_the_proxy(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str
) -> None:
    """restart_proxy with a long downtime, then SIGTERM: the downtime ends, the listener stays
    down and the proxy exits 0."""
    options = ["--listen", "ws://127.0.0.1:0/acp", "--admin", "127.0.0.1:0"]
    proxy, url = await start(proxies, hanging_agent(tmp_path, marker), *options)
    assert url is not None
    control = ControlClient((await proxy.logged("control API listening"))["url"])
    async with ws_connect(url) as connection:
        await ask(connection, 1)
        await asyncio.wait_for(asyncio.to_thread(control.restart_proxy, 600_000), TIMEOUT)
        assert (await rest_then_close_code(connection))[0] == []
    proxy.process.send_signal(signal.SIGTERM)
    assert await proxy.wait() == 0
    assert len(log_events(proxy.stderr, "listening")) == 1  # never back
    assert processes_with(marker) == []


# -- the control API -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["stdio", "ws"])
async def test_an_event_subscriber_does_not_hold_up_the_shutdown(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str, mode: str
) -> None:
    """An open ``GET /api/events``: SIGTERM ends the proxy with its usual status all the same;
    the stream gets the shutdown's records (each connection closed), then ends cleanly (an SSE
    response cut short would be a payload error)."""
    listen = ["--listen", "ws://127.0.0.1:0/acp"] if mode == "ws" else []
    agent = hanging_agent(tmp_path, marker)
    proxy, url = await start(proxies, agent, "--admin", "127.0.0.1:0", *listen)
    admin = (await proxy.logged("control API listening"))["url"]
    async with aiohttp.ClientSession() as http, http.get(admin + "/api/events") as events:
        assert events.headers["Content-Type"] == "text/event-stream"  # subscribed
        if url is None:
            await proxy.send(request(1, "_x/ping"))
            assert (await proxy.recv_json())["id"] == 1
            proxy.process.send_signal(signal.SIGTERM)
            assert await proxy.wait() == 128 + signal.SIGTERM
        else:
            async with ws_connect(url) as connection:
                await ask(connection, 1)
                proxy.process.send_signal(signal.SIGTERM)
                assert await proxy.wait() == 0
                assert await rest_then_close_code(connection) == ([], 1001)
        async with asyncio.timeout(TIMEOUT):
            stream = await events.read()
    records = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith(b"data: ")]
    closed = [r["side"] for r in records if r["event"] == "connection" and r["state"] == "closed"]
    assert sorted(closed) == ["agent", "client"]
    assert processes_with(marker) == []


async def test_a_control_request_in_flight_does_not_turn_the_stdio_status_into_a_crash(
    proxies: list[ProxyProcess], tmp_path: Path, marker: str
) -> None:
    """A control request whose body never comes is still running when the link has ended; the
    shutdown deadline passing meanwhile cuts nothing more: the proxy exits with the Agent's
    status (143), without a traceback."""
    agent = hanging_agent(tmp_path, marker)
    options = ["--admin", "127.0.0.1:0", "--shutdown-timeout", "0.01"]
    proxy, _ = await start(proxies, agent, *options)
    host, port = (await proxy.logged("control API listening"))["url"][7:].rsplit(":", 1)
    async with asyncio.timeout(TIMEOUT):
        reader, writer = await asyncio.open_connection(host, int(port))
        head = "PUT /api/rules HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
        writer.write(f"{head}Expect: 100-continue\r\n\r\n".encode())
        assert (await reader.readline()).startswith(b"HTTP/1.1 100")  # in the handler, reading
    try:
        proxy.process.send_signal(signal.SIGTERM)
        assert await proxy.wait() == 128 + signal.SIGTERM
    finally:
        writer.close()
    assert "Traceback" not in proxy.stderr
    assert processes_with(marker) == []


# -- when links do not end -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["stdio", "ws"])
async def test_a_second_signal_cuts_at_once(
    proxies: list[ProxyProcess], marker: str, mode: str
) -> None:
    """An Agent that would take minutes to stop (long grace, ignores signals): a second signal
    kills it and ends the proxy at once."""
    agent = [sys.executable, "-c", STUBBORN, marker]
    patience = ["--agent-grace", "600", "--shutdown-timeout", "600"]
    listen = ["--listen", "ws://127.0.0.1:0/acp"] if mode == "ws" else []
    proxy, url = await start(proxies, agent, *patience, *listen)
    if url is not None:
        async with ws_connect(url) as connection:
            async with asyncio.timeout(TIMEOUT):
                assert json.loads(await connection.recv()) == READY
            await stopped_twice(proxy, "shutting down", "cutting every link now")
            assert (await rest_then_close_code(connection))[0] == []
        assert await proxy.wait() == 0
    else:
        assert await proxy.recv_json() == READY
        await stopped_twice(proxy, "passing it to the agent", "cutting the link now")
        assert await proxy.wait() == 128 + signal.SIGKILL
    assert processes_with(marker) == []


@pytest.mark.parametrize("mode", ["stdio", "ws"])
async def test_restarts_during_a_restart_and_during_the_shutdown_are_ignored(
    proxies: list[ProxyProcess], marker: str, mode: str
) -> None:
    """restart_proxy twice at once, then again while the proxy shuts down (its Agent slow to
    stop): each is answered 200 and the ones that cannot be carried out are logged as ignored;
    the shutdown goes on, and a second signal ends the proxy with its usual status, no
    traceback, no Agent left."""
    agent = [sys.executable, "-c", STUBBORN, marker]
    patience = ["--agent-grace", "600", "--shutdown-timeout", "600", "--admin", "127.0.0.1:0"]
    listen = ["--listen", "ws://127.0.0.1:0/acp"] if mode == "ws" else []
    proxy, url = await start(proxies, agent, *patience, *listen)
    control = ControlClient((await proxy.logged("control API listening"))["url"])

    async def restart() -> None:
        await asyncio.wait_for(asyncio.to_thread(control.restart_proxy, 600_000), TIMEOUT)

    if url is not None:
        async with ws_connect(url) as connection:
            async with asyncio.timeout(TIMEOUT):
                assert json.loads(await connection.recv()) == READY
            await restart()
            await restart()  # the first one's downtime runs: this one is ignored
            await proxy.logged("restart ignored: the proxy is shutting down or already restarting")
            proxy.process.send_signal(signal.SIGTERM)
            await proxy.logged("signal received; shutting down")
            await restart()
            await proxy.logged(
                "restart ignored: the proxy is shutting down or already restarting", 2
            )
            proxy.process.send_signal(signal.SIGINT)
        assert await proxy.wait() == 0
    else:
        assert await proxy.recv_json() == READY
        proxy.process.send_signal(signal.SIGTERM)
        await proxy.logged("signal received; passing it to the agent")
        await restart()
        await proxy.logged("restart ignored: the link is shutting down or already restarting")
        proxy.process.send_signal(signal.SIGINT)
        assert await proxy.wait() == 128 + signal.SIGKILL
    assert "Traceback" not in proxy.stderr
    assert processes_with(marker) == []


async def stopped_twice(proxy: ProxyProcess, first: str, second: str) -> None:
    """SIGTERM; once the proxy logged that it stops (``first``), SIGINT, logged as ``second``."""
    proxy.process.send_signal(signal.SIGTERM)
    await proxy.logged(f"signal received; {first}")
    proxy.process.send_signal(signal.SIGINT)
    await proxy.logged(f"second signal received; {second}")


async def test_links_that_do_not_end_in_time_are_cut(
    proxies: list[ProxyProcess], marker: str
) -> None:
    """--shutdown-timeout: links still running then are cut, their Agents killed; exit 0."""
    agent = [sys.executable, "-c", STUBBORN, marker]
    options = ["--agent-grace", "600", "--shutdown-timeout", "0.2"]
    proxy, url = await start(proxies, agent, "--listen", "ws://127.0.0.1:0/acp", *options)
    assert url is not None
    async with ws_connect(url) as connection:
        async with asyncio.timeout(TIMEOUT):
            assert json.loads(await connection.recv()) == READY
        proxy.process.send_signal(signal.SIGTERM)
        assert await proxy.wait() == 0
        assert (await rest_then_close_code(connection))[0] == []
    assert processes_with(marker) == []
    assert log_events(proxy.stderr, "links did not end in time; cutting them")
