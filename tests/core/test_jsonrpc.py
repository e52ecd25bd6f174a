"""Classifying JSON-RPC messages by key presence, with ids kept as the sender's bytes."""

from __future__ import annotations

import json

import pytest

from proxy.core.jsonrpc import (
    Batch,
    ErrorCode,
    Invalid,
    InvalidReason,
    Kind,
    Message,
    error_response,
    id_key,
    parse,
)


def message(raw: bytes) -> Message:
    parsed = parse(raw)
    assert isinstance(parsed, Message), parsed
    return parsed


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"m"}', Kind.REQUEST),
        (b'{"jsonrpc":"2.0","id":0,"method":"m"}', Kind.REQUEST),
        (b'{"jsonrpc":"2.0","id":null,"method":"m"}', Kind.REQUEST),
        (b'{"jsonrpc":"2.0","method":"m"}', Kind.NOTIFICATION),
        (b'{"jsonrpc":"2.0","id":1,"result":null}', Kind.RESPONSE),
        (b'{"jsonrpc":"2.0","id":1,"result":false}', Kind.RESPONSE),
        (b'{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":""}}', Kind.ERROR),
        (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}', Kind.ERROR),
    ],
)
def test_classifies_by_key_presence(raw: bytes, kind: Kind) -> None:
    """Ids of 0 and null and results of null and false do not change the kind."""
    assert message(raw).kind is kind


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe{}", InvalidReason.NOT_UTF8),
        (b'{"id":1,"method":"\xc3"}', InvalidReason.NOT_UTF8),
        (b"{not json}", InvalidReason.INVALID_JSON),
        (b'{"a":1', InvalidReason.INVALID_JSON),
        (b'{"id":NaN,"method":"m"}', InvalidReason.INVALID_JSON),
        (b"42", InvalidReason.NOT_AN_OBJECT),
        (b'"text"', InvalidReason.NOT_AN_OBJECT),
        (b"[]", InvalidReason.EMPTY_BATCH),
        (b'{"jsonrpc":"2.0"}', InvalidReason.INVALID_SHAPE),
        (b'{"id":1,"result":1,"error":{}}', InvalidReason.INVALID_SHAPE),
        (b'{"id":1}', InvalidReason.INVALID_SHAPE),
        (b'{"id":1,"method":5}', InvalidReason.INVALID_SHAPE),
        (b'{"id":1.5,"method":"m"}', InvalidReason.INVALID_ID),
        (b'{"id":true,"method":"m"}', InvalidReason.INVALID_ID),
        (b'{"id":{},"result":1}', InvalidReason.INVALID_ID),
        (b'{"id":1e3,"method":"m"}', InvalidReason.INVALID_ID),
    ],
)
def test_invalid_input_is_classified_never_raised(raw: bytes, reason: InvalidReason) -> None:
    """Bad input becomes an Invalid with a bounded reason and a detail."""
    parsed = parse(raw)
    assert isinstance(parsed, Invalid)
    assert parsed.reason is reason
    assert parsed.detail
    assert parsed.raw == raw


def test_deep_nesting_is_invalid_not_a_crash() -> None:
    """Nesting beyond what the parsers accept is reported, not raised."""
    raw = b'{"id":1,"method":"m","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    parsed = parse(raw)
    assert isinstance(parsed, Invalid | Message)


@pytest.mark.parametrize(
    ("token", "key"),
    [
        (b"0", ("n", b"0")),
        (b"10", ("n", b"10")),
        (b'"0"', ("s", "0")),
        (b"-7", ("n", b"-7")),
        (b"123456789012345678901234567890", ("n", b"123456789012345678901234567890")),
        (b'"\\u0031"', ("s", "1")),
        (b"null", ("null", None)),
    ],
)
def test_id_keys_keep_type_and_exact_value(token: bytes, key: tuple[str, object]) -> None:
    """1 and "1" differ; a huge integer is not collapsed into a float."""
    parsed = message(b'{"id":' + token + b',"method":"m"}')
    assert parsed.id_token == token
    assert parsed.id_key == key


def test_huge_integer_ids_do_not_alias() -> None:
    """Two integers a double cannot tell apart stay two different ids."""
    a = message(b'{"id":12345678901234567890123,"method":"m"}')
    b = message(b'{"id":12345678901234567890124,"method":"m"}')
    assert a.id_key != b.id_key


def test_id_key_rejects_non_ids() -> None:
    """Booleans, fractions and containers are not ids."""
    assert id_key(b"true", True) is None
    assert id_key(b"1.5", 1.5) is None
    assert id_key(b"1e3", 1000.0) is None
    assert id_key(b"10.0", 10.0) is None
    assert id_key(b"[]", []) is None


def test_lone_surrogates_and_huge_numbers_parse() -> None:
    """Valid JSON that orjson refuses is still classified (the standard library takes it)."""
    parsed = message(b'{"id":"\\ud800","method":"m","params":{"n":1e400}}')
    assert parsed.kind is Kind.REQUEST
    assert parsed.id_key == ("s", "\ud800")


def test_integers_longer_than_python_reads_are_valid_json() -> None:
    """More digits than ``int()`` converts (4300) is still an integer id, and valid params."""
    digits = b"9" * 5000
    parsed = message(b'{"id":' + digits + b',"method":"m","params":{"n":-' + digits + b"}}")
    assert parsed.kind is Kind.REQUEST
    assert parsed.id_key == ("n", digits)


def test_duplicate_ids_are_all_spanned() -> None:
    """Every top-level id is located, so all can be rewritten."""
    parsed = message(b'{"id":1,"method":"m","id":2}')
    assert len(parsed.id_spans) == 2
    assert parsed.id_token == b"2"


def test_session_and_params() -> None:
    """The session is params.sessionId when it is a string."""
    assert message(b'{"method":"m","params":{"sessionId":"S"}}').session == "S"
    assert message(b'{"method":"m","params":{"sessionId":5}}').session is None
    assert message(b'{"method":"m","params":[1]}').session is None
    assert message(b'{"method":"m"}').params is None


def test_batches_keep_each_element_bytes() -> None:
    """A batch is split into elements that keep their own bytes and kinds."""
    parsed = parse(b'[{"id":1,"method":"a"}, {"method":"n"} ,5,{"id":2,"result":{}}]')
    assert isinstance(parsed, Batch)
    assert [element.kind for element in parsed.elements] == [
        Kind.REQUEST,
        Kind.NOTIFICATION,
        Kind.INVALID,
        Kind.RESPONSE,
    ]
    assert parsed.elements[1].raw == b'{"method":"n"}'


def test_error_response_is_valid_json_under_the_given_id() -> None:
    """The proxy's own errors carry the id bytes as given."""
    raw = error_response(b'"abc"', ErrorCode.PARSE_ERROR, "Parse error: x", {"k": 1})
    assert json.loads(raw) == {
        "jsonrpc": "2.0",
        "id": "abc",
        "error": {"code": -32700, "message": "Parse error: x", "data": {"k": 1}},
    }
    assert json.loads(error_response(b"null", -32600, "m"))["id"] is None


def test_reason_error_codes() -> None:
    """Unparsable input is a parse error; anything else invalid is an invalid request."""
    assert InvalidReason.INVALID_JSON.error_code is ErrorCode.PARSE_ERROR
    assert InvalidReason.NOT_UTF8.error_code is ErrorCode.PARSE_ERROR
    assert InvalidReason.INVALID_SHAPE.error_code is ErrorCode.INVALID_REQUEST
    assert InvalidReason.TOO_LARGE.error_code is ErrorCode.INVALID_REQUEST
