"""TLS on both sides, with real peers trusting a CA made by the test (``tests/support/certs.py``).

The proxy runs as a process (``acp-proxy run``): listening on ``https://`` or ``wss://`` with
``--tls-cert`` and ``--tls-key``, reaching an Agent on ``https://`` or ``wss://`` with
``--tls-ca``. The peers are the official SDKs: the Python SDK's Client and Agent (uvicorn serving
HTTPS and WSS), and the TypeScript SDK's Client and Agent on Node, which trusts the CA through
``NODE_EXTRA_CA_CERTS``. What cannot be used (a file, a pairing of options) is refused by the
command line with exit 2 and a message naming the option and the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from certs import Pki, make_pki
from control_calls import off
from harness import SDK_AGENT, TIMEOUT, Controlled, reference_agent
from peers.sdk_agent import big_text, digest
from peers.sdk_remote_client import (
    NODE_AGENT,
    NODE_AGENT_MISSING,
    HttpAgent,
    SimpleClient,
    connect_ws,
    exercise,
    listening_proxy,
    open_session,
    run_node_agent,
    run_sdk_http_agent,
    sdk_client,
    sdk_prompt,
    stdio_client,
    ws_url,
)
from tool_runs import acp_proxy

NODE_CLIENT = NODE_AGENT.parent / "client.mjs"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def trusting(pki: Pki) -> ssl.SSLContext:
    """A Client's TLS that trusts the test's CA alone."""
    return ssl.create_default_context(cafile=pki.ca)


def serving(pki: Pki) -> list[str]:
    """The proxy's options serving the test's certificate."""
    return ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]


def tls_agent(cert: Path, key: Path) -> contextlib.AbstractAsyncContextManager[HttpAgent]:
    """The Python SDK's Agent on uvicorn, serving HTTPS and WSS with ``cert``."""
    return run_sdk_http_agent("--tls-cert", str(cert), "--tls-key", str(key))


def target(agent: HttpAgent, kind: str) -> str:
    """The Agent's URL over ``kind`` (http: ``https://``, ws: ``wss://``)."""
    return agent.url if kind == "http" else ws_url(agent.url)


# -- every pairing, with the Python SDK --------------------------------------------------------


@pytest.mark.parametrize("downstream", ["http", "ws"])
@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_tls_on_both_sides(pki: Pki, downstream: str, upstream: str) -> None:
    """The SDK Client over HTTPS or WSS, through the proxy, to the SDK Agent over HTTPS or WSS:
    every message of a whole conversation (sessions, prompts, a request of the Agent, a cancel)
    goes through two TLS connections, each verified against the test's CA."""
    async with tls_agent(pki.cert, pki.key) as agent:
        assert agent.url.startswith("https://")
        listen = f"{'https' if downstream == 'http' else 'wss'}://127.0.0.1:0/acp"
        options = [*serving(pki), "--upstream", target(agent, upstream), "--tls-ca", str(pki.ca)]
        async with listening_proxy(listen, *options) as (_proxy, url):
            assert url.startswith(listen.removesuffix("0/acp"))
            client = SimpleClient()
            async with sdk_client(downstream, url, client, tls=trusting(pki)) as conn:
                await exercise(conn, client)


async def test_large_messages_both_ways_through_wss(pki: Pki) -> None:
    """Messages of megabytes each way through WSS on both sides: the listener's own reading and
    writing of large frames (its reader ahead of aiohttp's, its writes on the transport) work on
    a TLS transport as on a plain one."""
    size = 3 * 1024 * 1024
    async with tls_agent(pki.cert, pki.key) as agent:
        options = [*serving(pki), "--upstream", ws_url(agent.url), "--tls-ca", str(pki.ca)]
        async with listening_proxy("wss://127.0.0.1:0/acp", *options) as (_proxy, url):
            client = SimpleClient()
            async with connect_ws(url, client, tls=trusting(pki), max_size=2 * size) as conn:
                session = await open_session(conn)
                text = big_text(size)
                assert await sdk_prompt(conn, session, text) == "end_turn"
                assert await sdk_prompt(conn, session, f"big {size}") == "end_turn"
                await client.until(lambda: len(client.texts()) == 2)
    assert client.texts() == [digest(text), text]


@pytest.mark.parametrize("downstream", ["http", "ws"])
async def test_tls_listener_in_front_of_a_spawned_agent(pki: Pki, downstream: str) -> None:
    """TLS toward the Client alone: the Agent is a process the proxy spawns over stdio."""
    listen = f"{'https' if downstream == 'http' else 'wss'}://127.0.0.1:0/acp"
    async with listening_proxy(listen, *serving(pki), agent=SDK_AGENT) as (_proxy, url):
        client = SimpleClient()
        async with sdk_client(downstream, url, client, tls=trusting(pki)) as conn:
            await exercise(conn, client)


@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_stdio_client_to_an_agent_in_tls(pki: Pki, upstream: str) -> None:
    """TLS toward the Agent alone: the SDK Client launches the proxy over stdio."""
    async with tls_agent(pki.cert, pki.key) as agent:
        client = SimpleClient()
        async with stdio_client(target(agent, upstream), client, "--tls-ca", str(pki.ca)) as conn:
            await exercise(conn, client)


# -- trust refused, and --tls-insecure ---------------------------------------------------------


@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_an_agent_whose_certificate_is_not_trusted_is_not_reached(
    pki: Pki, upstream: str
) -> None:
    """An Agent whose certificate no trusted CA signed is refused by the proxy, and the log says
    why (the certificate could not be verified): the Client's initialize gets 502 (WebSocket:
    no connection), or the error of a POST that failed (HTTP: each POST is a connection)."""
    async with tls_agent(pki.stranger, pki.stranger_key) as agent:
        options = ["--upstream", target(agent, upstream), "--tls-ca", str(pki.ca)]
        async with listening_proxy("http://127.0.0.1:0/acp", *options) as (proxy, url):
            status, answer = await initialize(url)
            if upstream == "ws":
                assert status == 502
                event = await proxy.logged("could not connect to the agent")
            else:
                assert answer["error"]["data"]["status"] == 502, answer
                assert "certificate verify failed" in answer["error"]["data"]["body"]
                event = await proxy.logged("POST to the agent failed")
            assert "certificate verify failed" in event["error"], event


@pytest.mark.parametrize("upstream", ["http", "ws"])
async def test_tls_insecure_reaches_any_agent_and_says_so(pki: Pki, upstream: str) -> None:
    """``--tls-insecure`` reaches an Agent whose certificate nobody trusts, and the log says, when
    the proxy starts, that the Agent's certificate is not checked."""
    async with tls_agent(pki.stranger, pki.stranger_key) as agent:
        options = ["--upstream", target(agent, upstream), "--tls-insecure"]
        async with listening_proxy("http://127.0.0.1:0/acp", *options) as (proxy, url):
            warning = await proxy.logged("the agent's TLS certificate and name are not checked")
            assert "--tls-insecure" in warning["tls"]
            assert warning["level"] == "warning"
            client = SimpleClient()
            async with sdk_client("http", url, client) as conn:
                await exercise(conn, client)
            if upstream == "ws":
                connected = await proxy.logged("connected to the agent")
                assert connected["level"] == "warning"
                assert "--tls-insecure" in connected["tls"]


async def test_a_client_that_does_not_trust_the_certificate_is_refused(pki: Pki) -> None:
    """A Client without the CA fails its handshake; the proxy goes on serving the next one."""
    async with listening_proxy("https://127.0.0.1:0/acp", *serving(pki), agent=SDK_AGENT) as (
        _proxy,
        url,
    ):
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post_initialize(url, tls=ssl.create_default_context())
        assert await post_initialize(url, tls=trusting(pki)) == 200


async def test_plain_http_to_a_tls_listener_gets_no_answer(pki: Pki) -> None:
    """Plain HTTP sent to a listener in TLS is no handshake: the connection is closed, nothing
    reaches the Agent, and the listener still serves TLS."""
    async with listening_proxy("https://127.0.0.1:0/acp", *serving(pki), agent=SDK_AGENT) as (
        _proxy,
        url,
    ):
        with pytest.raises(aiohttp.ClientError):
            await post_initialize(url.replace("https://", "http://"))
        assert await post_initialize(url, tls=trusting(pki)) == 200


async def test_a_stalled_handshake_is_cut_after_the_header_timeout(pki: Pki) -> None:
    """A connection that never starts its TLS handshake is closed after ``--header-timeout``, as
    one that never sends its request head is."""
    options = [*serving(pki), "--header-timeout", "0.5"]
    async with listening_proxy("https://127.0.0.1:0/acp", *options, agent=SDK_AGENT) as (
        _proxy,
        url,
    ):
        port = int(url.split(":")[2].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            async with asyncio.timeout(TIMEOUT):
                assert await reader.read() == b""  # closed by the proxy, not by the test
        finally:
            writer.close()


async def test_a_page_of_the_tls_listener_is_its_own_origin(pki: Pki) -> None:
    """The listener in TLS takes ``https://`` and its own address as its pages' origin (a browser
    sends that on the WebSocket upgrade); the same origin over ``http://`` is another one."""
    async with listening_proxy("wss://127.0.0.1:0/acp", *serving(pki), agent=SDK_AGENT) as (
        _proxy,
        url,
    ):
        own = url.replace("wss://", "https://").removesuffix("/acp")
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(
                url, ssl=trusting(pki), headers={"Origin": own}
            ) as socket:
                assert not socket.closed
            other = own.replace("https://", "http://")
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(url, ssl=trusting(pki), headers={"Origin": other})
            assert refused.value.status == 403


async def initialize(url: str, *, tls: ssl.SSLContext | None = None) -> tuple[int, Any]:
    """The status and the JSON body of an ``initialize`` POSTed to ``url``."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(TIMEOUT):
            async with session.post(url, json=body, ssl=tls if tls is not None else True) as answer:
                return answer.status, await answer.json(content_type=None)


async def post_initialize(url: str, *, tls: ssl.SSLContext | None = None) -> int:
    """The status of an ``initialize`` POSTed to ``url``."""
    status, _ = await initialize(url, tls=tls)
    return status


async def test_the_control_api_stays_plain_and_restart_brings_tls_back(
    pki: Pki, controlled: Controlled
) -> None:
    """With a listener in TLS the control API still answers plain HTTP on its loopback port, and
    ``restart_proxy`` brings the listener back in TLS, with the same certificate."""
    listen = ["--listen", "https://127.0.0.1:0/acp", *serving(pki)]
    proxy, control = await controlled(SDK_AGENT, *listen)
    assert control.base_url.startswith("http://")
    assert (await off(control.health))["status"] == "ok"
    url = (await proxy.logged("listening"))["url"]
    assert await post_initialize(url, tls=trusting(pki)) == 200
    await off(control.restart_proxy, downtime_ms=0)
    assert (await proxy.logged("listening", 2))["url"] == url
    assert await post_initialize(url, tls=trusting(pki)) == 200


# -- the reference Client and Agent -----------------------------------------------------------


async def test_reference_client_and_agent_through_tls(pki: Pki) -> None:
    """``acp-proxy client --connect https:// --tls-ca`` through the proxy (HTTPS toward the
    Client, WSS toward the Agent) to ``acp-proxy agent --listen wss:// --tls-cert --tls-key``:
    the prompt is inserted once and confirmed (exit 0)."""
    agent = reference_agent("wss://127.0.0.1:0/acp", *serving(pki))
    async with agent as agent_url:
        assert agent_url.startswith("wss://")
        options = [*serving(pki), "--upstream", agent_url, "--tls-ca", str(pki.ca)]
        async with listening_proxy("https://127.0.0.1:0/acp", *options) as (_proxy, url):
            client = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "proxy", "client", "--connect", url),
                *("--tls-ca", str(pki.ca), "--prompt", "hello", "--json"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(TIMEOUT):
                out, err = await client.communicate()
    assert client.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["ok"], report
    assert report["transport"] == "http"
    assert len(report["userMessageIds"]) == 1  # inserted once


def test_reference_tools_refuse_tls_options_without_tls(pki: Pki) -> None:
    """The reference Client's ``--tls-ca`` needs a ``wss://`` or ``https://`` URL, the reference
    Agent's listener in TLS its certificate: usage errors (exit 2)."""
    client = acp_proxy("client", "--connect", "ws://127.0.0.1:9/acp", "--tls-ca", str(pki.ca))
    assert client.returncode == 2
    assert "are for an Agent in TLS" in " ".join(client.stderr.split())
    agent = acp_proxy("agent", "--listen", "https://127.0.0.1:0/acp")
    assert agent.returncode == 2
    assert "needs --tls-cert and --tls-key" in " ".join(agent.stderr.split())
    expired = acp_proxy(
        *("agent", "--listen", "https://127.0.0.1:0/acp", "--tls-cert", str(pki.expired)),
        *("--tls-key", str(pki.expired_key)),
    )
    assert expired.returncode == 2
    assert "the certificate expired on" in " ".join(expired.stderr.split())


# -- the TypeScript SDK on Node ----------------------------------------------------------------

needs_node = pytest.mark.skipif(NODE_AGENT_MISSING is not None, reason=str(NODE_AGENT_MISSING))


async def node_client(url: str, ca: Path) -> dict[str, object]:
    """The TypeScript SDK's Client (``node/client.mjs``) run against ``url``, trusting ``ca``
    through ``NODE_EXTRA_CA_CERTS``: its report."""
    process = await asyncio.create_subprocess_exec(
        "node",
        "--experimental-websocket",
        "--no-warnings",
        str(NODE_CLIENT),
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_EXTRA_CA_CERTS": str(ca)},
    )
    try:
        async with asyncio.timeout(TIMEOUT):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    report: dict[str, object] = json.loads(out)
    return report


@needs_node
@pytest.mark.parametrize("downstream", ["https", "wss"])
async def test_node_client_and_agent_through_tls(pki: Pki, downstream: str) -> None:
    """The TypeScript SDK's Client over HTTPS or WSS, through the proxy, to its Agent over HTTPS;
    each Node program trusts the test's CA as Node programs do (``NODE_EXTRA_CA_CERTS``)."""
    async with run_node_agent("--tls-cert", str(pki.cert), "--tls-key", str(pki.key)) as agent:
        assert agent.url.startswith("https://")
        options = [*serving(pki), "--upstream", agent.url, "--tls-ca", str(pki.ca)]
        async with listening_proxy(f"{downstream}://127.0.0.1:0/acp", *options) as (_proxy, url):
            report = await node_client(url, pki.ca)
    assert report == {"agent": "ts-sdk-agent", "chunks": ["hello"], "stopReason": "end_turn"}


@needs_node
async def test_node_client_refuses_an_untrusted_proxy(pki: Pki) -> None:
    """Without the CA, the Node Client refuses the proxy's certificate: trust is really checked."""
    async with listening_proxy("wss://127.0.0.1:0/acp", *serving(pki), agent=SDK_AGENT) as (
        _proxy,
        url,
    ):
        with pytest.raises(AssertionError):
            await node_client(url, pki.stranger)


# -- what the command line refuses -------------------------------------------------------------


def refused(*args: str) -> str:
    """The message of a run the command line refuses (exit 2, nothing on stdout)."""
    done = acp_proxy("run", *args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    return " ".join(done.stderr.split())


def test_files_that_cannot_be_used_are_located_errors(pki: Pki, tmp_path: Path) -> None:
    """Each file that cannot be used is refused before anything starts, naming the option, the
    file and why."""
    listen = ["--listen", "https://127.0.0.1:0/acp"]
    agent = ["--", sys.executable, "-c", "pass"]

    def run(cert: Path, key: Path) -> str:
        return refused(*listen, "--tls-cert", str(cert), "--tls-key", str(key), *agent)

    assert "--tls-cert" in (message := run(pki.expired, pki.expired_key))
    assert "the certificate expired on" in message
    assert "expired.pem" in message
    assert "--tls-key" in (message := run(pki.cert, pki.other_key))
    assert "other.key does not match the certificate of" in message
    assert "encrypted.key is encrypted" in run(pki.cert, pki.encrypted_key)
    missing = tmp_path / "missing.pem"
    assert f"cannot read {missing}: no such file or directory" in run(missing, pki.key)
    assert "cannot read" in run(pki.cert, tmp_path)  # a directory
    assert "server.key holds no PEM certificate" in run(pki.key, pki.key)
    assert "server.pem: not a usable PEM private key" in run(pki.cert, pki.cert)
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert "garbage.pem: the first certificate is not X.509" in run(garbage, pki.key)
    huge = tmp_path / "huge.pem"
    huge.write_bytes(b"x" * (2 * 1024 * 1024))
    assert "huge.pem is larger than" in run(huge, pki.key)
    upstream = ["--upstream", "https://127.0.0.1:9/acp"]
    assert "--tls-ca" in (message := refused(*upstream, "--tls-ca", str(pki.key)))
    assert "server.key holds no PEM certificate" in message
    assert f"cannot read {missing}" in refused(*upstream, "--tls-ca", str(missing))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--listen", "https://127.0.0.1:0/acp"], "needs --tls-cert and --tls-key"),
        (["--listen", "wss://127.0.0.1:0/acp"], "needs --tls-cert and --tls-key"),
        (
            ["--listen", "http://127.0.0.1:0/acp", "--tls-cert", "{cert}", "--tls-key", "{key}"],
            "serve a listener in TLS",
        ),
        (
            ["--listen", "https://127.0.0.1:0/acp", "--tls-cert", "{cert}"],
            "--tls-cert needs --tls-key too",
        ),
        (
            ["--listen", "https://127.0.0.1:0/acp", "--tls-key", "{key}"],
            "--tls-key needs --tls-cert too",
        ),
        (["--upstream", "http://127.0.0.1:9/acp", "--tls-ca", "{ca}"], "are for an Agent in TLS"),
        (["--upstream", "ws://127.0.0.1:9/acp", "--tls-insecure"], "are for an Agent in TLS"),
        (["--tls-insecure", "--", "true"], "are for an Agent in TLS"),
        (
            ["--upstream", "wss://127.0.0.1:9/acp", "--tls-ca", "{ca}", "--tls-insecure"],
            "--tls-ca and --tls-insecure exclude each other",
        ),
    ],
)
def test_tls_options_without_their_address_are_usage_errors(
    pki: Pki, args: list[str], expected: str
) -> None:
    """A TLS option is refused (exit 2) where no address in TLS takes it, and a listener in TLS
    without both of its files."""
    files = {"cert": str(pki.cert), "key": str(pki.key), "ca": str(pki.ca)}
    given = [arg.format(**files) for arg in args]
    if given[-2:] != ["--", "true"] and "--upstream" not in given:
        given += ["--", "true"]
    assert expected in refused(*given)
