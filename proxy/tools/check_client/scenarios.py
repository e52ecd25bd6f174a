"""The scenarios C0-C7: the RFD's rules for Clients, each judged from what the proxy saw.

A scenario names the fault setup its run needs (:data:`SETUPS`: the proxy's rules, the reference
Agent's options); scenarios that need the same setup share one run of the Client. Each judges
its run and, for the rules that hold across submissions, every run (``runs``). It returns the
reason of its PASS, raises :class:`~proxy.tools.verdicts.Fail` with the evidence (request ids,
keys by digest, times from the run's start) or :class:`~proxy.tools.verdicts.Skip` with the
reason (the Client sent no prompt, or no key where the rule is about keys).

C0 keys are well formed: every prompt carries one, a new one per submission, not derived from the
text (the same text in two runs, or sent again after its answer came, with the same key). C1 a
lost answer: the Client resends with the same key within ``--retry-window`` and accepts the
original ``messageId`` (sends the key no more once answered). C2 the connection cut after the
prompt was forwarded: the Client reconnects, resumes the session, then resends with the same key.
C3 the same across an Agent killed with the prompt pending. C4 an error answer: a resend may
reuse the key (it stays unused), never for another prompt. C5 no key with two prompts, across
every run. C6 ``session/cancel`` never sent twice for one turn, ``$/cancel_request`` only for
pending ids. C7 no prompt resent without a key (the ledger's ``unkeyed_resend``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.core import acp
from proxy.core.observations import Check
from proxy.tools.check_client.observed import Observed, key_text
from proxy.tools.check_client.run import Run
from proxy.tools.report import plural
from proxy.tools.report.prompts import Attempt, wire_text
from proxy.tools.verdicts import Error, Fail, Skip

__all__ = ["AGAIN", "SCENARIOS", "SETUPS", "Scenario", "Setup", "silent"]

V2 = 2
"""The protocol version that brings idempotency keys."""
RESUMES = frozenset({acp.RESUME_SESSION, "session/load"})
"""What a Client sends to take up its session on a new connection."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What the proxy does to the run (its rules) and how the reference Agent behaves."""

    rules: list[dict[str, Any]] = field(default_factory=list)
    agent_args: tuple[str, ...] = ()


def _first_prompt(name: str, action: dict[str, Any], direction: str = "to_agent") -> dict[str, Any]:
    """A rule named ``name`` doing ``action`` to the first prompt (``to_agent``) or its answer."""
    kind = "request" if direction == "to_agent" else "response"
    return {
        "name": name,
        "when": {"direction": direction, "kind": kind, "method": acp.PROMPT},
        "schedule": {"nth": [1]},
        "do": action,
    }


SETUPS: dict[str, Setup] = {
    "plain": Setup(),
    "lost": Setup([_first_prompt("lose-first-answer", {"action": "drop"}, "to_client")]),
    "severed": Setup(
        [
            _first_prompt(
                "cut-after-first-prompt", {"action": "sever", "side": "client", "moment": "after"}
            )
        ]
    ),
    "killed": Setup(
        [_first_prompt("kill-agent-after-first-prompt", {"action": "kill_agent", "signal": "KILL"})]
    ),
    "refused": Setup(agent_args=("--fail-prompts", "1")),
    "again": Setup(),
}
"""Each run's setup: none; the first prompt's answer dropped; the Client's connection cut once
the first prompt was forwarded; the Agent killed once it was forwarded (over stdio the proxy
ends with it; the Agent's store keeps the session); the first prompt answered -32603 by the
Agent, inserting nothing; ``again``: a second plain run, for a scenario that needs two runs
when no other would run (:attr:`Scenario.runs`)."""

AGAIN = "again"
"""The setup the runner adds for a scenario that judges more runs than the others need."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a scenario judges: its run, every run, and the options' bounds."""

    run: Run
    runs: list[Run]
    retry_window: float
    client_timeout: float
    prompts: int = 1
    """How many prompts the Client sends in a run (``--prompts``)."""

    @property
    def seen(self) -> Observed:
        return self.run.observed


Judge = Callable[[Context], str]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario: its title, the setup of its run (a key of :data:`SETUPS`), its judge."""

    title: str
    setup: str
    judge: Judge
    runs: int = 1
    """Runs it judges at least (C0 compares two submissions of the same text: a key derived from
    the text is the same in both); the runner adds plain ones (:data:`AGAIN`) when fewer run."""


def _prompted(context: Context) -> list[Attempt]:
    """The run's prompts; :class:`Skip` when the Client sent none, or is a v1 Client."""
    seen, run = context.seen, context.run
    old = sorted(version for version in run.versions if version < V2)
    if old:
        raise Skip(
            f"a Client of ACP v{old[0]}: it asked initialize for protocol version {old[0]}, and "
            f"idempotency keys are v{V2}'s"
        )
    if seen.attempts:
        return seen.attempts
    raise Skip(silent(run, context.client_timeout))


def silent(run: Run, timeout: float) -> str:
    """Why a run shows no prompt: the Client never started the Agent, or sent no prompt; how it
    ended and its last words; what that suggests."""
    said = run.said.splitlines()[-1][:200] if run.said.strip() else "nothing"
    failed = run.exit_status != 0
    if run.observed.start is None:
        started = "never started the Agent"
        hint = (
            "it failed before it reached the Agent"
            if failed
            else "a v1 Client, or one that needs a prompt on its command line"
        )
    else:
        started = "sent no session/prompt"
        hint = "a v1 Client, or one that needs a prompt on its command line"
    return f"the Client {started} ({run.how_it_ended(timeout)}; its last words: {said}): {hint}"


def _struck(context: Context, *, refused: bool = False) -> Attempt:
    """The first prompt the run's fault struck: lost (or, ``refused``, answered with the
    Agent's error). :class:`Skip` without prompts; :class:`Error` when the fault struck none
    (the setup did not do what it is for: nothing to judge the Client on)."""
    attempts = _prompted(context)
    for attempt in attempts:
        if (attempt.outcome() == "error") if refused else (attempt.loss() is not None):
            return attempt
    what = "answered with an error" if refused else "lost"
    raise Error(
        f"the run's fault struck no prompt ({plural(len(attempts), 'prompt')}, none {what}): "
        "nothing to judge"
    )


def _later(seen: Observed, attempt: Attempt) -> list[Attempt]:
    """The attempts after ``attempt`` with its session, key and prompt: its resends."""
    return [
        other
        for other in seen.attempts
        if other.time > attempt.time
        and other.key == attempt.key
        and other.session == attempt.session
        and seen.prompt_of(other) == seen.prompt_of(attempt)
    ]


def _answered_at(attempt: Attempt) -> float | None:
    """When a success answer to ``attempt`` reached the Client, if one did."""
    if attempt.outcome() != "answered":
        return None
    return attempt.time + (attempt.duration_ms or 0.0) / 1000


def _resend(context: Context, lost: Attempt, how: str) -> Attempt:
    """The resend of ``lost`` with its key within the retry window, or :class:`Fail`."""
    seen = context.seen
    at, cause = lost.loss() or (lost.time, how)  # lost: _struck found it so
    told = f"{seen.attempt_text(lost)} lost its answer ({cause}) at {seen.at(at)}"
    if lost.key is None:
        again = [other for other in seen.attempts if other.retry_of is lost]
        if again:
            raise Fail(
                f"{told}; it was resent without a key ({seen.attempt_text(again[0])}): the Agent "
                "cannot tell it from a new prompt"
            )
        ended = context.run.how_it_ended(context.client_timeout)
        raise Fail(f"{told}; it carried no key and was not resent ({ended})")
    same = _later(seen, lost)
    if not same:
        prompt = seen.prompt_of(lost)
        other = [
            keyed
            for keyed in seen.keyed
            if keyed.time > lost.time and keyed.prompt == prompt and keyed.key != lost.key
        ]
        if other:
            raise Fail(
                f"{told}; it was resent with another key ({key_text(other[0].key)} at "
                f"{seen.at(other[0].time)}): the Agent takes it for a new submission"
            )
        ended = context.run.how_it_ended(context.client_timeout)
        raise Fail(f"{told}; it was never resent with its key ({ended})")
    retry = same[0]
    delay = retry.time - at
    if delay > context.retry_window:
        raise Fail(
            f"{told}; resent as {seen.attempt_text(retry)} {delay:.3f} s later, past "
            f"--retry-window {context.retry_window:g} s"
        )
    _accepted(seen, lost, same)
    return retry


def _accepted(seen: Observed, lost: Attempt, same: list[Attempt]) -> None:
    """The Client took the first success answer for the submission: no attempt of the key after
    it (:class:`Fail` otherwise)."""
    answers = [(at, a) for a in same if (at := _answered_at(a)) is not None]
    if not answers:
        outcomes = ", ".join(f"{seen.attempt_text(a)}: {a.outcome()}" for a in same)
        raise Fail(f"no resend of {seen.attempt_text(lost)} was answered ({outcomes})")
    at, answered = answers[0]
    after = [a for a in same if a.time > at]
    if after:
        raise Fail(
            f"{seen.attempt_text(answered)} was answered at {seen.at(at)}, yet the Client sent "
            f"its prompt with its key again ({seen.attempt_text(after[0])}): it did not accept "
            "the answer, or took the key for a new submission's"
        )


def _message_of(seen: Observed, attempt: Attempt) -> str:
    named = seen.messages.get((attempt.session or "", attempt.key or ""), [])
    return f"messageId {named[0]}" if named else "its messageId"


# -- the scenarios --------------------------------------------------------------------------------


def c0(context: Context) -> str:
    _prompted(context)
    attempts = [(run, a) for run in context.runs for a in run.observed.attempts]
    unkeyed = [(run, a) for run, a in attempts if a.key is None]
    if unkeyed:
        run, attempt = unkeyed[0]
        none = ": a v2 Client that sends no keys"
        raise Fail(
            f"{len(unkeyed)} of {len(attempts)} prompts carried no valid idempotencyKey (none, or "
            f"not a 1-255 character string), the first {run.observed.attempt_text(attempt)} in "
            f"the {run.setup} run" + (none if len(unkeyed) == len(attempts) else "")
        )
    seen = context.seen
    submitted = {(keyed.session, keyed.key, keyed.prompt) for keyed in seen.keyed}
    if len(submitted) < context.prompts:
        raise Fail(
            f"{plural(len(submitted), 'submission')} in the {context.run.setup} run, where "
            f"--prompts says {context.prompts} "
            f"({context.run.how_it_ended(context.client_timeout)})"
        )
    first: dict[tuple[str, str], str] = {}
    for run in context.runs:
        for keyed in run.observed.keyed:
            earlier = first.setdefault((keyed.prompt, keyed.key), run.setup)
            if earlier != run.setup:
                raise Fail(
                    f"the same prompt came with the same key ({key_text(keyed.key)}) in the "
                    f"{earlier} and the {run.setup} runs: the key is derived from the text, "
                    "not random"
                )
    for run in context.runs:
        seen = run.observed
        for attempt in seen.attempts:
            at = _answered_at(attempt)
            again = [
                a
                for a in seen.attempts
                if at is not None
                and a.time > at
                and (a.session, a.key) == (attempt.session, attempt.key)
            ]
            if again:
                raise Fail(
                    f"{key_text(attempt.key or '')} was sent again ({seen.attempt_text(again[0])})"
                    f" after its prompt was answered at {seen.at(at or 0)} in the {run.setup} run:"
                    " a new submission needs a new key"
                )
    keys = {keyed.key for run in context.runs for keyed in run.observed.keyed}
    texts = {keyed.prompt for run in context.runs for keyed in run.observed.keyed}
    shared = (
        "nor shared by two runs"
        if len(context.runs) > 1
        else "(one run only: whether a key follows from its text was not checked)"
    )
    return (
        f"{plural(len(attempts), 'prompt')} in {plural(len(context.runs), 'run')}, each with a "
        f"key; {plural(len(keys), 'key')} for {plural(len(texts), 'distinct text')}, none sent "
        f"again after its answer came {shared}"
    )


def c1(context: Context) -> str:
    lost = _struck(context)
    retry = _resend(context, lost, "dropped")
    seen = context.seen
    delay = retry.time - (lost.loss() or (lost.time, ""))[0]
    return (
        f"{seen.attempt_text(lost)} lost its answer; resent as {seen.attempt_text(retry)} "
        f"{delay:.3f} s later with the same key, answered with {_message_of(seen, retry)}"
    )


def _reconnected(context: Context, what: str) -> str:
    lost = _struck(context)
    retry = _resend(context, lost, what)
    seen = context.seen
    connection = seen.connection_of(retry)
    if connection == seen.connection_of(lost):
        raise Fail(f"{seen.attempt_text(retry)} was sent on the connection that was cut ({what})")
    resumed = [
        sent
        for sent in seen.sent
        if sent.method in RESUMES
        and sent.session == lost.session
        and sent.connection == connection
        and sent.time < retry.time
    ]
    if not resumed:
        raise Fail(
            f"{seen.attempt_text(retry)} was resent on a new connection without resuming the "
            f"session {lost.session} there first (no session/resume or session/load before it)"
        )
    return (
        f"{seen.attempt_text(lost)} was cut off ({what}); the Client reconnected, sent "
        f"{resumed[-1].method} at {seen.at(resumed[-1].time)}, and resent it as "
        f"{seen.attempt_text(retry)}, answered with {_message_of(seen, retry)}"
    )


def c2(context: Context) -> str:
    return _reconnected(context, "the connection was cut after the prompt was forwarded")


def c3(context: Context) -> str:
    return _reconnected(context, "the Agent was killed with the prompt pending")


def c4(context: Context) -> str:
    refused = _struck(context, refused=True)
    seen = context.seen
    if refused.key is None:
        raise Skip(f"{seen.attempt_text(refused)} carried no key: no key to keep unused (see C0)")
    prompt = seen.prompt_of(refused)
    for keyed in seen.keyed:
        if keyed.key == refused.key and keyed.prompt != prompt:
            raise Fail(
                f"{key_text(keyed.key)} of {seen.attempt_text(refused)}, refused with -32603, "
                f"came back with another prompt at {seen.at(keyed.time)}: an unused key is "
                "still that prompt's"
            )
    same = _later(seen, refused)
    if same:
        _accepted(seen, refused, same)
        return (
            f"{seen.attempt_text(refused)} was refused with -32603; resent with the same "
            f"(unused) key as {seen.attempt_text(same[0])}, answered with "
            f"{_message_of(seen, same[0])}"
        )
    other = [k for k in seen.keyed if k.prompt == prompt and k.key != refused.key]
    if other:
        return (
            f"{seen.attempt_text(refused)} was refused with -32603; resent as a new submission "
            f"with {key_text(other[0].key)} at {seen.at(other[0].time)}"
        )
    return (
        f"{seen.attempt_text(refused)} was refused with -32603 and not resent "
        f"({context.run.how_it_ended(context.client_timeout)}): allowed, if the user is told"
    )


def c5(context: Context) -> str:
    _prompted(context)
    for run in context.runs:
        for finding in run.observed.findings:
            if finding.check == Check.KEY_REUSED_OTHER_PROMPT:
                key = key_text(finding.key or "")
                raise Fail(
                    f"{key} came with two different prompts in the {run.setup} run at "
                    f"{run.observed.at(finding.time)} (the ledger's key_reused_other_prompt)"
                )
    prompts: dict[str, tuple[str, str]] = {}
    for run in context.runs:
        for keyed in run.observed.keyed:
            prompt, where = prompts.setdefault(keyed.key, (keyed.prompt, run.setup))
            if prompt != keyed.prompt:
                raise Fail(
                    f"{key_text(keyed.key)} came with two different prompts, in the {where} "
                    f"and the {run.setup} runs"
                )
    if not prompts:
        raise Skip("the Client sent no keys (see C0)")
    return (
        f"{plural(len(prompts), 'key')} in {plural(len(context.runs), 'run')}, each with one prompt"
    )


def c6(context: Context) -> str:
    _prompted(context)
    cancels = 0
    for run in context.runs:
        seen = run.observed
        last: dict[str | None, float] = {}
        prompts = sorted(a.time for a in seen.attempts)
        for sent in seen.sent:
            if sent.method == acp.CANCEL_REQUEST:
                cancels += 1
                if sent.disposition == "cancel_dropped":
                    raise Fail(
                        f"$/cancel_request for id {wire_text(sent.id)} at {seen.at(sent.time)} "
                        f"in the {run.setup} run: no request of that id was pending"
                    )
            if sent.method != acp.SESSION_CANCEL:
                continue
            cancels += 1
            before = last.get(sent.session)
            if before is not None and not any(before < t < sent.time for t in prompts):
                raise Fail(
                    f"session/cancel of {sent.session} sent again at {seen.at(sent.time)} in "
                    f"the {run.setup} run (the first at {seen.at(before)}, no prompt between): "
                    "a cancel is never resent"
                )
            last[sent.session] = sent.time
    if not cancels:
        return "no session/cancel or $/cancel_request was sent: none resent, none misdirected"
    return f"{plural(cancels, 'cancel')}, none resent, each $/cancel_request for a pending id"


def c7(context: Context) -> str:
    _prompted(context)
    seen = context.seen
    for finding in seen.findings:
        if finding.check == Check.UNKEYED_RESEND:
            raise Fail(f"the ledger's unkeyed_resend at {seen.at(finding.time)}: {finding.detail}")
    return "no prompt was resent without a key after its answer was lost"


SCENARIOS: dict[str, Scenario] = {
    "C0": Scenario(
        "keys are well formed, one per submission, not from the text", "plain", c0, runs=2
    ),
    "C1": Scenario("a lost answer: resent with the same key", "lost", c1),
    "C2": Scenario("a cut connection: reconnect, resume, resend with the same key", "severed", c2),
    "C3": Scenario("the Agent killed: reconnect, resume, resend with the same key", "killed", c3),
    "C4": Scenario("an error answer: the key stays the prompt's", "refused", c4),
    "C5": Scenario("no key for two different prompts, across every run", "plain", c5),
    "C6": Scenario("session/cancel never resent, $/cancel_request for pending ids", "plain", c6),
    "C7": Scenario("no unkeyed resend (the ledger's unkeyed_resend)", "lost", c7),
}
"""Every scenario by name: its title, the setup of its run, and its judge."""
