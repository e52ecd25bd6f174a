"""Idempotency keys in merged traces: each (session, key) over all nodes, and what one proxy missed.

Each proxy's ledger writes a ``keyed`` record for every keyed ``session/prompt`` it relays
(session, key, a digest of the prompt, whether that ledger knew the key already) and a
``keyed_message`` record the first time it sees a ``messageId`` named for the key (in an answer, in
the swallowed answer to an injected copy, or in a ``user_message`` insert of the prompt). A ledger
judges only what crossed its own proxy: a retry that the Client's balancer sent to another replica,
or that reached the same proxy after a restart without ``--state``, meets a ledger that never saw
the key. :class:`Keys` gathers the records of every node and run per (session, key) and judges them
together (DESIGN 14):

``duplicate_insert``
    the key was given more than one ``messageId`` in all (the Agent ran the prompt twice);
``key_reused_other_prompt``
    the key came with more than one prompt in all.

A finding that a ledger already wrote for the same check, session and key is not repeated, so what
:meth:`Keys.findings` adds is what only the merged traces show; its ``detail`` says across what
(``across nodes``, ``across proxy runs``). Session ids are the Agent's: replicas behind one
balancer share their sessions, so one id names one session on every node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.core.observations import Check
from proxy.core.records import KeyedMessageRecord, KeyedRecord
from proxy.tools.report.load import Entry
from proxy.tools.report.model import Finding, KeyFinding, KeyRow, KeyVerdict
from proxy.tools.report.prompts import since

__all__ = ["Keys"]


@dataclass
class _Key:
    """What every node's records say of one (session, key)."""

    session: str
    key: str
    time: float
    attempts: int = 0
    scopes: list[tuple[str, int]] = field(default_factory=list)
    """Each (node, run) whose records name the key, in order of first sight."""
    prompts: list[str] = field(default_factory=list)
    other_prompt_at: float | None = None
    messages: dict[str, list[str]] = field(default_factory=dict)
    """Each ``messageId`` named for the key, and the nodes that saw it named."""
    several_at: float | None = None

    def seen(self, node: str, run: int) -> None:
        if (node, run) not in self.scopes:
            self.scopes.append((node, run))

    def nodes(self) -> list[str]:
        return sorted({node for node, _ in self.scopes})

    def across(self) -> str:
        """What the records of this key span, in words, or ``""`` for one ledger."""
        if len(self.nodes()) > 1:
            return "across nodes"
        return "across proxy runs" if len(self.scopes) > 1 else ""

    def verdict(self) -> KeyVerdict:
        count = len(self.messages)
        return "no messageId seen" if not count else "one message" if count == 1 else "duplicate"


class Keys:
    """Reads the ledger records of merged traces (:meth:`step`), then :meth:`view` and
    :meth:`findings`."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str], _Key] = {}

    def step(self, entry: Entry) -> None:
        """Take the next record (in time order); any but the ledger's is ignored."""
        record = entry.record
        if not isinstance(record, KeyedRecord | KeyedMessageRecord):
            return
        at = record.time
        key = self._keys.get((record.session, record.key))
        if key is None:
            key = self._keys[record.session, record.key] = _Key(record.session, record.key, at)
        key.seen(entry.node, entry.run)
        if isinstance(record, KeyedRecord):
            key.attempts += 1
            if record.prompt not in key.prompts:
                key.prompts.append(record.prompt)
                if len(key.prompts) == 2:
                    key.other_prompt_at = at
            return
        nodes = key.messages.get(record.message_id)
        if nodes is None:
            nodes = key.messages[record.message_id] = []
            if len(key.messages) == 2:
                key.several_at = at
        if entry.node not in nodes:
            nodes.append(entry.node)

    def view(self, start: float | None) -> list[KeyRow]:
        """Each (session, key) in order of first sight, JSON-ready (``time``: its first record,
        ``at_s``: that many seconds after ``start``)."""
        return [
            {
                "session": entry.session,
                "key": entry.key,
                "time": entry.time,
                "attempts": entry.attempts,
                "retries": max(entry.attempts - 1, 0),
                "nodes": entry.nodes(),
                "proxy_runs": len(entry.scopes),
                "prompts": len(entry.prompts),
                "message_ids": list(entry.messages),
                "message_nodes": {mid: sorted(nodes) for mid, nodes in entry.messages.items()},
                "verdict": entry.verdict(),
                "at_s": since(entry.time, start),
            }
            for entry in self._keys.values()
        ]

    def findings(self, written: Iterable[Finding]) -> list[KeyFinding]:
        """The findings only the merged records show: none that a ledger ``written`` already.

        Each is a finding of the trace's shape (``check``, ``session``, ``key``, ``detail``,
        ``time``) with ``nodes``, every node whose records name the key.
        """
        done = {
            (f["check"], f["session"], f["key"])
            for f in written
            if f["session"] is not None and f["key"] is not None
        }
        found: list[KeyFinding] = []
        for entry in self._keys.values():
            across = entry.across() or "in the merged traces"
            if (
                entry.several_at is not None
                and (Check.DUPLICATE_INSERT, entry.session, entry.key) not in done
            ):
                found.append(
                    self._finding(
                        Check.DUPLICATE_INSERT,
                        entry,
                        entry.several_at,
                        f"{across}, one key, several messages: {sorted(entry.messages)}",
                    )
                )
            if (
                entry.other_prompt_at is not None
                and (Check.KEY_REUSED_OTHER_PROMPT, entry.session, entry.key) not in done
            ):
                found.append(
                    self._finding(
                        Check.KEY_REUSED_OTHER_PROMPT,
                        entry,
                        entry.other_prompt_at,
                        f"{across}, one key came with {len(entry.prompts)} different prompts",
                    )
                )
        return sorted(found, key=lambda finding: finding["time"])

    @staticmethod
    def _finding(check: Check, entry: _Key, at: float, detail: str) -> KeyFinding:
        return {
            "check": check.value,
            "session": entry.session,
            "key": entry.key,
            "detail": detail,
            "time": at,
            "nodes": entry.nodes(),
        }
