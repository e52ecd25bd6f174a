"""Record a session of the SDK's Agent through the proxy, then replay it to the SDK's Client.

The official Python SDK's Client drives ``acp-proxy run --record FILE -- sdk_agent.py`` (the
SDK's Agent, scripted by prompt text) through prompts and their notifications, a permission
request and a cancelled prompt. Then the same Client, running the same script, talks to
``acp-proxy replay agent FILE`` (no Agent behind it), directly and behind ``acp-proxy run``
with a fault file, and must see the same messages, ids and session ids aside.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from acp import Client, spawn_agent_process
from acp.connection import StreamDirection, StreamEvent
from acp.schema import TextContentBlock
from harness import PEERS, TIMEOUT, fault_file
from peers.sdk_remote_client import SimpleClient, open_session, sdk_prompt

from proxy.core.matching import differences
from proxy.shell.defaults import DEFAULT_MAX_MESSAGE_BYTES
from proxy.tools.replay.files import load_recording

AGENT = PEERS / "sdk_agent.py"


class WatchingClient(SimpleClient):
    """The SDK Client of :mod:`peers.sdk_remote_client`, keeping every message it received."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[dict[str, Any]] = []

    def observe(self, event: StreamEvent) -> None:
        if event.direction is StreamDirection.INCOMING:
            self.received.append(event.message)
            self._news.set()  # what until() waits on


async def session(*command: str) -> list[dict[str, Any]]:
    """The script, by the SDK Client against ``command``: what it received, in order."""
    client = WatchingClient()
    async with spawn_agent_process(
        cast(Client, client),
        *command,
        transport_kwargs={
            "limit": DEFAULT_MAX_MESSAGE_BYTES,
            "stderr": None,
            "shutdown_timeout": TIMEOUT,
        },
        observers=[client.observe],
    ) as (conn, _):
        session_id = await open_session(conn)
        assert await sdk_prompt(conn, session_id, "echo one") == "end_turn"
        assert await sdk_prompt(conn, session_id, "permission") == "end_turn"
        waiting = asyncio.get_running_loop().create_task(
            conn.prompt(session_id=session_id, prompt=[TextContentBlock(text="wait")])
        )
        await client.until(lambda: "waiting" in client.texts())
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await client.until(lambda: any(t.startswith("cancelled ") for t in client.texts()))
        await client.until(lambda: any(_cancelled(m) for m in client.received))
        assert await sdk_prompt(conn, session_id, "echo still here") == "end_turn"
    assert client.texts()[:2] == ["one", "permission: selected allow"]
    return client.received


def _cancelled(message: dict[str, Any]) -> bool:
    error = message.get("error")
    return isinstance(error, dict) and error.get("code") == -32800


def proxy(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", *args]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The recording of one session with the SDK's Agent, and what the Client received then."""
    path = tmp_path_factory.mktemp("record") / "session.jsonl.gz"
    command = proxy("run", "--record", str(path), "--", sys.executable, str(AGENT))
    received = asyncio.run(session(*command))
    return path, received


def assert_same(recorded: list[dict[str, Any]], replayed: list[dict[str, Any]]) -> None:
    assert [m.get("method") for m in replayed] == [m.get("method") for m in recorded]
    for before, after in zip(recorded, replayed, strict=True):
        found, _ = differences(before, after)
        assert found == [], (before, after)


def test_the_recording_holds_the_session(recorded: tuple[Path, list[dict[str, Any]]]) -> None:
    """Every message of the session is in the recording, both ways, with its permission request
    and its cancel."""
    path, received = recorded
    recording = load_recording(path)
    methods = [r.message.method for r in recording.messages]
    assert "session/request_permission" in methods
    assert "$/cancel_request" in methods
    to_client = [r for r in recording.messages if r.direction == "to_client"]
    assert len(to_client) == len(received)
    assert {(e.event, e.side) for e in recording.links} == {
        ("open", "client"),
        ("open", "agent"),
        ("close", "client"),
        ("close", "agent"),
    }


async def test_the_replayed_agent_says_what_the_recorded_one_said(
    recorded: tuple[Path, list[dict[str, Any]]],
) -> None:
    """The SDK Client sees the same messages from the replay as from the Agent (ids and
    session ids aside): answers, chunks, the permission request, the cancelled prompt."""
    path, received = recorded
    replayed = await session(*proxy("replay", "agent", str(path), "--speed", "0"))
    assert_same(received, replayed)


async def test_the_replay_behind_the_proxy_with_faults(
    recorded: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Behind ``acp-proxy run`` with a fault file (every prompt delayed on its way), the replay
    still says the same."""
    path, received = recorded
    faults = fault_file(
        tmp_path,
        {
            "name": "slow-prompts",
            "when": {"direction": "to_agent", "method": "session/prompt"},
            "do": {"action": "delay", "ms": 20},
        },
    )
    agent = proxy("replay", "agent", str(path), "--speed", "0")
    replayed = await session(*proxy("run", "--faults", str(faults), "--", *agent))
    assert_same(received, replayed)


def test_the_recorded_client_against_the_sdk_agent(
    recorded: tuple[Path, list[dict[str, Any]]],
) -> None:
    """``replay client`` plays the SDK Client's session against a new SDK Agent: the permission
    request answered as recorded, the cancel sent when the Agent said it waits: it answers as
    the recorded one did, message for message."""
    path, received = recorded
    done = subprocess.run(
        proxy("replay", "client", str(path), "--json", "--", sys.executable, str(AGENT)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 4,
        check=False,
    )
    report = json.loads(done.stdout)
    assert report == {"compared": len(received), "differences": []}
    assert done.returncode == 0


async def test_a_redacted_recording_replays_to_the_sdk_client(tmp_path: Path) -> None:
    """The SDK Client's capabilities redacted in the recording (a path): its ``initialize``
    matches the recorded one again, and the whole session replays the same."""
    path = tmp_path / "redacted.jsonl.gz"
    redact = ["--redact", "params.clientCapabilities"]
    received = await session(
        *proxy("run", "--record", str(path), *redact, "--", sys.executable, str(AGENT))
    )
    initialize = next(r for r in load_recording(path).messages if r.message.method == "initialize")
    assert initialize.redacted == ("params.clientCapabilities",)
    replayed = await session(*proxy("replay", "agent", str(path), "--speed", "0"))
    assert_same(received, replayed)
