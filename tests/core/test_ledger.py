"""The idempotency ledger and each finding of DESIGN 7, on the relay core (no sockets, fake clock)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from proxy.core.commands import Command, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import BurstReceived, Event, MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.jsonrpc import Kind
from proxy.core.ledger import UNDIGESTED_BYTES, Ledger, prompt_hash
from proxy.core.observations import (
    Finding,
    KeyedAttempt,
    KeyedMessage,
    Observation,
    Relayed,
    RelayedRun,
    Restarted,
)
from proxy.core.relay import Relay

CLIENT, AGENT = Side.CLIENT, Side.AGENT


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lab:
    """A relay whose observations feed a ledger, as in the proxy."""

    def __init__(self, *rules: dict[str, Any], undigested_bytes: int = UNDIGESTED_BYTES) -> None:
        self.clock = Clock()
        self.emitted: list[Observation] = []
        self.ledger = Ledger(
            self.clock,
            emit=lambda observation, link: self.emitted.append(observation),
            undigested_bytes=undigested_bytes,
        )
        parsed = [Rule.model_validate({"name": f"r{i}", **rule}) for i, rule in enumerate(rules)]
        self.relay = Relay(engine=FaultEngine(parsed, random.Random(1)) if parsed else None)
        self.prompt_sizes: list[int] = []
        """The size of each prompt relayed to the Agent, in order."""
        self.timers: list[StartTimer] = []
        """Timers the relay started, in order (:meth:`fire` one)."""

    def feed(self, side: Side, message: dict[str, Any]) -> list[bytes]:
        return self.handle(MessageReceived(side, json.dumps(message).encode(), self.clock.now))

    def fire(self, timer: StartTimer) -> list[bytes]:
        """The timer fires now."""
        return self.handle(TimerFired(timer.token, self.clock.now))

    def handle(self, event: Event) -> list[bytes]:
        commands: list[Command] = self.relay.handle(event)
        for command in commands:
            if isinstance(command, Observation):
                self.ledger.observe(command, 1)
                if isinstance(command, Relayed) and (command.kind, command.method) == (
                    Kind.REQUEST,
                    "session/prompt",
                ):
                    self.prompt_sizes.append(command.size)
            elif isinstance(command, StartTimer):
                self.timers.append(command)
        return [c.data for c in commands if isinstance(c, Send)]

    def prompt(self, request_id: Any, key: Any = "K1", text: str = "A", session: str = "S") -> int:
        """Send a prompt; return the id the agent sees."""
        params: dict[str, Any] = {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
        if key is not None:
            params["idempotencyKey"] = key
        forwarded = self.feed(
            CLIENT,
            {"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params},
        )
        return int(json.loads(forwarded[0])["id"])

    def answer(self, agent_id: int, message_id: str = "M1") -> list[bytes]:
        return self.feed(
            AGENT, {"jsonrpc": "2.0", "id": agent_id, "result": {"messageId": message_id}}
        )

    def error(self, agent_id: int, code: int) -> list[bytes]:
        return self.feed(
            AGENT, {"jsonrpc": "2.0", "id": agent_id, "error": {"code": code, "message": "x"}}
        )

    def inserted(self, message_id: str, text: str = "A", session: str = "S") -> None:
        update = {
            "sessionUpdate": "user_message",
            "messageId": message_id,
            "content": [{"type": "text", "text": text}],
        }
        self.feed(
            AGENT,
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session, "update": update},
            },
        )

    def checks(self) -> list[str]:
        return [finding["check"] for finding in self.ledger.findings]


def test_a_clean_retry_records_attempts_and_no_finding() -> None:
    """T1: the retry is answered with the original messageId; two attempts, one message."""
    lab = Lab()
    first = lab.prompt(7)
    lab.inserted("M1")
    lab.answer(first)
    retry = lab.prompt(8)
    lab.answer(retry, "M1")
    [entry] = lab.ledger.summary()
    assert (entry["session"], entry["key"], entry["retries"]) == ("S", "K1", 1)
    assert entry["message_ids"] == ["M1"]
    assert entry["inserts"] == ["M1"]
    assert entry["original_returned"] is True
    assert [a["outcome"] for a in entry["attempts"]] == ["M1", "M1"]
    assert lab.checks() == []
    assert [o.retry for o in lab.emitted if isinstance(o, KeyedAttempt)] == [False, True]


def test_each_message_named_for_a_key_is_told_once() -> None:
    """What the trace carries for judging across proxies: every keyed attempt with its key and
    prompt digest, and each messageId the first time it is named for the key (an insert, an
    answer, an answer to an injected copy), never again."""
    lab = Lab()
    first = lab.prompt(7)
    lab.inserted("M1")
    lab.answer(first, "M1")
    lab.answer(lab.prompt(8), "M1")
    lab.answer(lab.prompt(9), "M2")
    lab.inserted("M2")
    attempts = [o for o in lab.emitted if isinstance(o, KeyedAttempt)]
    assert [(o.session, o.key, o.retry) for o in attempts] == [
        ("S", "K1", False),
        ("S", "K1", True),
        ("S", "K1", True),
    ]
    assert len({o.prompt for o in attempts}) == 1
    assert [
        (o.session, o.key, o.message_id, o.via) for o in lab.emitted if isinstance(o, KeyedMessage)
    ] == [("S", "K1", "M1", "insert"), ("S", "K1", "M2", "answer")]


def test_a_held_prompt_is_an_attempt_when_it_reaches_the_agent() -> None:
    """A delayed prompt counts when it is delivered, not when it was held: its retry, sent later
    but delivered first, is the first attempt the Agent saw, and the held one the retry."""
    lab = Lab(
        {
            "when": {"method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "delay", "ms": 100},
        }
    )
    prompt = {"sessionId": "S", "idempotencyKey": "K1", "prompt": [{"type": "text", "text": "A"}]}
    held = {"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": prompt}
    assert lab.feed(CLIENT, held) == []
    assert lab.ledger.summary() == []
    lab.clock.now += 0.05
    lab.prompt(8)
    lab.clock.now += 0.05
    [timer] = lab.timers
    [released] = lab.fire(timer)
    assert json.loads(released)["id"] == 0
    [entry] = lab.ledger.summary()
    assert [a["id"] for a in entry["attempts"]] == [8, 7]
    assert [a["at"] for a in entry["attempts"]] == pytest.approx([1000.05, 1000.1])
    assert [o.retry for o in lab.emitted if isinstance(o, KeyedAttempt)] == [False, True]


@pytest.mark.parametrize("delay_ms", [0, 50])
def test_a_spaced_copy_sent_after_its_original_was_answered_still_counts(delay_ms: int) -> None:
    """duplicate with gap_ms (and a delay, or none): the original is answered before its copy
    leaves the proxy; the copy's answer, swallowed, with another messageId, is still a duplicate
    insert of that key."""
    rules: list[dict[str, Any]] = [
        {"when": {"kind": "request"}, "do": {"action": "duplicate", "gap_ms": 10}}
    ]
    if delay_ms:
        rules.insert(
            0,
            {
                "when": {"kind": "request"},
                "do": {"action": "delay", "ms": delay_ms},
                "continue": True,
            },
        )
    lab = Lab(*rules)
    prompt = {"sessionId": "S", "idempotencyKey": "K1", "prompt": [{"type": "text", "text": "A"}]}
    request = {"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": prompt}
    forwarded = lab.feed(CLIENT, request)
    if delay_ms:
        original, copy = lab.timers
        forwarded = lab.fire(original)
    else:
        [copy] = lab.timers
    assert [json.loads(data)["id"] for data in forwarded] == [0]
    lab.answer(0, "M1")
    [copied] = lab.fire(copy)
    assert json.loads(copied)["id"] == 1
    assert lab.answer(1, "M2") == []  # swallowed
    assert lab.checks() == ["duplicate_insert"]
    [entry] = lab.ledger.summary()
    assert entry["message_ids"] == ["M1", "M2"]
    assert len(entry["attempts"]) == 1


def test_the_answer_to_an_injected_copy_is_told_as_such() -> None:
    lab = Lab(
        {"when": {"kind": "request", "method": "session/prompt"}, "do": {"action": "duplicate"}}
    )
    lab.prompt(1)
    lab.answer(0, "M1")
    lab.answer(1, "M2")
    assert [(o.message_id, o.via) for o in lab.emitted if isinstance(o, KeyedMessage)] == [
        ("M1", "answer"),
        ("M2", "copy"),
    ]


def test_two_message_ids_for_one_key_is_a_duplicate_insert() -> None:
    """A retry answered with a new messageId: the work ran twice."""
    lab = Lab()
    lab.answer(lab.prompt(7), "M1")
    lab.answer(lab.prompt(8), "M2")
    assert lab.checks() == ["duplicate_insert"]
    [finding] = [o for o in lab.emitted if isinstance(o, Finding)]
    assert (finding.check, finding.session, finding.key) == ("duplicate_insert", "S", "K1")
    assert lab.ledger.summary()[0]["original_returned"] is False


def test_two_inserts_of_the_keyed_prompt_is_a_duplicate_insert() -> None:
    """Two user_message inserts of the same keyed prompt under different ids."""
    lab = Lab()
    lab.prompt(7)
    lab.inserted("M1")
    lab.prompt(8)
    lab.inserted("M2")
    assert lab.checks() == ["duplicate_insert"]


def test_two_submissions_of_the_same_text_are_two_messages_not_a_duplicate() -> None:
    """The RFD: a new submission gets a new key even with the same text. Each insert belongs to
    one submission, so two keys of one text each inserted once are no finding, replayed or not,
    whether the inserts come before the answers or after them; a second insert for either is."""
    lab = Lab()
    first = lab.prompt(7, key="K1")
    lab.inserted("M1")
    lab.answer(first, "M1")
    second = lab.prompt(8, key="K2")
    lab.answer(second, "M2")
    lab.inserted("M2")
    lab.inserted("M1")  # a resume replays both
    lab.inserted("M2")
    assert lab.checks() == []
    assert [(e["key"], e["inserts"]) for e in lab.ledger.summary()] == [
        ("K1", ["M1"]),
        ("K2", ["M2"]),
    ]
    lab.clock.now += 1
    lab.prompt(9, key="K2")  # a retry of the second, inserted again
    lab.inserted("M3")
    assert [(f["check"], f["key"]) for f in lab.ledger.findings] == [("duplicate_insert", "K2")]


def test_a_replayed_insert_is_not_a_duplicate() -> None:
    """session/resume replays the same messageId: one message."""
    lab = Lab()
    lab.answer(lab.prompt(7))
    lab.inserted("M1")
    lab.inserted("M1")
    assert lab.checks() == []


def test_unkeyed_identical_prompts_are_not_judged_as_duplicates() -> None:
    """Without a key, two identical prompts are two submissions."""
    lab = Lab()
    lab.answer(lab.prompt(1, key=None), "M1")
    lab.answer(lab.prompt(2, key=None), "M2")
    assert lab.checks() == []
    assert lab.ledger.summary() == []


def test_same_key_in_another_session_is_unrelated() -> None:
    """T6: keys are scoped to the session."""
    lab = Lab()
    lab.answer(lab.prompt(1, session="S1"), "M6")
    lab.answer(lab.prompt(2, session="S2", text="G"), "M7")
    assert lab.checks() == []
    assert len(lab.ledger.summary()) == 2


def test_invalid_keys_must_be_rejected_with_invalid_params() -> None:
    """T0: "", 256 characters and non-strings are answered -32602, or it is a finding."""
    lab = Lab()
    lab.error(lab.prompt(1, key=""), -32602)
    lab.error(lab.prompt(2, key="x" * 256), -32602)
    assert lab.checks() == []
    lab.answer(lab.prompt(3, key=42))
    lab.error(lab.prompt(4, key=["k"]), -32603)
    assert lab.checks() == ["invalid_key_accepted", "invalid_key_accepted"]


def test_a_key_of_255_characters_is_valid() -> None:
    """The limit is inclusive and counted in characters."""
    lab = Lab()
    lab.answer(lab.prompt(1, key="é" * 255))
    assert lab.checks() == []
    assert len(lab.ledger.summary()) == 1


def test_a_recorded_key_with_another_prompt_is_a_client_fault() -> None:
    """The Client must not reuse a key for a different prompt."""
    lab = Lab()
    lab.answer(lab.prompt(1, text="A"))
    lab.prompt(2, text="B")
    assert lab.checks() == ["key_reused_other_prompt"]


def test_the_key_must_never_be_echoed() -> None:
    """Keys are private: one in an update is a finding."""
    lab = Lab()
    lab.prompt(1, key="secret-key-123")
    lab.feed(
        AGENT,
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "S",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"text": "your key is secret-key-123"},
                },
            },
        },
    )
    assert lab.checks() == ["key_echoed"]


def test_cancel_must_answer_every_pending_request_of_the_key_alike() -> None:
    """T4a: after $/cancel_request, a -32800 for one and a success for the other is a finding."""
    lab = Lab()
    held = lab.prompt(10, text="D")
    retry = lab.prompt(11, text="D")
    lab.feed(CLIENT, {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 10}})
    lab.error(held, -32800)
    lab.answer(retry, "M4")
    assert lab.checks() == ["cancel_incomplete"]


def test_a_complete_cancel_is_no_finding() -> None:
    """Both pending requests of the key answered -32800."""
    lab = Lab()
    held = lab.prompt(10, text="D")
    retry = lab.prompt(11, text="D")
    lab.feed(CLIENT, {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 11}})
    lab.error(held, -32800)
    lab.error(retry, -32800)
    assert lab.checks() == []


def test_keys_and_ids_json_cannot_write_are_still_tracked() -> None:
    """A key with a lone surrogate, a cancel naming a 400-digit id: recorded, never a crash."""
    lab = Lab()
    held = lab.prompt(10**400, key="\ud800", text="D")
    retry = lab.prompt(11, key="\ud800", text="D")
    lab.feed(
        CLIENT, {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 10**400}}
    )
    lab.error(held, -32800)
    lab.answer(retry, "M4")
    lab.feed(AGENT, {"jsonrpc": "2.0", "method": "_x/echo", "params": {"text": "\ud800"}})
    assert lab.checks() == ["cancel_incomplete", "key_echoed"]
    assert len(lab.ledger.entries[("S", "\ud800")].attempts) == 2


def test_an_unkeyed_resend_after_a_lost_answer_is_flagged() -> None:
    """The Client retried without a key after a fault: an unsafe retry."""
    lab = Lab(
        {
            "when": {"kind": "response", "method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "drop"},
        }
    )
    lab.answer(lab.prompt(1, key=None))
    lab.prompt(2, key=None)
    assert lab.checks() == ["unkeyed_resend"]


LOSE_FIRST_ANSWER = {
    "when": {"kind": "response", "method": "session/prompt"},
    "schedule": {"nth": [1]},
    "do": {"action": "drop"},
}


def test_an_unkeyed_prompt_is_held_while_pending_and_digested_only_once_lost() -> None:
    """A prompt without a key is held undigested while it is pending: answered, it is let go
    without a digest; its answer lost, it is digested then, and a resend of it is flagged,
    another prompt is not."""
    lab = Lab(LOSE_FIRST_ANSWER)
    first = lab.prompt(1, key=None, text="the first")
    second = lab.prompt(2, key=None, text="another")
    sizes = lab.prompt_sizes
    assert lab.ledger.held_bytes == sum(sizes)
    lab.answer(first)  # dropped: the first prompt's answer is lost, and it is digested
    assert lab.ledger.held_bytes == sizes[1]
    lab.answer(second)
    assert lab.ledger.held_bytes == 0
    lab.prompt(3, key=None, text="another")
    assert lab.checks() == []
    lab.prompt(4, key=None, text="the first")
    assert lab.checks() == ["unkeyed_resend"]


@pytest.mark.parametrize("lost", [1, 2, 3])
def test_past_the_bound_unkeyed_prompts_are_digested_as_they_are_seen(lost: int) -> None:
    """With room for two prompts, the third is digested at once and nothing more is held; a
    resend of whichever lost its answer is flagged all the same."""
    room = Lab()
    room.prompt(1, key=None, text="prompt 1")
    [size] = room.prompt_sizes  # each prompt's, the same
    lab = Lab({**LOSE_FIRST_ANSWER, "schedule": {"nth": [lost]}}, undigested_bytes=2 * size)
    ids = [lab.prompt(n, key=None, text=f"prompt {n}") for n in (1, 2, 3)]
    assert lab.prompt_sizes == [size] * 3
    assert lab.ledger.held_bytes == 2 * size
    for agent_id in ids:
        lab.answer(agent_id)
    assert lab.ledger.held_bytes == 0
    lab.prompt(4, key=None, text=f"prompt {lost}")
    assert lab.checks() == ["unkeyed_resend"]


def test_a_keyed_prompt_or_one_in_a_session_that_lost_one_is_digested_at_once() -> None:
    """The keyed record carries the prompt's digest; a session that lost an unkeyed prompt's
    answer may be resending it, which is judged as it is seen."""
    lab = Lab(LOSE_FIRST_ANSWER)
    lab.prompt(1, key="K1")
    assert lab.ledger.held_bytes == 0
    lab.answer(lab.prompt(2, key=None, session="T"))
    lab.prompt(3, key=None, session="T", text="other")
    assert lab.ledger.held_bytes == 0
    lab.prompt(4, key=None, session="U")
    assert lab.ledger.held_bytes > 0


def test_a_lost_link_digests_the_prompts_it_held() -> None:
    lab = Lab()
    lab.prompt(1, key=None, text="on the lost link")
    lab.ledger.observe(Restarted("proxy", 1), 1)
    assert lab.ledger.held_bytes == 0
    lab.prompt(2, key=None, text="on the lost link")
    assert lab.checks() == ["unkeyed_resend"]


def test_retry_delay_is_measured_from_the_fault() -> None:
    """Time from the lost answer to the retry, and whether the original messageId came back."""
    lab = Lab(
        {
            "when": {"kind": "response", "method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "drop"},
        }
    )
    first = lab.prompt(1)
    lab.clock.now += 2.0
    assert lab.answer(first) == []  # dropped by the rule
    lab.clock.now += 0.5
    lab.answer(lab.prompt(2), "M1")
    entry = lab.ledger.summary()[0]
    assert entry["retry_delays_ms"] == [500.0]
    assert entry["original_returned"] is True


def test_a_restart_with_a_keyed_prompt_pending_counts_as_the_fault() -> None:
    """A link restart loses pending attempts; the retry's delay counts from it."""
    lab = Lab()
    lab.prompt(1)
    lab.clock.now += 1.0
    lab.ledger.observe(Restarted("proxy", 1), 1)
    lab.clock.now += 0.25
    lab.prompt(2)
    assert lab.ledger.summary()[0]["retry_delays_ms"] == [250.0]


def test_answers_to_injected_copies_must_name_the_same_message() -> None:
    """duplicate: the swallowed answer of the copy with another messageId is a duplicate insert."""
    lab = Lab(
        {"when": {"kind": "request", "method": "session/prompt"}, "do": {"action": "duplicate"}}
    )
    lab.prompt(1)
    assert lab.answer(0, "M1")
    assert lab.answer(1, "M2") == []  # swallowed
    assert lab.checks() == ["duplicate_insert"]
    assert lab.ledger.summary()[0]["retries"] == 0  # a copy is not the Client's retry


def test_answers_to_injected_copies_naming_the_same_message_are_fine() -> None:
    """A deduplicating agent answers the copy with the original messageId."""
    lab = Lab(
        {"when": {"kind": "request", "method": "session/prompt"}, "do": {"action": "duplicate"}}
    )
    lab.prompt(1)
    lab.answer(1, "M1")
    lab.answer(0, "M1")
    assert lab.checks() == []


def test_each_finding_is_reported_once() -> None:
    """A third messageId for the same key adds no second finding of the same check."""
    lab = Lab()
    for index, message_id in enumerate(["M1", "M2", "M3"]):
        lab.answer(lab.prompt(index), message_id)
    assert lab.checks() == ["duplicate_insert"]


def test_snapshot_and_restore_keep_entries_and_findings() -> None:
    """--state: a restarted proxy still knows the key and its findings."""
    lab = Lab()
    lab.answer(lab.prompt(1), "M1")
    lab.answer(lab.prompt(2), "M2")
    snapshot = json.loads(json.dumps(lab.ledger.snapshot()))
    restored = Ledger(Clock())
    restored.restore(snapshot)
    assert restored.summary() == lab.ledger.summary()
    assert [f["check"] for f in restored.findings] == ["duplicate_insert"]


def test_an_answer_no_parser_reads_settles_its_prompt() -> None:
    """An Agent's answer with a byte that is not UTF-8 still reaches the Client: its attempt is
    answered ("unreadable", no messageId to judge) and a later restart is no loss of it."""
    lab = Lab()
    agent_id = lab.prompt(7)
    raw = b'{"jsonrpc":"2.0","id":%d,"result":{"messageId":"caf\xe9"}}' % agent_id
    commands = lab.relay.handle(MessageReceived(AGENT, raw, lab.clock.now))
    for command in commands:
        if isinstance(command, Observation):
            lab.ledger.observe(command, 1)
    assert [c.data for c in commands if isinstance(c, Send)] == [
        raw.replace(b'"id":%d' % agent_id, b'"id":7', 1)
    ]
    lab.ledger.observe(Restarted("proxy", 1), 1)
    lab.clock.now += 0.25
    lab.prompt(8)
    [entry] = lab.ledger.summary()
    assert [a["outcome"] for a in entry["attempts"]] == ["unreadable", None]
    assert entry["retry_delays_ms"] == []


def test_updates_read_together_are_judged_one_by_one_once_keys_are_known() -> None:
    """Notifications the relay forwards as a run (read together) are judged as each alone: a
    duplicate insert and an echoed key are found inside a run; before any key, nothing is."""

    def update(message_id: str, text: str = "A") -> bytes:
        return json.dumps(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "S",
                    "update": {
                        "sessionUpdate": "user_message",
                        "messageId": message_id,
                        "content": [{"type": "text", "text": text}],
                    },
                },
            }
        ).encode()

    lab = Lab()

    def together(*updates: bytes) -> list[Command]:
        commands, taken = lab.relay.handle_burst(BurstReceived(AGENT, updates, lab.clock.now))
        assert taken == len(updates)
        for command in commands:
            if isinstance(command, Observation):
                lab.ledger.observe(command, 1)
        return commands

    together(update("M0"), update("M0", "K1"))
    assert lab.checks() == []
    lab.prompt(7)
    commands = together(update("M1"), update("M2"), update("M3", "echo of K1"))
    assert [type(c) for c in commands if isinstance(c, Observation)] == [RelayedRun]
    assert sorted(lab.checks()) == ["duplicate_insert", "key_echoed"]


def test_a_prompt_digest_tells_large_prompts_apart_past_their_start() -> None:
    """Past 4 KiB the digest reads a prompt's length, CRC-32 and start, not all of it through
    SHA-256: two prompts of one length that differ only at their end still differ, and the
    same prompt with its keys in another order is the same."""
    text = "x" * 65536
    prompt = [{"type": "text", "text": text}]
    assert prompt_hash(prompt) == prompt_hash([{"text": text, "type": "text"}])
    assert prompt_hash(prompt) != prompt_hash([{"type": "text", "text": text[:-1] + "y"}])
    assert prompt_hash(prompt) != prompt_hash([{"type": "text", "text": text + "x"}])
    short = [{"type": "text", "text": "x" * 100}]
    assert prompt_hash(short) != prompt_hash([{"type": "text", "text": "x" * 99 + "y"}])


@pytest.mark.parametrize(("act", "lost"), [("drop", True), ("release", False)])
def test_an_answer_a_hold_rule_drops_is_lost_as_a_drop_rules_is(act: str, lost: bool) -> None:
    """A breakpoint's answer dropped (by the control API, or at its timeout with ``then: drop``)
    is lost to the Client as a ``drop`` rule's is: an unkeyed resend after it is flagged. One
    released goes on: the resend is a new prompt."""
    lab = Lab(
        {
            "when": {"kind": "response", "method": "session/prompt"},
            "schedule": {"nth": [1]},
            "do": {"action": "hold"},
        }
    )
    lab.answer(lab.prompt(1, key=None))
    [held] = lab.relay.held_messages()
    ended = getattr(lab.relay, f"{act}_held")(held.id, lab.clock.now)
    for command in ended:
        if isinstance(command, Observation):
            lab.ledger.observe(command, 1)
    lab.prompt(2, key=None)
    assert lab.checks() == (["unkeyed_resend"] if lost else [])
