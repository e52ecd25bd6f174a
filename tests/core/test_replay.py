"""The replayed Agent's mind: matching, what goes back with this run's ids, dedupe, order."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.core.events import Direction
from proxy.core.jsonrpc import Message, parse
from proxy.core.matching import Ignore
from proxy.core.recording import Recording, header_line, message_line, read_recording
from proxy.core.redact import Redactor
from proxy.core.replay import (
    NO_MATCH,
    UNKNOWN_METHOD,
    Outgoing,
    ReplayAgent,
    ReplayConnection,
    exchanges_of,
)

TO_AGENT, TO_CLIENT = Direction.TO_AGENT, Direction.TO_CLIENT
PROMPT = {"sessionId": "S1", "idempotencyKey": "k", "prompt": [{"type": "text", "text": "hello"}]}


def line(time: float, direction: Direction, pair: tuple[Any, Any], body: dict[str, Any]) -> bytes:
    ids = (orjson.dumps(pair[0]), orjson.dumps(pair[1]))
    return message_line(time, 1, direction, ids, orjson.dumps({"jsonrpc": "2.0", **body}))


def update(time: float, kind: str, **fields: Any) -> bytes:
    params = {"sessionId": "S1", "update": {"sessionUpdate": kind, **fields}}
    return line(time, TO_CLIENT, (None, None), {"method": "session/update", "params": params})


def recording() -> Recording:
    """initialize, session/new, a prompt that asks permission, then a notification."""
    return read_recording(
        "r",
        [
            header_line(0.0),
            line(1.0, TO_AGENT, (1, 0), {"id": 1, "method": "initialize", "params": {"v": 2}}),
            line(1.5, TO_CLIENT, (1, 0), {"id": 0, "result": {"protocolVersion": 2}}),
            line(2.0, TO_AGENT, (2, 1), {"id": 2, "method": "session/new", "params": {"cwd": "/"}}),
            line(2.1, TO_CLIENT, (2, 1), {"id": 1, "result": {"sessionId": "S1"}}),
            line(3.0, TO_AGENT, (3, 2), {"id": 3, "method": "session/prompt", "params": PROMPT}),
            update(3.2, "user_message", messageId="M1"),
            line(3.4, TO_CLIENT, (5, 0), {"id": 5, "method": "ask", "params": {"sessionId": "S1"}}),
            line(4.0, TO_AGENT, (5, 0), {"id": 0, "result": {"ok": True}}),
            update(4.5, "agent_message", messageId="A1"),
            line(5.0, TO_CLIENT, (3, 2), {"id": 2, "result": {"messageId": "M1"}}),
            line(6.0, TO_AGENT, (None, None), {"method": "note", "params": {"x": 1}}),
        ],
        max_bytes=10**6,
    )


def message(body: dict[str, Any]) -> Message:
    parsed = parse(orjson.dumps({"jsonrpc": "2.0", **body}))
    assert isinstance(parsed, Message)
    return parsed


def bodies(outgoing: list[Outgoing]) -> list[dict[str, Any]]:
    return [orjson.loads(o.raw) for o in outgoing]


def opened(agent: ReplayAgent) -> tuple[ReplayConnection, str]:
    """A connection initialized with one session; that session's live id."""
    connection = agent.connection()
    connection.receive(message({"id": "i", "method": "initialize", "params": {"v": 2}}))
    (answer,) = bodies(
        connection.receive(message({"id": "n", "method": "session/new", "params": {"cwd": "/x"}}))
    )
    return connection, answer["result"]["sessionId"]


def prompt(request_id: int, session: str, text: str = "hello", key: str = "k") -> Message:
    params = {
        "sessionId": session,
        "idempotencyKey": key,
        "prompt": [{"type": "text", "text": text}],
    }
    return message({"id": request_id, "method": "session/prompt", "params": params})


def test_exchanges_follow_each_client_message() -> None:
    """Each Client message leads what the Agent sent before the next one, at its offsets."""
    exchanges = exchanges_of(recording())
    assert [e.trigger.message.method for e in exchanges] == [
        "initialize",
        "session/new",
        "session/prompt",
        None,  # the Client's answer to the Agent's request
        "note",
    ]
    assert [offset for offset, _ in exchanges[2].followers] == pytest.approx([0.2, 0.4])
    assert exchanges[3].message_ids == ("A1", "M1")


def test_an_answer_takes_the_live_id_and_is_due_at_its_recorded_pace() -> None:
    """The recorded answer goes back under the request's own id (type included), its offset
    over the speed."""
    connection = ReplayAgent(recording(), speed=2.0).connection()
    (out,) = connection.receive(message({"id": "i", "method": "initialize", "params": {"v": 2}}))
    assert out.raw == b'{"jsonrpc":"2.0","id":"i","result":{"protocolVersion":2}}'
    assert out.delay == pytest.approx(0.25)
    assert connection.notes[0].what == "served"


def test_a_whole_turn_with_a_request_of_the_agent() -> None:
    """A prompt: its updates and the Agent's request (a new id); the Client's answer to that
    request leads to the rest of the turn and the prompt's answer, under the prompt's id."""
    agent = ReplayAgent(recording(), speed=0)
    connection, session = opened(agent)
    assert session == "S1"
    first = bodies(connection.receive(prompt(40, session)))
    assert [m.get("method") for m in first] == ["session/update", "ask"]
    assert first[0]["params"]["update"]["messageId"] == "M1"
    asked_id = first[1]["id"]
    rest = bodies(connection.receive(message({"id": asked_id, "result": {"ok": True}})))
    assert rest == [
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "S1",
                "update": {"sessionUpdate": "agent_message", "messageId": "A1"},
            },
        },
        {"jsonrpc": "2.0", "id": 40, "result": {"messageId": "M1"}},
    ]


def test_sessions_are_mapped_to_this_run() -> None:
    """A second session/new served from the same recorded one is another session; what is
    sent for it carries its id."""
    agent = ReplayAgent(recording(), speed=0)
    _, first = opened(agent)
    connection, second = opened(agent)
    assert (first, second) == ("S1", "S1~2")
    (user_message, _) = bodies(connection.receive(prompt(1, second)))
    assert user_message["params"]["sessionId"] == "S1~2"


def test_a_request_that_matches_nothing_names_the_nearest() -> None:
    """The error names the nearest recorded request, its line and the first difference."""
    connection, session = opened(ReplayAgent(recording(), speed=0))
    (error,) = bodies(connection.receive(prompt(7, session, text="goodbye")))
    assert error["id"] == 7
    assert error["error"]["code"] == NO_MATCH == -32603  # the method is known: no match
    text = error["error"]["message"]
    assert "nearest is line 6 (session/prompt)" in text
    assert 'params.prompt[0].text: recorded "hello", got "goodbye"' in text
    assert error["error"]["data"]["differences"] == [
        {"path": "params.prompt[0].text", "recorded": "hello", "got": "goodbye"}
    ]
    assert connection.notes[-1].what == "no match"


def test_an_unknown_method_names_the_nearest_request_of_any_method() -> None:
    """No recorded request of that method: method not found (-32601), as an Agent without it
    would answer, and the nearest of all is named, in data too."""
    connection = ReplayAgent(recording(), speed=0).connection()
    (error,) = bodies(connection.receive(message({"id": 1, "method": "fs/nothing"})))
    assert error["error"]["code"] == UNKNOWN_METHOD == -32601
    assert (
        "no recorded request matches this fs/nothing; the nearest is line"
        in error["error"]["message"]
    )
    assert error["error"]["data"]["nearest"]["line"] > 0


def test_ignored_paths_make_a_request_match() -> None:
    """--ignore: a path that differs no longer prevents the match."""
    connection = ReplayAgent(recording(), speed=0, ignore=Ignore(["params.v"])).connection()
    (out,) = connection.receive(message({"id": 1, "method": "initialize", "params": {"v": 9}}))
    assert orjson.loads(out.raw)["result"] == {"protocolVersion": 2}


def test_a_notification_that_matches_nothing_is_ignored() -> None:
    """A notification gets no answer, matched or not."""
    connection = ReplayAgent(recording(), speed=0).connection()
    assert connection.receive(message({"method": "note", "params": {"x": 2}})) == []
    assert connection.receive(message({"method": "note", "params": {"x": 1}})) == []
    assert connection.notes[-1].what == "served"


def test_a_retry_without_dedupe_is_a_new_turn() -> None:
    """The same prompt again is served again: its message ids are new ones."""
    connection, session = opened(ReplayAgent(recording(), speed=0))
    connection.receive(prompt(1, session))
    again = bodies(connection.receive(prompt(2, session)))
    assert again[0]["params"]["update"]["messageId"] == "M1~2"
    assert connection.notes[-1].what == "served again"


def test_with_dedupe_a_retry_gets_the_original_answer_and_nothing_else() -> None:
    """--dedupe: a retry of an answered key gets the original messageId under its own id."""
    connection, session = opened(ReplayAgent(recording(), speed=0, dedupe=True))
    asked = bodies(connection.receive(prompt(1, session)))[1]["id"]
    connection.receive(message({"id": asked, "result": {"ok": True}}))
    (retry,) = bodies(connection.receive(prompt(2, session)))
    assert retry == {"jsonrpc": "2.0", "id": 2, "result": {"messageId": "M1"}}
    # Another key is another prompt: served again.
    assert [m.get("method") for m in bodies(connection.receive(prompt(3, session, key="k2")))] == [
        "session/update",
        "ask",
    ]


def test_with_dedupe_a_retry_waits_for_its_original() -> None:
    """A retry while the original is unanswered gets the same answer once it is sent."""
    connection, session = opened(ReplayAgent(recording(), speed=0, dedupe=True))
    later: list[Outgoing] = []
    connection.on_later = later.append
    asked = bodies(connection.receive(prompt(1, session)))[1]["id"]
    assert connection.receive(prompt(2, session)) == []
    connection.receive(message({"id": asked, "result": {"ok": True}}))
    assert bodies(later) == [{"jsonrpc": "2.0", "id": 2, "result": {"messageId": "M1"}}]


def test_strict_order_requires_the_next_recorded_request() -> None:
    """--strict-order: a request out of order is refused, naming the one expected."""
    agent = ReplayAgent(recording(), speed=0, strict_order=True)
    connection = agent.connection()
    (error,) = bodies(
        connection.receive(message({"id": 1, "method": "session/new", "params": {"cwd": "/"}}))
    )
    assert "the next recorded request is line 2 (initialize)" in error["error"]["message"]
    assert connection.receive(message({"id": 2, "method": "initialize", "params": {"v": 2}}))
    (answer,) = bodies(
        connection.receive(message({"id": 3, "method": "session/new", "params": {"cwd": "/"}}))
    )
    assert answer["result"] == {"sessionId": "S1"}


def redacted_recording() -> Recording:
    """initialize (its capabilities redacted by a path) and a prompt holding a key (redacted by
    an expression, its request id too), as ``--record --redact`` writes them."""
    redactor = Redactor.of(["params.clientCapabilities", "sk-[A-Za-z0-9]+"], key=b"k")
    key = "sk-ABCdef123456"
    said: list[tuple[Direction, tuple[Any, Any], dict[str, Any]]] = [
        (TO_AGENT, (1, 0), {"id": 1, "method": "initialize", "params": CAPABLE}),
        (TO_CLIENT, (1, 0), {"id": 0, "result": {"protocolVersion": 2}}),
        (
            TO_AGENT,
            ("sk-IDVALUE4444", 1),
            {
                "id": "sk-IDVALUE4444",
                "method": "session/prompt",
                "params": {
                    "sessionId": "S1",
                    "prompt": [{"type": "text", "text": f"hello my key is {key} ok"}],
                },
            },
        ),
        (TO_CLIENT, ("sk-IDVALUE4444", 1), {"id": 1, "result": {"stopReason": "end_turn"}}),
    ]
    written = [header_line(0.0, [p.describe() for p in redactor.patterns])]
    for time, (direction, pair, body) in enumerate(said):
        raw, where = redactor.redact(orjson.dumps({"jsonrpc": "2.0", **body}))
        ids = (redactor.redact_id(orjson.dumps(pair[0])), redactor.redact_id(orjson.dumps(pair[1])))
        written.append(message_line(time, 1, direction, ids, raw, redacted=where))
    assert not any(secret in text for text in written for secret in (key.encode(), b"IDVALUE"))
    return read_recording("r", written, max_bytes=10**6)


CAPABLE = {"protocolVersion": 2, "clientCapabilities": {"fs": {"readTextFile": True}}}


@pytest.mark.parametrize("strict_order", [False, True], ids=["any-order", "strict-order"])
def test_a_redacted_recording_serves_the_same_client(strict_order: bool) -> None:
    """What the recording redacted matches what the same Client sends there again: the
    capabilities a path replaced, the key in the prompt's text; the answer finds its request
    by the redacted id's pair."""
    agent = ReplayAgent(redacted_recording(), strict_order=strict_order, speed=0)
    connection = agent.connection()
    (answer,) = bodies(
        connection.receive(message({"id": 7, "method": "initialize", "params": CAPABLE}))
    )
    assert answer == {"jsonrpc": "2.0", "id": 7, "result": {"protocolVersion": 2}}
    text = "hello my key is sk-ABCdef123456 ok"
    params: dict[str, Any] = {"sessionId": "S1", "prompt": [{"type": "text", "text": text}]}
    (answer,) = bodies(
        connection.receive(message({"id": 8, "method": "session/prompt", "params": params}))
    )
    assert answer["id"] == 8
    assert answer["result"] == {"stopReason": "end_turn"}
    params["prompt"][0]["text"] = "goodbye my key is sk-ABCdef123456 ok"
    (refused,) = bodies(
        connection.receive(message({"id": 9, "method": "session/prompt", "params": params}))
    )
    assert refused["error"]["code"] == NO_MATCH
