"""The pending requests of one direction: the proxy's ids on the next hop, the sender's bytes back."""

from __future__ import annotations

import itertools
import json

from proxy.core.idmap import DuplicateGroup, IdMap
from proxy.core.jsonrpc import id_key


def key(token: bytes) -> tuple[str, object]:
    """The id key of ``token`` as the parser computes it."""
    found = id_key(token, json.loads(token))
    assert found is not None
    return found


def test_each_request_gets_a_fresh_id_and_its_answer_gets_the_senders_bytes_back() -> None:
    ids = IdMap()
    first = ids.add(b'"a"', key(b'"a"'), "session/prompt", "s1", 1.0, keyed=True)
    second = ids.add(b"1.0e0", ("n", b"1.0e0"), "_x/y", None, 2.0)
    assert (first.forwarded_id, second.forwarded_id) == (b"0", b"1")
    assert len(ids) == 2
    assert ids.oldest() is first
    answered = ids.pop(b"0")
    assert answered is first
    assert (answered.original_id, answered.method, answered.session, answered.keyed) == (
        b'"a"',
        "session/prompt",
        "s1",
        True,
    )
    assert ids.pop(b"0") is None  # a second answer to the same id finds nothing
    assert ids.get(b"1") is second
    assert ids.oldest() is second


def test_a_sender_that_reuses_an_id_has_both_requests_pending_under_it() -> None:
    ids = IdMap()
    one = ids.add(b"7", ("n", b"7"), "m", None, 0.0)
    two = ids.add(b"7", ("n", b"7"), "m", None, 0.0)
    assert ids.pending_with(("n", b"7")) == [one, two]
    ids.pop(one.forwarded_id)
    assert ids.pending_with(("n", b"7")) == [two]
    ids.pop(two.forwarded_id)
    assert ids.pending_with(("n", b"7")) == []


def test_a_sibling_mints_from_the_same_counter_so_no_id_is_in_both_directions() -> None:
    to_agent = IdMap(itertools.count(100))
    to_client = to_agent.sibling()
    minted = [
        to_agent.add(b"1", ("n", b"1"), "m", None, 0.0).forwarded_id,
        to_client.add(b"1", ("n", b"1"), "m", None, 0.0).forwarded_id,
        to_agent.add(b"2", ("n", b"2"), "m", None, 0.0).forwarded_id,
    ]
    assert minted == [b"100", b"101", b"102"]
    assert len(to_client) == 1


def test_clear_forgets_everything_and_returns_what_was_pending() -> None:
    ids = IdMap()
    group = DuplicateGroup()
    a = ids.add(b'"x"', ("s", "x"), "session/prompt", "s", 0.0, group=group)
    b = ids.add(b'"x"', ("s", "x"), "session/prompt", "s", 0.0, group=group)
    assert ids.clear() == [a, b]
    assert len(ids) == 0
    assert ids.oldest() is None
    assert ids.pending_with(("s", "x")) == []
    assert a.group is b.group
