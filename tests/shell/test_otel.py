"""OpenTelemetry (``--otel``): the spans a real proxy exports over OTLP/HTTP, decoded as a collector
would, and the ``traceparent`` it writes into forwarded requests with ``--otel-propagate``.

The receiver is an OTLP/HTTP endpoint the test serves on loopback (``/v1/traces``); it decodes
each export with opentelemetry-proto. The proxy is told where it is by the standard variables.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from harness import ProxyProcess, captured, encode, fault_file, raw_agent, request, say
from listener_client import WS_LISTEN, compact, serving, ws_initialize, ws_recv
from listener_client import request as request_of
from websockets.asyncio.client import connect as ws_connect

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.core.events import Direction, Side
from proxy.core.jsonrpc import Kind
from proxy.core.observations import Disconnected, PeerGone, Relayed
from proxy.shell.otel import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SECRET_KEY = "key-7f3a-never-exported"


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, and the raw bodies."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.resources: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self.arrived = asyncio.Event()
        self.url = ""

    async def export(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        body = await request.read()
        self.bodies.append(body)
        decoded = ExportTraceServiceRequest.FromString(body)
        for resource_spans in decoded.resource_spans:
            self.resources.append(_attributes(resource_spans.resource.attributes))
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        self.arrived.set()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def span(self, name: str) -> Span:
        """The first span named ``name``, waiting for it."""
        async with asyncio.timeout(30):
            while True:
                for span in self.spans:
                    if span.name == name:
                        return span
                self.arrived.clear()
                await self.arrived.wait()


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.export)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    found.url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    try:
        yield found
    finally:
        await runner.cleanup()


def _prompt(request_id: str) -> bytes:
    params = {
        "sessionId": "sess-otel",
        "idempotencyKey": SECRET_KEY,
        "prompt": [{"type": "text", "text": "hello"}],
        "_meta": {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "vendor=1"},
    }
    return request(request_id, "session/prompt", params)


async def _run(tmp_path: Path, *options: str) -> tuple[ProxyProcess, Path]:
    faults = fault_file(
        tmp_path,
        {
            "name": "slow-prompt",
            "when": {"method": "session/prompt"},
            "do": {"action": "delay", "ms": 1},
        },
        {"name": "lose-it", "when": {"method": "_x/lost"}, "do": {"action": "drop"}},
    )
    capture = tmp_path / "agent.jsonl"
    proxy = await ProxyProcess.start(raw_agent(capture), "--faults", str(faults), *options)
    await proxy.send(request("init", "initialize", {"protocolVersion": 1}))
    assert json.loads(await proxy.recv())["id"] == "init"
    return proxy, capture


async def test_spans_of_requests_children_of_the_clients_traceparent(
    receiver: Receiver, tmp_path: Path
) -> None:
    proxy, capture = await _run(tmp_path, "--otel", "--otel-propagate")
    try:
        await proxy.send(request("lost-1", "_x/lost", {"sessionId": "sess-otel"}))
        await proxy.send(_prompt("p-1"))
        answer = json.loads(await proxy.recv())
        assert answer["id"] == "p-1"

        prompt = await receiver.span("session/prompt")
        assert prompt.trace_id.hex() == TRACE_ID
        assert prompt.parent_span_id.hex() == PARENT_ID
        assert prompt.kind == Span.SPAN_KIND_SERVER
        attributes = _attributes(prompt.attributes)
        assert attributes["rpc.system"] == "jsonrpc"
        assert attributes["rpc.method"] == "session/prompt"
        assert attributes["rpc.jsonrpc.request_id"] == '"p-1"'
        assert attributes["acp.session"] == "sess-otel"
        assert attributes["acp.direction"] == "to_agent"
        assert attributes["acp.outcome"] == "answered"
        assert isinstance(attributes["acp.link"], int)
        digest = hashlib.sha256(SECRET_KEY.encode()).hexdigest()[:16]
        assert attributes["acp.idempotency_key.digest"] == digest
        faults = [_attributes(e.attributes) for e in prompt.events if e.name == "fault"]
        assert faults == [  # the rule slows the request and its answer: both on its span
            {"acp.rule": "slow-prompt", "acp.action": "delay", "acp.direction": direction}
            for direction in ("to_agent", "to_client")
        ]
        assert prompt.end_time_unix_nano > prompt.start_time_unix_nano

        # The Agent got the proxy's span as its parent, the Client's trace state kept.
        forwarded = json.loads(
            next(line for line in captured(capture) if b"session/prompt" in line)
        )
        meta = forwarded["params"]["_meta"]
        assert meta["traceparent"] == f"00-{TRACE_ID}-{prompt.span_id.hex()}-01"
        assert meta["tracestate"] == "vendor=1"
        assert forwarded["params"]["idempotencyKey"] == SECRET_KEY  # the rest as it was

        lost = await receiver.span("_x/lost")
        assert _attributes(lost.attributes)["acp.outcome"] == "dropped"
        assert lost.status.code == Status.STATUS_CODE_ERROR
        assert len(lost.parent_span_id) == 0  # no traceparent: a root span
        initialize = await receiver.span("initialize")
        assert _attributes(initialize.attributes)["acp.outcome"] == "answered"

        assert receiver.resources[0]["service.name"] == "acp-fault-proxy"
        assert all(SECRET_KEY.encode() not in body for body in receiver.bodies)
    finally:
        await proxy.stop()


async def test_without_propagate_the_forwarded_bytes_stay(
    receiver: Receiver, tmp_path: Path
) -> None:
    proxy, capture = await _run(tmp_path, "--otel")
    try:
        sent = _prompt("p-2")
        await proxy.send(sent)
        assert json.loads(await proxy.recv())["id"] == "p-2"
        forwarded = next(line for line in captured(capture) if b"session/prompt" in line)
        agent_id = json.loads(forwarded)["id"]
        assert forwarded == sent.rstrip(b"\n").replace(b'"id":"p-2"', b'"id":%d' % agent_id)
        prompt = await receiver.span("session/prompt")
        assert prompt.parent_span_id.hex() == PARENT_ID  # still the Client's child
    finally:
        await proxy.stop()


async def test_spans_still_open_end_when_the_proxy_stops(
    receiver: Receiver, tmp_path: Path
) -> None:
    capture = tmp_path / "agent.jsonl"
    proxy = await ProxyProcess.start(raw_agent(capture, "--no-answer", "_x/hang"), "--otel")
    await proxy.send(request("h-1", "_x/hang", {"sessionId": "s"}))
    await proxy.send(request("ping", "_x/ping"))
    assert json.loads(await proxy.recv())["id"] == "ping"  # the hanging one went before
    await proxy.close_stdin()
    assert await proxy.wait() == 0
    hang = await receiver.span("_x/hang")
    assert _attributes(hang.attributes)["acp.outcome"] in {"peer_gone", "link_end", "proxy_stopped"}
    assert hang.status.code == Status.STATUS_CODE_ERROR


async def test_two_websocket_links_with_the_same_ids_have_their_own_spans(
    receiver: Receiver, tmp_path: Path
) -> None:
    async with (
        serving(tmp_path, "--otel", listen=WS_LISTEN) as setup,
        ws_connect(setup.url, proxy=None) as first,
        ws_connect(setup.url, proxy=None) as second,
    ):
        for ws, session in ((first, "s-first"), (second, "s-second")):
            await ws_initialize(ws)
            await ws.send(compact(request_of("r1", "_x/work", {"sessionId": session})).decode())
            assert (await ws_recv(ws))["id"] == "r1"
        async with asyncio.timeout(30):
            while len([s for s in receiver.spans if s.name == "_x/work"]) < 2:
                receiver.arrived.clear()
                await receiver.arrived.wait()
    work = [_attributes(s.attributes) for s in receiver.spans if s.name == "_x/work"]
    assert {(a["acp.session"], a["acp.outcome"]) for a in work} == {
        ("s-first", "answered"),
        ("s-second", "answered"),
    }
    assert len({a["acp.link"] for a in work}) == 2


async def test_a_client_that_closed_its_stdin_still_gets_answered_spans(
    receiver: Receiver, tmp_path: Path
) -> None:
    """``head -3 | acp-proxy run``: the Client's half-close ends no span; its answers do."""
    proxy = await ProxyProcess.start(raw_agent(tmp_path / "agent.jsonl"), "--otel")
    await proxy.send(*(request(f"h-{n}", "_x/work", {"sessionId": "s"}) for n in range(3)))
    await proxy.close_stdin()
    answers = [json.loads(await proxy.recv())["id"] for _ in range(3)]
    assert sorted(answers) == ["h-0", "h-1", "h-2"]
    assert await proxy.wait() == 0
    async with asyncio.timeout(30):
        while len([s for s in receiver.spans if s.name == "_x/work"]) < 3:
            receiver.arrived.clear()
            await receiver.arrived.wait()
    outcomes = [_attributes(s.attributes)["acp.outcome"] for s in receiver.spans]
    assert outcomes.count("answered") == 3, outcomes


async def test_an_agents_request_in_a_turn_is_a_child_of_the_prompt(
    receiver: Receiver, tmp_path: Path
) -> None:
    """The Agent's ``session/request_permission`` during a prompt of its session, with no
    ``traceparent`` of its own, joins the prompt's trace."""
    capture = tmp_path / "agent.jsonl"
    proxy = await ProxyProcess.start(raw_agent(capture, "--no-answer", "session/prompt"), "--otel")
    try:
        await proxy.send(_prompt("p-3"))
        asking = request("agent-ask", "session/request_permission", {"sessionId": "sess-otel"})
        other = request("agent-other", "session/request_permission", {"sessionId": "elsewhere"})
        await proxy.send(say(asking, other))
        asked = [json.loads(await proxy.recv())["id"] for _ in range(2)]
        for agent_id in asked:
            await proxy.send(encode({"jsonrpc": "2.0", "id": agent_id, "result": {}}))
        await proxy.close_stdin()
        assert await proxy.wait() == 0
        async with asyncio.timeout(30):
            while len([s for s in receiver.spans if s.name == "session/request_permission"]) < 2:
                receiver.arrived.clear()
                await receiver.arrived.wait()
        prompt = await receiver.span("session/prompt")
        permissions = {
            _attributes(s.attributes)["acp.session"]: s
            for s in receiver.spans
            if s.name == "session/request_permission"
        }
        inside = permissions["sess-otel"]
        assert inside.trace_id == prompt.trace_id
        assert inside.parent_span_id == prompt.span_id
        assert permissions["elsewhere"].trace_id != prompt.trace_id  # not this prompt's turn
    finally:
        await proxy.stop()


async def test_a_collector_that_never_answers_does_not_hold_the_exit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    silent_connections: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent_connections.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "600")  # the exporter alone would wait
    try:
        proxy = await ProxyProcess.start(
            raw_agent(tmp_path / "agent.jsonl"), "--otel", "--log-format", "json"
        )
        await proxy.send(request("w-1", "_x/work"))
        assert json.loads(await proxy.recv())["id"] == "w-1"
        await proxy.close_stdin()
        assert await proxy.wait() == 0
        assert "the last spans were not sent" in proxy.stderr
    finally:
        for writer in silent_connections:
            writer.close()
        server.close()


def test_the_grpc_protocol_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "run", "--otel", "--", *raw_agent(tmp_path / "a")],
        input=b"",
        capture_output=True,
        check=False,
        timeout=60,
        env={**os.environ, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    )
    assert done.returncode == 1
    assert done.stdout == b""
    err = done.stderr.decode()
    assert "Traceback" not in err
    assert "--otel with OTEL_EXPORTER_OTLP_PROTOCOL=grpc: only OTLP over HTTP" in err


def test_without_otel_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys, proxy.cli, proxy.shell.app, proxy.shell.server;"
        "sys.exit(any(m.split('.')[0] == 'opentelemetry' for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_otel_without_the_extra_is_one_clear_line(tmp_path: Path) -> None:
    # A Python where the package cannot be imported: the proxy's own entry, run as it is.
    code = (
        "import sys; sys.modules['opentelemetry'] = None;"
        "from proxy.cli import main; sys.argv = ['acp-proxy', *sys.argv[1:]]; main()"
    )
    argv = [sys.executable, "-c", code, "run", "--otel"]
    done = subprocess.run(
        [*argv, "--", *raw_agent(tmp_path / "a.jsonl")],
        input=b"",
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == b""
    err = done.stderr.decode()
    assert "Traceback" not in err
    assert "--otel needs OpenTelemetry: pip install 'acp-fault-proxy[otel]'" in err


def _sent(direction: Direction, request_id: bytes) -> Relayed:
    """The observation of a request forwarded (no socket: the observer alone is fed)."""
    return Relayed(
        direction=direction,
        kind=Kind.REQUEST,
        method="_x/work",
        session=None,
        size=40,
        original_id=request_id,
        forwarded_id=request_id,
    )


def test_a_links_end_ends_its_own_spans_and_no_other_links() -> None:
    """The observer alone, fed observations (no sockets): two links with the same request ids;
    the peer of one link gone ends that link's requests toward it, the link's end the rest of
    its own, oldest first; the other link's span stays open until the proxy stops."""

    exporter = InMemorySpanExporter()
    tracing = Tracing(exporter)
    for link in (1, 2):
        tracing.observe(_sent(Direction.TO_AGENT, b"7"), link)
        tracing.observe(_sent(Direction.TO_AGENT, b"8"), link)
        tracing.observe(_sent(Direction.TO_CLIENT, b"9"), link)
    tracing.observe(PeerGone(side=Side.AGENT, abandoned=2), 1)
    tracing.observe(Disconnected(Side.AGENT, "stdio"), 1)
    tracing.observe(Disconnected(Side.CLIENT, "stdio"), 1)
    tracing.close()
    ended = [
        (span.attributes["acp.link"], span.attributes["acp.outcome"])  # type: ignore[index]
        for span in exporter.get_finished_spans()
    ]
    assert ended == [
        (1, "peer_gone"),
        (1, "peer_gone"),
        (1, "link_end"),
        (2, "proxy_stopped"),
        (2, "proxy_stopped"),
        (2, "proxy_stopped"),
    ]


def test_a_span_evicted_is_gone_from_its_links_end() -> None:
    """Past ``max_open``, the oldest span ends ``evicted``; its link's end then ends only the
    spans still open (never the evicted one twice)."""
    exporter = InMemorySpanExporter()
    tracing = Tracing(exporter, max_open=2)
    for request_id in (b"1", b"2", b"3"):
        tracing.observe(_sent(Direction.TO_AGENT, request_id), 1)
    tracing.observe(Disconnected(Side.AGENT, "stdio"), 1)
    tracing.observe(Disconnected(Side.CLIENT, "stdio"), 1)
    tracing.close()
    ended = [span.attributes["acp.outcome"] for span in exporter.get_finished_spans()]  # type: ignore[index]
    assert ended == ["evicted", "link_end", "link_end"]
    assert tracing.evicted == 1
