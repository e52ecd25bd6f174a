"""Redaction: paths and regular expressions, changed in place, every other byte kept."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.errors import OptionError
from proxy.core.redact import REDACTED, Redactor, parse_pattern

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
