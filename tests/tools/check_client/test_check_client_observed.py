"""What a run's trace shows (``proxy.tools.check_client.observed``) and the scenarios' judgements
on it (``proxy.tools.check_client.scenarios``), from traces written here record by record, in
the proxy's format: the branches no real Client in the suite walks (a resend past the window or
with another key, a resend without resuming, a misdirected ``$/cancel_request``, one key for the
same text in two runs). No process, no socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.tools.check_client import observed
from proxy.tools.check_client.observed import key_text, observe
from proxy.tools.check_client.run import Run
from proxy.tools.check_client.scenarios import Context, c0, c1, c2, c6
from proxy.tools.verdicts import Error, Fail

SESSION = "sess_1"
START = 1000.0


class Trace:
    """A trace file written record by record, as a proxy writes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.header()

    def add(self, at: float, event: str, link: int | None = 1, **fields: Any) -> None:
        record = {"time": START + at, "event": event, **fields}
        if event != "trace":
            record = {"time": START + at, "link": link, "event": event, **fields}
        self.records.append(record)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def header(self, at: float = 0.0) -> None:
        self.add(at, "trace", version=1)

    def connection(self, at: float, state: str) -> None:
        self.add(at, "connection", state=state, side="client", transport="stdio")

    def message(self, at: float, direction: str, kind: str, method: str, ids: tuple[int, int],
                *, disposition: str = "relayed", **more: Any) -> None:  # fmt: skip
        self.add(
            at, "message", disposition=disposition, direction=direction, kind=kind,
            method=method, session=SESSION, id=ids[0], forwarded_id=ids[1], size=100, **more,
        )  # fmt: skip

    def prompt(self, at: float, ids: tuple[int, int], key: str | None, text: str = "p1") -> None:
        if key is not None:
            self.add(at, "keyed", session=SESSION, key=key, prompt=text, retry=False)
        self.message(at, "to_agent", "request", "session/prompt", ids)

    def answer(self, at: float, ids: tuple[int, int]) -> None:
        self.message(at, "to_client", "response", "session/prompt", ids, duration_ms=1.0)

    def lose(self, at: float, ids: tuple[int, int]) -> None:
        self.add(at, "fault", rule="lose", action="drop", direction="to_client",
                 kind="response", method="session/prompt", session=SESSION, id=ids[1])  # fmt: skip
        self.message(
            at, "to_client", "response", "session/prompt", ids, disposition="dropped", rule="lose"
        )


def context(*traces: Trace, window: float = 30.0) -> Context:
    runs = [Run(f"run{n}", 0, 1.0, observe(trace.path), "") for n, trace in enumerate(traces)]
    return Context(runs[0], runs, window, 60.0)


@pytest.fixture
def trace(tmp_path: Path) -> Trace:
    trace = Trace(tmp_path / "trace.jsonl")
    trace.connection(0.0, "open")
    return trace


def test_a_resend_with_the_same_key_passes_c1(trace: Trace) -> None:
    trace.prompt(1.0, (3, 2), "K1")
    trace.lose(1.1, (3, 2))
    trace.prompt(2.0, (4, 3), "K1")
    trace.answer(2.1, (4, 3))
    reason = c1(context(trace))
    assert reason.startswith(f"id 3 ({key_text('K1')}) at t+1.000s lost its answer; resent as id 4")


def test_a_resend_past_the_window_fails_c1(trace: Trace) -> None:
    trace.prompt(1.0, (3, 2), "K1")
    trace.lose(1.1, (3, 2))
    trace.prompt(9.0, (4, 3), "K1")
    trace.answer(9.1, (4, 3))
    with pytest.raises(Fail, match=r"7\.900 s later, past --retry-window 5 s"):
        c1(context(trace, window=5.0))


def test_a_resend_with_another_key_fails_c1(trace: Trace) -> None:
    trace.prompt(1.0, (3, 2), "K1")
    trace.lose(1.1, (3, 2))
    trace.prompt(2.0, (4, 3), "K2")
    trace.answer(2.1, (4, 3))
    with pytest.raises(Fail, match=rf"resent with another key \({key_text('K2')} at t\+2\.000s\)"):
        c1(context(trace))


def test_a_key_sent_again_after_its_answer_fails_c1(trace: Trace) -> None:
    """The answer to the resend came: the Client must not send the prompt again."""
    trace.prompt(1.0, (3, 2), "K1")
    trace.lose(1.1, (3, 2))
    trace.prompt(2.0, (4, 3), "K1")
    trace.answer(2.1, (4, 3))
    trace.prompt(3.0, (5, 4), "K1")
    with pytest.raises(Fail, match="did not accept the answer"):
        c1(context(trace))


def test_a_resend_on_a_new_connection_without_resuming_fails_c2(trace: Trace) -> None:
    """Over stdio a new connection is a new proxy process: a new run in the file."""
    trace.prompt(1.0, (3, 2), "K1")
    trace.add(1.0, "fault", rule="cut", action="sever", direction="to_agent", kind="request",
              method="session/prompt", session=SESSION, id=3)  # fmt: skip
    trace.connection(1.1, "closed")
    trace.header(2.0)
    trace.connection(2.0, "open")
    trace.prompt(2.5, (6, 2), "K1")
    trace.answer(2.6, (6, 2))
    with pytest.raises(Fail, match="without resuming the session sess_1 there first"):
        c2(context(trace))
    trace.message(2.7, "to_agent", "request", "session/resume", (7, 3))
    trace.prompt(2.8, (8, 4), "K1")  # a resend after resuming: but the first one did not
    with pytest.raises(Fail):
        c2(context(trace))


def test_a_cancel_request_for_an_answered_id_fails_c6(trace: Trace) -> None:
    """The proxy drops a ``$/cancel_request`` of no pending request: ``cancel_dropped``."""
    trace.prompt(1.0, (3, 2), "K1")
    trace.answer(1.1, (3, 2))
    trace.add(1.2, "message", disposition="cancel_dropped", direction="to_agent",
              kind="notification", method="$/cancel_request", id=3)  # fmt: skip
    with pytest.raises(Fail, match=r"\$/cancel_request for id 3 at t\+1\.200s in the run0 run"):
        c6(context(trace))


def test_one_key_for_the_same_text_in_two_runs_fails_c0(tmp_path: Path) -> None:
    """Two runs are two sessions: a random key never comes twice; one derived from the text does."""
    runs = []
    for n in range(2):
        trace = Trace(tmp_path / f"trace{n}.jsonl")
        trace.connection(0.0, "open")
        trace.prompt(1.0, (3, 2), "hash-of-p1")
        trace.answer(1.1, (3, 2))
        runs.append(trace)
    with pytest.raises(
        Fail, match="in the run0 and the run1 runs: the key is derived from the text"
    ):
        c0(context(*runs))


def test_a_missing_or_unfinished_trace() -> None:
    """No file: nothing seen (the Client never started the Agent); a link open: not settled."""
    assert observe(Path("/nonexistent/trace.jsonl")).start is None


def test_the_trace_is_settled_when_every_client_connection_closed(trace: Trace) -> None:
    assert not observe(trace.path).settled
    trace.connection(1.0, "closed")
    assert observe(trace.path).settled
    trace.header(2.0)
    trace.connection(2.0, "open")  # a new proxy process: the links before it are gone
    assert not observe(trace.path).settled


def test_a_trace_too_large_is_not_judged(trace: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Client flooding its Agent makes a trace past the bound: read no further, said why."""
    trace.prompt(1.0, (3, 2), "K1")
    monkeypatch.setattr(observed, "MAX_TRACE_BYTES", 100)
    seen = observe(trace.path)
    assert seen.attempts == []
    assert seen.unreadable == "the run's trace is over 0 MiB: not judged"


def test_a_fault_that_struck_nothing_is_not_the_clients_fault(trace: Trace) -> None:
    """No prompt lost in the run of a lost answer: the check could not be made (ERROR), never a
    FAIL of the Client for not resending."""
    trace.prompt(1.0, (3, 2), "K1")
    trace.answer(1.1, (3, 2))
    with pytest.raises(Error, match="the run's fault struck no prompt \\(1 prompt, none lost\\)"):
        c1(context(trace))
