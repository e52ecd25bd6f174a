"""What the tests of each fault action share: the fault on one message, built without a relay."""

from __future__ import annotations

import random

from proxy.core.actions.base import Fault, Subject
from proxy.core.events import Direction
from proxy.core.jsonrpc import Message, parse

PROMPT = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{}}'


def fault(
    raw: bytes = PROMPT,
    *,
    direction: Direction = Direction.TO_AGENT,
    downstream: str = "stdio",
    seed: int = 1,
    rule: str = "r",
) -> Fault:
    """The fault on the message ``raw``, as rules see it, with a random stream seeded ``seed``."""
    message = parse(raw)
    assert isinstance(message, Message)
    subject = Subject(
        direction,
        message.kind,
        message.method,
        message.session,
        keyed=False,
        params=message.params,
        downstream=downstream,
    )
    return Fault(message, subject, random.Random(seed), rule)
