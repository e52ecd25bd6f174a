"""The reference Client's hold on its session (``proxy.tools.lab.client.session``): after the
Agent dies it is respawned and the session resumed (T3); an Agent restarted behind the proxy is
initialized and resumed again on the same connection; a severed WebSocket is reconnected (T2);
an Agent without a store has lost the session, and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from client_lab import (
    AGENT,
    AGENT_DIES,
    LOSE_FIRST,
    PROXY,
    SEVER_CLIENT,
    TEXTS,
    check_inserted_once,
    followed,
    live_ids,
    outcomes,
    run,
    servers,
    through_proxy,
)
from harness import TIMEOUT

from proxy.tools.lab.client import render

pytestmark = pytest.mark.slow


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


async def test_a_severed_websocket_is_reconnected_and_the_session_resumed() -> None:
    """The proxy closes the Client's WebSocket after the first keyed prompt reached the Agent."""
    async with servers() as serve:
        agent = await serve(*AGENT, "--turn-ms", "1", "--listen", "ws://127.0.0.1:0/acp")
        proxy = await serve(
            *PROXY,
            "--listen",
            "ws://127.0.0.1:0/acp",
            "--upstream",
            agent,
            "--faults",
            SEVER_CLIENT,
        )
        report = await run(connect=proxy, prompts=TEXTS, answer_timeout=TIMEOUT)
    check_inserted_once(report)
    assert (report.transport, report.connections, report.reconnects) == ("ws", 2, 1)
    assert outcomes(report, 0) == [("connection_lost", False, 1), ("answered", False, 2)]
    first = report.submissions[0]
    assert report.resumes[0].connection == 2
    assert report.resumes[0].user_message_ids == [first.message_id]  # it was inserted
