"""The performance targets of DESIGN 11, checked against a run's figures: PASS, MISS, or SKIP
with the reason (information only: the exit status never depends on them)."""

from __future__ import annotations

from typing import Any

from proxy.tools.bench.delays import DELAY_EXCESS_LIMIT_MS
from proxy.tools.bench.memory import FLAT_GROWTH
from proxy.tools.bench.options import WS_LINKS
from proxy.tools.bench.targets import RULE_COUNT

__all__ = ["Comparisons", "RoundAdded", "check", "design_checks", "websocket_checks"]

Comparisons = dict[str, dict[str, dict[str, dict[str, float]]]]
"""Each target's figures against each base's (:func:`~.workloads.compare`)."""
RoundAdded = dict[str, dict[str, list[float]]]
"""Each target's latency added over direct in each round, by workload
(:func:`~.workloads.round_added`)."""


def check(
    name: str,
    target: str,
    value: float | None,
    limit: float | None,
    why: str = "",
    *,
    at_most: bool = True,
    rounds: list[float] | None = None,
) -> dict[str, Any]:
    """A DESIGN 11 target: PASS when ``value`` is at most (or least) ``limit``; SKIP without one.
    ``rounds``: the same figure taken in each round alone (how far the rounds agree)."""
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
    verdict = {
        "name": name,
        "target": target,
        "value": value,
        "limit": limit,
        "status": "PASS" if ok else "MISS",
        "note": why,
    }
    if rounds is not None:
        verdict["rounds"] = rounds
    return verdict


STREAM_FLOOR_RATIO = 0.6
"""The proxy's stream, at least, over the asyncio streams relay's."""
ADDED_FLOOR_RATIO = 1.2
"""The proxy's added ping and 64 KiB p50, at most, over the asyncio streams relay's."""
RULES_STREAM_RATIO = 0.95
"""The stream with non-matching rules loaded, at least, over the stream without."""
CLIENT_HEADROOM = 3.0
"""The direct stream, at least, over the proxy's: below it the Client may be what is measured."""
WS_STREAM_FLOOR_RATIO = 0.9
"""Over WebSocket, the proxy's stream, at least, over the bare ``websockets`` relay's."""
WS_ADDED_FLOOR_RATIO = 1.3
"""Over WebSocket, the proxy's added ping p50, at most, over the bare ``websockets`` relay's."""
AHEAD = 1.0
"""The proxy's stream over mitmproxy's, at least, and its added ping over mitmproxy's, at most."""


def _ratio(mine: float, base: float) -> float | None:
    return None if base <= 0 else mine / base


def _floor_checks(
    comparisons: Comparisons,
    target: str,
    floor: str,
    floor_name: str,
    workloads: tuple[tuple[str, str], ...],
    *,
    rounds: RoundAdded,
    stream_ratio: float,
    added_ratio: float,
    missing: str,
    unmeasured: str,
    prefix: str = "",
) -> list[dict[str, Any]]:
    """``target`` against a ``floor`` target: its stream at least ``stream_ratio`` of the
    floor's; the latency it adds over direct, for each of ``workloads`` (key and title), at most
    ``added_ratio`` of the floor's (each round's ratio beside, from ``rounds``). SKIP, saying
    ``missing`` without the floor, ``unmeasured`` without ``target``."""
    vs_direct = comparisons.get(target, {}).get("direct")
    vs_floor = comparisons.get(target, {}).get(floor)
    floor_vs_direct = comparisons.get(floor, {}).get("direct")
    if vs_direct is None:
        vs_floor = floor_vs_direct = None
        missing = unmeasured
    checks = [
        check(
            f"{prefix}stream at least {stream_ratio:g}x {floor_name}'s",
            target,
            None if vs_floor is None else vs_floor["stream"]["throughput_ratio"],
            stream_ratio,
            f"ratio to {floor_name}" if vs_floor else missing,
            at_most=False,
        )
    ]
    for workload, title in workloads:
        name = f"{prefix}{title} added p50 at most {added_ratio:g}x {floor_name}'s"
        if vs_direct is None or floor_vs_direct is None:
            checks.append(check(name, target, None, None, missing))
            continue
        added = vs_direct[workload]["added_p50_ms"]
        base = floor_vs_direct[workload]["added_p50_ms"]
        value = _ratio(added, base)
        why = f"adds {added:.3f} ms over direct, {floor_name} {base:.3f}"
        checks.append(
            check(
                name,
                target,
                value,
                None if value is None else added_ratio,
                why if value is not None else why + " (at or below 0)",
                rounds=_round_ratios(rounds, target, floor, workload),
            )
        )
    return checks


def _round_ratios(rounds: RoundAdded, target: str, floor: str, workload: str) -> list[float]:
    """``target``'s added latency over ``floor``'s, round by round (a round where the floor
    added nothing is left out)."""
    mine = rounds.get(target, {}).get(workload, [])
    base = rounds.get(floor, {}).get(workload, [])
    return [a / b for a, b in zip(mine, base, strict=False) if b > 0]


def _headroom_check(streams: dict[str, float], unmeasured: str, over: str = "") -> dict[str, Any]:
    """The Client is not the bottleneck: ``direct``'s stream well above the proxy's (SKIP, saying
    ``unmeasured``, without either)."""
    name = (
        f"the Client is not the bottleneck: direct {over}stream at least {CLIENT_HEADROOM:g}x "
        "the proxy's"
    )
    if "direct" not in streams or "proxy" not in streams:
        return check(name, "direct", None, None, unmeasured)
    return check(
        name,
        "direct",
        streams["direct"] / streams["proxy"],
        CLIENT_HEADROOM,
        "below it the bench may measure its own Client",
        at_most=False,
    )


def websocket_checks(
    comparisons: Comparisons,
    streams: dict[str, float],
    rounds: RoundAdded,
    *,
    unmeasured: str,
    mitmproxy: str,
) -> list[dict[str, Any]]:
    """The WebSocket targets (``comparisons``: each target against ``direct``, the bare
    ``websockets`` relay and mitmproxy; ``streams``: messages a second per target; ``rounds``:
    the latency each added over direct, round by round): the proxy
    against the relay, ahead of mitmproxy, and the Client's headroom. ``unmeasured``: why a
    check lacks the proxy or direct; ``mitmproxy``: why it lacks mitmproxy."""
    checks = _floor_checks(
        comparisons,
        "proxy",
        "websockets",
        "the websockets relay",
        (("ping", "ping"),),
        rounds=rounds,
        stream_ratio=WS_STREAM_FLOOR_RATIO,
        added_ratio=WS_ADDED_FLOOR_RATIO,
        missing="the websockets relay was not measured",
        unmeasured=unmeasured,
        prefix="WebSocket ",
    )
    checks += _floor_checks(
        comparisons,
        "proxy",
        "mitmproxy",
        "mitmproxy",
        (("ping", "ping"),),
        rounds=rounds,
        stream_ratio=AHEAD,
        added_ratio=AHEAD,
        missing=mitmproxy,
        unmeasured=unmeasured,
        prefix="WebSocket ",
    )
    checks.append(_headroom_check(streams, unmeasured, "WebSocket "))
    return checks


def design_checks(
    comparisons: Comparisons,
    memory: dict[str, Any] | None,
    ws: dict[str, Any] | None,
    delays: dict[str, Any] | None,
    streams: dict[str, float],
    *,
    rounds: RoundAdded,
    websocket: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The DESIGN 11 targets over stdio (``comparisons``: each target against ``direct`` and the
    ``asyncio`` streams relay; ``streams``: messages a second per target; ``rounds``: the
    latency each added over direct, round by round), then over WebSocket
    (``websocket``: :func:`websocket_checks`), memory, the WebSocket links and the injected
    delays."""
    checks: list[dict[str, Any]] = []
    for target in ("proxy", "proxy+rules"):
        checks += _floor_checks(
            comparisons,
            target,
            "asyncio",
            "the asyncio relay",
            (("ping", "ping"), ("prompt64k", "64 KiB prompt")),
            rounds=rounds,
            stream_ratio=STREAM_FLOOR_RATIO,
            added_ratio=ADDED_FLOOR_RATIO,
            missing="the asyncio relay was not measured",
            unmeasured=f"{target} was not measured: see errors",
        )
    if "proxy" in streams and "proxy+rules" in streams:
        checks.append(
            check(
                f"stream with rules loaded at least {RULES_STREAM_RATIO:g}x the stream without",
                "proxy+rules",
                streams["proxy+rules"] / streams["proxy"],
                RULES_STREAM_RATIO,
                f"stream with {RULE_COUNT} non-matching rules over the stream without",
                at_most=False,
            )
        )
    checks.append(_headroom_check(streams, "direct or the proxy was not measured: see errors"))
    checks += websocket
    if memory is None:
        checks.append(
            check(
                "memory flat over a long run",
                "proxy+rules",
                None,
                None,
                "run with --memory-check N",
            )
        )
    else:
        checks.append(
            check(
                "memory flat over a long run",
                "proxy+rules",
                memory["growth_ratio"],
                FLAT_GROWTH,
                "last quarter's max RSS over the first quarter's, after warm-up",
            )
        )
    checks.append(_ws_check(ws))
    checks += _delay_checks(delays)
    return checks


def _ws_check(ws: dict[str, Any] | None) -> dict[str, Any]:
    name = f"{WS_LINKS:,} concurrent WebSocket links"
    if ws is None:
        return check(name, "proxy", None, None, "left out (--ws-links 0), or failed: see errors")
    if "skipped" in ws:
        return check(name, "proxy", None, None, ws["skipped"])
    why = "links open at once, each answered right (ids and echoed params)"
    if ws["links"] < WS_LINKS:
        verdict = "all" if ws["passed"] else f"{ws['answered']} of {ws['links']}"
        return check(
            name,
            "proxy",
            None,
            None,
            f"only {ws['links']} links run ({verdict} open at once and answered); "
            f"--ws-links {WS_LINKS} for the target",
        )
    return check(name, "proxy", ws["answered"], WS_LINKS, why, at_most=False)


def _delay_checks(delays: dict[str, Any] | None) -> list[dict[str, Any]]:
    name = "injected delays within +2 ms at p99"
    if delays is None:
        return [check(name, "proxy", None, None, "left out (--delays 0), or failed: see errors")]
    return [
        check(
            name,
            f"proxy, {variant}",
            figures["excess"]["p99_ms"],
            DELAY_EXCESS_LIMIT_MS,
            "ms past the setting and the undelayed round trip's p50",
        )
        for variant, figures in delays["variants"].items()
    ]
