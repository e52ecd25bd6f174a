"""Faults a Client asks for on its own request (``params._meta.acpFault``), with
``--allow-client-faults``: read from the request, fired before the rules, taken out of the bytes;
a bad hint answered -32602; without the option, nothing happens to the request."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from proxy.core.client_faults import CLIENT_FAULT, client_fault
from proxy.core.commands import Command, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule
from proxy.core.jsonrpc import Message, parse
from proxy.core.observations import FaultInjected, Stopped
from proxy.core.relay import Relay

CLIENT, AGENT = Side.CLIENT, Side.AGENT


def hinted(hint: object, method: str = "session/prompt", extra: str = ',"trace":"t-1"') -> bytes:
    """A request whose ``_meta`` holds ``hint`` (and, after it, ``extra``)."""
    return (
        b'{"jsonrpc":"2.0","id":"p1","method":"' + method.encode() + b'","params":'
        b'{"sessionId":"S","_meta":{"acpFault":'
        + json.dumps(hint).encode()
        + extra.encode()
        + b"}}}"
    )


def message(raw: bytes) -> Message:
    parsed = parse(raw)
    assert isinstance(parsed, Message)
    return parsed


def relay(*rules: dict[str, object], allowed: bool = True) -> Relay:
    parsed = [Rule.model_validate({"name": f"r{n}", **rule}) for n, rule in enumerate(rules)]
    return Relay(engine=FaultEngine(parsed, random.Random(1), client_faults=allowed))


def feed(target: Relay, raw: bytes, side: Side = CLIENT) -> list[Command]:
    return target.handle(MessageReceived(side, raw, 0.0))


def test_the_hint_becomes_a_rule_and_leaves_the_bytes() -> None:
    """The rule is the hint's action, named ``_meta.acpFault``; the request without the hint
    keeps every other member of ``_meta`` and every other byte."""
    found = client_fault(message(hinted({"action": "delay", "ms": 20})))
    assert not isinstance(found, str)
    assert found is not None
    rule, stripped = found
    assert (rule.name, rule.do.action) == (CLIENT_FAULT, "delay")
    assert stripped.raw == (
        b'{"jsonrpc":"2.0","id":"p1","method":"session/prompt","params":'
        b'{"sessionId":"S","_meta":{"trace":"t-1"}}}'
    )
    alone = client_fault(message(hinted({"action": "drop"}, extra="")))
    assert not isinstance(alone, str)
    assert alone is not None
    assert alone[1].raw.endswith(b'"_meta":{}}}')


@pytest.mark.parametrize(
    ("hint", "why"),
    [
        ("drop", 'an action and its fields, as an object ({"action": "drop"})'),
        ({"action": "dorp"}, "do: unknown action 'dorp' (did you mean 'drop'?)"),
        ({"action": "delay"}, "do.ms: Field required"),
        ({"action": "drop", "often": True}, "do.often: unknown field"),
        ({"ms": 5}, 'no action: give "action" (drop, delay, '),
    ],
)
def test_a_bad_hint_says_what_is_wrong(hint: object, why: str) -> None:
    found = client_fault(message(hinted(hint)))
    assert isinstance(found, str)
    assert found.startswith(why)


def test_no_hint_no_fault() -> None:
    """No ``_meta``, a ``_meta`` without ``acpFault``, a notification, an answer: nothing."""
    plain = b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"x":1}}}'
    note = b'{"jsonrpc":"2.0","method":"m","params":{"_meta":{"acpFault":{"action":"drop"}}}}'
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"_meta":{"acpFault":{"action":"drop"}}}}'
    for raw in (plain, note, answer, b'{"jsonrpc":"2.0","id":1,"method":"m"}'):
        assert client_fault(message(raw)) is None


def test_the_client_s_fault_fires_before_the_rules_and_once() -> None:
    """A drop the request asked for: it goes nowhere, and the fault names ``_meta.acpFault``;
    the next request, without a hint, passes (``times: 1``: one request, one fault)."""
    target = relay()
    out = feed(target, hinted({"action": "drop"}))
    assert [c for c in out if isinstance(c, Send)] == []
    [fault] = [c for c in out if isinstance(c, FaultInjected)]
    assert (fault.rule, fault.action) == (CLIENT_FAULT, "drop")
    again = feed(target, b'{"jsonrpc":"2.0","id":"p2","method":"session/prompt","params":{}}')
    assert [c.to for c in again if isinstance(c, Send)] == [AGENT]


def test_a_delayed_request_reaches_the_agent_without_its_hint() -> None:
    target = relay()
    [timer] = [
        c for c in feed(target, hinted({"action": "delay", "ms": 20})) if isinstance(c, StartTimer)
    ]
    assert timer.delay == pytest.approx(0.02)
    [sent] = [c for c in target.handle(TimerFired(timer.token, 1.0)) if isinstance(c, Send)]
    assert sent.to is AGENT
    assert b"acpFault" not in sent.data
    assert json.loads(sent.data)["params"]["_meta"] == {"trace": "t-1"}


def test_a_bad_hint_is_answered_minus_32602_and_goes_no_further() -> None:
    out = feed(relay(), hinted({"action": "dorp"}))
    [reply] = [c for c in out if isinstance(c, Send)]
    assert reply.to is CLIENT
    error = json.loads(reply.data)
    assert error["id"] == "p1"
    assert error["error"]["code"] == -32602
    assert error["error"]["message"].startswith("_meta.acpFault: do: unknown action 'dorp'")
    [stopped] = [c for c in out if isinstance(c, Stopped)]
    assert (stopped.rule, stopped.disposition) == (CLIENT_FAULT, "answered_by_proxy")


def test_without_the_option_the_hint_is_forwarded_untouched() -> None:
    """``--allow-client-faults`` not given: the request, hint and all, goes on as it came."""
    raw = hinted({"action": "drop"})
    [sent] = [c for c in feed(relay(allowed=False), raw) if isinstance(c, Send)]
    assert sent.data.replace(b'"id":0', b'"id":"p1"') == raw


def test_the_agent_s_requests_cannot_ask() -> None:
    """Only the Client may ask: a request from the Agent with a hint is relayed untouched."""
    raw = hinted({"action": "drop"}, method="session/request_permission")
    [sent] = [c for c in feed(relay(), raw, AGENT) if isinstance(c, Send)]
    assert sent.to is CLIENT
    assert b"acpFault" in sent.data


def test_a_hint_its_action_cannot_act_on_is_refused() -> None:
    """``http_status`` from a Client on stdio could never act (a file's rule is only noted):
    the request is answered -32602 saying why, not left without an answer."""
    out = feed(relay(), hinted({"action": "http_status", "status": 503}))
    [reply] = [c for c in out if isinstance(c, Send)]
    assert reply.to is CLIENT
    assert json.loads(reply.data)["error"] == {
        "code": -32602,
        "message": "_meta.acpFault: http_status cannot act on this request (it acts only on "
        "Clients that connect over Streamable HTTP)",
    }


def test_the_client_s_fault_acts_alone_the_file_s_rules_count_it() -> None:
    """As a rule without ``continue`` before the file's: a file's drop on the same request
    counts the match but does not act; the Client's delay does (the request is held, not lost)."""
    target = relay(
        {"name": "drop-prompts", "when": {"method": "session/prompt"}, "do": {"action": "drop"}}
    )
    out = feed(target, hinted({"action": "delay", "ms": 20}))
    assert [f.rule for f in out if isinstance(f, FaultInjected)] == [CLIENT_FAULT]
    assert [c for c in out if isinstance(c, StartTimer)]
    assert not [c for c in out if isinstance(c, Stopped)]
    assert target._engine is not None
    assert target._engine.states["drop-prompts"].matched == 1


def test_the_acp_fault_header_asks_as_the_hint_does_and_leaves_every_byte() -> None:
    """Over Streamable HTTP the request's ``Acp-Fault`` header holds the hint (the listener
    hands it over with the message): the same fault, the bytes untouched; a header that is not
    JSON, a bad hint in it, or a request that asks both ways is answered -32602; a notification
    cannot ask."""
    plain = b'{"jsonrpc":"2.0","id":"p1","method":"session/prompt","params":{"sessionId":"S"}}'

    def with_header(raw: bytes, header: str) -> Message:
        return dataclasses.replace(message(raw), fault_header=header)

    found = client_fault(with_header(plain, '{"action": "error", "code": -32001}'))
    assert not isinstance(found, str)
    assert found is not None
    rule, kept = found
    assert (rule.name, rule.do.action, kept.raw) == (CLIENT_FAULT, "error", plain)
    assert client_fault(with_header(plain, "drop")) == "not JSON"
    assert str(client_fault(with_header(plain, '{"ms": 5}'))).startswith("no action")
    both = client_fault(with_header(hinted({"action": "drop"}), '{"action": "drop"}'))
    assert both == "asked twice: in the Acp-Fault header and in params._meta.acpFault"
    update = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S"}}'
    assert client_fault(with_header(update, '{"action": "drop"}')) is None

    target = relay()
    out = target.handle(
        MessageReceived(
            CLIENT, plain, 0.0, with_header(plain, '{"action": "error", "code": -32001}')
        )
    )
    [answer] = [c for c in out if isinstance(c, Send)]
    assert answer.to is CLIENT
    assert json.loads(answer.data)["error"]["code"] == -32001
    refused = target.handle(MessageReceived(CLIENT, plain, 0.0, with_header(plain, "{")))
    [error] = [c for c in refused if isinstance(c, Send)]
    assert (error.to, json.loads(error.data)["error"]["code"]) == (CLIENT, -32602)
    said = json.loads(error.data)["error"]["message"]  # where the hint was, named
    assert said == "Acp-Fault header: not JSON"
    typo = with_header(plain, '{"action": "delay", "ms": 5, "jiter_ms": 3}')
    [error] = [
        c for c in target.handle(MessageReceived(CLIENT, plain, 0.0, typo)) if isinstance(c, Send)
    ]
    assert json.loads(error.data)["error"]["message"] == (
        "Acp-Fault header: do.jiter_ms: unknown field (did you mean 'jitter_ms'?)"
    )
