"""The performance targets of DESIGN 11, checked against a run's figures: PASS, MISS, or SKIP
with the reason (information only: the exit status never depends on them)."""

from __future__ import annotations

from typing import Any

from proxy.tools.bench.delays import DELAY_EXCESS_LIMIT_MS
from proxy.tools.bench.memory import FLAT_GROWTH
from proxy.tools.bench.options import WS_LINKS
from proxy.tools.bench.targets import RULE_COUNT

__all__ = ["check", "design_checks"]


def check(
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


STREAM_FLOOR_RATIO = 0.6
"""The proxy's stream, at least, over the asyncio streams relay's."""
ADDED_FLOOR_RATIO = 1.2
"""The proxy's added ping and 64 KiB p50, at most, over the asyncio streams relay's."""
RULES_STREAM_RATIO = 0.95
"""The stream with non-matching rules loaded, at least, over the stream without."""
CLIENT_HEADROOM = 3.0
"""The direct stream, at least, over the proxy's: below it the Client may be what is measured."""


def _ratio(mine: float, base: float) -> float | None:
    return None if base <= 0 else mine / base


def design_checks(
    comparisons: dict[str, dict[str, dict[str, dict[str, float]]]],
    memory: dict[str, Any] | None,
    ws: dict[str, Any] | None,
    delays: dict[str, Any] | None,
    streams: dict[str, float],
) -> list[dict[str, Any]]:
    """The DESIGN 11 targets over stdio (``comparisons``: each target against ``direct`` and the
    ``asyncio`` streams relay; ``streams``: messages a second per target), then memory, the
    WebSocket links and the injected delays."""
    checks: list[dict[str, Any]] = []
    floor = comparisons.get("asyncio", {}).get("direct")
    why_no_floor = "the asyncio relay was not measured"
    for target in ("proxy", "proxy+rules"):
        vs_direct = comparisons.get(target, {}).get("direct")
        vs_floor = comparisons.get(target, {}).get("asyncio")
        if vs_direct is None:
            continue
        checks.append(
            check(
                f"stream at least {STREAM_FLOOR_RATIO}x the asyncio relay's",
                target,
                None if vs_floor is None else vs_floor["stream"]["throughput_ratio"],
                STREAM_FLOOR_RATIO,
                "ratio to the asyncio streams relay" if vs_floor else why_no_floor,
                at_most=False,
            )
        )
        for workload, title in (("ping", "ping"), ("prompt64k", "64 KiB prompt")):
            added = vs_direct[workload]["added_p50_ms"]
            base = None if floor is None else floor[workload]["added_p50_ms"]
            value = None if base is None else _ratio(added, base)
            why = (
                why_no_floor
                if base is None
                else f"adds {added:.3f} ms over direct, the asyncio relay {base:.3f}"
            )
            checks.append(
                check(
                    f"{title} added p50 at most {ADDED_FLOOR_RATIO}x the asyncio relay's",
                    target,
                    value,
                    None if value is None else ADDED_FLOOR_RATIO,
                    why if value is not None or base is None else why + " (at or below 0)",
                )
            )
    if "proxy" in streams and "proxy+rules" in streams:
        checks.append(
            check(
                f"rules loaded cost at most {1 - RULES_STREAM_RATIO:.0%} of the stream",
                "proxy+rules",
                streams["proxy+rules"] / streams["proxy"],
                RULES_STREAM_RATIO,
                f"stream with {RULE_COUNT} non-matching rules over the stream without",
                at_most=False,
            )
        )
    if "direct" in streams and "proxy" in streams:
        checks.append(
            check(
                f"the Client is not the bottleneck: direct stream at least {CLIENT_HEADROOM:g}x "
                "the proxy's",
                "direct",
                streams["direct"] / streams["proxy"],
                CLIENT_HEADROOM,
                "below it the bench may measure its own Client",
                at_most=False,
            )
        )
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
