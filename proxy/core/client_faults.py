"""Faults a Client asks for on one of its own requests (``--allow-client-faults``): a test that
drives a real Client can say "lose the answer to this prompt" in the request itself, as Envoy's
callers choose aborts and delays with a header.

A request whose ``params._meta.acpFault`` is an action and its fields, as a rule's ``do`` writes
them (``{"action": "error", "code": -32001}``), gets that fault as if a rule named
:data:`CLIENT_FAULT` with ``times: 1`` had matched it, before the fault file's rules. The hint is
taken out of the bytes before the request goes on: the one change to a message's bytes besides
its id (the ``_meta`` object that held it keeps its other members, separated by single commas).
A hint that names no action, or fields the action does not have, is answered ``-32602`` with
what is wrong, and the request goes no further.

Over Streamable HTTP the request's ``Acp-Fault`` header (:data:`ACP_FAULT`) may hold the hint
instead, the same JSON object: the request's bytes are then left as they are (the header is not
forwarded). A request may not ask both ways.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.actions import actions
from proxy.core.faultfile import CLIENT_FAULT, FaultFileError, Rule, validated
from proxy.core.jsonrpc import Kind, Message, parse
from proxy.core.splice import without_member

__all__ = ["ACP_FAULT", "CLIENT_FAULT", "client_fault"]

ACP_FAULT = "Acp-Fault"
"""The HTTP header of a Client's request that asks for a fault as ``_meta.acpFault`` does (and
of an answer that says which fault made it: ``http_status``)."""


def client_fault(message: Message) -> tuple[Rule, Message] | str | None:
    """The fault ``message`` asks for, as a rule, and the message without the hint; what is
    wrong with the hint; or ``None`` when it asks for none."""
    params = message.params
    if message.kind is not Kind.REQUEST:
        return None
    meta = params.get("_meta") if isinstance(params, dict) else None
    in_meta = isinstance(meta, dict) and "acpFault" in meta
    header = message.fault_header
    if header is not None:
        if in_meta:
            return f"asked twice: in the {ACP_FAULT} header and in params._meta.acpFault"
        try:
            hint = orjson.loads(header)
        except orjson.JSONDecodeError:
            return "not JSON"
        rule = _rule(hint)
        return rule if isinstance(rule, str) else (rule, message)
    if not in_meta:
        return None
    assert isinstance(meta, dict)
    rule = _rule(meta["acpFault"])
    if isinstance(rule, str):
        return rule
    raw = without_member(message.raw, ("params", "_meta"), "acpFault")
    stripped = None if raw is None else parse(raw)
    if not isinstance(stripped, Message):  # duplicate members, ... : the bytes disagree
        return "the hint could not be taken out of the request's bytes"
    return rule, stripped


def _rule(hint: Any) -> Rule | str:
    """The rule a hint asks for (named :data:`CLIENT_FAULT`), or what is wrong with it."""
    if not isinstance(hint, dict):
        return 'an action and its fields, as an object ({"action": "drop"})'
    if "action" not in hint:
        return 'no action: give "action" (' + ", ".join(actions.names()) + ") and its fields"
    try:
        checked = validated(Rule, {"name": "client", "do": hint}, CLIENT_FAULT)
    except FaultFileError as exc:
        return "; ".join(f"{error.field}: {error.message}" for error in exc.errors)
    return checked.model_copy(update={"name": CLIENT_FAULT})  # a name no other rule may bear
