"""The faults only remote transports have, and conductor mode, asserting what each side saw."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets
from acp import PROTOCOL_VERSION, RequestError
from acp.http.client import AcpHttpStatusError
from acp.schema import TextContentBlock
from aiohttp import web
from harness import SDK_AGENT, TIMEOUT, fault_file, log_events
from listener_client import (
    WS_LISTEN,
    Http,
    compact,
    notification,
    request,
    say,
    serving,
    ws_initialize,
)
from peers.sdk_remote_client import (
    SimpleClient,
    connect_http,
    connect_ws,
    exercise,
    listening_proxy,
    open_session,
    run_sdk_http_agent,
    sdk_client,
    sdk_prompt,
    sdk_state,
    stdio_client,
)
from peers.stalling import NOT_JSON, ScriptedHttpAgent

JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("forward", [False, True])
async def test_http_status_fails_the_post_with_or_without_the_agent_acting(
    tmp_path: Path, forward: bool
) -> None:
    """http_status: the Client's POST fails; with forward the Agent still ran the prompt."""
    faults = fault_file(
        tmp_path,
        {
            "name": "post-fails",
            "when": {"method": "session/prompt", "params": {"prompt": [{"text": "echo lost"}]}},
            "do": {"action": "http_status", "status": 502, "forward": forward},
        },
        seed=1,
    )
    async with listening_proxy(
        "http://127.0.0.1:0/acp", "--faults", str(faults), agent=SDK_AGENT
    ) as (
        proxy,
        url,
    ):
        client = SimpleClient()
        async with connect_http(url, client) as conn:
            session = await open_session(conn)
            with pytest.raises(AcpHttpStatusError) as failed:
                await sdk_prompt(conn, session, "echo lost")
            assert "502" in str(failed.value)
            texts = [p["text"] for p in (await sdk_state(conn))["prompts"]]
            assert ("echo lost" in texts) is forward  # "POST failed but the agent acted"
            assert await sdk_prompt(conn, session, "echo next") == "end_turn"
        [fault] = log_events(proxy.stderr, "fault injected")
        assert (fault["rule"], fault["action"]) == ("post-fails", "http_status")


@pytest.mark.parametrize("attribute", [True, False])
async def test_an_injected_status_says_which_rule_made_it(tmp_path: Path, attribute: bool) -> None:
    """http_status: the failed POST carries ``Acp-Fault`` (the rule and its action, as JSON),
    so that a test can tell it from a real failure; ``attribute: false`` leaves it out, to
    imitate one exactly."""
    faults = fault_file(
        tmp_path,
        {
            "name": "post-fails",
            "when": {"method": "_x/fail"},
            "do": {"action": "http_status", "status": 503, "attribute": attribute},
        },
    )
    async with serving(tmp_path, "--faults", str(faults)) as s:
        connection = await s.http.initialize()
        reply = await s.http.post(request(1, "_x/fail"), connection=connection)
        assert reply.status == 503
        said = reply.headers.get("Acp-Fault")
        if attribute:
            assert said is not None
            assert json.loads(said) == {"rule": "post-fails", "action": "http_status"}
        else:
            assert said is None
        passed = await s.http.post(request(2, "_x/pass"), connection=connection)
        assert passed.status == 202
        assert "Acp-Fault" not in passed.headers


async def test_truncate_over_a_websocket_sends_the_cut_message_then_closes(
    tmp_path: Path,
) -> None:
    """truncate toward a WebSocket Client: one text frame holding the first bytes of the
    message, then the close; what the Agent says after that never comes."""
    faults = fault_file(
        tmp_path,
        {"name": "cut", "when": {"method": "_x/cut"}, "do": {"action": "truncate", "bytes": 25}},
    )
    cut = compact(notification("_x/cut", {"n": 2}))
    async with (
        serving(tmp_path, "--faults", str(faults), listen=WS_LISTEN) as s,
        websockets.connect(s.url) as ws,
    ):
        await ws_initialize(ws)
        await ws.send(compact(say(cut, compact(notification("_x/after")))).decode())
        frame = await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert frame == cut[:25].decode()
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), TIMEOUT)


async def test_stall_and_timeout_over_a_websocket(tmp_path: Path) -> None:
    """Toward a WebSocket Client: a stall holds the message and what follows, then all arrive in
    order; a timeout then holds what follows, and the Client's socket is closed with the rule's
    code, nothing after the stall's last frame arriving."""
    faults = fault_file(
        tmp_path,
        {
            "name": "quiet",
            "when": {"direction": "to_client", "method": "_x/stop"},
            "do": {"action": "stall", "ms": 50},
        },
        {
            "name": "hang-up",
            "when": {"direction": "to_client", "method": "_x/hang"},
            "do": {"action": "timeout", "ms": 50, "side": "client", "close_code": 4008},
        },
    )
    said = [compact(notification(method)) for method in ("_x/before", "_x/stop", "_x/after")]
    lost = [compact(notification(method)) for method in ("_x/hang", "_x/never")]
    async with (
        serving(tmp_path, "--faults", str(faults), listen=WS_LISTEN) as s,
        websockets.connect(s.url) as ws,
    ):
        await ws_initialize(ws)
        await ws.send(compact(say(*said)).decode())
        assert [await asyncio.wait_for(ws.recv(), TIMEOUT) for _ in said] == [
            line.decode() for line in said
        ]
        await ws.send(compact(say(*lost)).decode())
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4008


def in_pieces(name: str, method: str, average_size: int, **when: str) -> dict[str, Any]:
    """A rule that slices the messages of ``method`` in pieces of ``average_size`` bytes."""
    return {
        "name": name,
        "when": {"method": method, **when},
        "do": {"action": "slice", "average_size": average_size},
    }


def unicode_notification(method: str, text: str) -> bytes:
    return json.dumps(
        notification(method, {"text": text}), separators=(",", ":"), ensure_ascii=False
    ).encode()


async def test_slice_toward_a_websocket_client_is_one_message_in_continuation_frames(
    tmp_path: Path,
) -> None:
    """slice toward a WebSocket Client: a text frame, then continuation frames, none cut inside
    a UTF-8 character, reassembled into the message; pieces over 125 and over 65,535 bytes get
    the longer length fields; what follows comes after it, whole."""
    faults = fault_file(
        tmp_path, in_pieces("small", "_x/small", 10), in_pieces("big", "_x/big", 66_000)
    )
    small = unicode_notification("_x/small", "déjà vu €😀 " * 4)
    big = unicode_notification("_x/big", "é" * 50_000)
    after = compact(notification("_x/after"))
    async with (
        serving(tmp_path, "--faults", str(faults), listen=WS_LISTEN) as s,
        websockets.connect(s.url, max_size=None) as ws,
    ):
        await ws_initialize(ws)
        await ws.send(compact(say(small, big, after)).decode())
        async with asyncio.timeout(TIMEOUT):
            for message, frames in ((small, range(10, 20)), (big, [2])):
                fragments = []
                async for fragment in ws.recv_streaming():
                    assert isinstance(fragment, str)  # a text message's frames
                    fragments.append(fragment)
                assert len(fragments) in frames
                assert "".join(fragments) == message.decode()
            assert await ws.recv() == after.decode()


async def test_slice_writes_sse_events_and_the_initialize_answer_in_http_chunks(
    tmp_path: Path,
) -> None:
    """slice toward a Streamable HTTP Client: the answer to initialize comes in chunks (chunked
    transfer coding), an SSE event in HTTP chunks of its own, each whole once reassembled."""
    faults = fault_file(
        tmp_path,
        in_pieces("init", "initialize", 16, kind="response"),
        in_pieces("event", "_x/sliced", 7),
    )
    sliced = unicode_notification("_x/sliced", "€uro " * 8)
    after = compact(notification("_x/after"))
    async with serving(tmp_path, "--faults", str(faults)) as s:
        reply = await s.http.post(request("init", "initialize", {"protocolVersion": 1}))
        assert reply.status == 200
        assert reply.headers["Transfer-Encoding"] == "chunked"
        assert reply.json()["id"] == "init"
        connection = reply.headers["Acp-Connection-Id"]
        headers = {"Acp-Connection-Id": connection, "Accept": "text/event-stream"}
        async with s.http.session.get(s.url, headers=headers) as response:
            assert response.status == 200
            posted = await s.http.post(say(sliced, after), connection=connection)
            assert posted.status == 202
            chunks: list[bytes] = []
            async with asyncio.timeout(TIMEOUT):
                while not b"".join(chunks).endswith(b"\n\n") or len(chunks) < 2:
                    data, _ = await response.content.readchunk()
                    if not data.startswith(b":"):  # not a keep-alive
                        chunks.append(data)
                assert len(chunks) > 5
                assert b"".join(chunks) == b"data: " + sliced + b"\n\n"
                event, _ = await response.content.readchunk()
                assert event == b"data: " + after + b"\n\n"


async def test_slice_toward_an_http_agent_posts_the_body_in_chunks(tmp_path: Path) -> None:
    """slice toward a Streamable HTTP Agent: the POST's body goes in chunks (chunked transfer
    coding), which the Agent reads whole."""
    faults = fault_file(tmp_path, in_pieces("body", "_x/sliced", 5))
    async with (
        ScriptedHttpAgent() as agent,
        listening_proxy(
            "http://127.0.0.1:0/acp", "--faults", str(faults), "--upstream", agent.url
        ) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        http = Http(session, url)
        connection = await http.initialize()
        reply = await http.post(request(1, "_x/sliced", {"pad": "x" * 40}), connection=connection)
        assert reply.status == 202
        await http.post(request(2, "_x/whole"), connection=connection)
        await agent.until_posted(3)
    assert agent.methods == ["initialize", "_x/sliced", "_x/whole"]
    assert agent.post_chunks[0] == agent.post_chunks[2] == 1
    assert agent.post_chunks[1] > 10


@pytest.mark.parametrize("downstream", ["http", "ws"])
async def test_sdk_peers_wait_through_stalls_and_reorders_over_the_network(
    tmp_path: Path, downstream: str
) -> None:
    """stall (the Client's stream quiet 100 ms, then what it held, in order), reorder (a chunk
    behind the answer that followed it) and delay toward an SDK Client over Streamable HTTP
    or WebSocket, and a stall toward the Agent: the SDK on both sides carries on as usual."""
    faults = fault_file(
        tmp_path,
        {
            "name": "quiet-client",
            "when": {"direction": "to_client", "method": "session/update"},
            "schedule": {"nth": [1]},
            "do": {"action": "stall", "ms": 100},
        },
        {
            "name": "late-chunk",
            "when": {"direction": "to_client", "method": "session/update"},
            "schedule": {"nth": [2]},
            "do": {"action": "reorder", "after": 1, "max_ms": 2000},
        },
        {
            "name": "quiet-agent",
            "when": {"direction": "to_agent", "method": "session/prompt"},
            "schedule": {"nth": [2]},
            "do": {"action": "stall", "ms": 100},
        },
    )
    trace = tmp_path / "trace.jsonl"
    client = SimpleClient()
    async with (
        listening_proxy(
            f"{downstream}://127.0.0.1:0/acp",
            "--faults",
            str(faults),
            "--trace",
            str(trace),
            agent=SDK_AGENT,
        ) as (_, url),
        sdk_client(downstream, url, client) as conn,
    ):
        await exercise(conn, client)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    rules = sorted(record["rule"] for record in records if record["event"] == "fault")
    assert rules == ["late-chunk", "quiet-agent", "quiet-client"]


@pytest.mark.parametrize("downstream", ["http", "ws"])
async def test_sdk_client_gets_an_attributed_error_and_its_own_fault_over_the_network(
    tmp_path: Path, downstream: str
) -> None:
    """Over Streamable HTTP and WebSocket, the SDK on both sides: a rule's error reaches the SDK
    Client with ``data.acpFault`` naming the rule; with ``--allow-client-faults`` a prompt whose
    ``_meta.acpFault`` asks for a delay is answered after it, the Agent having run it; the
    prompt that failed never reached the Agent."""
    faults = fault_file(
        tmp_path,
        {
            "name": "refuse-first",
            "when": {"method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "error", "code": -32050, "message": "busy", "data": {"retry": True}},
        },
    )
    client = SimpleClient()
    async with (
        listening_proxy(
            f"{downstream}://127.0.0.1:0/acp",
            "--faults",
            str(faults),
            "--allow-client-faults",
            agent=SDK_AGENT,
        ) as (proxy, url),
        sdk_client(downstream, url, client) as conn,
    ):
        session = await open_session(conn)
        with pytest.raises(RequestError) as raised:
            await sdk_prompt(conn, session, "echo refused")
        assert (raised.value.code, str(raised.value)) == (-32050, "busy")
        assert raised.value.data == {
            "retry": True,
            "acpFault": {"rule": "refuse-first", "action": "error"},
        }
        asked = {"action": "delay", "ms": 50}  # the SDK's extra arguments are the _meta
        answer = await asyncio.wait_for(
            conn.prompt(
                session_id=session,
                prompt=[TextContentBlock(text="echo late")],
                acpFault=asked,
                trace="t-1",
            ),
            TIMEOUT,
        )
        assert answer.stop_reason == "end_turn"
        texts = [p["text"] for p in (await sdk_state(conn))["prompts"]]
        assert texts == ["echo late"]
        await proxy.logged("fault injected", count=2)
        rules = [event["rule"] for event in log_events(proxy.stderr, "fault injected")]
        assert rules == ["refuse-first", "_meta.acpFault"]


ENDING = {
    "truncate": {
        "name": "cut-chunk",
        "when": {"method": "session/update"},
        "do": {"action": "truncate", "bytes": 40},
    },
    "timeout": {
        "name": "hang-up",
        "when": {"method": "session/prompt"},
        "do": {"action": "timeout", "ms": 50, "side": "client"},
    },
}
"""Faults that end the SDK Client's connection during a prompt: ``truncate`` on the chunk toward
it (an SSE event or a frame cut short, which it cannot read, then the cut), ``timeout`` on the
prompt toward the Agent (held, then the Client's connection is cut 50 ms later)."""


@pytest.mark.parametrize("fault", sorted(ENDING))
@pytest.mark.parametrize("downstream", ["http", "ws"])
async def test_a_fault_that_cuts_the_connection_ends_the_sdk_clients_prompt(
    tmp_path: Path, downstream: str, fault: str
) -> None:
    """Over Streamable HTTP or WebSocket (:data:`ENDING`): the SDK Client's pending prompt
    fails with its connection, no text reached it, nothing hangs."""
    rule = ENDING[fault]
    faults = fault_file(tmp_path, rule)
    client = SimpleClient()
    async with listening_proxy(
        f"{downstream}://127.0.0.1:0/acp", "--faults", str(faults), agent=SDK_AGENT
    ) as (proxy, url):
        async with sdk_client(downstream, url, client) as conn:
            session = await open_session(conn)
            with pytest.raises(ConnectionError, match="Connection closed"):
                await asyncio.wait_for(sdk_prompt(conn, session, "echo cut"), TIMEOUT)
        assert client.chunks == []
        [injected] = log_events(proxy.stderr, "fault injected")
        assert injected["rule"] == rule["name"]


async def test_a_sliced_post_may_take_longer_than_the_http_timeout(tmp_path: Path) -> None:
    """slice toward an HTTP Agent: the gaps between the pieces are the fault's, not the Agent's
    slowness: a POST whose pieces take longer than ``--http-timeout`` still goes through."""
    faults = fault_file(
        tmp_path,
        {
            "name": "slow-body",
            "when": {"method": "_x/sliced"},
            "do": {"action": "slice", "average_size": 30, "gap_us": 250_000},
        },
    )
    async with (
        ScriptedHttpAgent() as agent,
        listening_proxy(
            "http://127.0.0.1:0/acp",
            "--faults",
            str(faults),
            "--upstream",
            agent.url,
            "--http-timeout",
            "0.5",
        ) as (proxy, url),
        aiohttp.ClientSession() as session,
    ):
        http = Http(session, url)
        connection = await http.initialize()
        sliced = request(1, "_x/sliced", {"pad": "x" * 60})  # 5 pieces: a second of gaps
        assert (await http.post(sliced, connection=connection)).status == 202
        await agent.until_posted(2)
    assert agent.methods == ["initialize", "_x/sliced"]
    assert agent.post_chunks[1] >= 4
    assert not log_events(proxy.stderr, "POST to the agent timed out")


async def test_a_sever_cuts_a_message_being_written_in_pieces(tmp_path: Path) -> None:
    """A message sliced a minute a piece toward a WebSocket Client: its first frame comes, then
    a sever of the Client (a later message's rule) closes the socket at once, with the rule's
    code: the rest never comes, and nothing waits out the gaps."""
    faults = fault_file(
        tmp_path,
        {
            "name": "slow",
            "when": {"method": "_x/sliced"},
            "do": {"action": "slice", "average_size": 20, "gap_us": 60_000_000},
        },
        {
            "name": "cut",
            "when": {"method": "_x/cut"},
            "do": {"action": "sever", "side": "client", "close_code": 4009},
        },
    )
    sliced = compact(notification("_x/sliced", {"pad": "x" * 40}))
    async with (
        serving(tmp_path, "--faults", str(faults), listen=WS_LISTEN) as s,
        websockets.connect(s.url) as ws,
    ):
        await ws_initialize(ws)
        await ws.send(compact(say(sliced)).decode())
        frames = ws.recv_streaming()
        first = await asyncio.wait_for(anext(frames), TIMEOUT)
        assert first == sliced[:20].decode()
        await ws.send(compact(say(compact(notification("_x/cut")))).decode())
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(anext(frames), TIMEOUT)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4009


async def test_a_sever_cuts_an_sse_event_being_written_in_pieces(tmp_path: Path) -> None:
    """The same toward a Streamable HTTP Client: the event's first chunk comes, then the sever
    cuts the stream at once (the rest of the event never comes)."""
    faults = fault_file(
        tmp_path,
        {
            "name": "slow",
            "when": {"method": "_x/sliced"},
            "do": {"action": "slice", "average_size": 20, "gap_us": 60_000_000},
        },
        {"name": "cut", "when": {"method": "_x/cut"}, "do": {"action": "sever", "side": "client"}},
    )
    sliced = compact(notification("_x/sliced", {"pad": "x" * 40}))
    async with serving(tmp_path, "--faults", str(faults)) as s:
        connection = await s.http.initialize()
        headers = {"Acp-Connection-Id": connection, "Accept": "text/event-stream"}
        async with s.http.session.get(s.url, headers=headers) as response:
            await s.http.post(say(sliced), connection=connection)
            chunks = response.content.iter_chunks()
            async with asyncio.timeout(TIMEOUT):
                first, _ = await anext(chunks)
                assert first == (b"data: " + sliced)[:20]
                await s.http.post(say(compact(notification("_x/cut"))), connection=connection)
                rest = b""
                with contextlib.suppress(aiohttp.ClientPayloadError):
                    async for data, _ in chunks:
                        rest += data
        assert rest == b""  # the stream ended there


async def test_truncate_toward_an_http_agent_posts_the_cut_body_with_its_session(
    tmp_path: Path,
) -> None:
    """truncate toward a Streamable HTTP Agent: the POST's body is the message cut short, and
    its headers are the whole message's (its ``Acp-Session-Id``); then the connection is cut."""
    faults = fault_file(
        tmp_path,
        {"name": "cut", "when": {"method": "_x/cut"}, "do": {"action": "truncate", "bytes": 20}},
    )
    async with (
        ScriptedHttpAgent() as agent,
        listening_proxy(
            "http://127.0.0.1:0/acp", "--faults", str(faults), "--upstream", agent.url
        ) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        http = Http(session, url)
        connection = await http.initialize()
        cut = request(1, "_x/cut", {"sessionId": "S-1", "pad": "x" * 40})
        await http.post(cut, connection=connection, session="S-1")
        await agent.until_posted(2)
    assert agent.methods == ["initialize", NOT_JSON]
    assert agent.posted_sessions == [None, "S-1"]


SHAPING = (
    {
        "name": "pieces-to-agent",
        "when": {"direction": "to_agent"},
        "do": {"action": "slice", "average_size": 24, "size_variation": 16, "gap_us": 200},
        "continue": True,
    },
    {
        "name": "pieces-to-client",
        "when": {"direction": "to_client"},
        "do": {"action": "slice", "average_size": 9, "size_variation": 8, "gap_us": 100},
        "continue": True,
    },
    {
        "name": "slow-updates",
        "when": {"direction": "to_client", "method": "session/update"},
        "do": {"action": "bandwidth", "bytes_per_second": 50_000, "burst_bytes": 200},
    },
)
"""Every message in pieces, both ways, and the updates toward the Client throttled."""


@pytest.mark.parametrize("upstream", ["stdio", "http", "ws"])
@pytest.mark.parametrize("downstream", ["stdio", "http", "ws"])
async def test_sdk_peers_read_every_message_whole_through_slices_and_a_throttle(
    tmp_path: Path, downstream: str, upstream: str
) -> None:
    """slice and bandwidth on every transport, the SDK on both sides: each message is written
    in pieces (partial lines, body and SSE chunks, continuation frames) toward the Agent and
    toward the Client, the updates throttled; the peers' framing takes them whole (initialize,
    sessions, prompts, a permission request, a cancel: :func:`exercise`)."""
    faults = fault_file(tmp_path, *SHAPING, seed=2)
    trace = tmp_path / "trace.jsonl"
    options = ["--faults", str(faults), "--trace", str(trace)]
    client = SimpleClient()
    async with contextlib.AsyncExitStack() as stack:
        agent = None
        if upstream != "stdio":
            served = await stack.enter_async_context(run_sdk_http_agent())
            agent = served.url if upstream == "http" else served.ws_url
        if downstream == "stdio":
            conn = await stack.enter_async_context(stdio_client(agent, client, *options))
        else:
            target = ["--upstream", agent] if agent is not None else []
            _, url = await stack.enter_async_context(
                listening_proxy(
                    f"{downstream}://127.0.0.1:0/acp",
                    *options,
                    *target,
                    agent=None if agent is not None else SDK_AGENT,
                )
            )
            conn = await stack.enter_async_context(sdk_client(downstream, url, client))
        await exercise(conn, client)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    rules = {record["rule"] for record in records if record["event"] == "fault"}
    assert rules == {"pieces-to-agent", "pieces-to-client", "slow-updates"}


def lingering(tmp_path: Path) -> Path:
    """A fault file whose ``_x/linger`` makes the close toward the Client come 300 ms late."""
    return fault_file(
        tmp_path,
        {
            "name": "linger",
            "when": {"method": "_x/linger"},
            "do": {"action": "slow_close", "ms": 300},
        },
    )


async def test_slow_close_closes_a_websocket_client_late(tmp_path: Path) -> None:
    """slow_close toward a WebSocket Client: when the Agent exits, the close frame reaches the
    Client 300 ms later, not at once."""
    faults = lingering(tmp_path)
    linger = compact(notification("_x/linger"))
    async with (
        serving(tmp_path, "--faults", str(faults), listen=WS_LISTEN) as s,
        websockets.connect(s.url) as ws,
    ):
        await ws_initialize(ws)
        await ws.send(compact(say(linger)).decode())
        assert await asyncio.wait_for(ws.recv(), TIMEOUT) == linger.decode()
        exited = asyncio.get_running_loop().time()  # the Agent exits after this, never before
        await ws.send(compact(notification("_test/exit", {"code": 0})).decode())
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert asyncio.get_running_loop().time() - exited >= 0.3


async def test_slow_close_ends_a_streamable_http_clients_stream_late(tmp_path: Path) -> None:
    """slow_close toward a Streamable HTTP Client: when the Agent exits, the Client's event
    stream ends 300 ms later, not at once."""
    faults = lingering(tmp_path)
    linger = compact(notification("_x/linger"))
    async with serving(tmp_path, "--faults", str(faults)) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as stream:
            await s.http.post(say(linger), connection=connection)
            assert await stream.next() == linger
            exited = asyncio.get_running_loop().time()  # the Agent exits after this, not before
            await s.http.post(notification("_test/exit", {"code": 0}), connection=connection)
            await stream.ended()
            assert asyncio.get_running_loop().time() - exited >= 0.3


async def read_events(response: aiohttp.ClientResponse, queue: asyncio.Queue[Any]) -> None:
    """Put each SSE event's JSON on ``queue``; ``None`` at the end of the stream."""
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = [line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")]
                if data:
                    await queue.put(json.loads(b"\n".join(data)))
    except aiohttp.ClientPayloadError:
        pass
    await queue.put(None)


@contextlib.asynccontextmanager
async def sse(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> AsyncIterator[asyncio.Queue[Any]]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    async with http.get(url, headers={"Accept": "text/event-stream", **headers}) as response:
        assert response.status == 200
        reader = asyncio.get_running_loop().create_task(read_events(response, queue))
        try:
            yield queue
        finally:
            reader.cancel()


async def next_event(queue: asyncio.Queue[Any]) -> Any:
    return await asyncio.wait_for(queue.get(), TIMEOUT)


async def test_close_stream_loses_the_message_and_a_new_get_gets_the_rest(tmp_path: Path) -> None:
    """close_stream: the stream carrying the answer dies without it; a new GET gets later ones."""
    faults = fault_file(
        tmp_path,
        {
            "name": "kill-stream",
            "when": {"direction": "to_client", "kind": "response", "method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "close_stream"},
        },
        seed=1,
    )
    async with (
        listening_proxy("http://127.0.0.1:0/acp", "--faults", str(faults), agent=SDK_AGENT) as (
            proxy,
            url,
        ),
        aiohttp.ClientSession() as http,
    ):
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": PROTOCOL_VERSION},
        }
        async with http.post(url, json=init) as response:
            assert response.status == 200
            connection = {"Acp-Connection-Id": response.headers["Acp-Connection-Id"]}
        async with sse(http, url, connection) as events:
            new = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "session/new",
                "params": {"cwd": "/tmp", "mcpServers": []},
            }
            async with http.post(url, json=new, headers=connection) as response:
                assert response.status == 202
            session = (await next_event(events))["result"]["sessionId"]
            scoped = {**connection, "Acp-Session-Id": session}

            def prompt_message(request_id: int, text: str) -> dict[str, Any]:
                return {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "session/prompt",
                    "params": {"sessionId": session, "prompt": [{"type": "text", "text": text}]},
                }

            async with sse(http, url, scoped) as first:
                async with http.post(
                    url, json=prompt_message(2, "echo one"), headers=scoped
                ) as response:
                    assert response.status == 202
                seen = []
                while (event := await next_event(first)) is not None:
                    seen.append(event)
                assert [e.get("id") for e in seen] == [None]  # the update came; the answer died
                assert seen[0]["params"]["update"]["content"]["text"] == "one"
            async with sse(http, url, scoped) as second:
                async with http.post(
                    url, json=prompt_message(3, "echo two"), headers=scoped
                ) as response:
                    assert response.status == 202
                events_seen = [await next_event(second), await next_event(second)]
                assert events_seen[-1]["id"] == 3
                assert events_seen[-1]["result"]["stopReason"] == "end_turn"
        assert [f["action"] for f in log_events(proxy.stderr, "fault injected")] == ["close_stream"]


async def test_sever_closes_a_websocket_with_the_configured_code(tmp_path: Path) -> None:
    """sever on a WebSocket Client: the socket closes with close_code; the prompt never arrives."""
    faults = fault_file(
        tmp_path,
        {
            "name": "cut",
            "when": {"method": "session/prompt"},
            "do": {"action": "sever", "side": "client", "moment": "before", "close_code": 4001},
        },
        seed=1,
    )
    async with (
        listening_proxy("ws://127.0.0.1:0/acp", "--faults", str(faults), agent=SDK_AGENT) as (
            _proxy,
            url,
        ),
        websockets.connect(url, proxy=None) as ws,
    ):
        await ws.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {"protocolVersion": PROTOCOL_VERSION},
                }
            )
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["id"] == 0
        await ws.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "session/prompt",
                    "params": {"sessionId": "S", "prompt": []},
                }
            )
        )
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert ws.close_code == 4001


async def test_restart_proxy_takes_the_listener_down_and_brings_it_back(tmp_path: Path) -> None:
    """restart_proxy: connections closed, a fresh Agent after the downtime, the same port."""
    faults = fault_file(
        tmp_path,
        {
            "name": "restart",
            "when": {"method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "restart_proxy", "downtime_ms": 200},
        },
        seed=1,
    )
    async with listening_proxy(
        "ws://127.0.0.1:0/acp", "--faults", str(faults), agent=SDK_AGENT
    ) as (
        proxy,
        url,
    ):
        client = SimpleClient()
        async with connect_ws(url, client) as conn:
            session = await open_session(conn)
            first_pid = (await sdk_state(conn))["pid"]
            with pytest.raises(ConnectionError):
                await sdk_prompt(conn, session, "echo lost")
        await proxy.logged("listening", count=2)  # back on the same port
        async with connect_ws(url, SimpleClient()) as conn:
            await open_session(conn)
            assert (await sdk_state(conn))["pid"] != first_pid
        assert log_events(proxy.stderr, "listening")[1]["url"] == url


async def test_conductor_mode_keeps_the_agent_for_the_next_client() -> None:
    """--keep-upstream: a reconnecting Client resumes its session in the same Agent process."""
    async with listening_proxy("ws://127.0.0.1:0/acp", "--keep-upstream", agent=SDK_AGENT) as (
        proxy,
        url,
    ):
        first = SimpleClient()
        async with connect_ws(url, first) as conn:
            session = await open_session(conn)
            assert await sdk_prompt(conn, session, "echo before") == "end_turn"
            before = await sdk_state(conn)
        await proxy.logged("client gone; keeping the agent connection for the next client")
        second = SimpleClient()
        async with connect_ws(url, second) as conn:
            init = await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION), TIMEOUT
            )
            assert init.protocol_version == PROTOCOL_VERSION  # answered from the first answer
            assert await sdk_prompt(conn, session, "echo after") == "end_turn"
            after = await sdk_state(conn)
        assert after["pid"] == before["pid"]
        assert [method for _, method in after["requests"]].count("initialize") == 1
        assert (session, "after") in second.chunks
        assert len(log_events(proxy.stderr, "agent started")) == 1


async def test_conductor_mode_after_a_sever() -> None:
    """A Client cut off by sever reconnects, is answered initialize, and prompts its session."""
    # The sever here is the Client's own disconnect without a close handshake.
    async with listening_proxy("http://127.0.0.1:0/acp", "--keep-upstream", agent=SDK_AGENT) as (
        proxy,
        url,
    ):
        ws = await websockets.connect(url.replace("http://", "ws://"), proxy=None)
        await ws.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {"protocolVersion": PROTOCOL_VERSION},
                }
            )
        )
        await asyncio.wait_for(ws.recv(), TIMEOUT)
        await ws.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "session/new",
                    "params": {"cwd": "/tmp", "mcpServers": []},
                }
            )
        )
        session = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["result"]["sessionId"]
        ws.transport.abort()
        await proxy.logged("client gone; keeping the agent connection for the next client")
        client = SimpleClient()
        async with connect_http(url, client) as conn:
            await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), TIMEOUT)
            assert await sdk_prompt(conn, session, "echo resumed") == "end_turn"
        assert (session, "resumed") in client.chunks


async def test_client_auth_headers_reach_a_network_agent() -> None:
    """Authorization and X-* headers of the Client go on to the Agent's connection."""
    seen: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            data = json.loads(message.data)
            await ws.send_str(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": data["id"],
                        "result": {"protocolVersion": PROTOCOL_VERSION},
                    }
                )
            )
        return ws

    app = web.Application()
    app.router.add_get("/acp", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with listening_proxy(
            "ws://127.0.0.1:0/acp", "--upstream", f"ws://127.0.0.1:{port}/acp"
        ) as (_proxy, url):
            headers = {
                "Authorization": "Bearer secret-token",
                "X-Tenant": "t1",
                "Cookie": "route=a",
            }
            async with websockets.connect(url, proxy=None, additional_headers=headers) as ws:
                await ws.send(
                    json.dumps({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}})
                )
                assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["id"] == 7
    finally:
        await runner.cleanup()
    [upstream] = seen
    assert upstream["Authorization"] == "Bearer secret-token"
    assert upstream["X-Tenant"] == "t1"
    assert upstream["Cookie"] == "route=a"
