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
    CancelDropped,
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


def relay_of(*rules: dict[str, Any], max_held: int | None = None) -> Relay:
    """A relay whose engine has ``rules``."""
    return Relay(
        engine=FaultEngine(validate_rules(list(rules)), random.Random(1), max_held=max_held)
    )


BREAKPOINT = {
    "name": "bp",
    "when": {"direction": "to_agent", "method": "session/prompt"},
    "do": {"action": "hold"},
}
STOP = b'{"jsonrpc":"2.0","method":"_x/stop"}'


def quiet(action: str, **fields: Any) -> dict[str, Any]:
    """A ``stall`` (or ``timeout``) of the Client's direction, started by ``_x/stop``."""
    when = {"direction": "to_agent", "method": "_x/stop"}
    return {"name": "quiet", "when": when, "do": {"action": action, "ms": 100, **fields}}


def timers(commands: list[Command]) -> list[StartTimer]:
    return [c for c in commands if isinstance(c, StartTimer)]


def methods(commands: list[Command]) -> list[str]:
    """The methods of the messages ``commands`` send to the Agent, in order."""
    return [body(data)["method"] for data in sent(commands, Side.AGENT)]


def still_held_then_released(relay: Relay, passing: list[Command], at: float) -> list[Command]:
    """``passing`` (what a stall's end or an overtaking message did) ended no hold and the prompt
    is held still; the control API's release of it at ``at``, which sends it."""
    assert not [c for c in passing if isinstance(c, HeldEnded)]
    assert [m.id for m in relay.held_messages()] == [1]
    released = relay.release_held(1, at)
    assert released is not None
    assert methods(released) == ["session/prompt"]
    return released


def test_a_stall_that_ends_first_lets_the_breakpoint_be() -> None:
    """A stall ends before anyone acts on the prompt it holds behind a breakpoint: what the stall
    held goes on, the prompt stays held (no ``timeout_release``: its timeout is its own, 60 s,
    not stretched by the stall); released later, it goes on at once."""
    relay = relay_of(quiet("stall"), BREAKPOINT)
    end = timers(relay.handle(MessageReceived(Side.CLIENT, STOP, 0.0)))[0]  # the stall's end
    held = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.01))
    assert only(held, StartTimer).delay == 60.0
    ended = relay.handle(TimerFired(end.token, 0.1))
    assert methods(ended) == ["_x/stop"]
    released = still_held_then_released(relay, ended, 0.2)
    assert only(released, HeldEnded).outcome == "release"
    assert only(released, ForgetTimer).token == only(held, StartTimer).token


def test_a_reorder_does_not_release_a_breakpoint() -> None:
    """``reorder`` (``continue``) and ``hold`` on one prompt: a message overtaking it does not
    release it; it leaves when the control API releases it."""
    reorder = {
        "name": "shuffle",
        "when": {"method": "session/prompt"},
        "do": {"action": "reorder", "after": 1},
        "continue": True,
    }
    relay = relay_of(reorder, BREAKPOINT)
    assert sent(relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0)), Side.AGENT) == []
    passing = relay.handle(MessageReceived(Side.CLIENT, OTHER, 0.1))
    assert methods(passing) == ["session/load"]
    still_held_then_released(relay, passing, 0.2)


def test_a_timeout_that_cuts_the_client_lets_a_breakpoint_to_the_agent_be() -> None:
    """A ``timeout`` cutting the Client ends while a prompt it holds is held by a breakpoint:
    what the timeout held is lost, but the prompt is not sent to the Agent (nor lost): it stays
    held until the control API acts; dropped then, it never reaches the Agent."""
    relay = relay_of(quiet("timeout", side="client"), BREAKPOINT)
    end = timers(relay.handle(MessageReceived(Side.CLIENT, STOP, 0.0)))[0]  # the stall's end
    relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.01))
    ended = relay.handle(TimerFired(end.token, 0.1))
    assert sent(ended, Side.AGENT) == []
    assert not [c for c in ended if isinstance(c, HeldEnded)]
    assert [m.id for m in relay.held_messages()] == [1]
    dropped = relay.drop_held(1, 0.2)
    assert dropped is not None
    assert sent(dropped, Side.AGENT) == []
    assert only(dropped, HeldEnded).outcome == "drop"


def test_only_its_own_timer_times_a_breakpoint_out() -> None:
    """Left alone past a stall's end, the prompt times out when its own timer fires, as ``then``
    says."""
    relay = relay_of(quiet("stall"), BREAKPOINT)
    end = timers(relay.handle(MessageReceived(Side.CLIENT, STOP, 0.0)))[0]  # the stall's end
    own = only(relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.01)), StartTimer)
    relay.handle(TimerFired(end.token, 0.1))
    timed_out = relay.handle(TimerFired(own.token, 60.01))
    assert only(timed_out, HeldEnded).outcome == "timeout_release"
    assert [body(data)["method"] for data in sent(timed_out, Side.AGENT)] == ["session/prompt"]


def test_a_discarded_hold_has_its_timer_forgotten() -> None:
    """``discard_held`` tells the shell to forget each lost hold's timer now (its bytes and its
    fault in progress are counted no more, and it cannot fire into the next relay); the engine
    counts no held message any more."""
    shared = engine()
    relay = Relay(engine=shared)
    commands = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    assert shared.held.count == 1
    forgotten = relay.discard_held()
    assert [c.token for c in forgotten if isinstance(c, ForgetTimer)] == [
        only(commands, StartTimer).token
    ]
    assert shared.held.count == 0


def duplicate(gap_ms: float = 0) -> dict[str, Any]:
    """A rule adding one copy to each prompt (``gap_ms`` later), letting the hold rule act too."""
    return {
        "name": "twice",
        "when": {"method": "session/prompt"},
        "do": {"action": "duplicate", "copies": 1, "gap_ms": gap_ms},
        "continue": True,
    }


def test_a_duplicate_copy_stays_under_the_breakpoint() -> None:
    """``duplicate`` and ``hold`` on one prompt: nothing leaves and one timer holds it (no copy
    on a timer of its own); released, the prompt and its copy go on, each under an id of its
    own, both pending."""
    relay = relay_of(duplicate(), BREAKPOINT)
    held = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    assert sent(held, Side.AGENT) == []
    assert len(timers(held)) == 1
    assert relay.pending(Direction.TO_AGENT) == 1
    released = relay.release_held(1, 0.1)
    assert released is not None
    ids = [body(data)["id"] for data in sent(released, Side.AGENT)]
    assert len(ids) == 2
    assert ids[0] != ids[1]
    assert [c.copy for c in released if isinstance(c, Relayed)] == [False, True]
    assert relay.pending(Direction.TO_AGENT) == 2


def test_a_dropped_breakpoint_drops_its_copies() -> None:
    """Dropped, the prompt and its copies reach no one, not even when their time would come;
    nothing is pending."""
    relay = relay_of(duplicate(gap_ms=50), BREAKPOINT)
    held = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    dropped = relay.drop_held(1, 0.1)
    assert dropped is not None
    assert sent(dropped, Side.AGENT) == []
    for timer in timers(held):
        assert sent(relay.handle(TimerFired(timer.token, 61.0)), Side.AGENT) == []
    assert relay.pending(Direction.TO_AGENT) == 0


def test_an_edited_breakpoint_has_edited_copies_spaced_from_its_release() -> None:
    """Edited, the prompt goes on as edited; its copy, ``gap_ms`` later (counted from the
    release), is the edit too, under an id of its own."""
    relay = relay_of(duplicate(gap_ms=50), BREAKPOINT)
    relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    edit = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"E"}}'
    edited = relay.edit_held(1, edit, 1.0, limit=1 << 20)
    assert edited is not None
    [first] = sent(edited, Side.AGENT)
    [spacing] = [t for t in timers(edited)]
    assert spacing.delay == pytest.approx(0.05)
    assert only(edited, Held).relayed.copy
    [copy] = sent(relay.handle(TimerFired(spacing.token, 1.05)), Side.AGENT)
    assert body(copy)["params"] == body(first)["params"] == {"sessionId": "E"}
    assert body(copy)["id"] != body(first)["id"]


CANCEL_HOLD = {"name": "bp", "when": {"method": "$/cancel_request"}, "do": {"action": "hold"}}


def test_a_held_cancel_names_its_request_by_the_id_it_has_when_it_leaves() -> None:
    """A held ``$/cancel_request`` released while its request is pending goes on under the
    Agent's id for it; one released after its request was answered is dropped (rule 3), not
    forwarded with a stale id."""
    cancel = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":7}}'
    for answered in (False, True):
        relay = relay_of(CANCEL_HOLD)
        [forwarded] = sent(relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0)), Side.AGENT)
        relay.handle(MessageReceived(Side.CLIENT, cancel, 0.1))
        agent_id = body(forwarded)["id"]
        if answered:
            answer = b'{"jsonrpc":"2.0","id":%d,"result":{}}' % agent_id
            assert (
                len(sent(relay.handle(MessageReceived(Side.AGENT, answer, 0.2)), Side.CLIENT)) == 1
            )
        released = relay.release_held(1, 0.3)
        assert released is not None
        if answered:
            assert sent(released, Side.AGENT) == []
            assert only(released, CancelDropped).direction is Direction.TO_AGENT
        else:
            [data] = sent(released, Side.AGENT)
            assert body(data)["params"] == {"requestId": agent_id}


def test_an_edit_carries_its_own_session_and_key() -> None:
    """A prompt edited into another session with an ``idempotencyKey``: it is relayed under that
    session, and its answer is judged by the edit (the answer's session is the edit's, and a rule
    on keyed answers matches it)."""
    lose = {
        "name": "lose",
        "when": {"direction": "to_client", "kind": "response", "idempotency_key": "present"},
        "do": {"action": "drop"},
    }
    relay = relay_of(BREAKPOINT, lose)
    relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    params = b'{"sessionId":"U","idempotencyKey":"k2"}'
    edit = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":%s}' % params
    edited = relay.edit_held(1, edit, 0.1, limit=1 << 20)
    assert edited is not None
    assert only(edited, Relayed).session == "U"
    [forwarded] = sent(edited, Side.AGENT)
    answer = b'{"jsonrpc":"2.0","id":%d,"result":{}}' % body(forwarded)["id"]
    answered = relay.handle(MessageReceived(Side.AGENT, answer, 0.2))
    stopped = only(answered, Stopped)
    assert (stopped.rule, stopped.session) == ("lose", "U")


def test_past_max_held_the_rule_does_not_act() -> None:
    """With ``max_held`` 1, a second prompt is not held: it goes on at once, the overflow is
    observed (the first refusal marked first, to be logged); once the first is let go, the next
    is held again. A held message's bytes count twice toward what its timer holds (as it came,
    and as it will be sent)."""
    relay = relay_of(BREAKPOINT, max_held=1)
    first = relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    [timer] = timers(first)
    assert only(first, Held).relayed.forwarded_id == b"0"  # as long as the Client's 7
    assert timer.size == 2 * len(PROMPT)
    refusals = []
    for at, request_id in ((0.1, b"8"), (0.2, b"9")):
        passing = relay.handle(
            MessageReceived(Side.CLIENT, PROMPT.replace(b":7", b":" + request_id), at)
        )
        assert len(sent(passing, Side.AGENT)) == 1
        refusals.append(only(passing, FaultOverflowed))
    assert [(r.bound, r.first, r.action) for r in refusals] == [
        ("max_held", True, "hold"),
        ("max_held", False, "hold"),
    ]
    assert [m.id for m in relay.held_messages()] == [1]
    relay.release_held(1, 0.3)
    again = relay.handle(MessageReceived(Side.CLIENT, PROMPT.replace(b":7", b":10"), 0.4))
    assert sent(again, Side.AGENT) == []
    assert only(again, Held).held_id == 2


def test_deleting_its_rule_or_resetting_leaves_the_message_held() -> None:
    """The rules replaced by none and their counters reset: the prompt stays held (its timeout
    and ``then`` are its rule's still) until the control API releases it."""
    shared = engine()
    relay = Relay(engine=shared)
    relay.handle(MessageReceived(Side.CLIENT, PROMPT, 0.0))
    shared.replace([])
    shared.reset()
    [message] = relay.held_messages()
    assert (message.timeout, message.then) == (1.0, "release")
    released = relay.release_held(message.id, 0.5)
    assert released is not None
    assert len(sent(released, Side.AGENT)) == 1
