"""``acp-proxy bench``: the proxy's cost, measured as ratios in one run (DESIGN 11).

What is measured
----------------
The bench process plays the Client. For each *target* it spawns, on loopback pipes, one process
tree and drives three *workloads* through it:

* ``ping``: small requests, one in flight at a time (ping-pong); the round trip of each is timed
  with :func:`time.perf_counter` from just before the write to just after the answer is read;
* ``stream``: one request asks the Agent for N ``session/update`` notifications, written as fast as
  it can; throughput is N over the time from the request's write to the last message read;
* ``prompt64k``: ``session/prompt`` requests carrying a 64 KiB text, one in flight, each round
  trip timed.

The targets are the same bench Agent (a tiny stdio echo Agent, :func:`agent_main`, started as
``python -m proxy.bench --agent``) reached

* ``direct``: spawned by the bench itself;
* ``socat``: through a byte relay, ``socat -b 262144 STDIO EXEC:...`` (only when ``socat`` is on
  ``PATH``; ``apt-get install socat`` to get the column; the report says when it is absent);
* ``proxy``: through ``python -m proxy run -- AGENT`` with no rules;
* ``proxy+rules``: the same with :data:`RULES` loaded, a realistic fault file whose rules are
  evaluated on every message but never fire (other methods, a params subset that does not match, a
  probability-0 rule on ``session/prompt``).

Both proxies run with ``--log-level warning``. A round runs every target in turn, each in a fresh
process tree; samples of all rounds are pooled, so slow drift touches every target alike.

The report gives p50/p99 round trip per target and workload, the latency added over ``direct``
(and over ``socat``), throughput and its ratio to ``direct`` (and ``socat``), and the peak resident
memory of the process the bench spawned (the Agent for ``direct``, socat, the proxy): ``VmHWM``
read from ``/proc/PID/status`` before the process is told to stop, or, without ``/proc``,
``ru_maxrss`` of :func:`resource.getrusage` (``RUSAGE_CHILDREN``, the largest child so far, a
coarser figure; ``rss_source`` says which). The DESIGN 11 targets are checked and marked PASS,
MISS or SKIP next to their figures; they are information only, the exit status does not depend on
them (0, or 1 when a target could not be driven at all).

``--memory-check N`` then sends N messages (mostly small requests, with a notification stream
and a 64 KiB prompt every so often, pipelined 32 at a time) through the proxy with the rules
loaded, sampling its ``VmRSS``; memory is *flat* when, after the first 10% (warm-up), the largest
sample of the last quarter is within 10% of the largest of the first quarter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RULES",
    "TARGETS",
    "WORKLOADS",
    "BenchError",
    "BenchOptions",
    "agent_main",
    "bench_main",
    "main",
    "make_options",
    "render",
    "run_bench",
]

TARGETS = ("direct", "socat", "proxy", "proxy+rules")
WORKLOADS = ("ping", "stream", "prompt64k")
PROMPT_BYTES = 64 * 1024
STREAM_METHOD = "_bench/stream"
READ_LIMIT = 1 << 20
ANSWER_TIMEOUT = 60.0
"""Seconds any single answer may take before the bench gives up on a target."""

RULES = """\
# A realistic rule set that matches nothing the bench sends: every rule is evaluated on every
# message, none fires.
version: 1
seed: 11
rules:
  - name: drop-cancel
    when: {direction: to_agent, kind: notification, method: session/cancel}
    do: {action: drop}
  - name: slow-tool-calls
    when:
      direction: to_client
      kind: notification
      method: session/update
      params: {update: {sessionUpdate: tool_call}}
    do: {action: delay, ms: 50, jitter_ms: 10}
  - name: never-fail-prompts
    when: {direction: to_agent, kind: request, method: session/prompt}
    schedule: {probability: 0.0}
    do: {action: error, code: -32603}
  - name: replay-keyed-prompts
    when: {direction: to_agent, kind: request, method: session/prompt, idempotency_key: present}
    do: {action: duplicate, copies: 1, gap_ms: 20}
  - name: other-sessions-slow
    when: {session: "other-*"}
    do: {action: delay, ms: 40}
  - name: kill-on-write
    when: {direction: to_agent, method: fs/write_text_file}
    do: {action: kill_agent, signal: KILL}
  - name: sever-terminals
    when: {method: "terminal/*"}
    do: {action: sever, side: both}
  - name: garble-loads
    when: {direction: to_client, kind: response, method: session/load}
    schedule: {every: 3}
    do: {action: corrupt, mode: garbage}
"""


# --- the bench Agent -------------------------------------------------------------------------


def agent_main() -> int:
    """The bench Agent: answers every request at once; ``_bench/stream`` first sends N updates.

    Stdlib only, one message per line on stdin/stdout. ``_bench/stream`` (params ``{"count": N}``)
    writes N ``session/update`` notifications, buffered, then its answer; any other request is
    answered ``{"ok": true, "size": bytes of the request}``; notifications are ignored.
    """
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        if message["method"] == STREAM_METHOD:
            count = int((message.get("params") or {}).get("count", 0))
            for seq in range(count):
                out.write(_update(seq))
            result: dict[str, object] = {"sent": count}
        else:
            result = {"ok": True, "size": len(line)}
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode())
        out.write(b"\n")
        out.flush()
    return 0


_UPDATE_HEAD = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"bench-1","update":'
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"chunk '
)


def _update(seq: int) -> bytes:
    return b'%s%d"}}}}\n' % (_UPDATE_HEAD, seq)


# --- the Client side -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What a bench run does."""

    requests: int = 2000
    notifications: int = 20000
    prompts: int = 300
    rounds: int = 3
    memory_check: int = 0
    """Messages of the long-run memory check (0: no check)."""
    short: bool = False
    socat: str | None = None
    """The socat executable, or ``None`` for no byte-relay column."""
    python: str = sys.executable

    @classmethod
    def short_run(cls, **changes: Any) -> BenchOptions:
        """Tiny counts, for CI: checks that everything runs, not how fast."""
        values: dict[str, Any] = {
            "requests": 30,
            "notifications": 300,
            "prompts": 10,
            "rounds": 1,
            "short": True,
            "socat": shutil.which("socat"),
        }
        values.update(changes)
        return cls(**values)


class BenchError(Exception):
    """A target could not be driven (it died, or did not answer)."""


@dataclass(slots=True)
class _Samples:
    ping: list[float] = field(default_factory=list)
    prompt: list[float] = field(default_factory=list)
    stream_messages: int = 0
    stream_seconds: float = 0.0
    peak_rss_kib: int = 0


def _rss_source() -> str:
    return "VmHWM" if Path("/proc/self/status").exists() else "ru_maxrss(RUSAGE_CHILDREN)"


def _proc_kib(pid: int, key: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def _children_maxrss_kib() -> int:
    """The largest resident set of any waited-for child so far (the fallback without /proc)."""
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return maxrss // 1024 if sys.platform == "darwin" else maxrss


def _agent_argv(python: str) -> list[str]:
    return [python, "-m", "proxy.bench", "--agent"]


def _argv(target: str, options: BenchOptions, rules: Path) -> list[str]:
    agent = _agent_argv(options.python)
    if target == "direct":
        return agent
    if target == "socat":
        assert options.socat is not None
        return [options.socat, "-b", "262144", "STDIO", "EXEC:" + " ".join(agent)]
    proxy = [options.python, "-m", "proxy", "run", "--log-level", "warning"]
    if target == "proxy+rules":
        proxy += ["--faults", str(rules), "--seed", "1"]
    return [*proxy, "--", *agent]


class _Peer:
    """One spawned process tree, driven as a Client over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Any) -> None:
        self.process = process
        self._stderr = stderr
        assert process.stdin is not None
        assert process.stdout is not None
        self.writer = process.stdin
        self.reader = process.stdout
        self._next_id = 0

    @classmethod
    async def spawn(cls, argv: Sequence[str]) -> _Peer:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=READ_LIMIT,
        )
        return cls(process, stderr)

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        return self._next_id, json.dumps(message).encode() + b"\n"

    async def read_line(self) -> bytes:
        try:
            line = await asyncio.wait_for(self.reader.readline(), ANSWER_TIMEOUT)
        except TimeoutError:
            raise BenchError(f"no answer in {ANSWER_TIMEOUT} s{self.stderr_tail()}") from None
        if not line:
            raise BenchError(f"the target closed its stdout{self.stderr_tail()}")
        return line

    async def answer(self, request_id: int) -> dict[str, Any]:
        """Read until the answer to ``request_id``; anything else on the way is an error."""
        line = await self.read_line()
        message = json.loads(line)
        if not isinstance(message, dict) or message.get("id") != request_id:
            raise BenchError(f"expected the answer to {request_id}, got {line[:200]!r}")
        if "result" not in message:
            raise BenchError(f"request {request_id} failed: {line[:200]!r}")
        return message

    async def call(self, method: str, params: dict[str, Any]) -> float:
        """One round trip; its duration in seconds."""
        request_id, data = self.request(method, params)
        start = time.perf_counter()
        self.writer.write(data)
        await self.writer.drain()
        await self.answer(request_id)
        return time.perf_counter() - start

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
        return f"; its stderr ends: {tail}" if tail else ""

    async def close(self) -> None:
        with contextlib.suppress(ConnectionError):
            self.writer.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        finally:
            self._stderr.close()


async def _stream(peer: _Peer, count: int) -> tuple[int, float]:
    """Ask for ``count`` notifications; the count received and the seconds it took."""
    request_id, data = peer.request(STREAM_METHOD, {"count": count})
    start = time.perf_counter()
    peer.writer.write(data)
    await peer.writer.drain()
    received = 0
    while True:
        line = await peer.read_line()
        if b'"session/update"' in line:
            received += 1
            continue
        message = json.loads(line)
        if message.get("id") != request_id:
            raise BenchError(f"unexpected message in the stream: {line[:200]!r}")
        break
    elapsed = time.perf_counter() - start
    if received != count:
        raise BenchError(f"asked for {count} notifications, got {received}")
    return received, elapsed


def _prompt_params(size: int) -> dict[str, Any]:
    return {"sessionId": "bench-1", "prompt": [{"type": "text", "text": "x" * size}]}


async def _drive(argv: Sequence[str], options: BenchOptions, samples: _Samples) -> None:
    """One round on one target: the three workloads, in one process tree."""
    peer = await _Peer.spawn(argv)
    try:
        await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        warmup = max(5, options.requests // 20)
        for _ in range(warmup):
            await peer.call("_bench/ping", {"seq": -1})
        for seq in range(options.requests):
            samples.ping.append(await peer.call("_bench/ping", {"seq": seq}))
        await _stream(peer, min(100, options.notifications))  # warm-up
        received, seconds = await _stream(peer, options.notifications)
        samples.stream_messages += received
        samples.stream_seconds += seconds
        prompt = _prompt_params(PROMPT_BYTES)
        await peer.call("session/prompt", prompt)  # warm-up
        for _ in range(options.prompts):
            samples.prompt.append(await peer.call("session/prompt", prompt))
        peak = _proc_kib(peer.process.pid, "VmHWM")
    finally:
        await peer.close()
    samples.peak_rss_kib = max(samples.peak_rss_kib, peak or _children_maxrss_kib())


# --- figures ---------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def _latency(values: Sequence[float]) -> dict[str, float | int]:
    ms = [value * 1000 for value in values]
    return {
        "count": len(ms),
        "p50_ms": _percentile(ms, 50),
        "p99_ms": _percentile(ms, 99),
        "mean_ms": statistics.fmean(ms),
        "per_second": len(ms) / sum(values),
    }


def _figures(samples: _Samples) -> dict[str, dict[str, float | int]]:
    prompt = _latency(samples.prompt)
    prompt["mib_per_second"] = len(samples.prompt) * PROMPT_BYTES / sum(samples.prompt) / 2**20
    return {
        "ping": _latency(samples.ping),
        "stream": {
            "count": samples.stream_messages,
            "seconds": samples.stream_seconds,
            "per_second": samples.stream_messages / samples.stream_seconds,
        },
        "prompt64k": prompt,
    }


def _compare(
    mine: dict[str, dict[str, float | int]], base: dict[str, dict[str, float | int]]
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for workload in ("ping", "prompt64k"):
        a, b = mine[workload], base[workload]
        out[workload] = {
            "added_p50_ms": a["p50_ms"] - b["p50_ms"],
            "added_p99_ms": a["p99_ms"] - b["p99_ms"],
            "p50_ratio": a["p50_ms"] / b["p50_ms"],
        }
    out["stream"] = {
        "throughput_ratio": mine["stream"]["per_second"] / base["stream"]["per_second"]
    }
    return out


def _check(
    name: str,
    target: str,
    value: float | None,
    limit: float | None,
    why: str = "",
    *,
    at_most: bool = True,
) -> dict[str, Any]:
    """A DESIGN 11 target: PASS when ``value`` is at most (or least) ``limit``; SKIP without one."""
    if value is None or limit is None:
        return {
            "name": name,
            "target": target,
            "value": None,
            "limit": None,
            "status": "SKIP",
            "note": why,
        }
    ok = value <= limit if at_most else value >= limit
    return {
        "name": name,
        "target": target,
        "value": value,
        "limit": limit,
        "status": "PASS" if ok else "MISS",
        "note": why,
    }


def _design_checks(
    comparisons: dict[str, dict[str, dict[str, dict[str, float]]]], memory: dict[str, Any] | None
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    socat_vs_direct = comparisons.get("socat", {}).get("direct")
    for target in ("proxy", "proxy+rules"):
        vs_direct = comparisons.get(target, {}).get("direct")
        if vs_direct is None:
            continue
        added = vs_direct["ping"]["added_p50_ms"]
        if socat_vs_direct is None:
            checks.append(
                _check("ping added p50 within 2x socat's", target, None, None, "socat absent")
            )
        else:
            # socat's own added latency can be ~0 or below (noise); never ask for less than 0.
            relay = max(socat_vs_direct["ping"]["added_p50_ms"], 0.0)
            checks.append(
                _check(
                    "ping added p50 within 2x socat's",
                    target,
                    added,
                    2 * relay,
                    "ms over direct; limit is 2x socat's",
                )
            )
        checks.append(
            _check(
                "stream throughput at least 50% of direct",
                target,
                vs_direct["stream"]["throughput_ratio"],
                0.5,
                "ratio to direct",
                at_most=False,
            )
        )
        checks.append(
            _check(
                "64 KiB prompt added p50 under 0.5 ms",
                target,
                vs_direct["prompt64k"]["added_p50_ms"],
                0.5,
                "ms over direct",
            )
        )
    if memory is None:
        checks.append(
            _check(
                "memory flat over a long run",
                "proxy+rules",
                None,
                None,
                "run with --memory-check N",
            )
        )
    else:
        checks.append(
            _check(
                "memory flat over a long run",
                "proxy+rules",
                memory["growth_ratio"],
                1.10,
                "last quarter's max RSS over the first quarter's, after warm-up",
            )
        )
    checks.append(
        _check(
            "1,000 concurrent WebSocket links", "proxy", None, None, "not measured by this bench"
        )
    )
    checks.append(
        _check(
            "injected delays within +2 ms at p99", "proxy", None, None, "not measured by this bench"
        )
    )
    return checks


# --- the long-run memory check ---------------------------------------------------------------


async def _memory_check(options: BenchOptions, rules: Path) -> dict[str, Any]:
    peer = await _Peer.spawn(_argv("proxy+rules", options, rules))
    pid = peer.process.pid
    window = 32
    sample_every = max(window, options.memory_check // 64)
    samples: list[tuple[int, int]] = []
    sent = 0
    prompt = _prompt_params(PROMPT_BYTES)
    try:
        await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        next_sample = 0
        batch = 0
        while sent < options.memory_check:
            batch += 1
            if batch % 50 == 0:
                received, _seconds = await _stream(peer, 200)
                sent += received + 1
            else:
                ids = []
                for i in range(window):
                    big = batch % 10 == 0 and i == 0
                    request_id, data = peer.request(
                        "session/prompt" if big else "_bench/ping",
                        prompt if big else {"seq": sent + i},
                    )
                    ids.append(request_id)
                    peer.writer.write(data)
                await peer.writer.drain()
                for request_id in ids:
                    await peer.answer(request_id)
                sent += window
            if sent >= next_sample:
                rss = _proc_kib(pid, "VmRSS")
                if rss is not None:
                    samples.append((sent, rss))
                next_sample = sent + sample_every
    finally:
        peak = _proc_kib(pid, "VmHWM")
        await peer.close()
    peak = peak or _children_maxrss_kib()
    if len(samples) < 8:
        return {
            "messages": sent,
            "samples": samples,
            "peak_rss_kib": peak,
            "flat": None,
            "growth_ratio": None,
            "note": "too few RSS samples (no /proc?)",
        }
    steady = samples[len(samples) // 10 :]
    quarter = max(1, len(steady) // 4)
    first = max(rss for _, rss in steady[:quarter])
    last = max(rss for _, rss in steady[-quarter:])
    growth = last / first
    return {
        "messages": sent,
        "samples": samples,
        "peak_rss_kib": peak,
        "first_quarter_max_kib": first,
        "last_quarter_max_kib": last,
        "growth_ratio": growth,
        "flat": growth <= 1.10,
    }


# --- the run ---------------------------------------------------------------------------------


async def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every target and workload; the report as a JSON-ready dict (see :func:`render`)."""
    targets = [t for t in TARGETS if t != "socat" or options.socat is not None]
    samples = {target: _Samples() for target in targets}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as directory:
        rules = Path(directory) / "rules.yaml"
        rules.write_text(RULES)
        for _round in range(options.rounds):
            for target in targets:
                if target in errors:
                    continue
                try:
                    await _drive(_argv(target, options, rules), options, samples[target])
                except (BenchError, OSError, ValueError) as exc:
                    errors[target] = f"{type(exc).__name__}: {exc}"
        memory = None
        if options.memory_check > 0 and "proxy+rules" not in errors:
            try:
                memory = await _memory_check(options, rules)
            except (BenchError, OSError, ValueError) as exc:
                errors["memory_check"] = f"{type(exc).__name__}: {exc}"
    report_targets: dict[str, Any] = {}
    figures: dict[str, dict[str, dict[str, float | int]]] = {}
    for target in TARGETS:
        entry: dict[str, Any] = {"available": target in samples}
        if target in samples:
            entry["command"] = _argv(target, options, Path("RULES.yaml"))
            entry["process"] = {"direct": "agent", "socat": "socat"}.get(target, "proxy")
        else:
            entry["reason"] = (
                "socat left out (--no-socat)"
                if shutil.which("socat")
                else "socat not found on PATH (apt-get install socat for this column)"
            )
        if target in errors:
            entry["error"] = errors[target]
        elif target in samples:
            figures[target] = _figures(samples[target])
            entry["workloads"] = figures[target]
            entry["peak_rss_kib"] = samples[target].peak_rss_kib
        report_targets[target] = entry
    comparisons: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for target, mine in figures.items():
        comparisons[target] = {
            base: _compare(mine, figures[base])
            for base in ("direct", "socat")
            if base in figures and base != target
        }
    return {
        "bench": "acp-proxy bench",
        "version": 1,
        "mode": "short" if options.short else "normal",
        "config": {
            "requests": options.requests,
            "notifications": options.notifications,
            "prompts": options.prompts,
            "prompt_bytes": PROMPT_BYTES,
            "rounds": options.rounds,
            "python": platform.python_version(),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
            "socat": options.socat,
            "rss_source": _rss_source(),
        },
        "targets": report_targets,
        "comparisons": comparisons,
        "design_targets": _design_checks(comparisons, memory),
        "memory_check": memory,
        "errors": errors,
    }


# --- rendering -------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(report: dict[str, Any]) -> str:
    """The report as text tables."""
    config = report["config"]
    lines = [
        f"acp-proxy bench ({report['mode']}): {config['rounds']} round(s), "
        f"{config['requests']} pings, {config['notifications']} notifications, "
        f"{config['prompts']} x 64 KiB prompts per round; {config['machine']}, "
        f"Python {config['python']}",
    ]
    if config["socat"] is None:
        lines.append("socat: absent, no byte-relay column (apt-get install socat to add it)")
    targets = report["targets"]
    comparisons = report["comparisons"]
    for workload, title in (("ping", "ping-pong, small requests"), ("prompt64k", "64 KiB prompts")):
        lines += [
            "",
            f"{title} (round trip, ms)",
            f"{'target':<12} {'p50':>8} {'p99':>8} {'+p50':>8} {'+p99':>8} "
            f"{'x direct':>9} {'+p50 vs socat':>14} {'req/s':>9}",
        ]
        for target in TARGETS:
            entry = targets[target]
            if "workloads" not in entry:
                lines.append(f"{target:<12} {entry.get('error') or entry.get('reason')}")
                continue
            fig = entry["workloads"][workload]
            vs_direct = comparisons[target].get("direct", {}).get(workload, {})
            vs_socat = comparisons[target].get("socat", {}).get(workload, {})
            lines.append(
                f"{target:<12} {_num(fig['p50_ms']):>8} {_num(fig['p99_ms']):>8} "
                f"{_num(vs_direct.get('added_p50_ms')):>8} "
                f"{_num(vs_direct.get('added_p99_ms')):>8} "
                f"{_num(vs_direct.get('p50_ratio'), 2):>9} "
                f"{_num(vs_socat.get('added_p50_ms')):>14} {fig['per_second']:>9.0f}"
            )
    lines += [
        "",
        "session/update stream (throughput)",
        f"{'target':<12} {'msg/s':>10} {'x direct':>9} {'x socat':>8} {'peak RSS':>10}",
    ]
    for target in TARGETS:
        entry = targets[target]
        if "workloads" not in entry:
            lines.append(f"{target:<12} {entry.get('error') or entry.get('reason')}")
            continue
        fig = entry["workloads"]["stream"]
        ratio_direct = comparisons[target].get("direct", {}).get("stream", {})
        ratio_socat = comparisons[target].get("socat", {}).get("stream", {})
        lines.append(
            f"{target:<12} {fig['per_second']:>10.0f} "
            f"{_num(ratio_direct.get('throughput_ratio'), 2):>9} "
            f"{_num(ratio_socat.get('throughput_ratio'), 2):>8} "
            f"{entry['peak_rss_kib'] / 1024:>7.1f} MiB  ({entry['process']})"
        )
    lines.append(f"peak RSS from {config['rss_source']}, of the process the bench spawned")
    memory = report["memory_check"]
    if memory is not None:
        lines += ["", f"memory check: {memory['messages']} messages through proxy+rules"]
        if memory.get("growth_ratio") is None:
            lines.append(f"  {memory.get('note')}")
        else:
            lines.append(
                f"  first quarter max {memory['first_quarter_max_kib'] / 1024:.1f} MiB, "
                f"last quarter max {memory['last_quarter_max_kib'] / 1024:.1f} MiB, "
                f"x{memory['growth_ratio']:.3f}: {'flat' if memory['flat'] else 'GROWING'}"
            )
    lines += ["", "DESIGN 11 targets (information only; the exit status ignores them)"]
    for check in report["design_targets"]:
        figure = (
            ""
            if check["value"] is None
            else (f"{check['value']:.3f} (limit {check['limit']:.3f}) ")
        )
        lines.append(
            f"  {check['status']:<4} {check['name']} [{check['target']}]: {figure}{check['note']}"
        )
    for where, error in report["errors"].items():
        lines.append(f"error: {where}: {error}")
    return "\n".join(lines)


# --- the command line ------------------------------------------------------------------------


def make_options(
    *,
    short: bool = False,
    requests: int | None = None,
    notifications: int | None = None,
    prompts: int | None = None,
    rounds: int | None = None,
    memory_check: int = 0,
    socat: bool = True,
) -> BenchOptions:
    """The options of a run: the defaults (or ``short``'s tiny counts) with what was given.

    ``socat=False`` leaves the byte relay out even when ``socat`` is on ``PATH``.
    """
    given = {
        "requests": requests,
        "notifications": notifications,
        "prompts": prompts,
        "rounds": rounds,
    }
    for name, value in given.items():
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be at least 1")
    if memory_check < 0:
        raise ValueError("--memory-check must be 0 or more")
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    changes["memory_check"] = memory_check
    changes["socat"] = shutil.which("socat") if socat else None
    return BenchOptions.short_run(**changes) if short else BenchOptions(**changes)


def bench_main(options: BenchOptions, *, as_json: bool) -> int:
    """Run the bench, print its report; 0, or 1 when a target could not be driven."""
    report = asyncio.run(run_bench(options))
    text = json.dumps(report, indent=2) if as_json else render(report)
    sys.stdout.write(text + "\n")
    return 1 if report["errors"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m proxy.bench [--json] [--short] ...``, or ``--agent`` for the bench Agent."""
    parser = argparse.ArgumentParser(prog="acp-proxy bench", description=__doc__.split("\n")[0])
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    parser.add_argument("--short", action="store_true", help="Tiny counts, for CI.")
    parser.add_argument("--requests", type=int, help="Ping-pong requests per round.")
    parser.add_argument("--notifications", type=int, help="Notifications per round.")
    parser.add_argument("--prompts", type=int, help="64 KiB prompts per round.")
    parser.add_argument("--rounds", type=int, help="Rounds (fresh processes each).")
    parser.add_argument(
        "--memory-check",
        type=int,
        metavar="N",
        help="Also send N messages through the proxy, watching its memory.",
    )
    parser.add_argument("--no-socat", action="store_true", help="Leave out the socat column.")
    args = parser.parse_args(argv)
    if args.agent:
        return agent_main()
    try:
        options = make_options(
            short=args.short,
            requests=args.requests,
            notifications=args.notifications,
            prompts=args.prompts,
            rounds=args.rounds,
            memory_check=args.memory_check or 0,
            socat=not args.no_socat,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return bench_main(options, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
