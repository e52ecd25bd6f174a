"""The reference v2 Client (``acp-proxy client``): one key per submission, resent after failures.

The Client runs in the test process; everything else is a real subprocess: the reference Agent on
its own, or behind ``acp-proxy run`` with the ready fault files of ``config/``. Each test reads
the Client's report and checks it against what the Agent put in the session's history (the final
replay): every submission inserted once, and a resent prompt answered with the original
``messageId``. Nothing sleeps, and no test races a clock: a Client behind a proxy follows the
proxy's trace (``follow_trace``: an answer the proxy lost is resent at once, and its
``answer_timeout``, the harness's bound, never expires), except the one that checks that the
Client alone resends on its timer, and asserts only what a slow answer cannot change.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from harness import TIMEOUT, ProxyProcess

from proxy.tools.lab.client import (
    ClientOptions,
    ClientReport,
    SeenMessage,
    Submission,
    judge,
    render,
    run_client,
)

pytestmark = pytest.mark.slow

AGENT = (sys.executable, "-m", "proxy", "agent")
PROXY = (sys.executable, "-m", "proxy", "run")
CLIENT = (sys.executable, "-m", "proxy", "client")
CONFIG = Path(__file__).parents[2] / "config"
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


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start network servers (the Agent or the proxy on port 0); yields a starter of their URLs."""
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

    yield _serve
    for server in started:
        await server.stop()


# -- a clean run ---------------------------------------------------------------------------------


async def test_each_prompt_is_inserted_once_with_its_own_key() -> None:
    """Straight to the Agent: three prompts, three keys, one attempt each, no reconnect."""
    report = await run(agent_argv=(*AGENT, "--turn-ms", "1"), prompts=TEXTS)
    check_inserted_once(report)
    assert (report.transport, report.connections, report.reconnects, report.resyncs) == (
        "stdio",
        1,
        0,
        0,
    )
    for number, text in enumerate(TEXTS):
        assert outcomes(report, number) == [("answered", False, 1)]
        assert live_ids(report, text) == [report.submissions[number].message_id]
    [final] = report.resumes
    assert final.final
    assert final.user_message_ids == report.history
    assert report.user_message_ids() == report.history
    assert "OK: every submission confirmed" in render(report)


@pytest.mark.parametrize("scheme", ["ws", "http"])
async def test_over_a_network_transport(serve: Serve, scheme: str) -> None:
    """The Client connects to an Agent served over WebSocket or Streamable HTTP."""
    url = await serve(*AGENT, "--turn-ms", "1", "--listen", f"{scheme}://127.0.0.1:0/acp")
    report = await run(connect=url, prompts=TEXTS)
    check_inserted_once(report)
    assert (report.transport, report.connections, report.reconnects) == (scheme, 1, 0)


# -- a lost answer on an open connection (T1) ----------------------------------------------------


async def test_a_lost_answer_is_resent_with_the_same_key_and_gets_the_original(
    tmp_path: Path,
) -> None:
    """The first answer is dropped: a timeout, the same key again, the original messageId."""
    report = await run(**followed(tmp_path, "--faults", LOSE_FIRST), prompts=TEXTS)
    check_inserted_once(report)
    assert (report.connections, report.reconnects, report.resyncs) == (1, 0, 0)
    # The lost attempt stays unanswered; the retry on the same connection is answered.
    assert outcomes(report, 0) == [("pending", True, 1), ("answered", False, 1)]
    first = report.submissions[0]
    assert first.attempts[1].message_id == first.message_id
    assert live_ids(report, "first") == [first.message_id]  # inserted by the first attempt
    assert outcomes(report, 1) == outcomes(report, 2) == [("answered", False, 1)]
    assert "timeout" in render(report)


async def test_alone_the_client_resends_when_its_timer_expires() -> None:
    """No trace to follow: the dropped answer is noticed by ``answer_timeout`` alone.

    A busy machine may make another answer slower than the timer too: each such timeout is one
    more attempt with the same key (hence the room in ``max_attempts``), never a second message.
    """
    report = await run(
        agent_argv=through_proxy("--faults", LOSE_FIRST),
        prompts=TEXTS[:1],
        answer_timeout=1.0,
        max_attempts=20,
    )
    check_inserted_once(report, TEXTS[:1])
    [first] = report.submissions
    assert outcomes(report, 0)[0] == ("pending", True, 1)  # its answer was dropped
    assert len(first.attempts) > 1
    assert first.attempts[-1].outcome == "answered"
    assert first.attempts[-1].message_id == first.message_id
    assert "timeout" in render(report)


# -- the Agent dies (T3) -------------------------------------------------------------------------


async def test_a_dead_agent_is_respawned_resumed_and_answers_the_retry_with_the_original(
    tmp_path: Path,
) -> None:
    """The 1st answer is lost and the Agent killed: respawn, resume, same key, original id.

    ``agent-dies-with-prompt-pending.yaml`` kills the Agent 100 ms after the first keyed prompt;
    ``lose-first-prompt-response.yaml`` makes sure its answer never arrives before that. With
    ``--state`` neither rule fires again in the respawned proxy; with ``--store`` the new Agent
    knows the session and the key.
    """
    argv = through_proxy(
        "--faults",
        LOSE_FIRST,
        "--faults",
        AGENT_DIES,
        "--state",
        tmp_path / "state.json",
        agent=(*AGENT, "--store", str(tmp_path / "store")),
    )
    report = await run(agent_argv=argv, prompts=TEXTS, answer_timeout=TIMEOUT)
    check_inserted_once(report)
    assert (report.connections, report.reconnects, report.resyncs) == (2, 1, 0)
    assert outcomes(report, 0) == [("connection_lost", False, 1), ("answered", False, 2)]
    first = report.submissions[0]
    assert first.attempts[0].request_id != first.attempts[1].request_id
    assert live_ids(report, "first") == [first.message_id]  # the first Agent inserted it
    # The resume on the new connection replayed it before the retry was sent.
    resumed, final = report.resumes
    assert (resumed.connection, resumed.final, final.final) == (2, False, True)
    assert resumed.user_message_ids == [first.message_id]
    assert outcomes(report, 1) == outcomes(report, 2) == [("answered", False, 2)]


async def test_a_prompt_held_when_the_agent_dies_is_inserted_once_after_the_respawn(
    tmp_path: Path,
) -> None:
    """``agent-dies-with-prompt-pending.yaml`` alone: the held prompt dies with the Agent.

    The first prompt is inserted and answered at once; its turn lasts 10 s, so the second is
    held (not inserted, not stored) when the Agent is killed. The respawned Agent has no record
    of the key: the resent prompt is inserted then, once.
    """
    argv = through_proxy(
        "--faults",
        AGENT_DIES,
        "--state",
        tmp_path / "state.json",
        agent=(*AGENT, "--store", str(tmp_path / "store"), "--turn-ms", "10000"),
    )
    report = await run(agent_argv=argv, prompts=TEXTS[:2], answer_timeout=TIMEOUT)
    check_inserted_once(report, TEXTS[:2])
    assert report.reconnects == 1
    assert outcomes(report, 0) == [("answered", False, 1)]
    assert outcomes(report, 1) == [("connection_lost", False, 1), ("answered", False, 2)]
    first, second = report.submissions
    assert report.resumes[0].user_message_ids == [first.message_id]
    assert live_ids(report, "second", connection=1) == []
    assert live_ids(report, "second", connection=2) == [second.message_id]


async def test_without_a_store_the_respawned_agent_lost_the_session(tmp_path: Path) -> None:
    """The Agent kept the session in memory only: the resume fails, the report says why."""
    argv = through_proxy(
        "--faults", LOSE_FIRST, "--faults", AGENT_DIES, "--state", tmp_path / "state.json"
    )
    report = await run(agent_argv=argv, prompts=TEXTS, answer_timeout=TIMEOUT)
    assert report.error is not None
    assert "no longer knows session" in report.error
    assert [s.text for s in report.submissions] == ["first"]  # the run stopped there
    assert report.not_submitted == ["second", "third"]
    assert report.history is None
    assert not report.submissions[0].confirmed
    assert (report.connections, report.reconnects) == (2, 0)
    assert not report.ok
    assert "FAIL" in render(report)
    assert "unconfirmed" in render(report)
    assert "2 prompt(s) not submitted" in render(report)


def lose_first_and_respawn(tmp_path: Path) -> Path:
    """A fault file: the first keyed answer is dropped and its Agent killed and started again
    at that moment (the proxy keeps the Client's pipe)."""
    path = tmp_path / "lose-first-and-respawn.yaml"
    when = {
        "direction": "to_client",
        "kind": "response",
        "method": "session/prompt",
        "idempotency_key": "present",
    }
    first = {"nth": [1]}
    rules = [
        {
            "name": "lose",
            "when": when,
            "schedule": first,
            "do": {"action": "drop"},
            "continue": True,
        },
        {
            "name": "respawn",
            "when": when,
            "schedule": first,
            "do": {"action": "kill_agent", "signal": "KILL", "respawn": True},
        },
    ]
    path.write_text(json.dumps({"version": 1, "rules": rules}))
    return path


async def test_an_agent_restarted_behind_the_proxy_is_initialized_and_resumed_again(
    tmp_path: Path,
) -> None:
    """The proxy starts a new Agent and keeps the pipe: -32600, initialize, resume, resend.

    The Client resends once the trace says the new Agent is up (the answer was dropped and its
    Agent replaced): the retry always meets the new Agent, however long it takes to start.
    """
    report = await run(
        **followed(
            tmp_path,
            "--faults",
            lose_first_and_respawn(tmp_path),
            agent=(*AGENT, "--store", str(tmp_path / "store")),
        ),
        prompts=TEXTS,
    )
    check_inserted_once(report)
    assert (report.connections, report.reconnects, report.resyncs) == (1, 0, 1)
    assert outcomes(report, 0) == [
        ("pending", True, 1),  # the answer was dropped, then its Agent killed
        ("error", False, 1),  # the new Agent: not initialized
        ("answered", False, 1),
    ]
    first = report.submissions[0]
    assert first.attempts[1].error is not None
    assert first.attempts[1].error["code"] == -32600
    assert live_ids(report, "first") == [first.message_id]
    assert report.resumes[0].user_message_ids == [first.message_id]


# -- a severed WebSocket (T2) --------------------------------------------------------------------


async def test_a_severed_websocket_is_reconnected_and_the_session_resumed(serve: Serve) -> None:
    """The proxy closes the Client's WebSocket after the first keyed prompt reached the Agent."""
    agent = await serve(*AGENT, "--turn-ms", "1", "--listen", "ws://127.0.0.1:0/acp")
    proxy = await serve(
        *PROXY, "--listen", "ws://127.0.0.1:0/acp", "--upstream", agent, "--faults", SEVER_CLIENT
    )
    report = await run(connect=proxy, prompts=TEXTS, answer_timeout=TIMEOUT)
    check_inserted_once(report)
    assert (report.transport, report.connections, report.reconnects) == ("ws", 2, 1)
    assert outcomes(report, 0) == [("connection_lost", False, 1), ("answered", False, 2)]
    first = report.submissions[0]
    assert report.resumes[0].connection == 2
    assert report.resumes[0].user_message_ids == [first.message_id]  # it was inserted


# -- an Agent that ignores keys ------------------------------------------------------------------


async def test_an_agent_that_ignores_keys_inserts_the_retry_again(tmp_path: Path) -> None:
    """``--no-dedupe``: the retry after the lost answer is a second message, one duplicate."""
    options = followed(tmp_path, "--faults", LOSE_FIRST, agent=(*AGENT, "--no-dedupe"))
    report = await run(**options, prompts=TEXTS[:2])
    assert report.error is None
    assert report.duplicates == 1
    assert not report.ok
    first, second = report.submissions
    assert first.confirmed
    assert outcomes(report, 0) == [("pending", True, 1), ("answered", False, 1)]
    [original, again] = first.history_ids  # two messages for one submission
    assert original != again
    assert first.message_id == again
    assert live_ids(report, "first") == [original, again]
    assert first.message_ids == [original, again]
    assert second.history_ids == second.message_ids == [second.message_id]
    assert report.exit_status == 1
    text = render(report)
    assert f"#1 inserted 2 times: {original}, {again}" in text
    assert "FAIL: 1 submission inserted more than once" in text
    assert report.to_json()["duplicates"] == 1


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


async def test_a_duplicate_seen_live_counts_though_the_final_replay_lacks_it(
    tmp_path: Path,
) -> None:
    """Every user message seen for a submission counts, not only the final replay's.

    The first answer is lost, the Agent ignores keys and inserts the retry again; the final
    replay misses the second copy. The Client saw both live: one duplicate, as the ledger says.
    """
    state = tmp_path / "state.json"
    options = followed(
        tmp_path,
        "--faults",
        LOSE_FIRST,
        "--faults",
        replay_without_the_retry(tmp_path),
        "--state",
        state,
        agent=(*AGENT, "--no-dedupe"),
    )
    report = await run(**options, prompts=TEXTS[:2])
    first, second = report.submissions
    [original, again] = live_ids(report, "first")
    assert report.history is not None
    assert original in report.history
    assert again not in report.history  # the replay left the copy out
    assert report.duplicates == 1
    assert first.history_ids == [original]
    assert first.message_ids == [original, again]
    assert second.message_ids == second.history_ids == [second.message_id]
    assert (report.ok, report.exit_status) == (False, 1)
    assert ledger_duplicates(state) == {first.key}
    text = render(report)
    assert "FAIL: 1 submission inserted more than once" in text


def test_the_client_command_exits_1_on_a_duplicate(tmp_path: Path) -> None:
    """``acp-proxy client`` prints the duplicate and exits 1, agreeing with the ledger."""
    state = tmp_path / "state.json"
    trace = tmp_path / "trace.jsonl"
    argv = through_proxy(
        "--trace",
        trace,
        "--faults",
        LOSE_FIRST,
        "--faults",
        replay_without_the_retry(tmp_path),
        "--state",
        state,
        agent=(*AGENT, "--no-dedupe"),
    )
    patience = ["--answer-timeout", str(TIMEOUT), "--follow-trace", str(trace)]
    done = subprocess.run(
        [*CLIENT, "-p", "first", "-p", "second", *patience, "--json", "--", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["duplicates"] == 1
    first, second = report["submissions"]
    assert len(first["messageIds"]) == 2
    assert second["messageIds"] == [second["messageId"]]
    assert ledger_duplicates(state) == {first["key"]}


# -- the verdict, from what was seen ------------------------------------------------------------


def judged(
    submissions: list[Submission], seen: list[SeenMessage], history: list[str] | None
) -> ClientReport:
    report = ClientReport("stdio", submissions=submissions, user_messages=seen, history=history)
    judge(report)
    return report


def test_a_message_in_chunks_is_put_together_per_stream() -> None:
    """Chunks live and chunks replayed are two streams: the text is not doubled, one message."""
    chunks = [
        SeenMessage("m1", "fir", 1, 0, 0, chunk=True),
        SeenMessage("m1", "st", 1, 0, 0, chunk=True),
        SeenMessage("m1", "fir", 2, 1, 0, chunk=True),
        SeenMessage("m1", "st", 2, 1, 0, chunk=True),
        SeenMessage("m2", "fir", 2, 1, 0, chunk=True),
        SeenMessage("m2", "st", 2, 1, 0, chunk=True),
    ]
    report = judged([Submission("first", "k1", answers=["m1"])], chunks, ["m1", "m2"])
    [first] = report.submissions
    assert first.message_ids == first.history_ids == ["m1", "m2"]  # m2: a copy, replayed
    assert report.duplicates == 1


def test_messages_go_to_the_submission_sent_latest_with_their_text() -> None:
    """Two submissions of one text are two messages, not a duplicate; a late copy of an
    earlier submission, seen while a later one is under way, is the earlier one's."""
    submissions = [
        Submission("same", "k1", answers=["m1"]),
        Submission("other", "k2", answers=["m2"]),
        Submission("same", "k3", answers=["m3"]),
    ]
    seen = [
        SeenMessage("m1", "same", 1, 0, 0),
        SeenMessage("m2", "other", 1, 0, 1),
        SeenMessage("m1b", "same", 1, 0, 1),  # k1 inserted again, late
        SeenMessage("m3", "same", 1, 0, 2),
    ]
    report = judged(submissions, seen, None)
    assert [s.message_ids for s in report.submissions] == [["m1", "m1b"], ["m2"], ["m3"]]
    assert [s.history_ids for s in report.submissions] == [[], [], []]  # not verified
    assert report.duplicates == 1
    assert "#1 inserted 2 times: m1, m1b" in render(report)


def test_a_flood_of_copies_is_listed_in_bounded_text() -> None:
    """A hostile Agent's many long messageIds: the JSON has all, the text a few, each cut."""
    ids = [f"{n:03d}" + "x" * 10_000 for n in range(100)]
    seen = [SeenMessage(message_id, "first", 1, 0, 0) for message_id in ids]
    report = judged([Submission("first", "k1")], seen, None)
    assert report.submissions[0].message_ids == ids
    assert report.duplicates == 99
    [line] = [line for line in render(report).splitlines() if "inserted 100 times" in line]
    assert len(line) < 400
    assert line.endswith(" and 95 more")


# -- bad input and bad starts --------------------------------------------------------------------


async def test_garbage_from_the_agent_is_skipped_and_lost_answers_resent(tmp_path: Path) -> None:
    """Corrupted messages are skipped; answers among them are recovered by resending the key."""
    report = await run(
        **followed(tmp_path, "--faults", GARBAGE, agent=(*AGENT, "--turn-ms", "1")),
        prompts=TEXTS,
    )
    assert report.error is None
    assert all(s.confirmed for s in report.submissions)
    assert report.duplicates == 0
    assert report.connections == 1
    assert sum(len(s.attempts) for s in report.submissions) > len(TEXTS)  # some were resent
    for submission in report.submissions:
        assert len(submission.answers) == 1  # every answer to a key named the same message


async def test_a_command_that_cannot_start_is_reported(tmp_path: Path) -> None:
    """No exception: the report carries the error, and nothing was submitted."""
    report = await run(agent_argv=(str(tmp_path / "missing"),), prompts=TEXTS)
    assert report.error is not None
    assert report.error.startswith("cannot connect")
    assert (report.connections, report.submissions, report.ok) == (0, [], False)
    assert report.not_submitted == list(TEXTS)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({}, "either an agent command or a URL"),
        ({"agent_argv": ("a",), "connect": "ws://127.0.0.1:1/acp"}, "not both"),
        ({"connect": "tcp://127.0.0.1:1"}, "ws:// or http:// URL"),
        ({"agent_argv": ("a",), "max_attempts": 0}, "at least 1"),
        ({"agent_argv": ("a",), "answer_timeout": 0}, "positive"),
    ],
)
def test_options_are_checked(fields: dict[str, object], match: str) -> None:
    """One of a command and a URL; a ws or http URL; at least one attempt; positive timeouts."""
    with pytest.raises(ValueError, match=match):
        ClientOptions(**fields)  # type: ignore[arg-type]
