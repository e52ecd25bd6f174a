"""Redaction: paths and regular expressions, changed in place, every other byte kept."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.errors import OptionError
from proxy.core.redact import MAX_DEPTH, REDACTED, Redaction, Redactor, TooDeep, parse_pattern

PROMPT = (
    b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s",'
    b'"prompt":[{"type":"text","text":"deploy with sk-live-123"},{"type":"text","text":"two"}],'
    b'"n":123456789012345678901234567890,"_meta":{"token":"abc","x":{"k":"sk-live-999"}}}}'
)


def test_a_path_replaces_every_value_it_names() -> None:
    """``params.prompt[*].text``: each prompt text is redacted, the rest byte for byte."""
    raw, where = Redactor.of(["params.prompt[*].text"]).redact(PROMPT)
    assert where == ["params.prompt[0].text", "params.prompt[1].text"]
    assert b"sk-live-123" not in raw
    assert b"two" not in raw
    assert raw == PROMPT.replace(b'"deploy with sk-live-123"', b'"[redacted]"').replace(
        b'"two"', b'"[redacted]"'
    )


def test_a_path_with_an_index_and_a_wildcard() -> None:
    """``[N]`` names one element, ``*`` every member of an object (a whole value replaced)."""
    raw, where = Redactor.of(["params.prompt[1].text", "params._meta.*"]).redact(PROMPT)
    assert where == ["params.prompt[1].text", "params._meta.token", "params._meta.x"]
    body = orjson.loads(raw)
    assert body["params"]["_meta"] == {"token": REDACTED, "x": REDACTED}
    assert body["params"]["prompt"][0]["text"] == "deploy with sk-live-123"


def test_a_regular_expression_is_searched_in_every_string() -> None:
    """Each match, at any depth, becomes the marker; keys and other bytes stay."""
    raw, where = Redactor.of([r"sk-live-\d+"]).redact(PROMPT)
    assert b"sk-live" not in raw
    assert where == ["params.prompt[0].text", "params._meta.x.k"]
    assert b'"deploy with [redacted]"' in raw
    assert b"123456789012345678901234567890" in raw  # the big integer as it was


def test_an_escaped_secret_is_found_too() -> None:
    """A secret spelt with escapes in the JSON text is matched on its value."""
    raw, _ = Redactor.of(["secret"]).redact(b'{"a":"my \\u0073ecret"}')
    assert raw == b'{"a":"my [redacted]"}'


def test_nothing_named_leaves_the_message_alone() -> None:
    """No pattern matches: the very bytes, and no path."""
    redactor = Redactor.of(["params.absent[*].x", "nomatch"])
    assert redactor.redact(PROMPT) == (PROMPT, [])
    assert Redactor([]).redact(PROMPT) == (PROMPT, [])


def test_paths_and_expressions_are_told_apart() -> None:
    """A dotted name is a path, anything else an expression; a prefix decides."""
    assert parse_pattern("params.prompt[*].text").steps == ("params", "prompt", "[*]", "text")
    assert parse_pattern("sk-[a-z]+").regex is not None
    assert parse_pattern("re:params.token").regex is not None
    assert parse_pattern("path:token").steps == ("token",)


@pytest.mark.parametrize(
    ("text", "says"), [("re:(", "not a regular expression"), ("path:a..b", "not a JSON path")]
)
def test_a_bad_pattern_names_the_option(text: str, says: str) -> None:
    """A pattern that is neither: an option error naming --redact."""
    with pytest.raises(OptionError, match=says) as caught:
        parse_pattern(text)
    assert caught.value.option == "--redact"


@pytest.mark.parametrize("text", ["z*", "a|", "^", "(x)?", "re:.*"])
def test_an_expression_that_matches_the_empty_string_is_refused(text: str) -> None:
    """``z*`` would mark every gap between two characters (``jsonrpc`` and ``method`` too)."""
    with pytest.raises(OptionError, match="matches the empty string") as caught:
        parse_pattern(text)
    assert caught.value.option == "--redact"
    assert "\n" not in str(caught.value)


def test_an_empty_match_is_never_replaced() -> None:
    """A lookahead alone matches nothing but gaps: nothing is changed, nothing is said."""
    raw = b'{"jsonrpc":"2.0","method":"m","params":{"t":"a sk-1 b"}}'
    assert Redactor.of(["(?=sk-)"]).redact(raw) == (raw, [])


def test_the_option_named_is_the_callers() -> None:
    """--ignore takes paths of the same syntax: its errors name --ignore."""
    with pytest.raises(OptionError) as caught:
        parse_pattern("path:sk-[", "--ignore")
    assert caught.value.option == "--ignore"


SECRET_ID = b'{"jsonrpc":"2.0","id":"sk-IDVALUE4444","method":"session/prompt","params":{}}'


def test_an_id_a_pattern_names_becomes_a_marker_and_a_keyed_digest() -> None:
    """The whole id is replaced, the same way each time (a request and its answer pair up), the
    line's id fields as the body's; two ids stay two; an id no pattern names stays."""
    redactor = Redactor.of(["sk-[A-Za-z0-9]+"], key=b"k" * 32)
    raw, where = redactor.redact(SECRET_ID)
    assert where == ["id"]
    assert b"IDVALUE" not in raw
    new_id = orjson.loads(raw)["id"]
    assert new_id.startswith(REDACTED + "#")
    assert orjson.dumps(new_id) == redactor.redact_id(b'"sk-IDVALUE4444"')
    assert redactor.redact_id(b'"sk-IDVALUE4444"') == redactor.redact_id(b'"sk-IDVALUE4444"')
    assert redactor.redact_id(b'"sk-OTHER5555"') != redactor.redact_id(b'"sk-IDVALUE4444"')
    assert redactor.redact_id(b'"c1"') == b'"c1"'
    assert redactor.redact_id(b"7") == b"7"
    assert redactor.redact_id(None) is None
    other_key = Redactor.of(["sk-[A-Za-z0-9]+"], key=b"j" * 32)
    assert other_key.redact_id(b'"sk-IDVALUE4444"') != redactor.redact_id(b'"sk-IDVALUE4444"')


def test_a_path_naming_the_id_redacts_every_id() -> None:
    """``path:id``: numbers too, each to its own digest."""
    redactor = Redactor.of(["path:id"])
    raw, where = redactor.redact(PROMPT)
    assert where == ["id"]
    assert orjson.loads(raw)["id"].startswith(REDACTED + "#")
    assert redactor.redact_id(b"1") != redactor.redact_id(b"2")


def test_what_a_header_says_holds_no_secret() -> None:
    """A regular expression by a digest of its text, a path as it is; an older header's plain
    patterns read as the same."""
    secret = parse_pattern("hunter2XYZ").describe()
    assert secret.kind == "regex"
    assert "hunter2XYZ" not in orjson.dumps(secret.to_json()).decode()
    assert Redaction.of_json(secret.to_json()) == secret
    assert Redaction.of_json("hunter2XYZ") == secret
    assert Redaction.of_json("re:hunter2XYZ") == secret
    path = parse_pattern("params.prompt[*].text").describe()
    assert path.to_json() == {"kind": "path", "path": "params.prompt[*].text"}
    assert Redaction.of_json("path:params.prompt[*].text") == path
    with pytest.raises(ValueError, match="not a redaction"):
        Redaction.of_json({"kind": "regex"})


@pytest.mark.parametrize(
    "patterns",
    [["params.prompt[*].text", "params.prompt"], ["params.prompt", "params.prompt[*].text", "a"]],
)
def test_a_value_inside_another_named_is_replaced_once(patterns: list[str]) -> None:
    """Two paths naming nested values, in either order: the outer one replaced whole, the JSON
    still JSON."""
    raw = b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"prompt":[{"text":"a"}]}}'
    new, where = Redactor.of(patterns).redact(raw)
    assert orjson.loads(new)["params"] == {"prompt": REDACTED}
    assert where == ["params.prompt"]


def test_many_values_are_redacted_in_one_pass() -> None:
    """Thousands of values named by a path and searched by an expression: each replaced, in the
    order they come (each checked against those replaced whole by a bisection, not a scan)."""
    items = [{"text": f"t{i}", "note": f"sk-{i}"} for i in range(5000)]
    raw = orjson.dumps({"jsonrpc": "2.0", "method": "m", "params": {"items": items}})
    new, where = Redactor.of(["params.items[*].text", "sk-[0-9]+"]).redact(raw)
    assert orjson.loads(new)["params"]["items"][4999] == {"text": REDACTED, "note": REDACTED}
    assert where[:3] == ["params.items[0].text", "params.items[0].note", "params.items[1].text"]
    assert len(where) == 10000


def test_a_message_nested_too_deep_for_an_expression_is_not_redacted() -> None:
    """Past MAX_DEPTH levels a string would go unsearched: the message is refused (its writer
    leaves it out), not returned with the secret in it; a path, which walks only its steps,
    still redacts it."""
    deep = (
        b'{"jsonrpc":"2.0","method":"m","params":'
        + b"[" * MAX_DEPTH
        + b'"sk-1"'
        + b"]" * MAX_DEPTH
        + b"}"
    )
    with pytest.raises(TooDeep, match="nested deeper than"):
        Redactor.of(["sk-[0-9]+"]).redact(deep)
    raw, where = Redactor.of(["path:params"]).redact(deep)
    assert where == ["params"]
    assert b"sk-1" not in raw
