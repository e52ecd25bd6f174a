"""``acp-proxy replay client`` against the reference Agent: the same answers pass, a changed one
is reported with where, what was recorded and what came."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
from pathlib import Path

import pytest
from harness import TIMEOUT, fault_file
from peers.sdk_remote_client import listening_proxy
from tool_runs import command, session_run

from proxy.core.matching import MISSING, Difference
from proxy.tools.replay.client import Found


def test_the_same_agent_answers_the_same(recorded: Path) -> None:
    """Against the Agent recorded, nothing differs (its random ids and session ids aside)."""
    done = session_run("replay", "client", str(recorded), "--", *command("agent"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.endswith("messages of the Agent compared: same as recorded\n")


def changed(recorded: Path, directory: Path) -> Path:
    """The recording with the Agent's "running" state said as "walking" (gzip, as --record
    writes a .gz)."""
    text = gzip.decompress(recorded.read_bytes())
    text = text.replace(b'"state":"running"', b'"state":"walking"')
    assert b"walking" in text
    path = directory / "changed.jsonl.gz"
    path.write_bytes(gzip.compress(text))
    return path


def test_a_changed_answer_is_reported(recorded: Path, tmp_path: Path) -> None:
    """Exit 1; each difference on a line: the recorded line, the method, the path, the values."""
    done = session_run(
        "replay", "client", str(changed(recorded, tmp_path)), "--", *command("agent")
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("line ")
        and line.endswith(': session/update params.update.state: recorded "walking", new "running"')
        for line in lines
    ), done.stdout
    as_json = session_run(
        "replay", "client", str(changed(recorded, tmp_path)), "--json", "--", *command("agent")
    )
    report = json.loads(as_json.stdout)
    assert {
        "method": "session/update",
        "path": "params.update.state",
        "recorded": "walking",
        "got": "running",
    } in [{k: v for k, v in d.items() if k != "line"} for d in report["differences"]]


def test_ignored_paths_are_no_difference(recorded: Path, tmp_path: Path) -> None:
    """--ignore the path that changed: exit 0."""
    path = changed(recorded, tmp_path)
    done = session_run(
        "replay", "client", str(path), "--ignore", "params.update.state", "--", *command("agent")
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_agent_that_cannot_be_started_is_said(recorded: Path, tmp_path: Path) -> None:
    """Exit 2 with the reason."""
    done = session_run("replay", "client", str(recorded), "--", str(tmp_path / "no-such-agent"))
    assert done.returncode == 2
    assert "acp-proxy replay client: cannot connect: " in done.stderr


def test_through_the_proxy_with_faults(recorded: Path, tmp_path: Path) -> None:
    """Behind ``acp-proxy run`` with a fault file that delays each prompt, the Agent answers as
    recorded."""
    faults = fault_file(
        tmp_path,
        {
            "name": "slow-prompts",
            "when": {"direction": "to_agent", "method": "session/prompt"},
            "do": {"action": "delay", "ms": 50},
        },
    )
    agent = command("run", "--faults", str(faults), "--", *command("agent"))
    done = session_run("replay", "client", str(recorded), "--", *agent)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_a_session_recorded_over_the_network_replays(tmp_path: Path, scheme: str) -> None:
    """Recorded by a proxy listening on Streamable HTTP or WebSocket (the Client's messages
    came as POST bodies or frames), the session replays against a new Agent with no
    difference."""
    path = tmp_path / "network.jsonl"
    options = ("--record", str(path))
    async with listening_proxy(f"{scheme}://127.0.0.1:0/acp", *options, agent=command("agent")) as (
        _,
        url,
    ):
        done = await asyncio.to_thread(session_run, "client", "--connect", url)
        assert done.returncode == 0, done.stdout + done.stderr
    replayed = await asyncio.to_thread(
        session_run, "replay", "client", str(path), "--", *command("agent")
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


def test_what_the_agent_said_redacted_matches_what_it_says(tmp_path: Path) -> None:
    """The Agent's capabilities redacted in the recording (a path): the same Agent's answer
    matches there, whatever it holds."""
    path = tmp_path / "redacted.jsonl.gz"
    redact = ["--redact", "result.capabilities", "--redact", "sk-[A-Za-z0-9]+"]
    agent = command("run", "--record", str(path), *redact, "--", *command("agent"))
    done = session_run("client", "-p", "hello my key is sk-ABCdef123456 ok", "--", *agent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert b'"capabilities":"[redacted]"' in gzip.decompress(path.read_bytes())
    done = session_run("replay", "client", str(path), "--", *command("agent"))
    assert done.returncode == 0, done.stdout + done.stderr


async def test_requests_whose_ids_were_redacted_still_pair_with_their_answers(
    tmp_path: Path,
) -> None:
    """A Client whose request ids hold what ``--redact`` names: the file has none of them, and
    the recorded Client, sending the redacted ids, finds each answer by its id."""
    path = tmp_path / "ids.jsonl.gz"
    argv = command("run", "--record", str(path), "--redact", "sk-[A-Za-z0-9]+")
    process = await asyncio.create_subprocess_exec(
        *argv,
        "--",
        *command("agent"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    initialize = {"protocolVersion": 2, "capabilities": {}}
    requests = [
        {"jsonrpc": "2.0", "id": "sk-IDVALUE4444", "method": "initialize", "params": initialize},
        {"jsonrpc": "2.0", "id": "sk-IDVALUE5555", "method": "session/new", "params": {"cwd": "/"}},
    ]
    try:
        for request in requests:
            process.stdin.write(json.dumps(request).encode() + b"\n")
            answer = json.loads(await asyncio.wait_for(process.stdout.readline(), TIMEOUT))
            assert answer["id"] == request["id"]
            assert "result" in answer
        process.stdin.close()
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert b"IDVALUE" not in gzip.decompress(path.read_bytes())
    done = session_run("replay", "client", str(path), "--", *command("agent"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "2 messages of the Agent compared: same as recorded\n"


SILENT_AFTER_INITIALIZE = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "initialize":
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": 2}}
        print(json.dumps(answer), flush=True)
"""
"""An Agent that answers initialize, then nothing ever again (it reads until its stdin ends)."""
READS_ONLY = "import sys\nfor line in sys.stdin: pass"


@pytest.mark.parametrize(
    ("agent", "says"),
    [
        (["false"], "the agent exited with status 1 before answering initialize"),
        (["true"], "the agent closed the connection before answering initialize"),
        ([sys.executable, "-c", READS_ONLY], "the agent did not answer initialize within 1 s"),
    ],
    ids=["exits-1", "exits-0", "silent"],
)
def test_an_agent_that_never_answers_initialize_cannot_be_replayed_against(
    recorded: Path, agent: list[str], says: str
) -> None:
    """An Agent gone or silent before it answered initialize: one line saying so, exit 2 (not a
    difference per recorded message)."""
    done = session_run("replay", "client", str(recorded), "--timeout", "1", "--", *agent)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"acp-proxy replay client: {says}\n"


def test_a_silent_agent_after_initialize_is_reported_not_waited_for_without_end(
    recorded: Path,
) -> None:
    """After initialize the Agent says nothing: the replay ends (each request waits its
    --timeout once, what follows it is not waited for) and reports every message it never sent.
    (How long it takes is not asserted: the suite runs on loaded machines.)"""
    done = session_run(
        "replay", "client", str(recorded), "--timeout", "1", "--",
        sys.executable, "-c", SILENT_AFTER_INITIALIZE,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "8 messages of the Agent compared" in done.stdout


def test_a_message_the_recording_does_not_have_has_no_line_in_json() -> None:
    """--json: an unrecorded message's line is null (no line 0 in a file numbered from 1)."""
    extra = Found(0, "session/update", Difference("", MISSING, {"method": "session/update"}))
    assert extra.to_json()["line"] is None
    assert Found(7, "initialize", Difference("result.v", 1, 2)).to_json()["line"] == 7
