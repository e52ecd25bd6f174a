"""JSON-RPC 2.0 messages as the relay sees them: classified by key presence, ids kept as bytes.

Rules of this module (wire brief 2.1 and 7):

* Classification is by key presence, never truthiness: ``"id": 0`` and ``"id": null`` are ids.
* An id is kept as the exact bytes the sender wrote, so it goes back with its type and spelling
  (``1`` is not ``"1"``). Ids are compared by :data:`IdKey`: a string by its decoded value, a
  number by its token (JSON parsers turn huge integers into floats, which would alias).
* Nothing here re-serialises a peer's message. Bytes the proxy writes itself (its own error
  answers) are built by :func:`error_response`.
* :func:`parse` never raises: anything that is not a usable message comes back as
  :class:`Invalid` with a bounded :class:`InvalidReason` (a metrics label) and a detail.
* An invalid message that a lenient peer could still read names the id that peer would read
  (:attr:`Invalid.id_token`): the relay rewrites it hop by hop like any id, so that a request's
  answer is not taken for the answer to another request, and an answer reaches the request it
  answers.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Final

import orjson

from proxy.core.splice import ScanLimit, Span, array_elements, find_member, member_spans, members
from proxy.core.values import value

__all__ = [
    "Batch",
    "ErrorCode",
    "IdKey",
    "Invalid",
    "InvalidReason",
    "Kind",
    "Message",
    "classify",
    "error_response",
    "has_idempotency_key",
    "id_key",
    "load",
    "notification",
    "parse",
    "session_of",
    "token_at",
]


class Kind(enum.StrEnum):
    """What a JSON value is, as JSON-RPC defines it."""

    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"
    ERROR = "error"
    BATCH = "batch"
    INVALID = "invalid"


class InvalidReason(enum.StrEnum):
    """Why a message is not a usable JSON-RPC message (a bounded metrics label)."""

    NOT_UTF8 = "not_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    INVALID_SHAPE = "invalid_shape"
    INVALID_ID = "invalid_id"
    EMPTY_BATCH = "empty_batch"
    TOO_LARGE = "too_large"
    TOO_COMPLEX = "too_complex"
    """Valid JSON whose id cannot be located within the scanner's bounds
    (:data:`proxy.core.splice.MAX_STEPS`): it cannot be relayed, and is answered like one too
    large."""

    @property
    def error_code(self) -> ErrorCode:
        """The JSON-RPC error a receiver answers this with."""
        if self in (InvalidReason.NOT_UTF8, InvalidReason.INVALID_JSON):
            return ErrorCode.PARSE_ERROR
        return ErrorCode.INVALID_REQUEST


class ErrorCode(enum.IntEnum):
    """JSON-RPC and ACP error codes (wire brief 2.4)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    REQUEST_CANCELLED = -32800
    AUTH_REQUIRED = -32000
    RESOURCE_NOT_FOUND = -32002


IdKey = tuple[str, object]
"""The identity of a JSON-RPC id: ``("s", text)``, ``("n", token)`` or ``("null", None)``."""

_INTEGER: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)\Z")
_NUMBER: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?\Z")
_BOM: Final = b"\xef\xbb\xbf"
_PAUSE_COLLECTOR_BYTES: Final = 1024 * 1024
"""Messages this large are parsed with the garbage collector paused (:func:`_collector_paused`)."""
_TOO_DEEP: Final = "depth limit exceeded"
"""How orjson's error begins for nesting beyond its limit (1,024 levels)."""


def id_key(token: bytes, value: object) -> IdKey | None:
    """The identity of an id written as ``token`` that parsed to ``value``.

    ``None`` when the value is not a valid JSON-RPC id (a fraction, a boolean, a container).
    """
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("null", None)
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        # digits alone, no leading zero, tested before a regular expression (which costs more)
        and ((token.isdigit() and (token[0] != 0x30 or len(token) == 1)) or _INTEGER.match(token))
    ):
        return ("n", token)
    return None


@value
class Message:
    """A single request, notification, response or error, with its original bytes."""

    raw: bytes
    kind: Kind
    body: dict[str, Any]
    method: str | None = None
    id_token: bytes | None = None
    """The id exactly as written (``None`` for a notification)."""
    id_key: IdKey | None = None
    id_spans: tuple[Span, ...] = ()
    """Where every top-level ``id`` member's value sits in :attr:`raw` (duplicates included)."""
    session: str | None = None
    """``params.sessionId`` when it is a string."""
    content_digest: str | None = None
    """The digest of its prompt or update content, when a worker parsed it
    (:mod:`proxy.core.compact`): its body holds only part of them."""
    fault_header: str | None = None
    """The ``Acp-Fault`` header of the HTTP request that carried it, as sent: the fault its
    Client asks for (:mod:`proxy.core.client_faults`)."""

    @property
    def params(self) -> Any:
        """``params``, or ``None`` when absent."""
        return self.body.get("params")


def notification(raw: bytes, body: dict[str, Any], method: str) -> Message:
    """The notification ``raw``, its JSON ``body`` (an object with ``method`` and no ``id``)."""
    return Message(raw, Kind.NOTIFICATION, body, method, session=session_of(body))


def session_of(value: dict[str, Any]) -> str | None:
    """``params.sessionId`` of a message's JSON ``value``, when it is a string."""
    params = value.get("params")
    if isinstance(params, dict):
        session = params.get("sessionId")
        if isinstance(session, str):
            return session
    return None


def has_idempotency_key(params: Any) -> bool:
    """Whether a message's ``params`` carry an ``idempotencyKey`` (present and not null)."""
    return isinstance(params, dict) and params.get("idempotencyKey") is not None


@value
class Invalid:
    """Bytes that are not a usable JSON-RPC message, and why."""

    raw: bytes
    reason: InvalidReason
    detail: str
    response: bool = False
    """Shaped like a response (id, no method): never forwarded blindly, it may answer the wrong
    request (only under a readable id that names a pending request, back to its sender)."""
    kind: Kind = Kind.INVALID
    id_token: bytes | None = None
    """The top-level id a lenient reader would find (a string or a number), when there is one:
    a peer that reads a request anyway answers under it; an answer names the request."""
    id_key: IdKey | None = None
    id_spans: tuple[Span, ...] = ()
    method: str | None = None
    """The top-level ``method`` as far as it can be read (with ``id_token`` only)."""
    reads_as: Kind | None = None
    """What a lenient reader takes it for (a request, a response or an error), with ``id_token``."""


@value
class Batch:
    """A JSON array of messages; each element keeps its own bytes."""

    raw: bytes
    elements: tuple[Message | Invalid, ...]
    kind: Kind = Kind.BATCH


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _integer(token: str) -> int | float:
    """An integer of any length: ``int()`` refuses more than 4300 digits, a float takes them.

    Only the type of a number matters to the relay (an id is identified by its token).
    """
    try:
        return int(token)
    except ValueError:
        return float(token)


@contextlib.contextmanager
def _collector_paused(size: int) -> Iterator[None]:
    """Pause the cyclic garbage collector while a message of ``size`` bytes or more is parsed.

    Parsing allocates one object per JSON container, and every few hundred allocations the
    collector walks the young objects again, and now and then all of them: for a message of
    millions of small containers that triples the parse. The objects a parse makes hold no
    cycles, so nothing is lost by collecting them later.
    """
    if size < _PAUSE_COLLECTOR_BYTES or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _load(raw: bytes) -> tuple[Any, Invalid | None]:
    try:
        if len(raw) < _PAUSE_COLLECTOR_BYTES:  # most messages: no context manager to enter
            return orjson.loads(raw), None
        with _collector_paused(len(raw)):
            return orjson.loads(raw), None
    except orjson.JSONDecodeError as first:
        if str(first).startswith(_TOO_DEEP):  # no parser the relay uses goes deeper
            return None, Invalid(raw, InvalidReason.INVALID_JSON, str(first))
        # orjson refuses a few things that are valid JSON (numbers beyond a double, lone
        # surrogate escapes); the standard library takes those, and must agree on the rest.
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, Invalid(raw, InvalidReason.NOT_UTF8, f"invalid UTF-8 at byte {exc.start}")
        try:
            return json.loads(text, parse_constant=_reject_constant, parse_int=_integer), None
        except (ValueError, RecursionError):
            return None, Invalid(raw, InvalidReason.INVALID_JSON, str(first))


def load(raw: bytes) -> Any:
    """The JSON value of ``raw``, read as the relay reads a message (numbers beyond a double and
    lone surrogates taken); :class:`ValueError` saying why when it is not JSON."""
    value, invalid = _load(raw)
    if invalid is not None:
        raise ValueError(invalid.detail)
    return value


def _classify(raw: bytes, value: Any) -> Message | Invalid:
    if not isinstance(value, dict):
        return Invalid(raw, InvalidReason.NOT_AN_OBJECT, f"a JSON {type(value).__name__}")
    has_id = "id" in value
    if "method" in value:
        method = value["method"]
        if not isinstance(method, str):
            return Invalid(raw, InvalidReason.INVALID_SHAPE, "method is not a string")
        if not has_id:
            return notification(raw, value, method)
        kind = Kind.REQUEST
    elif has_id and (("result" in value) != ("error" in value)):
        method = None
        kind = Kind.ERROR if "error" in value else Kind.RESPONSE
    else:  # an id with both result and error (or neither) may still answer the wrong request
        answers = has_id and ("result" in value or "error" in value)
        detail = "neither a request nor a response"
        return Invalid(raw, InvalidReason.INVALID_SHAPE, detail, response=answers)
    try:
        spans = tuple(member_spans(raw, "id", present=True))
    except ScanLimit as exc:
        detail = f"too complex to relay: {exc}"
        return Invalid(raw, InvalidReason.TOO_COMPLEX, detail, response=method is None)
    start, end = spans[-1]
    token = raw[start:end]
    key = id_key(token, value["id"])
    if key is None:
        detail = f"id {token[:40].decode('utf-8', 'replace')} is not a string or an integer"
        return Invalid(raw, InvalidReason.INVALID_ID, detail, response=method is None)
    return Message(raw, kind, value, method, token, key, spans, session_of(value))


def _readable_id(invalid: Invalid) -> Invalid:
    """``invalid`` with the id a lenient reader would find in it, if any.

    The top-level members are scanned as bytes, so invalid UTF-8, nesting beyond any parser's
    depth or a member of the wrong type leave the id readable; bytes that cannot be scanned
    (truncated, not an object), or an id that is itself no JSON string or number, give none.
    With ``result`` or ``error`` and no ``method``, the message reads as an answer
    (:attr:`Invalid.response`); otherwise as a request.
    """
    if invalid.reason in (InvalidReason.TOO_LARGE, InvalidReason.TOO_COMPLEX):
        return invalid
    raw = invalid.raw
    begin = len(_BOM) if raw.startswith(_BOM) else 0  # lenient readers skip one
    try:
        found = members(raw, begin)
        spans = found.get("id", [])
        keys = [_plain_id_key(raw[start:end]) for start, end in spans]
    except ScanLimit as exc:
        # Forwarded as it is, it might be read under an id the proxy did not rewrite.
        answers = "method" not in exc.keys and bool({"result", "error"} & exc.keys)
        detail = f"too complex to relay: {exc}"
        return Invalid(raw, InvalidReason.TOO_COMPLEX, detail, response=answers)
    except (ValueError, RecursionError):
        return invalid
    if not keys or None in keys:
        return invalid
    methods = found.get("method")
    reads_as = Kind.REQUEST
    if not methods and "error" in found:
        reads_as = Kind.ERROR
    elif not methods and "result" in found:
        reads_as = Kind.RESPONSE
    method = None
    if methods:
        start, end = methods[-1]
        if raw[start : start + 1] == b'"':
            method = raw[start + 1 : end - 1].decode("utf-8", "replace")
    start, end = spans[-1]
    return replace(
        invalid,
        id_token=raw[start:end],
        id_key=keys[-1],
        id_spans=tuple(spans),
        method=method,
        reads_as=reads_as,
        response=invalid.response or reads_as is not Kind.REQUEST,
    )


def _plain_id_key(token: bytes) -> IdKey | None:
    """The identity of ``token`` if it is, alone, a JSON string or number (``1.0`` is no valid
    id, but a reader that makes it ``1`` answers under an id the proxy may use)."""
    if _NUMBER.match(token):
        return ("n", token)
    if token[:1] == b'"':
        try:
            text = json.loads(token)
        except ValueError:
            return None
        if isinstance(text, str):
            return ("s", text)
    return None


def parse(raw: bytes) -> Message | Batch | Invalid:
    """Classify one framed message. Never raises."""
    value, invalid = _load(raw)
    if invalid is not None:
        return _readable_id(invalid)
    return classify(raw, value)


def classify(raw: bytes, value: Any) -> Message | Batch | Invalid:
    """Classify ``raw`` from ``value``, its JSON parsed already (``orjson.loads(raw)``, as
    :func:`parse` would have found it). Never raises."""
    try:
        if isinstance(value, list):
            if not value:
                return Invalid(raw, InvalidReason.EMPTY_BATCH, "an empty array")
            spans = array_elements(raw)
            elements = tuple(
                _readable(_classify(raw[start:end], item))
                for (start, end), item in zip(spans, value, strict=True)
            )
            return Batch(raw, elements)
        return _readable(_classify(raw, value))
    except ScanLimit as exc:
        return Invalid(raw, InvalidReason.TOO_COMPLEX, f"too complex to relay: {exc}")
    except (ValueError, RecursionError) as exc:  # the scanner and the parser disagreed
        return Invalid(raw, InvalidReason.INVALID_JSON, f"unscannable: {exc}")


def _readable(classified: Message | Invalid) -> Message | Invalid:
    return _readable_id(classified) if isinstance(classified, Invalid) else classified


def token_at(raw: bytes, path: tuple[str, ...]) -> tuple[Span, bytes] | None:
    """The span and bytes of the value at ``path`` in ``raw``, or ``None``."""
    span = find_member(raw, path)
    if span is None:
        return None
    return span, raw[span[0] : span[1]]


def error_response(id_token: bytes, code: int, message: str, data: Any = None) -> bytes:
    """A JSON-RPC error answer written by the proxy itself, under ``id_token`` as given."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return b'{"jsonrpc":"2.0","id":' + id_token + b',"error":' + orjson.dumps(error) + b"}"
