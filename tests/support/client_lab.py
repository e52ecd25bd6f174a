"""What the tests of the reference Client (``proxy.tools.lab.client``) share: the Agent and proxy
commands, the ready fault files, a run with its report checked for shape, and readings of it.

The Client runs in the test process; everything else is a real subprocess: the reference Agent on
its own, or behind ``acp-proxy run`` with the ready fault files of ``config/``. Nothing sleeps,
and no test races a clock: a Client behind a proxy follows the proxy's trace (``follow_trace``:
an answer the proxy lost is resent at once, and its ``answer_timeout``, the harness's bound,
never expires), except the one that checks that the Client alone resends on its timer, and
asserts only what a slow answer cannot change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from harness import ROOT, TIMEOUT, ProxyProcess

from proxy.tools.lab.client import (
    ClientOptions,
    ClientReport,
    SeenMessage,
    Submission,
    judge,
    render,
    run_client,
)

AGENT = (sys.executable, "-m", "proxy", "agent")
PROXY = (sys.executable, "-m", "proxy", "run")
CLIENT = (sys.executable, "-m", "proxy", "client")
CONFIG = ROOT / "config"
LOSE_FIRST = CONFIG / "lose-first-prompt-response.yaml"
AGENT_DIES = CONFIG / "agent-dies-with-prompt-pending.yaml"
SEVER_CLIENT = CONFIG / "sever-client-after-keyed-prompt.yaml"
GARBAGE = CONFIG / "garbage-from-agent.yaml"
TEXTS = ("first", "second", "third")

Serve = Callable[..., Awaitable[str]]


def through_proxy(*proxy_options: str | Path, agent: tuple[str, ...] = AGENT) -> tuple[str, ...]:
    """argv of the proxy with ``proxy_options`` in front of ``agent``, spawned by the Client."""
    return (*PROXY, *map(str, proxy_options), "--", *agent)


def followed(
    tmp_path: Path, *proxy_options: str | Path, agent: tuple[str, ...] = AGENT
) -> dict[str, object]:
    """Options of a Client that spawns the proxy with a trace and follows it: what the proxy
    loses is resent at once, and nothing else times out (``answer_timeout`` is the bound)."""
    trace = tmp_path / "trace.jsonl"
    return {
        "agent_argv": through_proxy("--trace", trace, *proxy_options, agent=agent),
        "follow_trace": trace,
        "answer_timeout": TIMEOUT,
    }


async def run(**fields: object) -> ClientReport:
    """Run the Client with these options; the report is also JSON and renders as text. Starting
    and stopping what it spawns get the harness's bound (``TIMEOUT``)."""
    fields = {"setup_timeout": TIMEOUT, "grace": TIMEOUT, **fields}
    async with asyncio.timeout(TIMEOUT * 2):
        report = await run_client(ClientOptions(**fields))  # type: ignore[arg-type]
    assert json.loads(json.dumps(report.to_json()))["ok"] == report.ok
    assert render(report)
    return report


def live_ids(report: ClientReport, text: str, connection: int = 1) -> list[str]:
    """User messages with ``text`` that arrived live (not replayed) on ``connection``."""
    return [
        seen.message_id
        for seen in report.user_messages
        if seen.text == text and seen.connection == connection and not seen.replayed
    ]


def outcomes(report: ClientReport, number: int) -> list[tuple[str, bool, int]]:
    """(outcome, timed out, connection) of each attempt of submission ``number`` (0-based)."""
    return [(a.outcome, a.timed_out, a.connection) for a in report.submissions[number].attempts]


def check_inserted_once(report: ClientReport, texts: tuple[str, ...] = TEXTS) -> None:
    """Every submission confirmed, with its own key, and exactly one copy of it in history."""
    assert report.error is None
    assert [s.text for s in report.submissions] == list(texts)
    keys = [s.key for s in report.submissions]
    assert len(set(keys)) == len(keys)
    assert all(uuid.UUID(key).version == 4 for key in keys)
    for submission in report.submissions:
        assert submission.confirmed, submission
        assert submission.message_id is not None
        assert submission.answers == [submission.message_id]  # retries answered alike
        assert submission.history_ids == [submission.message_id]
        assert submission.message_ids == [submission.message_id]
        request_ids = [a.request_id for a in submission.attempts]
        assert len(set(request_ids)) == len(request_ids)  # a new JSON-RPC id per attempt
    assert report.history == [s.message_id for s in report.submissions]
    assert report.duplicates == 0
    assert (report.ok, report.exit_status) == (True, 0)


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[Serve]:
    """A starter of network servers (the Agent or the proxy on port 0) that returns their URLs;
    every one is stopped on the way out."""
    started: list[ProxyProcess] = []

    async def _serve(*argv: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *argv,
            "--log-format",
            "json",
            "--log-level",
            "info",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        server = ProxyProcess(process)  # collects stderr, waits for log events, stops
        started.append(server)
        return str((await server.logged("listening"))["url"])

    try:
        yield _serve
    finally:
        for server in started:
            await server.stop()


def replay_without_the_retry(tmp_path: Path) -> Path:
    """A fault file: the final replay loses the second ``first`` user message (the retry's copy).

    ``user_message`` updates of ``first`` to the Client: the original and the retry's copy live,
    then the original and the copy replayed by the final ``session/resume``: the 4th is dropped,
    as an Agent whose replay leaves a message out would.
    """
    path = tmp_path / "replay-without-the-retry.yaml"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "rules": [
                    {
                        "name": "replay-without-the-retry",
                        "when": {
                            "direction": "to_client",
                            "kind": "notification",
                            "method": "session/update",
                            "params": {
                                "update": {
                                    "sessionUpdate": "user_message",
                                    "content": [{"text": "first"}],
                                }
                            },
                        },
                        "schedule": {"nth": [4]},
                        "do": {"action": "drop"},
                    }
                ],
            }
        )
    )
    return path


def ledger_duplicates(state: Path) -> set[str]:
    """The keys the proxy's ledger found ``duplicate_insert`` for (from ``--state``)."""
    findings = json.loads(state.read_text())["ledger"]["findings"]
    return {f["key"] for f in findings if f["check"] == "duplicate_insert"}


def judged(
    submissions: list[Submission], seen: list[SeenMessage], history: list[str] | None
) -> ClientReport:
    """A report of these submissions and messages seen (and ``history``), judged."""
    report = ClientReport("stdio", submissions=submissions, user_messages=seen, history=history)
    judge(report)
    return report
