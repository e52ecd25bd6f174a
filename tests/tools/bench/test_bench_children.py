"""The bench's own processes, each ``python -m proxy.tools.bench.<module>`` with an argument list
of its own (no second command line): the stdio Agent (``agent``), the WebSocket Agent
(``ws_agent``) and the asyncio floor (``relay``)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import pytest
from harness import TIMEOUT
from websockets.asyncio.client import connect

from proxy.tools.bench.ws_driver import BlockingWsPeer

AGENT = [sys.executable, "-m", "proxy.tools.bench.agent"]
RELAY = [sys.executable, "-m", "proxy.tools.bench.relay"]
WS_AGENT = [sys.executable, "-m", "proxy.tools.bench.ws_agent"]
WS_RELAY = [sys.executable, "-m", "proxy.tools.bench.ws_relay"]


def lines(stdin: str, argv: list[str]) -> list[dict[str, object]]:
    """What ``argv`` writes for ``stdin``, one JSON message a line; it must exit 0."""
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


PING = '{"jsonrpc":"2.0","id":2,"method":"_bench/ping","params":{}}'
SCRIPT = "\n".join(
    [
        "not json",
        '{"jsonrpc":"2.0","method":"_bench/noise","params":{}}',
        '{"jsonrpc":"2.0","id":1,"method":"_bench/stream","params":{"count":3}}',
        PING,
    ]
)


@pytest.mark.parametrize(
    "argv",
    [AGENT, [*RELAY, "--", *AGENT], [*RELAY, "--protocol", "--", *AGENT]],
    ids=["agent", "relay", "protocol relay"],
)
def test_the_agent_streams_then_answers_and_ignores_the_rest(argv: list[str]) -> None:
    """``_bench/stream`` writes its N updates, then its answer; any other request is answered
    with its size (its line's, newline included); notifications and garbage get nothing. Through the relay: the same lines."""
    messages = lines(SCRIPT + "\n", argv)
    updates = [m for m in messages if m.get("method") == "session/update"]
    assert [u["params"]["update"]["content"]["text"] for u in updates] == [  # type: ignore[index]
        "chunk 0",
        "chunk 1",
        "chunk 2",
    ]
    answers = [m for m in messages if "id" in m]
    assert answers == [
        {"jsonrpc": "2.0", "id": 1, "result": {"sent": 3}},
        {"jsonrpc": "2.0", "id": 2, "result": {"ok": True, "size": len(PING) + 1}},
    ]
    assert messages[3:] == answers  # the updates came before the stream's answer


@pytest.mark.parametrize("mode", [[], ["--protocol"]], ids=["streams", "protocols"])
def test_the_relay_exits_with_its_commands_status(mode: list[str]) -> None:
    """The relay ends when both directions have, with the command's exit status; a last line
    without its newline is passed on all the same, and a line cut across reads arrives whole."""
    echo = "import sys; sys.stdout.write(sys.stdin.read()); exit(3)"
    done = subprocess.run(
        [*RELAY, *mode, sys.executable, "-c", echo],
        input="a line\n" + "x" * 300_000 + "\nno newline",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert (done.returncode, done.stdout) == (3, "a line\n" + "x" * 300_000 + "\nno newline")


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        ([*AGENT, "--agent"], "usage: python -m proxy.tools.bench.agent"),
        ([*WS_AGENT, "x"], "usage: python -m proxy.tools.bench.ws_agent"),
        (WS_RELAY, "usage: python -m proxy.tools.bench.ws_relay UPSTREAM_URL"),
        ([*WS_RELAY, "ws://a", "ws://b"], "usage: python -m proxy.tools.bench.ws_relay"),
        ([*WS_RELAY, "http://a"], "usage: python -m proxy.tools.bench.ws_relay"),
        (RELAY, "usage: python -m proxy.tools.bench.relay [--protocol] [--] COMMAND"),
        ([*RELAY, "--"], "usage: python -m proxy.tools.bench.relay [--protocol] [--] COMMAND"),
        ([*RELAY, "--protocol"], "usage: python -m proxy.tools.bench.relay [--protocol] [--]"),
    ],
)
def test_a_wrong_argument_list_is_a_usage_line_and_status_2(argv: list[str], usage: str) -> None:
    """The Agents take no arguments, the relay a command, the WebSocket relay one WebSocket URL:
    one line on stderr, exit 2."""
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, check=False, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 2
    assert done.stderr.startswith(usage)
    assert "Traceback" not in done.stderr


async def test_the_websocket_agent_says_where_and_echoes_every_request() -> None:
    """Its URL on stdout; every request on any connection answered with its params echoed."""
    process = await asyncio.create_subprocess_exec(
        *WS_AGENT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(TIMEOUT):
            url = (await process.stdout.readline()).decode().strip()
            assert url.startswith("ws://127.0.0.1:")
            assert url.endswith("/acp")
            async with connect(url) as one, connect(url) as two:
                await one.send('{"jsonrpc":"2.0","method":"_bench/noise","params":{}}')
                for number, link in enumerate((one, two)):
                    request = {"jsonrpc": "2.0", "id": 5, "method": "x", "params": {"n": number}}
                    await link.send(json.dumps(request))
                    answer = json.loads(await link.recv())
                    assert answer == {
                        "jsonrpc": "2.0",
                        "id": 5,
                        "result": {"ok": True, "echo": {"n": number}},
                    }
    finally:
        process.terminate()
        await process.wait()


def test_the_websocket_agent_sends_nothing_after_a_close() -> None:
    """A stream asked for and the WebSocket closed in one write: the Agent reads the request
    after it answered the close, and sends no frame after it (nor fails: a write after its
    half-close would raise in its handler)."""
    from websockets.client import ClientProtocol
    from websockets.frames import Frame
    from websockets.uri import parse_uri

    agent = subprocess.Popen(
        WS_AGENT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert agent.stdout is not None
        url = agent.stdout.readline().decode().strip()
        uri = parse_uri(url)
        protocol = ClientProtocol(uri)
        with socket.create_connection((uri.host, uri.port), timeout=TIMEOUT) as link:
            protocol.send_request(protocol.connect())
            link.sendall(b"".join(protocol.data_to_send()))
            while not protocol.events_received():
                protocol.receive_data(link.recv(1 << 16))
            stream = {"jsonrpc": "2.0", "id": 1, "method": "_bench/stream", "params": {"count": 3}}
            protocol.send_text(json.dumps(stream).encode())
            protocol.send_close()
            link.sendall(b"".join(data for data in protocol.data_to_send() if data))
            while data := link.recv(1 << 16):  # until the Agent closes the connection
                protocol.receive_data(data)
        frames = [event for event in protocol.events_received() if isinstance(event, Frame)]
        # A ping answered on a new connection: the handler of the first has run by then (one
        # event loop serves both, the first's message queued before).
        peer = BlockingWsPeer(url)
        try:
            assert peer.call("_bench/ping", {}) > 0
        finally:
            peer.close()
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=TIMEOUT)
    assert [frame.opcode.name for frame in frames] == ["CLOSE"]
    assert b"Traceback" not in stderr, stderr.decode()
