"""Nothing lost, nothing reordered while the rules change (after Toxiproxy's ``TestNoDataDropped``).

A real proxy process relays numbered notifications, requests and answers both ways between the
test (the Client, over stdio, WebSocket or Streamable HTTP) and ``peers/seq_agent.py``, while its
rules are added, replaced, removed and reset over the control API, or rewritten in the fault file
and reloaded by ``--watch``. Every rule set holds the same three rules on *marked* messages
(``params.mark``: ``drop``, ``delay``, ``duplicate``) and rules that never act on the stream (other
methods, a schedule never due, a mark never sent). Unmarked messages, and every answer, must
arrive exactly once and in their sender's order, both ways; marked ones as their rule says:
dropped ones never, delayed ones once and in their own order (a delay holds only its message,
docs/fault-files.md, "Ordering"), duplicated notifications and requests twice (a duplicated request answered
once; of the two answers to a duplicated Agent request, one reaches the Agent). The same holds,
with the rules left as they are, while a shaping action (``bandwidth``, ``slice``) acts on every
message as well.

The ends are found without waiting on time: the Agent's ``_seq/drained`` and the Client's
``_seq/report`` are delayed like the delayed messages, and equal delays keep their order, so each
arrives after everything its sender sent before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import PEERS, TIMEOUT, ProxyProcess, fault_file, log_events
from listener_client import compact
from wires import Wire, client_wire

from proxy.control import ControlClient

SEQ_AGENT = [sys.executable, str(PEERS / "seq_agent.py")]
DELAY_MS = 30
TARGETS = ("drop-marked", "delay-marked", "dup-marked")
MARKS = [None, "delay", None, "drop", None, None, "dup", None, "delay", None, None, "dup", "drop"]
"""The marks of a burst's messages, in turn (unmarked ones in between)."""
BURST = 26
"""Messages each way per round."""


def target_rules(suffix: str = "") -> list[dict[str, Any]]:
    """The rules on marked messages (``suffix`` renames them: a replacement, not the same rule)."""
    return [
        {
            "name": f"drop-marked{suffix}",
            "when": {"params": {"mark": "drop"}},
            "do": {"action": "drop"},
        },
        {
            "name": f"delay-marked{suffix}",
            "when": {"params": {"mark": "delay"}},
            "do": {"action": "delay", "ms": DELAY_MS},
        },
        {
            "name": f"dup-marked{suffix}",
            "when": {"params": {"mark": "dup"}},
            "do": {"action": "duplicate", "copies": 1},
        },
    ]


def noise_rules(tag: str) -> list[dict[str, Any]]:
    """Rules that never act on the stream: each would be seen if it did."""
    return [
        {"name": f"other-method-{tag}", "when": {"method": "_never/*"}, "do": {"action": "drop"}},
        {
            "name": f"never-due-{tag}",
            "when": {"method": "_seq/*"},
            "schedule": {"nth": [10**9]},
            "do": {"action": "drop"},
        },
        {
            "name": f"other-mark-{tag}",
            "when": {"params": {"mark": "never"}},
            "do": {"action": "delay", "ms": 5000},
        },
        {
            "name": f"no-errors-{tag}",
            "when": {"kind": "error"},
            "do": {"action": "sever", "side": "both"},
        },
    ]


def rule_set(round_: int) -> list[dict[str, Any]]:
    """Round ``round_``'s rules: targets renamed every other round, noise around them, rotated."""
    rules = noise_rules(f"r{round_}") + target_rules("" if round_ % 2 else f"-{round_}")
    shift = round_ % len(rules)
    return rules[shift:] + rules[:shift]


def is_target(name: str) -> bool:
    """Whether ``name`` is one of the rules on marked messages (under any of its names)."""
    return any(name == target or name.startswith(f"{target}-") for target in TARGETS)


# -- the Client's connection, whatever the transport ----------------------------------------------


@contextlib.asynccontextmanager
async def running_proxy(transport: str, *options: str) -> AsyncIterator[tuple[ProxyProcess, str]]:
    """A proxy in front of the sequencing Agent, its Clients on ``transport``; and its URL."""
    listen = [] if transport == "stdio" else ["--listen", f"{transport}://127.0.0.1:0/acp"]
    proxy = await ProxyProcess.start(SEQ_AGENT, "--log-format", "json", *listen, *options)
    try:
        url = "" if transport == "stdio" else (await proxy.logged("listening"))["url"]
        yield proxy, url
    finally:
        await proxy.stop()


# -- the conversation -------------------------------------------------------------------------------


@dataclass
class Conversation:
    """Both streams as the Client sent and saw them.

    ``sent``: ``(seq, kind, category)`` in the order written, where the category is the mark, or
    ``dup-answer`` for an answer to a duplicated request (only one of the two answers to its
    copies passes the proxy). ``got``: ``(out, kind, category)`` of each message from the Agent,
    in order (the Agent gives its answers their category).
    """

    wire: Wire
    sent: list[tuple[int, str, str | None]] = field(default_factory=list)
    got: list[tuple[int, str, str | None]] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    asks: dict[str, str | None] = field(default_factory=dict)
    """The Client's requests: id -> mark."""
    report: dict[str, Any] | None = None
    _outbox: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)

    def queue(self, message: dict[str, Any]) -> None:
        """Send ``message`` after everything queued before (``seq`` is added when it is sent)."""
        self._outbox.put_nowait(message)

    def burst(self, round_: int) -> None:
        """``BURST`` messages of the Client's, and a burst of as many from the Agent."""
        items = []
        for index in range(BURST):
            mark = MARKS[(index + round_) % len(MARKS)]
            kind = "ask" if index % 3 == 1 else "note"
            self.queue({"method": f"_seq/{kind}", "params": {"mark": mark}})
            agent_mark = MARKS[(index * 5 + round_) % len(MARKS)]
            items.append(["ask" if index % 3 == 2 else "note", agent_mark])
        self.queue({"method": "_seq/burst", "params": {"items": items}})

    async def write(self) -> None:
        """Send what is queued, in order, numbering each message."""
        while (message := await self._outbox.get()) is not None:
            seq = len(self.sent)
            category: str | None
            if "method" in message:
                message["params"]["seq"] = seq
                category = message["params"].get("mark")
                kind = "note"
                if message["method"] in ("_seq/ask", "_seq/report"):
                    kind = "ask"
                    message.setdefault("id", f"c{seq}")
                    self.asks[message["id"]] = category
            else:
                message["result"]["seq"] = seq
                kind, category = "answer", message.pop("category")
            self.sent.append((seq, kind, category))
            await self.wire.send(compact({"jsonrpc": "2.0", **message}))

    async def read(self) -> None:
        """Take in the Agent's messages, answering its requests, until the report's answer."""
        while True:
            message = json.loads(await self.wire.receive())
            if "method" not in message:
                self.answers[message["id"]] += 1
                self.got.append((message["result"]["out"], "answer", message["result"].get("mark")))
                if message["id"] == "report":
                    self.report = message["result"]
                    self._outbox.put_nowait(None)
                    return
                continue
            params = message["params"]
            mark = params["mark"]
            kind = "ask" if "id" in message else "note"
            self.got.append((params["out"], kind, mark))
            if kind == "ask":
                result = {"to": params["out"]}
                category = "dup-answer" if mark == "dup" else None
                self.queue({"id": message["id"], "result": result, "category": category})
            elif message["method"] == "_seq/drained":
                self.queue({"id": "report", "method": "_seq/report", "params": {"mark": "delay"}})


def check_to_client(conversation: Conversation) -> None:
    """The Agent's stream: unmarked ones and answers once, in order; marked ones per their rule."""
    assert conversation.report is not None
    written = [(out, kind, mark) for out, kind, mark in conversation.report["written"]]
    got = conversation.got
    unmarked = [out for out, _, mark in written if mark is None]
    assert [out for out, _, mark in got if mark is None] == unmarked
    assert len(unmarked) > 100
    assert not [out for out, _, mark in got if mark == "drop"]
    delayed = [out for out, _, mark in written if mark == "delay"]
    assert len(delayed) > 10
    assert [out for out, _, mark in got if mark == "delay"] == delayed
    duplicated = Counter(out for out, _, mark in got if mark == "dup")
    assert duplicated == Counter({out: 2 for out, _, mark in written if mark == "dup"})
    assert {kind for _, kind, mark in written if mark == "drop"} == {"ask", "note"}
    assert {kind for _, kind, mark in written if mark == "dup"} == {"ask", "note"}
    # The Client's own requests: each answered once, unless dropped on its way.
    expected = {id_: 0 if mark == "drop" else 1 for id_, mark in conversation.asks.items()}
    assert {id_: conversation.answers[id_] for id_ in expected} == expected
    assert sum(conversation.answers.values()) == sum(expected.values())


def check_to_agent(conversation: Conversation) -> None:
    """The Client's stream as the Agent read it, by the same rules."""
    assert conversation.report is not None
    received = conversation.report["received"]
    category = {seq: category for seq, _, category in conversation.sent}
    seqs = [seq for _, seq, _ in received]
    sent_unmarked = [seq for seq, _, category in conversation.sent if category is None]
    assert [seq for seq in seqs if category[seq] is None] == sent_unmarked
    assert len(sent_unmarked) > 100
    assert not [seq for seq in seqs if category[seq] == "drop"]
    delayed = [seq for seq, _, category in conversation.sent if category == "delay"]
    assert len(delayed) > 10
    assert [seq for seq in seqs if category[seq] == "delay"] == delayed
    duplicated = Counter(seq for seq in seqs if category[seq] == "dup")
    assert duplicated == Counter({seq: 2 for seq, _, c in conversation.sent if c == "dup"})
    # Of the Client's two answers to each duplicated Agent request, exactly one got through.
    answered = Counter(to for kind, seq, to in received if category[seq] == "dup-answer")
    duplicated_asks = {
        out for out, kind, mark in conversation.got if kind == "ask" and mark == "dup"
    }
    assert answered == Counter(dict.fromkeys(duplicated_asks, 1))


async def converse(wire: Wire, rounds: int, change: Callable[[int], Awaitable[None]]) -> None:
    """``rounds`` rounds of a rule change then a burst each way (the last still in flight while
    the next change is made), then the ends; both streams checked."""
    conversation = Conversation(wire)
    async with asyncio.timeout(TIMEOUT * 3), asyncio.TaskGroup() as tasks:
        tasks.create_task(conversation.write())
        tasks.create_task(conversation.read())
        for round_ in range(rounds):
            await change(round_)
            conversation.burst(round_)
        conversation.queue({"method": "_seq/drain", "params": {"mark": "delay"}})
    check_to_client(conversation)
    check_to_agent(conversation)


def assert_only_targets_fired(proxy: ProxyProcess) -> None:
    """Every fault the proxy injected came from a rule on marked messages."""
    fired = Counter(event["rule"] for event in log_events(proxy.stderr, "fault injected"))
    assert fired, "no fault was injected"
    assert all(is_target(rule) for rule in fired), fired


TRANSPORTS = ["stdio", "ws", "http"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_no_data_dropped_while_the_control_api_changes_rules(
    transport: str, tmp_path: Path
) -> None:
    """Rules added, removed, replaced and reset over the control API between bursts both ways."""
    faults = fault_file(tmp_path, *target_rules(), *noise_rules("file"))
    async with running_proxy(transport, "--faults", str(faults), "--admin", "127.0.0.1:0") as (
        proxy,
        url,
    ):
        control = ControlClient((await proxy.logged("control API listening"))["url"])

        def added(round_: int) -> dict[str, Any]:
            return noise_rules(f"added{round_}")[round_ // 4 % 4]

        def apply(round_: int) -> list[dict[str, Any]]:
            match round_ % 4:
                case 0:
                    return control.add_rule(added(round_))
                case 1:
                    return control.remove_rule(added(round_ - 1)["name"])
                case 2:
                    return control.set_rules(rule_set(round_))
                case _:
                    return control.reset()

        async def change(round_: int) -> None:
            rules = await asyncio.to_thread(apply, round_)
            assert sum(is_target(rule["name"]) for rule in rules) == len(TARGETS)

        async with client_wire(transport, proxy, url) as wire:
            await converse(wire, 12, change)
        assert_only_targets_fired(proxy)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_no_data_dropped_while_watch_reloads_the_fault_file(
    transport: str, tmp_path: Path
) -> None:
    """The fault file rewritten between bursts; each reload waited for (its log line)."""
    faults = fault_file(tmp_path, *rule_set(0))
    async with running_proxy(transport, "--faults", str(faults), "--watch") as (proxy, url):

        async def change(round_: int) -> None:
            if round_:
                # Names grow each round, so the file's size changes with its stamp.
                fault_file(tmp_path, *rule_set(round_), *noise_rules("n" * round_))
                await proxy.logged("fault files reloaded", count=round_)

        async with client_wire(transport, proxy, url) as wire:
            await converse(wire, 7, change)
        assert_only_targets_fired(proxy)


SHAPING = {
    "bandwidth": {"action": "bandwidth", "bytes_per_second": 10_000_000},
    "slice": {"action": "slice", "average_size": 40, "size_variation": 30, "gap_us": 50},
}
"""Each shaping action, on every message (a throttle keeps the order of those it holds, and lets
the others pass them: it must hold them all): fast enough that what it holds back is never held
as long as a delayed message (:data:`DELAY_MS`), as the ends of the streams are."""


@pytest.mark.parametrize("action", sorted(SHAPING))
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_no_data_dropped_while_other_messages_are_shaped(
    transport: str, action: str, tmp_path: Path
) -> None:
    """Every message both ways throttled, or written in pieces (partial lines, body chunks,
    continuation frames): the unmarked ones still arrive once and in order, the marked ones as
    the target rules drop, delay and duplicate them."""
    shaping = {"name": "shaping", "do": SHAPING[action], "continue": True}  # every message
    faults = fault_file(tmp_path, shaping, *target_rules(), *noise_rules("file"))

    async def unchanged(_round: int) -> None:
        pass

    async with running_proxy(transport, "--faults", str(faults)) as (proxy, url):
        async with client_wire(transport, proxy, url) as wire:
            await converse(wire, 6, unchanged)
        fired = Counter(event["rule"] for event in log_events(proxy.stderr, "fault injected"))
    assert fired["shaping"] > 100
    assert all(rule == "shaping" or is_target(rule) for rule in fired), fired
