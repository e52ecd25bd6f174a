"""``acp-proxy replay agent`` as a user runs it: a session of the reference Agent recorded through
the proxy, then replayed in the Agent's place, with faults in front, over stdio and WebSocket,
and checked by check-agent."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from certs import make_pki
from harness import ROOT, TIMEOUT
from tool_runs import acp_proxy, check_agent, command, session_run

from proxy.shell.transports.stdio import spawn_agent
from proxy.tools.replay.files import load_recording
from proxy.tools.rpc import Peer

LOSE_FIRST_ANSWER = ROOT / "config" / "lose-first-prompt-response.yaml"


def findings(trace: Path) -> list[str]:
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    return [r["check"] for r in records if r.get("event") == "finding"]


@pytest.mark.parametrize("dedupe", [True, False], ids=["dedupe", "no-dedupe"])
def test_a_lost_answer_retried_against_the_replay(
    recorded: Path, tmp_path: Path, dedupe: bool
) -> None:
    """A drop rule in front, the reference Client retrying with its key: with --dedupe the
    retry gets the original messageId (no finding); without it, a second insert, which the
    proxy's ledger finds."""
    trace = tmp_path / "trace.jsonl"
    agent = command("replay", "agent", str(recorded), "--speed", "0", *(["--dedupe"] * dedupe))
    front = command("run", "--faults", str(LOSE_FIRST_ANSWER), "--trace", str(trace), "--", *agent)
    done = session_run("client", "--follow-trace", str(trace), "--", *front)
    if dedupe:
        assert done.returncode == 0, done.stdout + done.stderr
        assert findings(trace) == []
        assert "none inserted twice" in done.stdout
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        assert findings(trace) == ["duplicate_insert"]
    assert "#3@1 timeout, #4@1 answered" in done.stdout  # the first answer lost, then a retry


async def open_session(peer: Peer) -> str:
    await peer.call("initialize", {"protocolVersion": 2, "capabilities": {}, "info": INFO}, TIMEOUT)
    answer = await peer.call("session/new", {"cwd": "/elsewhere", "mcpServers": []}, TIMEOUT)
    return str(answer["result"]["sessionId"])


INFO = {"name": "acp-proxy-reference-client", "version": "0.1.0"}


async def test_a_request_that_matches_nothing_names_the_nearest(recorded: Path) -> None:
    """Another prompt: a JSON-RPC error naming the recorded prompt, its line and the text that
    differs; the connection goes on."""
    endpoint = await spawn_agent(command("replay", "agent", str(recorded)), limit=1 << 20)
    peer = Peer(endpoint)
    try:
        session = await open_session(peer)
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "goodbye"}]}
        answer = await peer.call("session/prompt", prompt, TIMEOUT)
        error = answer["error"]
        assert error["code"] == -32603
        assert (
            "no recorded request matches this session/prompt; the nearest is line"
            in (error["message"])
        )
        assert 'params.prompt[0].text: recorded "hello", got "goodbye"' in error["message"]
        assert error["data"]["nearest"]["method"] == "session/prompt"
        assert {"path": "params.prompt[0].text", "recorded": "hello", "got": "goodbye"} in (
            error["data"]["differences"]
        )
        again = await peer.call("session/new", {"cwd": "/", "mcpServers": []}, TIMEOUT)
        assert again["result"]["sessionId"] != session  # served again, as another session
    finally:
        await peer.close(TIMEOUT)


@pytest.mark.parametrize("scheme", ["ws", "http", "wss"])
async def test_over_the_network(recorded: Path, tmp_path: Path, scheme: str) -> None:
    """--listen ws://, http:// or wss:// (with --tls-cert and --tls-key): the reference Client,
    over WebSocket or Streamable HTTP (trusting the test's CA), gets its prompt confirmed."""
    listen = [
        "--listen",
        f"{scheme}://127.0.0.1:0/acp",
        "--log-format",
        "json",
        "--log-level",
        "info",
    ]
    trust: list[str] = []
    if scheme == "wss":
        pki = make_pki(tmp_path)
        listen += ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)]
        trust = ["--tls-ca", str(pki.ca)]
    process = await asyncio.create_subprocess_exec(
        *command("replay", "agent", str(recorded), "--speed", "0", *listen),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        url = await listening(process)
        done = await asyncio.to_thread(session_run, "client", "--connect", url, *trust)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), TIMEOUT)


async def listening(process: asyncio.subprocess.Process) -> str:
    """The URL the replay listens on, from its log line."""
    assert process.stderr is not None
    async with asyncio.timeout(TIMEOUT):
        while line := await process.stderr.readline():
            event: dict[str, Any] = json.loads(line)
            if event.get("event") == "listening":
                return str(event["url"])
    raise AssertionError("the replay ended without listening")


def test_a_bad_recording_is_refused_with_where(tmp_path: Path) -> None:
    """Exit 2, each problem on stderr with its line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "acp-recording", "version": 1, "time": 0}\n{"event": 1}\n')
    done = session_run("replay", "agent", str(bad))
    assert done.returncode == 2
    assert f"{bad}: line 2: time is not a finite number" in done.stderr
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"format": "acp-recording", "version": 9, "time": 0}\n')
    done = session_run("replay", "client", str(newer), "--", "true")
    assert done.returncode == 2
    assert "recorded by a newer acp-proxy (format version 9" in done.stderr


def test_check_agent_runs_against_a_replayed_agent(tmp_path: Path) -> None:
    """check-agent's run against the reference Agent, recorded, then replayed with --dedupe in
    the Agent's place: the same traces pass."""
    path = tmp_path / "check.jsonl"
    only = ["--only", "T1", "--only", "T4"]
    first = check_agent(
        *only, "--", *command("run", "--record", str(path), "--", *command("agent"))
    )
    assert first.returncode == 0, first.stdout
    replayed = check_agent(*only, "--", *command("replay", "agent", str(path), "--dedupe"))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "T1  PASS" in replayed.stdout
    assert "T4  PASS" in replayed.stdout


def test_strict_order_serves_a_session_in_its_recorded_order(recorded: Path) -> None:
    """--strict-order: the same Client, sending what it sent then in the same order, is served."""
    agent = command("replay", "agent", str(recorded), "--speed", "0", "--strict-order")
    done = session_run("client", "--", *agent)
    assert done.returncode == 0, done.stdout + done.stderr


KEY_PROMPT = "hello my key is sk-ABCdef123456 ok"


@pytest.mark.parametrize(
    "redact", ["sk-[A-Za-z0-9]+", "params.capabilities"], ids=["expression", "path"]
)
def test_a_redacted_recording_serves_the_same_client(tmp_path: Path, redact: str) -> None:
    """Recorded with a key in the prompt redacted (or the Client's capabilities), the same
    Client is served by the replay: what was redacted matches what it sends there again."""
    path = tmp_path / "s1.jsonl.gz"
    agent = command("run", "--record", str(path), "--redact", redact, "--", *command("agent"))
    done = session_run("client", "-p", KEY_PROMPT, "--", *agent)
    assert done.returncode == 0, done.stdout + done.stderr
    data = gzip.decompress(path.read_bytes())
    assert b"[redacted]" in data
    replay = command("replay", "agent", str(path), "--speed", "0")
    done = session_run("client", "-p", KEY_PROMPT, "--", *replay)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_bad_ignore_path_names_ignore(recorded: Path) -> None:
    """``--ignore 'sk-['``: a usage error naming --ignore."""
    done = session_run("replay", "agent", str(recorded), "--ignore", "sk-[")
    assert done.returncode == 2
    assert "Invalid value for --ignore: not a JSON path" in done.stderr, done.stderr


def test_what_is_owed_goes_out_after_stdin_ends(recorded: Path) -> None:
    """``printf '<initialize>\\n' | acp-proxy replay agent FILE``: the answer is due a second
    after the Client's last line (the pace slowed to that), and still goes out before the replay
    ends, 0."""
    initialize, answered = load_recording(recorded).messages[:2]
    assert initialize.message.method == "initialize"
    speed = (answered.time - initialize.time) / 1.0
    assert speed > 0
    line = initialize.message.raw.decode() + "\n"
    done = acp_proxy("replay", "agent", str(recorded), "--speed", repr(speed), stdin=line)
    assert done.returncode == 0, done.stderr
    (answer,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert answer["id"] == initialize.message.body["id"]
    assert "result" in answer


@pytest.mark.parametrize("tool", [["replay", "agent", "RECORDING"], ["agent"]])
async def test_the_url_listened_on_is_said_at_the_default_log_level(
    recorded: Path, tool: list[str]
) -> None:
    """``--listen ws://127.0.0.1:0/acp`` at the default log level: the URL served, port picked,
    is on stderr, and the reference Client reaches the Agent there."""
    argv = [str(recorded) if arg == "RECORDING" else arg for arg in tool]
    process = await asyncio.create_subprocess_exec(
        *command(*argv, "--listen", "ws://127.0.0.1:0/acp"),
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(TIMEOUT):
            line = (await process.stderr.readline()).decode()
        assert line.startswith("listening on ws://127.0.0.1:")
        url = line.removeprefix("listening on ").strip()
        assert not url.endswith(":0/acp")
        done = await asyncio.to_thread(session_run, "client", "--connect", url)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), TIMEOUT)
