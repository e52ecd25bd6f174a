"""Delivering a submission (``proxy.tools.lab.client.retry``): a lost answer is resent with the same
key and gets the original (T1); garbage among the answers is skipped and what it hid resent; an
Agent that ignores keys inserts the retry again, and every copy seen counts; alone (no trace to
follow) the Client resends on its timer."""

from __future__ import annotations

from pathlib import Path

import pytest
from client_lab import (
    AGENT,
    GARBAGE,
    LOSE_FIRST,
    TEXTS,
    check_inserted_once,
    followed,
    ledger_duplicates,
    live_ids,
    outcomes,
    replay_without_the_retry,
    run,
    through_proxy,
)

from proxy.tools.lab.client import render

pytestmark = pytest.mark.slow


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
