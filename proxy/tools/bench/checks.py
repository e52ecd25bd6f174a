"""The performance targets of DESIGN 11, checked against a run's figures: PASS, MISS, or SKIP
with the reason (information only: the exit status never depends on them)."""

from __future__ import annotations

from typing import Any

from proxy.tools.bench.delays import DELAY_EXCESS_LIMIT_MS
from proxy.tools.bench.memory import FLAT_GROWTH
from proxy.tools.bench.options import WS_LINKS

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


def design_checks(
    comparisons: dict[str, dict[str, dict[str, dict[str, float]]]],
    memory: dict[str, Any] | None,
    ws: dict[str, Any] | None,
    delays: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    socat_vs_direct = comparisons.get("socat", {}).get("direct")
    floor = comparisons.get("asyncio", {}).get("direct")
    floor_note = (
        "" if floor is None else f"; a bare asyncio relay adds {floor['ping']['added_p50_ms']:.3f}"
    )
    for target in ("proxy", "proxy+rules"):
        vs_direct = comparisons.get(target, {}).get("direct")
        if vs_direct is None:
            continue
        added = vs_direct["ping"]["added_p50_ms"]
        if socat_vs_direct is None:
            checks.append(
                check("ping added p50 within 2x socat's", target, None, None, "socat absent")
            )
        else:
            # socat's own added latency can be ~0 or below (noise); never ask for less than 0.
            measured = socat_vs_direct["ping"]["added_p50_ms"]
            relay = max(measured, 0.0)
            socat_note = f"; socat adds {measured:.3f}"
            if relay < 0.005:
                socat_note += " (below what this run can measure)"
            checks.append(
                check(
                    "ping added p50 within 2x socat's",
                    target,
                    added,
                    2 * relay,
                    "ms over direct; limit is 2x socat's" + socat_note + floor_note,
                )
            )
        checks.append(
            check(
                "stream throughput at least 50% of direct",
                target,
                vs_direct["stream"]["throughput_ratio"],
                0.5,
                "ratio to direct",
                at_most=False,
            )
        )
        checks.append(
            check(
                "64 KiB prompt added p50 under 0.5 ms",
                target,
                vs_direct["prompt64k"]["added_p50_ms"],
                0.5,
                "ms over direct",
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
