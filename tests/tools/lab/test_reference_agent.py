"""The reference v2 Agent (``acp-proxy agent``): the idempotency RFD's behaviours on the wire."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from harness import TIMEOUT

Predicate = Callable[[dict[str, Any]], bool]


class Agent:
    """``python -m proxy agent`` as a subprocess, the test as its raw Client."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.seen: list[dict[str, Any]] = []
        self._next = 100

    @classmethod
    async def start(cls, *options: str) -> Agent:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "agent",
            *options,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,  # a few log lines: read once it has exited
        )
        return cls(process)

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        await self.process.stdin.drain()

    async def until(self, predicate: Predicate) -> dict[str, Any]:
        """Read messages until one matches (all are kept in ``seen``)."""
        assert self.process.stdout is not None
        async with asyncio.timeout(TIMEOUT):
            while True:
                line = await self.process.stdout.readline()
                assert line, "the agent closed its stdout"
                message: dict[str, Any] = json.loads(line)
                self.seen.append(message)
                if predicate(message):
                    return message

    async def request(
        self, method: str, params: dict[str, Any], request_id: Any = None
    ) -> dict[str, Any]:
        if request_id is None:
            self._next += 1
            request_id = self._next
        await self.send({"id": request_id, "method": method, "params": params})
        return await self.until(lambda m: m.get("id") == request_id and "method" not in m)

    async def open(self) -> str:
        init = await self.request("initialize", {"protocolVersion": 2, "capabilities": {}})
        assert init["result"]["protocolVersion"] == 2
        assert "session" in init["result"]["capabilities"]
        return str(
            (await self.request("session/new", {"cwd": "/p", "mcpServers": []}))["result"][
                "sessionId"
            ]
        )

    async def idle(self, session: str) -> None:
        await self.until(
            lambda m: (
                is_update(m, session, "state_update") and m["params"]["update"]["state"] == "idle"
            )
        )

    def user_messages(self, session: str) -> list[str]:
        return [
            m["params"]["update"]["messageId"]
            for m in self.seen
            if is_update(m, session, "user_message")
        ]

    async def stop(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return await asyncio.wait_for(self.process.wait(), TIMEOUT)

    async def stderr_text(self) -> str:
        """What it logged (once it has exited)."""
        assert self.process.stderr is not None
        return (await self.process.stderr.read()).decode()


def is_update(message: dict[str, Any], session: str, kind: str) -> bool:
    params = message.get("params")
    return (
        message.get("method") == "session/update"
        and isinstance(params, dict)
        and params.get("sessionId") == session
        and params["update"].get("sessionUpdate") == kind
    )


def prompt(session: str, text: str, key: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    if key is not None:
        params["idempotencyKey"] = key
    return params


@pytest.fixture
async def agents() -> AsyncIterator[Callable[..., Any]]:
    started: list[Agent] = []

    async def _start(*options: str) -> Agent:
        agent = await Agent.start(*options)
        started.append(agent)
        return agent

    yield _start
    for agent in started:
        if agent.process.returncode is None:
            agent.process.kill()
            await agent.process.wait()


async def test_a_keyed_prompt_is_inserted_and_its_retry_answered_with_the_original(
    agents: Any,
) -> None:
    """T1: the retry gets the original messageId, and no second user_message or turn."""
    agent = await agents("--turn-ms", "1")
    session = await agent.open()
    first = await agent.request("session/prompt", prompt(session, "A", "K1"))
    message_id = first["result"]["messageId"]
    await agent.idle(session)
    retry = await agent.request("session/prompt", prompt(session, "A", "K1"))
    assert retry["result"] == {"messageId": message_id}
    assert agent.user_messages(session) == [message_id]
    assert "K1" not in json.dumps(agent.seen)  # keys are never echoed


@pytest.mark.parametrize("key", ["", "x" * 256, 42, True, {}, []])
async def test_invalid_keys_are_rejected_never_treated_as_omitted(agents: Any, key: Any) -> None:
    """T0: anything but a 1-255 character string is -32602 and inserts nothing."""
    agent = await agents()
    session = await agent.open()
    answer = await agent.request("session/prompt", prompt(session, "A", key))
    assert answer["error"]["code"] == -32602
    assert agent.user_messages(session) == []


async def test_a_retry_while_the_prompt_is_held_is_answered_with_it(agents: Any) -> None:
    """T4: a prompt held behind a running turn; its retry joins it; both get the same id."""
    agent = await agents("--turn-ms", "300")
    session = await agent.open()
    await agent.request("session/prompt", prompt(session, "long task", "K0"))
    await agent.send({"id": 10, "method": "session/prompt", "params": prompt(session, "D", "K4")})
    await agent.send({"id": 11, "method": "session/prompt", "params": prompt(session, "D", "K4")})
    first = await agent.until(lambda m: m.get("id") == 10)
    second = await agent.until(lambda m: m.get("id") == 11)
    assert first["result"] == second["result"]
    assert len(agent.user_messages(session)) == 2  # the long task and D, once


async def test_cancel_request_of_a_held_prompt_cancels_every_request_of_its_key(
    agents: Any,
) -> None:
    """T4a: $/cancel_request of one held request answers both with -32800; nothing inserted."""
    agent = await agents("--turn-ms", "500")
    session = await agent.open()
    await agent.request("session/prompt", prompt(session, "long task", "K0"))
    await agent.send({"id": 10, "method": "session/prompt", "params": prompt(session, "D", "K4")})
    await agent.send({"id": 11, "method": "session/prompt", "params": prompt(session, "D", "K4")})
    await agent.send({"method": "$/cancel_request", "params": {"requestId": 10}})
    first = await agent.until(lambda m: m.get("id") == 10)
    second = await agent.until(lambda m: m.get("id") == 11)
    assert first["error"]["code"] == second["error"]["code"] == -32800
    await agent.idle(session)
    assert len(agent.user_messages(session)) == 1  # only the long task


async def test_session_cancel_answers_held_prompts_and_ends_the_turn(agents: Any) -> None:
    """T4b: session/cancel: held requests -32800, idle with stopReason cancelled."""
    agent = await agents("--turn-ms", "5000")
    session = await agent.open()
    await agent.request("session/prompt", prompt(session, "long task", "K0"))
    await agent.send({"id": 10, "method": "session/prompt", "params": prompt(session, "D", "K4")})
    await agent.send({"method": "session/cancel", "params": {"sessionId": session}})
    assert (await agent.until(lambda m: m.get("id") == 10))["error"]["code"] == -32800
    idle = await agent.until(
        lambda m: is_update(m, session, "state_update") and m["params"]["update"]["state"] == "idle"
    )
    assert idle["params"]["update"]["stopReason"] == "cancelled"


async def test_an_error_leaves_the_key_unused(agents: Any) -> None:
    """T5: after a cancelled (error) attempt, the same key inserts a fresh message."""
    agent = await agents("--turn-ms", "500")
    session = await agent.open()
    await agent.request("session/prompt", prompt(session, "long task", "K0"))
    await agent.send({"id": 20, "method": "session/prompt", "params": prompt(session, "E", "K5")})
    await agent.send({"method": "$/cancel_request", "params": {"requestId": 20}})
    assert (await agent.until(lambda m: m.get("id") == 20))["error"]["code"] == -32800
    await agent.idle(session)
    retry = await agent.request("session/prompt", prompt(session, "E", "K5"))
    assert retry["result"]["messageId"] in agent.user_messages(session)
    assert len(agent.user_messages(session)) == 2


async def test_fail_prompts_refuses_the_first_prompts_and_leaves_their_keys_unused(
    agents: Any,
) -> None:
    """--fail-prompts 1: the first prompt is -32603 and inserts nothing; its resend with the
    same key is inserted (the key was unused)."""
    agent = await agents("--fail-prompts", "1", "--turn-ms", "1")
    session = await agent.open()
    refused = await agent.request("session/prompt", prompt(session, "R", "K8"))
    assert refused["error"]["code"] == -32603
    assert agent.user_messages(session) == []
    resent = await agent.request("session/prompt", prompt(session, "R", "K8"))
    assert agent.user_messages(session) == [resent["result"]["messageId"]]


@pytest.mark.parametrize("version", [1, 2])
async def test_the_store_says_which_protocol_version_created_a_session(
    agents: Any, tmp_path: Path, version: int
) -> None:
    """What check-client reads to tell a v1 Client: the version initialize agreed on."""
    agent = await agents("--store", str(tmp_path))
    await agent.request("initialize", {"protocolVersion": version, "capabilities": {}})
    created = await agent.request("session/new", {"cwd": "/p", "mcpServers": []})
    session = created["result"]["sessionId"]
    stored = json.loads((tmp_path / f"{session}.json").read_text())
    assert stored["protocolVersion"] == version


async def test_the_same_key_in_another_session_is_unrelated(agents: Any) -> None:
    """T6: keys are scoped to their session."""
    agent = await agents("--turn-ms", "1")
    first = await agent.open()
    second = str(
        (await agent.request("session/new", {"cwd": "/p", "mcpServers": []}))["result"]["sessionId"]
    )
    one = await agent.request("session/prompt", prompt(first, "F", "K6"))
    other = await agent.request("session/prompt", prompt(second, "G", "K6"))
    assert one["result"]["messageId"] != other["result"]["messageId"]


async def test_no_dedupe_inserts_every_retry(agents: Any) -> None:
    """--no-dedupe: the known-bad Agent inserts the retry again."""
    agent = await agents("--no-dedupe", "--turn-ms", "1")
    session = await agent.open()
    first = await agent.request("session/prompt", prompt(session, "A", "K1"))
    await agent.idle(session)
    retry = await agent.request("session/prompt", prompt(session, "A", "K1"))
    assert retry["result"]["messageId"] != first["result"]["messageId"]


async def test_a_restarted_agent_with_a_store_still_knows_the_key(
    agents: Any, tmp_path: Path
) -> None:
    """T3: killed and started again on the same store, resume replays one copy; the retry gets M."""
    store = str(tmp_path / "store")
    agent = await agents("--store", store, "--turn-ms", "1")
    session = await agent.open()
    message_id = (await agent.request("session/prompt", prompt(session, "C", "K3")))["result"][
        "messageId"
    ]
    agent.process.kill()
    await agent.process.wait()
    again = await agents("--store", store, "--turn-ms", "1")
    await again.request("initialize", {"protocolVersion": 2})
    resumed = await again.request(
        "session/resume", {"sessionId": session, "cwd": "/p", "replayFrom": {"type": "start"}}
    )
    assert resumed["result"] == {}
    assert again.user_messages(session) == [message_id]
    assert any(is_update(m, session, "state_update") for m in again.seen)  # the snapshot
    retry = await again.request("session/prompt", prompt(session, "C", "K3"))
    assert retry["result"] == {"messageId": message_id}


async def test_prompting_a_session_not_resumed_on_this_connection_fails(
    agents: Any, tmp_path: Path
) -> None:
    """v2: a session is active only after session/new or session/resume on the connection."""
    store = str(tmp_path / "store")
    agent = await agents("--store", store)
    session = await agent.open()
    await agent.stop()
    again = await agents("--store", store)
    await again.request("initialize", {"protocolVersion": 2})
    answer = await again.request("session/prompt", prompt(session, "X", "K"))
    assert answer["error"]["code"] == -32002
    unknown = await again.request("session/resume", {"sessionId": "nope", "cwd": "/p"})
    assert unknown["error"]["code"] == -32002


async def test_requests_before_initialize_are_refused(agents: Any) -> None:
    """-32600 until the connection is initialized."""
    agent = await agents()
    answer = await agent.request("session/new", {"cwd": "/p"})
    assert answer["error"]["code"] == -32600


def test_every_answer_reaches_a_file_even_when_the_agent_exits_at_once(tmp_path: Path) -> None:
    """stdout to a file: every answer is written out, though stdin ends at once."""
    sink = tmp_path / "out.jsonl"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 2}}
    new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/p"}}
    with sink.open("wb") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "agent"],
            input=(json.dumps(init) + "\n" + json.dumps(new) + "\n").encode(),
            stdout=stdout,
            timeout=TIMEOUT,
            check=False,
        )
    assert done.returncode == 0
    assert [json.loads(line)["id"] for line in sink.read_text().splitlines()] == [0, 1]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_on_stdio_a_signal_ends_it_as_it_ends_any_command(signum: int) -> None:
    """Ctrl-C (SIGINT) or SIGTERM while it serves: it dies of the signal, as a shell expects."""
    agent = await Agent.start()
    try:
        await agent.open()
        agent.process.send_signal(signum)
        assert await asyncio.wait_for(agent.process.wait(), TIMEOUT) == -signum
    finally:
        if agent.process.returncode is None:
            agent.process.kill()
            await agent.process.wait()


def test_a_start_that_fails_is_one_line(tmp_path: Path) -> None:
    """An address in use, or a store that cannot be made: one line naming the option, exit 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {
            f"--listen ws://127.0.0.1:{port}/acp: address already in use": [
                "--listen",
                f"ws://127.0.0.1:{port}/acp",
            ],
            f"--store {tmp_path / 'file' / 'sub'}: not a directory": [
                "--store",
                str(tmp_path / "file" / "sub"),
            ],
        }
        (tmp_path / "file").write_text("")
        for line, options in cases.items():
            done = subprocess.run(
                [sys.executable, "-m", "proxy", "agent", *options],
                check=False,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=TIMEOUT,
            )
            assert (done.returncode, done.stderr, done.stdout) == (
                1,
                f"acp-proxy agent: {line}\n",
                "",
            )


async def test_a_store_that_fails_later_answers_an_error_and_changes_nothing(
    agents: Any, tmp_path: Path
) -> None:
    """The store's folder replaced by a file while the Agent runs: a prompt and a new session
    are answered -32603 in one logged line (no traceback), nothing is inserted, the key stays
    unused; once the folder is back, the same key is a fresh submission."""
    store = tmp_path / "store"
    agent = await agents("--store", str(store), "--turn-ms", "1")
    session = await agent.open()
    store.rename(tmp_path / "moved")
    store.write_text("")  # mkstemp in it: not a directory

    failed = await agent.request("session/prompt", prompt(session, "C", "K"))
    assert failed["error"]["code"] == -32603
    assert failed["error"]["message"] == "the session could not be stored: not a directory"
    refused = await agent.request("session/new", {"cwd": "/p", "mcpServers": []})
    assert refused["error"]["code"] == -32603
    assert agent.user_messages(session) == []

    store.unlink()
    (tmp_path / "moved").rename(store)
    inserted = await agent.request("session/prompt", prompt(session, "C", "K"))
    assert inserted["result"]["messageId"] == agent.user_messages(session)[0]
    assert await agent.stop() == 0
    stderr = await agent.stderr_text()
    assert "Traceback" not in stderr
    assert stderr.count("the session could not be stored") == 2
