"""The network listener, status code by status code (wire brief 1.2 and 1.3), over raw HTTP.

A real proxy process listens on ``127.0.0.1:0`` with a stdio Agent behind it (the scripted
``raw_agent`` or the SDK ``sdk_agent``). The tests speak Streamable HTTP with a bare
``aiohttp.ClientSession`` (so every header is under their control) and WebSocket with the
``websockets`` client, and check the table of the brief as the listener's docstring states it:
415/200/400/404/202/501/413 on POST, 406/200/404/409 on GET, 202/400/404 on DELETE, 426 on a
WebSocket-only listener, SSE framing byte for byte, the WebSocket limits (1009, binary frames) and
backpressure from a Client that stops reading (its SSE stream, or its WebSocket).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from acp import PROTOCOL_VERSION
from aiohttp import WebSocketError, WSMessage, WSMsgType, web
from aiohttp._websocket.reader import WebSocketDataQueue
from aiohttp.base_protocol import BaseProtocol
from harness import TIMEOUT, captured, log_events, raw_agent
from listener_client import (
    CONNECTION_ID,
    EVENT_STREAM,
    HTTP_LISTEN,
    JSON,
    NOTIFICATIONS,
    SESSION_ID,
    SESSION_SCOPED,
    SILENCE,
    WS_LISTEN,
    Http,
    Reply,
    captured_methods,
    compact,
    notification,
    padded,
    request,
    roundtrip,
    say,
    serving,
    small_receive_buffer,
    ws_initialize,
    ws_probe,
    ws_recv,
)
from peers.sdk_agent import big_text
from peers.sdk_remote_client import SimpleClient, connect_http, connect_ws, listening_proxy
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.typing import Origin

from proxy.shell.endpoint import Sliced, bytes_of
from proxy.shell.transports.websocket import (
    UNMASKED,
    Assembled,
    MaskedOnlyReader,
    MaskedOnlyWebSocketResponse,
    WsServerEndpoint,
    _Outbox,
)
from proxy.shell.transports.websocket import connect_ws as connect_agent

# -- POST ------------------------------------------------------------------------------------------


async def test_post_without_json_content_type_is_415(tmp_path: Path) -> None:
    """POST without Content-Type application/json is 415; a charset parameter is fine."""
    async with serving(tmp_path) as s:
        init = request(1, "initialize", {"protocolVersion": 1})
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            assert (await s.http.post(init, content_type=content_type)).status == 415
        connection = await s.http.initialize()
        for content_type in ("text/plain", "application/octet-stream", None):
            reply = await s.http.post(
                request(2, "_test/probe"), connection=connection, content_type=content_type
            )
            assert reply.status == 415, reply
        charset = await s.http.post(
            request(3, "_test/probe"), connection=connection, content_type=f"{JSON}; charset=utf-8"
        )
        assert charset.status == 202, charset


async def test_initialize_answers_200_with_a_new_connection_id_each_time(tmp_path: Path) -> None:
    """initialize: 200, answer under the Client's id, a fresh Acp-Connection-Id every time."""
    async with serving(tmp_path) as s:
        reply = await s.http.post(request("init-\u00e9", "initialize", {"protocolVersion": 1}))
        assert reply.status == 200, reply
        assert reply.headers["Content-Type"].startswith(JSON)
        body = reply.json()
        assert body["id"] == "init-\u00e9"
        assert body["result"]["method"] == "initialize"
        first = reply.headers[CONNECTION_ID]
        assert first

        second = await s.http.initialize(7)
        again = await s.http.post(
            request(8, "initialize", {"protocolVersion": 1}), connection=first
        )
        assert again.status == 200, again
        assert again.json()["id"] == 8
        third = again.headers[CONNECTION_ID]
        assert len({first, second, third}) == 3

        for connection in (first, second, third):  # all three are alive, each its own link
            assert (
                await s.http.post(request(9, "_test/probe"), connection=connection)
            ).status == 202
        assert len(log_events(s.proxy.stderr, "agent started")) == 3


async def test_an_answer_no_parser_reads_reaches_the_stream_of_its_request(
    tmp_path: Path,
) -> None:
    """An Agent's answer with a byte that is not UTF-8 names a pending request: it is routed by
    that id, to its stream, under the Client's id (as a lenient Client would read it)."""
    agent = raw_agent(tmp_path / "capture", "--no-answer", "_x/hang")
    async with (
        listening_proxy(HTTP_LISTEN, agent=agent) as (_proxy, url),
        aiohttp.ClientSession() as session,
    ):
        http = Http(session, url)
        connection = await http.initialize()
        note = compact(notification("_x/note", {"sessionId": "S"}))
        async with http.stream(connection, "S") as stream:
            assert (await http.post(say(note), connection=connection)).status == 202
            assert await stream.next() == note  # session S is known now
            hang = request("q", "_x/hang", {"sessionId": "S"})
            assert (await http.post(hang, connection=connection)).status == 202
            lenient = b'{"jsonrpc":"2.0","id":1,"result":{"t":"caf\xe9"}}'  # the proxy's id 1
            assert (await http.post(say(lenient), connection=connection)).status == 202
            assert await stream.next() == lenient.replace(b'"id":1', b'"id":"q"')


async def test_a_post_asks_for_its_fault_in_the_acp_fault_header(tmp_path: Path) -> None:
    """With ``--allow-client-faults``, a POSTed request's ``Acp-Fault`` header asks for a fault
    as ``_meta.acpFault`` does: an error is answered on the stream, an ``http_status`` answers
    the POST itself, a delayed request reaches the Agent with its bytes untouched, a hint that is
    not JSON is answered -32602. Without the option the header changes nothing."""

    def asking(**hint: Any) -> dict[str, str]:
        return {"Acp-Fault": json.dumps(hint)}

    async with serving(tmp_path, "--allow-client-faults") as setup:
        http = setup.http
        connection = await http.initialize()
        async with http.stream(connection) as stream:
            error = asking(action="error", code=-32001)
            reply = await http.post(request("e", "_x/e"), connection=connection, extra=error)
            assert reply.status == 202
            answer = await stream.next_json()
            assert (answer["id"], answer["error"]["code"]) == ("e", -32001)
            assert answer["error"]["data"]["acpFault"]["action"] == "error"
            status = asking(action="http_status", status=503)
            reply = await http.post(request("s", "_x/s"), connection=connection, extra=status)
            assert reply.status == 503
            assert json.loads(reply.headers["Acp-Fault"])["action"] == "http_status"
            late = asking(action="delay", ms=10)
            delayed = request("d", "_x/d", {"k": 1})
            reply = await http.post(delayed, connection=connection, extra=late)
            assert reply.status == 202
            assert (await stream.next_json())["id"] == "d"
            bad = {"Acp-Fault": "{"}
            assert (
                await http.post(request("b", "_x/b"), connection=connection, extra=bad)
            ).status == 202
            refused = await stream.next_json()
            assert (refused["id"], refused["error"]["code"]) == ("b", -32602)
            assert "not JSON" in refused["error"]["message"]
        assert [json.loads(line) for line in captured(setup.capture)][1:] == [
            {**delayed, "id": 1}  # after initialize: the delayed request alone, as it was sent
        ]
    (tmp_path / "off").mkdir()
    async with serving(tmp_path / "off") as setup:
        http = setup.http
        connection = await http.initialize()
        async with http.stream(connection) as stream:
            error = asking(action="error", code=-32001)
            await http.post(request("e", "_x/e"), connection=connection, extra=error)
            assert (await stream.next_json())["result"]["method"] == "_x/e"  # the Agent's echo


async def test_post_without_or_with_unknown_connection_id(tmp_path: Path) -> None:
    """A non-initialize POST without Acp-Connection-Id is 400; with an unknown one, 404."""
    async with serving(tmp_path) as s:
        await s.http.initialize()
        assert (await s.http.post(request(1, "_test/probe"))).status == 400
        assert (await s.http.post(notification("_test/note"))).status == 400
        unknown = await s.http.post(request(1, "_test/probe"), connection="0" * 32)
        assert unknown.status == 404, unknown


@pytest.mark.parametrize("method", SESSION_SCOPED)
async def test_session_scoped_post_needs_a_matching_session_header(
    tmp_path: Path, method: str
) -> None:
    """A session-scoped POST without Acp-Session-Id or with a mismatched one is 400, unrelayed."""
    params = {"sessionId": "sess-1"}
    body = notification(method, params) if method in NOTIFICATIONS else request(5, method, params)
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        missing = await s.http.post(body, connection=connection)
        assert missing.status == 400, missing
        mismatched = await s.http.post(body, connection=connection, session="sess-2")
        assert mismatched.status == 400, mismatched
        async with s.http.stream(connection) as stream:
            await roundtrip(s.http, stream, connection, "before")
            accepted = await s.http.post(body, connection=connection, session="sess-1")
            assert accepted.status == 202, accepted
            assert accepted.body == b""
            if method not in NOTIFICATIONS:  # no session stream exists: the connection stream
                answer = await stream.next_json()
                assert answer["id"] == 5
                assert answer["result"]["method"] == method
            await roundtrip(s.http, stream, connection, "after")
        assert captured_methods(s.capture) == [
            "initialize",
            "_test/probe",
            method,
            "_test/probe",
        ]


async def test_other_posts_are_202_and_answered_on_the_connection_stream(tmp_path: Path) -> None:
    """Request, notification, response: 202 with an empty body; answers come on the GET stream."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as stream:
            reply = await s.http.post(request("req-1", "_x/thing", {"a": 1}), connection=connection)
            assert (reply.status, reply.body) == (202, b"")
            answer = await stream.next_json()
            assert answer == {"jsonrpc": "2.0", "id": "req-1", "result": answer["result"]}
            assert answer["result"]["method"] == "_x/thing"

            reply = await s.http.post(notification("_x/note"), connection=connection)
            assert (reply.status, reply.body) == (202, b"")

            ask = {"jsonrpc": "2.0", "id": "agent-ask", "method": "_x/ask", "params": {}}
            reply = await s.http.post(say(compact(ask)), connection=connection)
            assert (reply.status, reply.body) == (202, b"")
            asked = await stream.next_json()
            assert asked["method"] == "_x/ask"
            response = {"jsonrpc": "2.0", "id": asked["id"], "result": {"ok": True}}
            reply = await s.http.post(response, connection=connection)
            assert (reply.status, reply.body) == (202, b"")
            await roundtrip(s.http, stream, connection, "probe")
        lines = [json.loads(line) for line in captured(s.capture)]
        assert [line.get("method") for line in lines] == [
            "initialize",
            "_x/thing",
            "_x/note",
            "_test/say",
            None,
            "_test/probe",
        ]
        assert lines[4] == {"jsonrpc": "2.0", "id": "agent-ask", "result": {"ok": True}}


async def test_session_scoped_answers_use_the_session_stream_once_it_exists(
    tmp_path: Path,
) -> None:
    """A session-scoped answer uses the connection stream until its session's stream exists."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        prompt = request("p-1", "session/prompt", {"sessionId": "sess-a", "prompt": []})
        async with s.http.stream(connection) as main:
            assert (
                await s.http.post(prompt, connection=connection, session="sess-a")
            ).status == 202
            assert (await main.next_json())["id"] == "p-1"
            async with s.http.stream(connection, "sess-a") as session:
                assert session.response.headers[CONNECTION_ID] == connection
                assert session.response.headers[SESSION_ID] == "sess-a"
                prompt["id"] = "p-2"
                reply = await s.http.post(prompt, connection=connection, session="sess-a")
                assert reply.status == 202, reply
                assert (await session.next_json())["id"] == "p-2"
                await roundtrip(s.http, main, connection, "probe")  # p-2 never reached `main`


async def test_session_new_answer_creates_the_session_stream(tmp_path: Path) -> None:
    """A session/new answer (connection stream) creates the session stream, which buffers."""
    async with serving(tmp_path, sdk=True) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as main:
            reply = await s.http.post(
                request(1, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection=connection
            )
            assert reply.status == 202, reply
            created = await main.next_json()
            assert created["id"] == 1
            session_id = created["result"]["sessionId"]
            prompt = request(
                2,
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": "echo hi"}]},
            )
            reply = await s.http.post(prompt, connection=connection, session=session_id)
            assert reply.status == 202, reply
            async with s.http.stream(connection, session_id) as session:
                update = await session.next_json()
                assert update["method"] == "session/update"
                assert update["params"]["update"]["content"]["text"] == "hi"
                answer = await session.next_json()
                assert answer["id"] == 2
                assert answer["result"]["stopReason"] == "end_turn"
            reply = await s.http.post(request(3, "_sdk_agent/state"), connection=connection)
            assert reply.status == 202, reply
            assert (await main.next_json())["id"] == 3  # nothing of the prompt came here


async def test_post_of_a_batch_is_501(tmp_path: Path) -> None:
    """A JSON array is refused with 501, with or without a connection, and is not relayed."""
    async with serving(tmp_path) as s:
        batch = [request(1, "_test/probe"), request(2, "_test/probe")]
        assert (await s.http.post(batch)).status == 501
        connection = await s.http.initialize()
        assert (await s.http.post(batch, connection=connection)).status == 501
        async with s.http.stream(connection) as stream:
            await roundtrip(s.http, stream, connection, "probe")
        assert captured_methods(s.capture) == ["initialize", "_test/probe"]


async def test_post_of_invalid_json_is_400_with_a_parse_error(tmp_path: Path) -> None:
    """Invalid JSON is 400 with a JSON-RPC -32700 error (id null) as the body."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        for body in (b'{"jsonrpc":"2.0","id":1,"method":', b"\xff\xfe", b"not json"):
            reply = await s.http.post(body, connection=connection)
            assert reply.status == 400, reply
            assert reply.headers["Content-Type"].startswith(JSON)
            error = reply.json()
            assert error["jsonrpc"] == "2.0"
            assert error["id"] is None
            assert error["error"]["code"] == -32700


async def test_post_above_max_message_bytes_is_413(tmp_path: Path) -> None:
    """A body of exactly --max-message-bytes is accepted; one byte more is 413."""
    limit = 4096
    async with serving(tmp_path, "--max-message-bytes", str(limit)) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as stream:
            fits = await s.http.post(
                padded(request("fits", "_test/probe"), limit), connection=connection
            )
            assert fits.status == 202, fits
            answer = await stream.next_json()
            assert answer["id"] == "fits"
            too_big = await s.http.post(
                padded(request("big", "_test/probe"), limit + 1), connection=connection
            )
            assert too_big.status == 413, too_big
            await roundtrip(s.http, stream, connection, "after")
        assert captured_methods(s.capture) == ["initialize", "_test/probe", "_test/probe"]


# -- GET -------------------------------------------------------------------------------------------


async def test_get_without_event_stream_accept_is_406(tmp_path: Path) -> None:
    """GET whose Accept lacks text/event-stream (or without Accept) is 406."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        for accept in (None, JSON, "text/html"):
            reply = await s.http.get(connection=connection, accept=accept)
            assert reply.status == 406, (accept, reply)


async def test_get_opens_the_connection_stream(tmp_path: Path) -> None:
    """GET with a connection id is 200 text/event-stream, no-cache, echoing Acp-Connection-Id."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as stream:
            headers = stream.response.headers
            assert headers["Content-Type"].startswith(EVENT_STREAM)
            assert headers["Cache-Control"] == "no-cache"
            assert headers[CONNECTION_ID] == connection
            assert SESSION_ID not in headers
            await roundtrip(s.http, stream, connection, "probe")


async def test_get_of_a_session_stream(tmp_path: Path) -> None:
    """GET with Acp-Session-Id is 200 for a session seen on the connection, and for one not seen
    yet: that stream buffers until the session appears, as the SDKs' servers do (a TypeScript
    Client opens it before its session/load or session/resume)."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        seen = notification("session/cancel", {"sessionId": "sess-x"})
        assert (await s.http.post(seen, connection=connection, session="sess-x")).status == 202
        async with s.http.stream(connection, "sess-x") as stream:
            assert stream.response.headers[SESSION_ID] == "sess-x"
            assert stream.response.headers[CONNECTION_ID] == connection
        async with s.http.stream(connection, "sess-new") as early:
            assert early.response.headers[SESSION_ID] == "sess-new"
            note = compact(notification("_x/note", {"sessionId": "sess-new"}))
            assert (await s.http.post(say(note), connection=connection)).status == 202
            assert await early.next() == note  # the Agent's message of that session, there


async def test_second_concurrent_get_of_a_stream_is_409(tmp_path: Path) -> None:
    """A second GET of a stream that has a receiver is 409 (connection and session streams)."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        seen = notification("session/cancel", {"sessionId": "sess-1"})
        assert (await s.http.post(seen, connection=connection, session="sess-1")).status == 202
        async with s.http.stream(connection) as main:
            assert (await s.http.get(connection=connection)).status == 409
            async with s.http.stream(connection, "sess-1"):
                assert (await s.http.get(connection=connection, session="sess-1")).status == 409
                assert (await s.http.get(connection=connection)).status == 409
            await roundtrip(s.http, main, connection, "still-served")


async def test_get_after_the_receiver_left_is_accepted(tmp_path: Path) -> None:
    """Once the Client dropped its GET, a new GET of that stream is 200 (not concurrent: no 409)."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as stream:
            await roundtrip(s.http, stream, connection, "first")
        # The first receiver's TCP connection is closed now. A notification (no answer, nothing
        # for the stream) gives the proxy's loop time to see the connection go.
        assert (await s.http.post(notification("_x/note"), connection=connection)).status == 202
        async with s.http.stream(connection) as stream:
            await roundtrip(s.http, stream, connection, "second")


async def test_a_message_for_a_dropped_stream_waits_for_the_next_receiver(tmp_path: Path) -> None:
    """A message routed to a stream after its receiver left is kept for the next GET, not lost."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        seen = notification("session/cancel", {"sessionId": "sess-1"})
        assert (await s.http.post(seen, connection=connection, session="sess-1")).status == 202
        prompt = request("p-1", "session/prompt", {"sessionId": "sess-1", "prompt": []})
        async with s.http.stream(connection) as main:
            async with s.http.stream(connection, "sess-1"):
                pass  # the Client drops its session stream at once
            assert (
                await s.http.post(prompt, connection=connection, session="sess-1")
            ).status == 202
            await roundtrip(s.http, main, connection, "probe")  # p-1's answer went by meanwhile
            async with s.http.stream(connection, "sess-1") as session:
                prompt["id"] = "p-2"
                reply = await s.http.post(prompt, connection=connection, session="sess-1")
                assert reply.status == 202, reply
                assert (await session.next_json())["id"] == "p-1"
                assert (await session.next_json())["id"] == "p-2"


async def test_get_without_or_with_unknown_connection_id(tmp_path: Path) -> None:
    """GET without Acp-Connection-Id is 400; with an unknown one, 404."""
    async with serving(tmp_path) as s:
        await s.http.initialize()
        assert (await s.http.get(connection=None)).status == 400
        assert (await s.http.get(connection="f" * 32)).status == 404
        assert (await s.http.get(connection="f" * 32, session="sess")).status == 404


# -- DELETE ----------------------------------------------------------------------------------------


async def test_delete_ends_the_connection(tmp_path: Path) -> None:
    """DELETE is 202: the streams end, later POST/GET/DELETE are 404, other connections go on."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        other = await s.http.initialize()
        seen = notification("session/cancel", {"sessionId": "sess-1"})
        assert (await s.http.post(seen, connection=connection, session="sess-1")).status == 202
        async with (
            s.http.stream(connection) as main,
            s.http.stream(connection, "sess-1") as session,
        ):
            await roundtrip(s.http, main, connection, "before")
            reply = await s.http.delete(connection=connection)
            assert (reply.status, reply.body) == (202, b"")
            await main.ended()
            await session.ended()
        assert (await s.http.post(request(1, "_test/probe"), connection=connection)).status == 404
        assert (await s.http.get(connection=connection)).status == 404
        assert (await s.http.delete(connection=connection)).status == 404
        async with s.http.stream(other) as stream:
            await roundtrip(s.http, stream, other, "other")


async def test_delete_without_or_with_unknown_connection_id(tmp_path: Path) -> None:
    """DELETE without Acp-Connection-Id is 400; with an unknown one, 404."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        assert (await s.http.delete(connection=None)).status == 400
        assert (await s.http.delete(connection="e" * 32)).status == 404
        async with s.http.stream(connection) as stream:  # the real connection is untouched
            await roundtrip(s.http, stream, connection, "probe")


# -- SSE framing -----------------------------------------------------------------------------------

ODD_NOTIFICATION = (
    b'{ "params" :\t{"sessionId":"sess-odd","update":{"sessionUpdate":"agent_message_chunk",'
    b'"content":{"type":"text","text":"caf\\u00e9 \xe4\xb8\xad \xf0\x9f\x98\x80 \\ud800 \\/ \\"q\\""}},'
    b'"n":[1E+2,-0.0,123456789012345678901234567890,0.1e-7,true,null,{},[]],"k":1,"k":2} ,'
    b' "method" : "session/update" , "jsonrpc":"2.0"   }'
)
ODD_REQUEST_HEAD = b'{"method":"_x/ask" ,"params":{"id":"not-this-one","x":[ ]}, "id" :\t'
ODD_REQUEST_TAIL = b' ,"jsonrpc" : "2.0","z":"\\u0000"}'


async def test_sse_events_carry_the_agents_bytes(tmp_path: Path) -> None:
    """An SSE event is ``data: <the Agent's bytes, id aside>`` and a blank line, nothing else."""
    async with serving(tmp_path) as s:
        connection = await s.http.initialize()
        async with s.http.stream(connection) as stream:
            odd_request = ODD_REQUEST_HEAD + b'"agent-\\u00e9"' + ODD_REQUEST_TAIL
            reply = await s.http.post(say(ODD_NOTIFICATION, odd_request), connection=connection)
            assert reply.status == 202, reply
            assert await stream.next() == ODD_NOTIFICATION
            relayed = await stream.next()
            assert relayed.startswith(ODD_REQUEST_HEAD), relayed
            assert relayed.endswith(ODD_REQUEST_TAIL), relayed
            minted = relayed.removeprefix(ODD_REQUEST_HEAD).removesuffix(ODD_REQUEST_TAIL)
            assert isinstance(json.loads(minted), int | str), minted

            response = b'{"jsonrpc":"2.0","id":' + minted + b',"result":{}}'
            assert (await s.http.post(response, connection=connection)).status == 202
            await roundtrip(s.http, stream, connection, "probe")
            raw = bytes(stream.raw)
        assert raw.startswith(b"data: " + ODD_NOTIFICATION + b"\n\n" + b"data: " + relayed)
        for line in raw.split(b"\n"):
            assert line == b"" or line.startswith((b"data: ", b":")), line[:100]
        assert captured(s.capture)[-2] == b'{"jsonrpc":"2.0","id":"agent-\\u00e9","result":{}}'


# -- WebSocket -------------------------------------------------------------------------------------


async def test_websocket_upgrade_on_the_http_endpoint(tmp_path: Path) -> None:
    """The http:// endpoint upgrades: 101 with Acp-Connection-Id, text frames both ways."""
    async with serving(tmp_path) as s, ws_connect(s.ws_url(), proxy=None) as ws:
        assert ws.response is not None
        assert ws.response.status_code == 101
        assert ws.response.headers[CONNECTION_ID]
        await ws_initialize(ws)
        await ws.send(compact(say(compact(notification("_x/hello", {"a": 1})))).decode())
        assert await ws_recv(ws) == notification("_x/hello", {"a": 1})
        await ws_probe(ws, 2)
        async with ws_connect(s.ws_url(), proxy=None) as second:
            assert second.response is not None
            assert second.response.headers[CONNECTION_ID] != ws.response.headers[CONNECTION_ID]


async def test_malformed_websocket_upgrade_is_400_and_starts_no_agent(tmp_path: Path) -> None:
    """An upgrade without Sec-WebSocket-Key (or of another version) is 400, and no Agent is
    started for it: a well-formed upgrade afterwards is the first link."""
    async with serving(tmp_path) as s:
        upgrade = {"Upgrade": "websocket", "Connection": "Upgrade"}
        for extra in (
            {},
            {"Sec-WebSocket-Key": "AAAAAAAAAAAAAAAAAAAAAA==", "Sec-WebSocket-Version": "99"},
        ):
            async with asyncio.timeout(TIMEOUT):
                async with s.http.session.get(s.url, headers={**upgrade, **extra}) as response:
                    assert response.status == 400, response
                    body = await response.json()
            assert "Sec-WebSocket-Key" in body["error"]["message"]
        async with ws_connect(s.ws_url(), proxy=None) as ws:
            await ws_initialize(ws)
            await ws_probe(ws, 2)
        assert len(log_events(s.proxy.stderr, "agent started")) == 1


async def test_ws_listener_refuses_plain_http_with_426(tmp_path: Path) -> None:
    """A ws:// listener answers POST, GET and DELETE with 426 but accepts the upgrade."""
    async with serving(tmp_path, listen=WS_LISTEN) as s:
        assert s.url.startswith("ws://")
        s.http.url = "http" + s.url.removeprefix("ws")
        init = request(1, "initialize", {"protocolVersion": 1})
        assert (await s.http.post(init)).status == 426
        assert (await s.http.post(init, connection="a" * 32)).status == 426
        assert (await s.http.get(connection=None)).status == 426
        assert (await s.http.delete(connection="a" * 32)).status == 426
        async with ws_connect(s.url, proxy=None) as ws:
            assert ws.response is not None
            assert ws.response.status_code == 101
            assert ws.response.headers[CONNECTION_ID]
            await ws_initialize(ws)
            await ws_probe(ws, 2)


async def test_websocket_frame_above_the_limit_closes_with_1009(tmp_path: Path) -> None:
    """A frame above --max-message-bytes closes with 1009 (the limit fits); others go on."""
    limit = 4096
    async with serving(tmp_path, "--max-message-bytes", str(limit)) as s:
        async with ws_connect(s.ws_url(), max_size=None, proxy=None) as bystander:
            await ws_initialize(bystander)
            async with ws_connect(s.ws_url(), max_size=None, proxy=None) as ws:
                await ws_initialize(ws)
                await ws.send(padded(request("fits", "_test/probe"), limit).decode())
                assert (await ws_recv(ws))["id"] == "fits"
                await ws.send(padded(request("big", "_test/probe"), limit + 1).decode())
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), TIMEOUT)
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1009
            await ws_probe(bystander, "bystander")
        async with ws_connect(s.ws_url(), proxy=None) as fresh:
            await ws_initialize(fresh)
            await ws_probe(fresh, "fresh")
        assert b'"big"' not in s.capture.read_bytes()
        await s.http.initialize()  # the HTTP side of the listener is alive as well


async def test_binary_websocket_frames_are_ignored(tmp_path: Path) -> None:
    """A binary frame is logged and dropped; the connection goes on with text frames."""
    async with serving(tmp_path) as s, ws_connect(s.ws_url(), proxy=None) as ws:
        await ws_initialize(ws)
        await ws.send(compact(request("binary", "_x/binary")))
        await ws_probe(ws, "text")
        await s.proxy.logged("binary WebSocket frame from the client ignored")
        await ws_probe(ws, "text-again")
        assert "_x/binary" not in captured_methods(s.capture)


# -- a web page in the browser ---------------------------------------------------------------------


def refused_403(reply: Reply | aiohttp.ClientResponse, body: Any, message: str) -> None:
    """The Host/Origin policy's answer: 403, ``{"error": message, "status": 403}``."""
    status = reply.status
    assert status == 403, (status, body)
    assert body == {"error": message, "status": 403}


async def test_a_cross_origin_websocket_upgrade_is_refused_before_any_agent_starts(
    tmp_path: Path,
) -> None:
    """A page's WebSocket (it always carries the page's Origin) gets 403 with the reason, on an
    http:// and a ws:// listener; no Agent is started for it, and the logs say so once per
    origin. The same upgrade without an Origin (the SDKs, websockets) is the first link."""
    evil = "origin http://evil.example is not allowed (see --allow-origin)"
    for listen in (HTTP_LISTEN, WS_LISTEN):
        async with serving(tmp_path, listen=listen) as s:
            url = s.url if listen == WS_LISTEN else s.ws_url()
            for _ in range(2):
                with pytest.raises(InvalidStatus) as refused:
                    async with asyncio.timeout(TIMEOUT):
                        await ws_connect(url, origin=Origin("http://evil.example"), proxy=None)
                response = refused.value.response
                assert response.status_code == 403
                assert json.loads(response.body or b"") == {"error": evil, "status": 403}
            async with ws_connect(url, proxy=None) as ws:
                await ws_initialize(ws)
            assert len(log_events(s.proxy.stderr, "agent started")) == 1
            [logged] = log_events(s.proxy.stderr, "request refused")
            assert (logged["server"], logged["reason"], logged["detail"]) == (
                "listener",
                "origin",
                evil,
            )


async def test_a_cross_origin_post_or_get_is_refused_with_no_agent(tmp_path: Path) -> None:
    """A page's initialize POST (JSON: a preflighted fetch it might send blind) and its GET get
    403; no Agent starts; a POST from the page's own origin would be accepted."""
    async with serving(tmp_path) as s:
        page = {"Origin": "https://evil.example"}
        init = compact(request(1, "initialize", {"protocolVersion": 1}))
        async with s.http.session.post(
            s.url, data=init, headers={"Content-Type": JSON, **page}
        ) as response:
            refused_403(
                response,
                await response.json(),
                "origin https://evil.example is not allowed (see --allow-origin)",
            )
        connection = await s.http.initialize()  # no Origin: the one link
        headers = {CONNECTION_ID: connection, "Accept": EVENT_STREAM, **page}
        async with s.http.session.get(s.url, headers=headers) as response:
            assert response.status == 403
        async with s.http.session.delete(s.url, headers=headers) as response:
            assert response.status == 403
        assert len(log_events(s.proxy.stderr, "agent started")) == 1
        own = {"Origin": s.url.removesuffix("/acp"), "Content-Type": JSON}
        async with s.http.session.post(s.url, data=init, headers=own) as response:
            assert response.status == 200


async def test_a_rebinding_host_is_refused_by_the_listener(tmp_path: Path) -> None:
    """A request whose Host is a page's rebound name gets 403 on POST, GET, DELETE and the
    WebSocket upgrade, and starts no Agent; the loopback names with the bound port are fine."""
    async with serving(tmp_path) as s:
        port = urlsplit(s.url).port
        evil = f"evil.example:{port}"
        message = f"host {evil} is not allowed (see --allow-host)"
        init = compact(request(1, "initialize", {"protocolVersion": 1}))
        bad = {"Host": evil}
        async with s.http.session.post(
            s.url, data=init, headers={"Content-Type": JSON, **bad}
        ) as response:
            refused_403(response, await response.json(), message)
        upgrade = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "AAAAAAAAAAAAAAAAAAAAAA==",
            "Sec-WebSocket-Version": "13",
        }
        for method, headers in (
            ("GET", {**upgrade, **bad}),
            ("GET", {"Accept": EVENT_STREAM, CONNECTION_ID: "a" * 32, **bad}),
            ("DELETE", {CONNECTION_ID: "a" * 32, **bad}),
        ):
            async with s.http.session.request(method, s.url, headers=headers) as response:
                refused_403(response, await response.json(), message)
        assert log_events(s.proxy.stderr, "agent started") == []
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            async with s.http.session.post(
                s.url, data=init, headers={"Content-Type": JSON, "Host": host}
            ) as response:
                assert response.status == 200, host


async def test_the_sdk_clients_send_nothing_the_policy_refuses(tmp_path: Path) -> None:
    """The official SDK's HTTP and WebSocket Clients send no Origin and the Host of the URL:
    through a listener on localhost and on 127.0.0.1 they initialize as before."""
    async with serving(tmp_path, sdk=True) as s:
        for url in (s.url, s.url.replace("127.0.0.1", "localhost")):
            for connect in (connect_http, connect_ws):
                async with connect(url, SimpleClient()) as conn, asyncio.timeout(TIMEOUT):
                    await conn.initialize(protocol_version=PROTOCOL_VERSION)
        assert log_events(s.proxy.stderr, "request refused") == []


# -- unmasked frames (RFC 6455 5.1) ----------------------------------------------------------------


def client_frame(
    text: str | bytes, *, masked: bool = True, opcode: Opcode = Opcode.TEXT, fin: bool = True
) -> bytes:
    """A frame as a Client sends it (masked), or as it must not (unmasked)."""
    payload = text.encode() if isinstance(text, str) else text
    return Frame(opcode, payload, fin=fin).serialize(mask=masked, extensions=[])


def fragments(payload: bytes, sizes: list[int]) -> list[bytes]:
    """``payload`` as the frames of one text message, cut after each of ``sizes`` bytes in turn
    (cycled); a ping after the first frame and an empty continuation after the second."""
    frames: list[bytes] = []
    pos, n = 0, 0
    while pos < len(payload) or not frames:
        size = sizes[n % len(sizes)]
        piece, pos, n = payload[pos : pos + size], pos + size, n + 1
        opcode = Opcode.CONT if frames else Opcode.TEXT
        frames.append(client_frame(piece, opcode=opcode, fin=pos >= len(payload)))
        if n == 1:
            frames.append(client_frame(b"ping", opcode=Opcode.PING))
        if n == 2:
            frames.append(client_frame(b"", opcode=Opcode.CONT, fin=False))
    return frames


async def read_messages(stream: bytes, cuts: list[int], count: int) -> tuple[list[Any], Any]:
    """``stream`` fed to the listener's frame reader (on aiohttp's own message queue) in the
    slices ``cuts`` makes, as reads bring it; the first ``count`` messages it delivers (a text
    message as its bytes) and the error it failed with, if any."""
    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    protocol._upgraded = True  # as after the upgrade: the queue pauses the transport alone
    queue = WebSocketDataQueue(protocol, 2**16, loop=loop)
    reader = MaskedOnlyReader(queue, 64 << 20, compress=False, decode_text=False)
    pos = 0
    for cut in [*cuts, len(stream)]:
        if reader.feed_data(stream[pos:cut])[0]:
            break
        pos = cut
    messages = []
    with contextlib.suppress(WebSocketError):
        for _ in range(count):  # reading resumes the reader whenever the queue held it back
            message = await asyncio.wait_for(queue.read(), TIMEOUT)
            data = message.data
            if isinstance(data, Assembled):
                data = b"".join(data.chunks) if message.type == WSMsgType.TEXT else data.size
            messages.append((message.type, data))
    return messages, queue.exception()


async def test_the_frame_reader_delivers_the_same_messages_however_the_stream_is_sliced() -> None:
    """Small whole messages (aiohttp's), large and fragmented ones (assembled as they come,
    a multi-byte character cut between fragments), binary ones (only their size), pings in
    between, and far more than the queue holds (so its reader is held back and resumed): the
    same messages in the same order whether the stream comes whole, in slices, or a byte at a
    time; a frame that is not masked then fails the connection with 1002."""
    large = ("é€😀" * 30_000).encode()
    stream = b"".join(
        [
            client_frame('{"a":1}'),
            client_frame(b"hi", opcode=Opcode.PING),
            client_frame(large),
            *fragments(large, [100_001, 3, 65_536]),
            client_frame(b"z" * 70_000, opcode=Opcode.BINARY),
            client_frame(b"b" * 10, opcode=Opcode.BINARY),
            *(client_frame(str(n)) for n in range(2_000)),
            client_frame("last"),
        ]
    )
    unmasked = client_frame("{}", masked=False)
    expected = [
        (WSMsgType.TEXT, b'{"a":1}'),
        (WSMsgType.PING, b"hi"),
        (WSMsgType.TEXT, large),
        (WSMsgType.PING, b"ping"),
        (WSMsgType.TEXT, large),
        (WSMsgType.BINARY, 70_000),
        (WSMsgType.BINARY, b"b" * 10),
        *((WSMsgType.TEXT, str(n).encode()) for n in range(2_000)),
        (WSMsgType.TEXT, b"last"),
    ]
    rng = random.Random(13)
    slicings = [
        [],
        list(range(1, 4_000)),
        *(sorted(rng.sample(range(1, len(stream)), k)) for k in (1, 7, 300)),
    ]
    for cuts in slicings:
        messages, error = await read_messages(stream + unmasked, cuts, len(expected) + 1)
        assert messages == expected, len(cuts)
        assert isinstance(error, WebSocketError)
        assert (error.code, str(error)) == (1002, UNMASKED)


async def raw_upgrade(
    url: str, *, early: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket handshake by hand (``early``: bytes sent right behind the request, before the
    ``101``); returns once the ``101`` is read."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        + early
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return reader, writer


async def server_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frame from the proxy (never masked): its opcode and payload."""
    async with asyncio.timeout(TIMEOUT):
        first, second = await reader.readexactly(2)
        assert not second & 0x80, "a server's frame is never masked"
        size = second & 0x7F
        if size >= 126:
            size = int.from_bytes(await reader.readexactly(2 if size == 126 else 8), "big")
        return first & 0x0F, await reader.readexactly(size)


async def closed_with_code(reader: asyncio.StreamReader) -> tuple[int, str]:
    """Read frames until the proxy's close frame; its code and reason."""
    while True:
        opcode, payload = await server_frame(reader)
        if opcode == Opcode.CLOSE:
            return int.from_bytes(payload[:2], "big"), payload[2:].decode()


async def closed(writer: asyncio.StreamWriter) -> None:
    """Close the test's side of a raw connection."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)


INIT_TEXT = compact(request("init", "initialize", {"protocolVersion": 1})).decode()


async def test_an_unmasked_client_frame_closes_the_websocket_with_1002(tmp_path: Path) -> None:
    """RFC 6455 5.1: a frame the Client did not mask fails the connection with 1002 (protocol
    error), after the masked frames before it are relayed; the unmasked one never reaches the
    Agent, and the listener goes on. Bytes sent before the 101 are checked as well."""
    async with serving(tmp_path) as s:
        reader, writer = await raw_upgrade(s.ws_url())
        writer.write(client_frame(INIT_TEXT, masked=True))
        opcode, payload = await server_frame(reader)
        assert (opcode, json.loads(payload)["id"]) == (Opcode.TEXT, "init")
        probe = compact(request("unmasked", "_test/probe")).decode()
        writer.write(client_frame(probe, masked=False))
        assert (await closed_with_code(reader))[0] == 1002
        await closed(writer)
        await s.proxy.logged("WebSocket frame from the client not masked; closing with 1002")

        # Sent before the 101: relayed when masked, and followed frame by frame from there.
        reader, writer = await raw_upgrade(s.ws_url(), early=client_frame(INIT_TEXT, masked=True))
        opcode, payload = await server_frame(reader)
        assert (opcode, json.loads(payload)["id"]) == (Opcode.TEXT, "init")
        writer.write(client_frame(probe, masked=False))
        assert (await closed_with_code(reader))[0] == 1002
        await closed(writer)
        early = client_frame(INIT_TEXT, masked=True) + client_frame(probe, masked=False)
        reader, writer = await raw_upgrade(s.ws_url(), early=early)
        assert (await closed_with_code(reader))[0] == 1002  # the answer to init may come first
        await closed(writer)

        async with ws_connect(s.ws_url(), proxy=None) as ws:  # masked, as clients send: fine
            await ws_initialize(ws)
            await ws_probe(ws, "masked")
        assert "unmasked" not in s.capture.read_text()


async def text_answer(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next text frame from the proxy (pongs skipped), as JSON."""
    while True:
        opcode, payload = await server_frame(reader)
        if opcode == Opcode.TEXT:
            answer = json.loads(payload)
            assert isinstance(answer, dict)
            return answer
        assert opcode == Opcode.PONG, (opcode, payload[:100])


def large_notification(method: str, size: int) -> bytes:
    """A notification of about ``size`` bytes, its text mostly characters of 2 to 4 bytes."""
    head = compact(notification(method, {"text": ""}))
    return head[:-3] + ("é€😀 " * ((size - len(head)) // 10)).encode() + head[-3:]


async def test_large_websocket_messages_reach_the_agent_byte_for_byte(tmp_path: Path) -> None:
    """Text messages of several MB, one in a single frame and one in many fragments (cut inside
    multi-byte characters, a ping and an empty fragment among them), reach the Agent byte for
    byte, in order, and the link goes on."""
    whole = large_notification("_x/whole", 6_000_000)
    cut = large_notification("_x/fragmented", 6_000_000)
    async with serving(tmp_path) as s:
        reader, writer = await raw_upgrade(s.ws_url())
        writer.write(client_frame(INIT_TEXT))
        assert (await text_answer(reader))["id"] == "init"
        writer.write(client_frame(whole))
        for frame in fragments(cut, [1, 999_999, 3, 65_536, 2_000_001]):
            writer.write(frame)
        writer.write(client_frame(compact(request("after", "_test/probe"))))
        await writer.drain()
        assert (await text_answer(reader))["id"] == "after"
        await closed(writer)
        lines = captured(s.capture)
    assert [line for line in lines if line in (whole, cut)] == [whole, cut]


async def test_a_text_message_that_is_not_utf8_reaches_the_agent_as_it_came(
    tmp_path: Path,
) -> None:
    """The listener does not judge a text message's UTF-8 (aiohttp's reader never did with
    ``decode_text=False``; docs/security.md: invalid UTF-8 is forwarded untouched): a sequence
    cut short, split between two fragments of a large message, of a small one, and in a small
    whole frame, reaches the Agent byte for byte."""
    head = b'{"jsonrpc":"2.0","method":"_x/bad","params":{"n":%d,"text":"'
    large = head % 1 + b"a" * 100_000 + b"\xe2\x82(" + b'"}}'
    small = head % 2 + b"\xe2\x82(" + b'"}}'
    whole = head % 3 + b"\xff\xe2\x82(" + b'"}}'
    async with serving(tmp_path) as s:
        reader, writer = await raw_upgrade(s.ws_url())
        writer.write(client_frame(INIT_TEXT))
        assert (await text_answer(reader))["id"] == "init"
        for message in (large, small):
            at = message.index(b"\xe2") + 1  # between the two bytes of the sequence
            writer.write(client_frame(message[:at], fin=False))
            writer.write(client_frame(message[at:], opcode=Opcode.CONT))
        writer.write(client_frame(whole))
        writer.write(client_frame(compact(request("after", "_test/probe"))))
        assert (await text_answer(reader))["id"] == "after"
        await closed(writer)
        lines = captured(s.capture)
    assert [line for line in lines if b"_x/bad" in line] == [large, small, whole]


async def test_fragments_over_the_limit_close_with_1009_before_the_message_ends(
    tmp_path: Path,
) -> None:
    """Fragments adding up to more than --max-message-bytes close the socket with 1009 once
    their sum is over: the message is not held to its end (it has none: its last fragment is
    never sent), and nothing of it reaches the Agent. Other links go on."""
    limit = 1024 * 1024
    piece = 256 * 1024
    head = b'{"jsonrpc":"2.0","method":"_x/huge","params":"'
    async with serving(tmp_path, "--max-message-bytes", str(limit)) as s:
        async with ws_connect(s.ws_url(), proxy=None) as bystander:
            await ws_initialize(bystander)
            reader, writer = await raw_upgrade(s.ws_url())
            writer.write(client_frame(INIT_TEXT))
            assert (await text_answer(reader))["id"] == "init"
            writer.write(client_frame(head + b"x" * (piece - len(head)), fin=False))
            for _ in range(limit // piece):  # one more than fits
                writer.write(client_frame(b"x" * piece, opcode=Opcode.CONT, fin=False))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            assert (await closed_with_code(reader))[0] == 1009
            await closed(writer)
            await ws_probe(bystander, "bystander")
        assert b"_x/huge" not in s.capture.read_bytes()


async def test_a_large_message_reaches_the_endpoint_in_the_pieces_reads_brought() -> None:
    """A 64 MB text message in one frame is unmasked and kept a read at a time: it reaches the
    endpoint as pieces no larger than a read (aiohttp's reader joined, copied and unmasked it
    whole in the callback of its last read, which held the event loop 115 ms for 60 MB), and
    the endpoint hands it on whole, byte for byte."""
    size = 64 * 1024 * 1024 - 1
    first = b"a" + bytes(range(32, 127)) * (size // 95) + b"z"
    second = first.replace(b"a", b"b", 1)
    received: asyncio.Future[tuple[WSMessage, bytes | None]] = (
        asyncio.get_running_loop().create_future()
    )

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = MaskedOnlyWebSocketResponse(
            max_msg_size=64 * 1024 * 1024 + 1, decode_text=False, compress=False
        )
        endpoint = WsServerEndpoint(ws, "test", 64 * 1024 * 1024)
        await ws.prepare(request)
        endpoint.opened(True)
        try:
            message = await ws.receive()
            data = await endpoint.receive()
            received.set_result((message, bytes_of(data)))
        finally:
            endpoint.close()
            await endpoint.wait_closed()
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        async with ws_connect(f"ws://{host}:{port}/", max_size=None, compression=None) as ws:
            await ws.send(first, text=True)
            await ws.send(second, text=True)
            message, data = await asyncio.wait_for(received, TIMEOUT)
    finally:
        await runner.cleanup()
    assert message.type is WSMsgType.TEXT
    assembled = message.data
    assert isinstance(assembled, Assembled), type(assembled)
    assert assembled.size == len(first)
    assert max(map(len, assembled.chunks)) <= 1024 * 1024
    assert b"".join(assembled.chunks) == first
    assert data == second


# -- the close of an Agent that failed -------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "close"), [(3, (1011, "the agent exited with status 3")), (0, (1000, ""))]
)
async def test_a_websocket_client_hears_how_its_agent_ended(
    tmp_path: Path, code: int, close: tuple[int, str]
) -> None:
    """The spawned Agent exits by itself: with a failure status the Client's WebSocket is closed
    1011 with the status in the reason; after a clean exit, 1000 as before."""
    async with serving(tmp_path) as s, ws_connect(s.ws_url(), proxy=None) as ws:
        await ws_initialize(ws)
        await ws.send(compact(notification("_test/exit", {"code": code})).decode())
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == close


# -- backpressure ----------------------------------------------------------------------------------

BIG = 400_000
"""Characters of one ``big`` chunk (about 500 kB of JSON: the pattern has escaped characters)."""
PROMPTS = 48
"""About 24 MB in all: well above the proxy's 8 MiB stream bound plus the kernel's socket
buffers (the Client's receive buffer is made small below, the proxy's send buffer is at most
4 MiB)."""
BOUND = 16 * 1024 * 1024
"""The most the proxy may read from the Agent ahead of a Client that stops reading."""


@contextlib.asynccontextmanager
async def cancelling(task: asyncio.Task[Any]) -> AsyncIterator[None]:
    """Cancel ``task`` (and wait for it) on exit, unless it finished."""
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_client_that_stops_reading_stalls_the_agent(tmp_path: Path) -> None:
    """An unread SSE stream stops the proxy reading the Agent until the Client reads again."""
    async with (
        serving(tmp_path, sdk=True) as s,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(socket_factory=small_receive_buffer)
        ) as slow_client,
    ):
        connection = await s.http.initialize()
        async with s.http.stream(connection) as main:
            reply = await s.http.post(
                request("new", "session/new", {"cwd": "/tmp", "mcpServers": []}),
                connection=connection,
            )
            assert reply.status == 202, reply
            session_id = (await main.next_json())["result"]["sessionId"]
            async with s.http.stream(
                connection, session_id, reading=False, client=slow_client
            ) as stalled:
                stalled.keep_raw = False
                for n in range(PROMPTS):
                    params = {
                        "sessionId": session_id,
                        "prompt": [{"type": "text", "text": f"big {BIG}"}],
                    }
                    reply = await s.http.post(
                        request(n, "session/prompt", params),
                        connection=connection,
                        session=session_id,
                    )
                    assert reply.status == 202, reply
                reply = await s.http.post(
                    request("probe", "_sdk_agent/state"), connection=connection
                )
                assert reply.status == 202, reply
                probe = asyncio.get_running_loop().create_task(main.next_json())
                async with cancelling(probe):
                    done, _ = await asyncio.wait({probe}, timeout=SILENCE)
                    assert not done, "the probe was answered while the Client read nothing"
                    stalled.reading.set()
                    answer = await asyncio.wait_for(probe, TIMEOUT)
                    read_when_answered = stalled.received
                assert answer["id"] == "probe"
                expected = big_text(BIG)
                answered = []
                for _ in range(2 * PROMPTS):  # prompts run concurrently in the Agent
                    message = await stalled.next_json()
                    if "id" in message:
                        answered.append(message["id"])
                    else:
                        assert message["params"]["update"]["content"]["text"] == expected
                assert sorted(answered) == list(range(PROMPTS))
                total = stalled.received
        assert total > PROMPTS * BIG
        assert read_when_answered >= total - BOUND, (read_when_answered, total)


LINE = 512 * 1024
"""Bytes of one line the raw Agent writes in the WebSocket flood."""
LINES = 40
"""About 20 MiB in all: above the proxy's 4 MiB WebSocket outbox plus the socket buffers."""
WS_BOUND = 12 * 1024 * 1024
"""The most the proxy may read from the Agent ahead of a WebSocket Client that stops reading."""


async def test_a_websocket_client_that_stops_reading_blocks_the_agents_writes(
    tmp_path: Path,
) -> None:
    """A WebSocket Client that reads nothing blocks the Agent's writes until it reads again."""
    lines = [
        compact(notification("_x/flood", {"n": n, "pad": "y" * (LINE - 64)})) for n in range(LINES)
    ]
    mark = compact(notification("_test/stderr", {"text": '{"event": "agent-mark"}'}))
    async with serving(tmp_path) as s:
        host, port = s.url.removeprefix("http://").split("/")[0].split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        except OSError:
            sock.close()
            raise
        async with ws_connect(
            s.ws_url(), sock=sock, proxy=None, max_size=None, max_queue=1, compression=None
        ) as ws:
            await ws_initialize(ws)
            await ws.send(
                compact(
                    notification("_test/say", {"lines": [line.decode() for line in lines]})
                ).decode()
            )
            await ws.send(mark.decode())
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(s.proxy.logged("agent-mark"), SILENCE)
            received: list[bytes] = []
            size = 0
            marked = asyncio.get_running_loop().create_task(s.proxy.logged("agent-mark"))
            read_when_marked = -1
            async with cancelling(marked):
                while len(received) < LINES:
                    frame = await asyncio.wait_for(ws.recv(), TIMEOUT)
                    assert isinstance(frame, str)
                    received.append(frame.encode())
                    size += len(frame)
                    if read_when_marked < 0 and marked.done():
                        read_when_marked = size
                await asyncio.wait_for(marked, TIMEOUT)
            assert received == lines
            await ws_probe(ws, "after")
        total = sum(map(len, lines))
        if read_when_marked < 0:
            read_when_marked = total
        assert read_when_marked >= total - WS_BOUND, (read_when_marked, total)


async def test_the_messages_queued_toward_a_websocket_peer_are_written_together() -> None:
    """The writer takes every whole message queued behind the one it took, up to a bound, to
    write their frames at once; a message written in pieces waits for a turn of its own."""
    outbox = _Outbox()
    for data in (b"a", b"bb", Sliced(b"cc", (1,), 0.0), b"d", b"e" * 10, b"f"):
        outbox.put(data)
    assert await outbox.get() == b"a"
    assert outbox.take_more(100) == [b"bb"]
    assert isinstance(await outbox.get(), Sliced)
    assert await outbox.get() == b"d"
    assert outbox.take_more(5) == [b"e" * 10]  # past the bound: what is taken stops there
    assert outbox.take_more(5) == [b"f"]
    assert outbox.size() == 0


async def test_a_burst_toward_a_websocket_client_arrives_whole_and_in_order(
    tmp_path: Path,
) -> None:
    """Hundreds of messages the Agent writes at once reach the WebSocket Client as as many
    text frames, whole and in order (written together, frames built by the proxy)."""
    lines = [compact(notification("_x/n", {"n": n, "pad": "é" * (n % 7)})) for n in range(300)]
    async with serving(tmp_path, listen=WS_LISTEN) as s, ws_connect(s.url) as ws:
        await ws_initialize(ws)
        await ws.send(compact(say(*lines)).decode())
        got = [await asyncio.wait_for(ws.recv(), TIMEOUT) for _ in lines]
    assert got == [line.decode() for line in lines]


async def test_messages_toward_an_idle_websocket_agent_are_written_at_the_turns_end() -> None:
    """Nothing queued nor being written: the messages sent in one turn of the loop are written
    together at its end (counted as not written until then), the writing task left asleep.
    Behind a message written in pieces the next ones wait for it; sent and closed in one turn,
    a message is written before the close. The Agent reads them all whole, in order."""
    got: list[int] = []
    all_in = asyncio.Event()

    async def agent(connection: ServerConnection) -> None:
        async for frame in connection:
            got.append(json.loads(frame)["n"])
            if len(got) == 6:
                all_in.set()

    async with ws_serve(agent, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        endpoint = await connect_agent(f"ws://127.0.0.1:{port}/", limit=1 << 20)
        try:
            endpoint.send(b'{"n":1}')
            endpoint.send(b'{"n":2}')
            assert endpoint.buffered() == 14  # until the turn ends
            await asyncio.sleep(0)
            assert endpoint.buffered() == 0  # written
            endpoint.send_sliced(b'{"n":3,"pad":"' + b"x" * 64 + b'"}', (8, 8), 0.01)
            endpoint.send(b'{"n":4}')
            endpoint.send(b'{"n":5}')
            await asyncio.sleep(0)
            assert endpoint.buffered() > 0  # behind the pieces
            endpoint.send(b'{"n":6}')
            endpoint.close()
            await asyncio.wait_for(all_in.wait(), TIMEOUT)
        finally:
            endpoint.close()
            await asyncio.wait_for(endpoint.wait_closed(), TIMEOUT)
    assert got == [1, 2, 3, 4, 5, 6]
