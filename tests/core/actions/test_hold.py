"""``hold``: a breakpoint. The message waits at the proxy until the control API releases, drops or
edits it, or its ``timeout_ms`` is up (then ``then`` says); other messages keep flowing."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from action_lab import fault
from pydantic import ValidationError

from proxy.core.actions.base import Breakpoint
from proxy.core.actions.hold import ACTION, Hold
from proxy.core.commands import Command, ForgetTimer, Send, StartTimer
from proxy.core.engine import FaultEngine
from proxy.core.events import Direction, MessageReceived, Side, TimerFired
from proxy.core.faultfile import Rule, validate_rules
from proxy.core.held import EditRefused, digest
from proxy.core.observations import (
    FaultOverflowed,
    Held,
    HeldEnded,
    Relayed,
    Stopped,
)
from proxy.core.relay import Relay

PROMPT = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"S"}}'
OTHER = b'{"jsonrpc":"2.0","id":8,"method":"session/load","params":{"sessionId":"S"}}'
NOTE = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"S"}}'


def engine(*, timeout_ms: float = 1000, then: str = "release", **when: Any) -> FaultEngine:
    rule = Rule.model_validate(
        {
            "name": "bp",
            "when": when or {"direction": "to_agent", "method": "session/prompt"},
            "do": {"action": "hold", "timeout_ms": timeout_ms, "then": then},
        }
    )
    return FaultEngine([rule], random.Random(1))


def sent(commands: list[Command], to: Side) -> list[bytes]:
    return [c.data for c in commands if isinstance(c, Send) and c.to is to]


def only(commands: list[Command], kind: type[Any]) -> Any:
    [found] = [c for c in commands if isinstance(c, kind)]
    return found


def holding(**options: Any) -> tuple[Relay, list[Command]]:
    """A relay that holds the Client's prompt (arrived at 0.0)."""
    relay = Relay(engine=engine(**options))
    return relay, relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))


def body(data: bytes) -> Any:
    return json.loads(data)


def test_the_action_is_a_breakpoint() -> None:
    """``timeout_ms`` and ``then`` become the breakpoint's timeout (seconds) and its end."""
    action = Hold(action="hold", timeout_ms=250, then="drop")
    assert ACTION.apply(action, fault()) == [Breakpoint(0.25, "drop")]


def test_the_defaults_wait_a_minute_then_release() -> None:
    """Without fields, the message waits 60 s and is then released."""
    action = Hold.model_validate({"action": "hold"})
    assert (action.timeout_ms, action.then) == (60_000.0, "release")


@pytest.mark.parametrize(
    "fields",
    [{"timeout_ms": 0}, {"timeout_ms": 3_600_001}, {"timeout_ms": "5"}, {"then": "edit"}, {"x": 1}],
)
def test_the_fields_are_bounded(fields: dict[str, Any]) -> None:
    """A timeout of 0 or over an hour, a text for a number, another ``then``, an unknown field:
    refused."""
    with pytest.raises(ValidationError):
        Hold.model_validate({"action": "hold", **fields})


def test_a_held_message_waits_and_others_flow() -> None:
    """The prompt is not sent; it is observed held with a proxy-wide id and its ``then``; it is
    counted held and its request pending; a message behind it goes on at once."""
    relay, commands = holding()
    assert sent(commands, Side.AGENT) == []
    held = only(commands, Held)
    assert (held.held_id, held.then, held.delay, held.rules) == (1, "release", 1.0, ("bp",))
    assert only(commands, StartTimer).delay == 1.0
    [message] = relay.held_messages()
    assert (message.id, message.rule, message.relayed.method, message.data) == (
        1,
        "bp",
        "session/prompt",
        PROMPT,
    )
    assert (message.relayed.original_id, message.at, message.deadline) == (b"7", 0.0, 1.0)
    assert relay.held(Direction.TO_AGENT) == 1
    assert relay.pending(Direction.TO_AGENT) == 1
    passing = relay.handle(MessageReceived(Side.CLIENT, OTHER, 0.1))
    assert [body(data)["method"] for data in sent(passing, Side.AGENT)] == ["session/load"]


def test_the_timeout_releases_it_with_its_id_rewritten() -> None:
    """``then: release``: when its timer fires the prompt goes on under the proxy's id, observed
    relayed (``hold`` names its timer) after its hold's end (``timeout_release``)."""
    relay, commands = holding()
    timer = only(commands, StartTimer)
    released = relay.handle(TimerFired(timer.token, 1.0))
    [data] = sent(released, Side.AGENT)
    forwarded = only(commands, Held).relayed.forwarded_id
    assert body(data)["id"] == json.loads(forwarded)
    assert body(data)["params"] == {"sessionId": "S"}
    ended = only(released, HeldEnded)
    assert (ended.held_id, ended.outcome, ended.rule) == (1, "timeout_release", "bp")
    assert only(released, Relayed).hold == timer.token
    assert relay.held_messages() == []
    assert relay.held(Direction.TO_AGENT) == 0


def test_the_timeout_drops_it_when_then_says_so() -> None:
    """``then: drop``: nothing goes on, the prompt is observed dropped by its rule and is pending
    no more (it will never be answered)."""
    relay, commands = holding(then="drop")
    dropped = relay.handle(TimerFired(only(commands, StartTimer).token, 1.0))
    assert sent(dropped, Side.AGENT) == []
    assert only(dropped, HeldEnded).outcome == "timeout_drop"
    stopped = only(dropped, Stopped)
    assert (stopped.rule, stopped.disposition, stopped.original_id) == ("bp", "dropped", b"7")
    assert relay.pending(Direction.TO_AGENT) == 0
    assert relay.held_messages() == []


def test_release_by_id_sends_it_now_and_forgets_its_timer() -> None:
    """The control API's release: the prompt goes on at once, its timer is forgotten; when that
    timer fires anyway, nothing more happens; a second release finds nothing."""
    relay, commands = holding()
    timer = only(commands, StartTimer)
    released = relay.release_held(1, 0.5)
    assert released is not None
    assert len(sent(released, Side.AGENT)) == 1
    assert only(released, HeldEnded).outcome == "release"
    assert only(released, ForgetTimer).token == timer.token
    assert only(released, Relayed).duration is None  # a request: no duration
    assert relay.handle(TimerFired(timer.token, 1.0)) == []
    assert relay.release_held(1, 0.6) is None


def test_drop_by_id_of_an_answer_loses_it() -> None:
    """An Agent's answer held and dropped never reaches the Client; its request was answered
    (pending no more); the timer is forgotten."""
    relay = Relay(engine=engine(direction="to_client", kind="response"))
    asked = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    [forwarded] = sent(asked, Side.AGENT)
    answer = (
        b'{"jsonrpc":"2.0","id":%s,"result":{"stopReason":"end_turn"}}'
        % json.dumps(body(forwarded)["id"]).encode()
    )
    held = relay.handle(MessageReceived(Side.AGENT, answer, 0.1))
    assert only(held, Held).held_id == 1
    assert relay.held(Direction.TO_CLIENT) == 1
    dropped = relay.drop_held(1, 0.2)
    assert dropped is not None
    assert sent(dropped, Side.CLIENT) == []
    assert only(dropped, HeldEnded).outcome == "drop"
    assert only(dropped, Stopped).original_id == b"7"  # the Client's id
    assert only(dropped, ForgetTimer).token == only(held, StartTimer).token
    assert relay.pending(Direction.TO_AGENT) == 0


def test_an_edit_is_relayed_under_the_rewritten_id() -> None:
    """The edited prompt goes on instead, its id rewritten to the proxy's as the original's
    would have been; what is observed relayed is the edit; the hold's end names both by their
    digests."""
    relay, commands = holding()
    edit = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"text":"s3cr3t"}}'
    edited = relay.edit_held(1, edit, 0.5, limit=1 << 20)
    assert edited is not None
    [data] = sent(edited, Side.AGENT)
    forwarded = only(commands, Held).relayed.forwarded_id
    assert body(data) == {**body(edit), "id": json.loads(forwarded)}
    relayed = only(edited, Relayed)
    assert relayed.message is not None
    assert relayed.message.raw == edit
    assert relayed.size == len(edit)
    ended = only(edited, HeldEnded)
    assert (ended.outcome, ended.digest, ended.edited_digest) == (
        "edit",
        digest(PROMPT),
        digest(edit),
    )
    assert "s3cr3t" not in repr(ended)  # digests, not text


def test_an_answer_may_be_edited_into_an_error() -> None:
    """An answer held on its way to the Client may become an error; it reaches the Client under
    the Client's own id."""
    relay = Relay(engine=engine(direction="to_client", kind="response"))
    [forwarded] = sent(relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0)), Side.AGENT)
    agent_id = json.dumps(body(forwarded)["id"]).encode()
    answer = b'{"jsonrpc":"2.0","id":%s,"result":{}}' % agent_id
    relay.handle(MessageReceived(Side.AGENT, answer, 0.1))
    error = b'{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"no"}}' % agent_id
    edited = relay.edit_held(1, error, 0.2, limit=1 << 20)
    assert edited is not None
    [data] = sent(edited, Side.CLIENT)
    assert body(data) == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": "no"}}


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (b"{not json", "not valid JSON-RPC"),
        (b'[{"jsonrpc":"2.0","id":7,"method":"session/prompt"}]', "a batch"),
        (b'{"jsonrpc":"2.0","id":7,"result":{}}', "a request; the edited message is a response"),
        (b'{"jsonrpc":"2.0","method":"session/prompt"}', "the edited message is a notification"),
        (b'{"jsonrpc":"2.0","id":"7","method":"session/prompt"}', "keep the held message's id"),
        (b'{"jsonrpc":"2.0","id":8,"method":"session/prompt"}', "keep the held message's id (7)"),
        (b'{"jsonrpc":"2.0","id":7,"method":"session/load"}', "keep the method"),
        (b'{"id":7,"method":"session/prompt"}', '"jsonrpc" member must be "2.0"'),
        (b'{"jsonrpc":"1.0","id":7,"method":"session/prompt"}', '"jsonrpc" member must be'),
        (b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":1}', '"params" must be'),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":"' + b"x" * 64 + b'"}',
            "over",
        ),
    ],
)
def test_an_edit_that_cannot_replace_the_message_is_refused(edit: bytes, reason: str) -> None:
    """Not JSON-RPC, a batch, another kind, another id (``"7"`` is not ``7``), another method,
    over the size limit: refused with the reason; the message stays held, untouched."""
    relay, _ = holding()
    with pytest.raises(EditRefused, match=reason.replace("(", r"\(").replace(")", r"\)")):
        relay.edit_held(1, edit, 0.5, limit=100)
    [message] = relay.held_messages()
    assert message.data == PROMPT


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (b'{"id":%s,"result":{}}', '"jsonrpc" member must be "2.0"'),
        (b'{"jsonrpc":"2.0","id":%s,"error":"oops"}', '"error" must be an object'),
        (b'{"jsonrpc":"2.0","id":%s,"error":{"code":"1","message":"no"}}', "an integer"),
        (b'{"jsonrpc":"2.0","id":%s,"result":{},"error":{"code":1,"message":"no"}}', "neither"),
    ],
)
def test_an_edited_answer_must_be_json_rpc_to_the_letter(template: bytes, reason: str) -> None:
    """The relay passes on what a lenient peer reads; an answer a person writes in place of a
    held one is held to the specification (an error that is a string crashed the SDK's Client):
    refused with the reason, the answer still held."""
    relay = Relay(engine=engine(direction="to_client", kind="response"))
    [forwarded] = sent(relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0)), Side.AGENT)
    agent_id = json.dumps(body(forwarded)["id"]).encode()
    relay.handle(
        MessageReceived(Side.AGENT, b'{"jsonrpc":"2.0","id":%s,"result":{}}' % agent_id, 0.1)
    )
    with pytest.raises(EditRefused, match=reason):
        relay.edit_held(1, template % agent_id, 0.2, limit=1 << 20)
    assert [message.id for message in relay.held_messages()] == [1]


def test_ids_are_proxy_wide_and_never_reused() -> None:
    """Two links of one proxy (one engine) number their held messages from one counter; the
    engine knows which ids it has given."""
    shared = engine(timeout_ms=1000)
    first, second = Relay(engine=shared), Relay(engine=shared)
    first.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    second.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    assert [m.id for m in first.held_messages()] == [1]
    assert [m.id for m in second.held_messages()] == [2]
    first.release_held(1, 0.1)
    assert first.release_held(2, 0.1) is None  # another link's
    assert shared.held_ids.issued(1)
    assert not shared.held_ids.issued(3)


def test_a_notification_may_be_held_and_edited() -> None:
    """A notification has no id: its edit is a notification."""
    relay = Relay(engine=engine(direction="to_agent", method="session/cancel"))
    relay.handle(MessageReceived(Side.CLIENT, NOTE, 0.0))
    edit = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"U"}}'
    edited = relay.edit_held(1, edit, 0.1, limit=1 << 20)
    assert edited is not None
    assert sent(edited, Side.AGENT) == [edit]


def test_a_link_that_ends_loses_what_it_holds() -> None:
    """``discard_held``: each held message is observed lost (``link_end``), none is sent."""
    relay, _ = holding()
    relay.handle(MessageReceived(Side.CLIENT, PROMPT.replace(b":7", b":9"), 0.1))
    lost = relay.discard_held()
    assert [(c.held_id, c.outcome) for c in lost if isinstance(c, HeldEnded)] == [
        (1, "link_end"),
        (2, "link_end"),
    ]
    assert not [c for c in lost if isinstance(c, Send)]
    assert relay.held_messages() == []
    assert relay.held(Direction.TO_AGENT) == 0


def test_holds_count_toward_max_active_faults() -> None:
    """Past ``--max-active-faults`` holds in progress, the rule does not act: the message goes
    on at once and the overflow is observed."""
    rule = Rule.model_validate(
        {"name": "bp", "when": {"direction": "to_agent"}, "do": {"action": "hold"}}
    )
    relay = Relay(engine=FaultEngine([rule], random.Random(1), max_active_faults=1))
    first = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    relay.active_faults.count += 1  # the shell counts the timer it starts
    assert sent(first, Side.AGENT) == []
    second = relay.handle(MessageReceived(Side.CLIENT, OTHER, 0.1))
    assert len(sent(second, Side.AGENT)) == 1
    assert only(second, FaultOverflowed).action == "hold"
    assert [m.id for m in relay.held_messages()] == [1]


def test_in_a_stalled_direction_a_released_message_waits_for_the_stall() -> None:
    """A message held by a hold rule in a direction a stall holds: released over the control
    API, it goes on when the stall ends, in order; dropped, it is gone at once and the stall's
    end does not send it."""
    quiet = {"direction": "to_agent", "method": "_x/stop"}
    rules = validate_rules(
        [
            {"name": "quiet", "when": quiet, "do": {"action": "stall", "ms": 100}},
            {"name": "bp", "when": {"method": "session/prompt"}, "do": {"action": "hold"}},
        ]
    )
    relay = Relay(engine=FaultEngine(rules, random.Random(1)))
    stop = b'{"jsonrpc":"2.0","method":"_x/stop"}'
    started = relay.handle(MessageReceived(Side.CLIENT, stop, 0.0))
    end = next(c for c in started if isinstance(c, StartTimer))
    relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.01))
    relay.handle(MessageReceived(Side.CLIENT, PROMPT.replace(b":7", b":9"), 0.02))
    released = relay.release_held(1, 0.03)
    assert released is not None
    assert sent(released, Side.AGENT) == []  # the stall still holds it
    assert only(released, HeldEnded).outcome == "release"
    dropped = relay.drop_held(2, 0.04)
    assert dropped is not None
    assert only(dropped, Stopped).original_id == b"9"
    ended = relay.handle(TimerFired(end.token, 0.1))
    forwarded = [body(data).get("id") for data in sent(ended, Side.AGENT)]
    assert forwarded == [None, 0]  # the stop, then prompt 7 (the proxy's id 0); 9 was dropped
    assert relay.held(Direction.TO_AGENT) == 0
