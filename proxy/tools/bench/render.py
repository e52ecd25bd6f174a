"""The bench's report as text tables: the workloads per target, over stdio then over WebSocket,
the checks, the targets met."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.tools.bench.delays import DELAY_METHOD
from proxy.tools.bench.targets import TARGETS
from proxy.tools.bench.ws_targets import WS_TARGETS

__all__ = ["render"]


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(report: dict[str, Any]) -> str:
    """The report as text tables."""
    config = report["config"]
    lines = [
        f"acp-proxy bench ({report['mode']}): {config['rounds']} round(s), "
        f"{config['requests']} pings, {config['notifications']} notifications, "
        f"{config['prompts']} x 64 KiB prompts per round; {config['machine']}, "
        f"Python {config['python']}; {report['core']['build']}",
    ]
    allocator = config.get("allocator")
    if allocator:
        fixed = ", ".join(f"{name}={value}" for name, value in allocator.items())
        lines.append(f"every process with glibc's allocator thresholds fixed: {fixed}")
    if config["socat"] is None:
        lines.append("socat: absent, no byte-relay column (apt-get install socat to add it)")
    lines += _workload_tables(report["targets"], report["comparisons"], TARGETS, "asyncio")
    websocket = report["websocket"]
    if websocket is not None:
        lines += [
            "",
            "Over WebSocket: the WebSocket Agent, direct or through a bare websockets relay, "
            "mitmproxy (reverse mode) or the proxy",
        ]
        mitmproxy = websocket["targets"]["mitmproxy"]
        if not mitmproxy["available"]:
            lines.append(f"mitmproxy: {mitmproxy['reason']}")
        lines += _workload_tables(
            websocket["targets"], websocket["comparisons"], WS_TARGETS, "websockets"
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
    if report["delays"] is not None:
        lines += _render_delays(report["delays"])
    if report["ws_links"] is not None:
        lines += _render_ws(report["ws_links"])
    lines += ["", "Performance targets (information only; the exit status ignores them)"]
    if report["mode"] == "short":
        lines.append("  (--short: too few samples for these verdicts to mean anything)")
    for check in report["design_targets"]:
        figure = (
            ""
            if check["value"] is None
            else f"{_figure(check['value'])} (limit {_figure(check['limit'])}"
            f"{_rounds(check.get('rounds', []))}) "
        )
        lines.append(
            f"  {check['status']:<4} {check['name']} [{check['target']}]: {figure}{check['note']}"
        )
    for where, error in report["errors"].items():
        lines.append(f"error: {where}: {error}")
    return "\n".join(lines)


def _workload_tables(
    targets: dict[str, Any], comparisons: dict[str, Any], names: Sequence[str], floor: str
) -> list[str]:
    """The round trips and the stream of each of ``names``, against direct and ``floor``."""
    lines: list[str] = []
    for workload, title in (("ping", "ping-pong, small requests"), ("prompt64k", "64 KiB prompts")):
        lines += [
            "",
            f"{title} (round trip, ms; + is added over direct)",
            f"{'target':<16} {'p50':>8} {'p99':>8} {'+p50':>8} {'+p99':>8} "
            f"{'x direct':>9} {'+p50 x ' + floor:>18} {'req/s':>9}",
        ]
        for target in names:
            entry = targets[target]
            if "workloads" not in entry:
                lines.append(f"{target:<16} {entry.get('error') or entry.get('reason')}")
                continue
            fig = entry["workloads"][workload]
            vs_direct = comparisons[target].get("direct", {}).get(workload, {})
            lines.append(
                f"{target:<16} {_num(fig['p50_ms']):>8} {_num(fig['p99_ms']):>8} "
                f"{_num(vs_direct.get('added_p50_ms')):>8} "
                f"{_num(vs_direct.get('added_p99_ms')):>8} "
                f"{_num(vs_direct.get('p50_ratio'), 2):>9} "
                f"{_num(_added_over_floor(comparisons, target, workload, floor), 2):>18} "
                f"{fig['per_second']:>9.0f}"
            )
    lines += [
        "",
        "session/update stream (throughput)",
        f"{'target':<16} {'msg/s':>10} {'x direct':>9} {'x ' + floor:>12} {'peak RSS':>10}",
    ]
    for target in names:
        entry = targets[target]
        if "workloads" not in entry:
            lines.append(f"{target:<16} {entry.get('error') or entry.get('reason')}")
            continue
        fig = entry["workloads"]["stream"]
        ratio_direct = comparisons[target].get("direct", {}).get("stream", {})
        ratio_floor = comparisons[target].get(floor, {}).get("stream", {})
        lines.append(
            f"{target:<16} {fig['per_second']:>10.0f} "
            f"{_num(ratio_direct.get('throughput_ratio'), 2):>9} "
            f"{_num(ratio_floor.get('throughput_ratio'), 2):>12} "
            f"{entry['peak_rss_kib'] / 1024:>7.1f} MiB  ({entry['process']})"
        )
    return lines


def _added_over_floor(
    comparisons: dict[str, Any], target: str, workload: str, floor: str
) -> float | None:
    """``target``'s latency added over direct, as a multiple of ``floor``'s."""
    mine = comparisons[target].get("direct", {}).get(workload)
    base = comparisons.get(floor, {}).get("direct", {}).get(workload)
    if mine is None or base is None or base["added_p50_ms"] <= 0:
        return None
    return float(mine["added_p50_ms"] / base["added_p50_ms"])


def _figure(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.3f}"


SHOWN_ROUNDS = 6
"""Rounds whose figures a check lists one by one; past them, their range."""


def _rounds(figures: Sequence[float]) -> str:
    """A check's figure in each round alone: how far the rounds agree (none shown for one)."""
    if len(figures) < 2:
        return ""
    if len(figures) <= SHOWN_ROUNDS:
        return "; each round " + " ".join(f"{figure:.2f}" for figure in figures)
    return f"; {len(figures)} rounds {min(figures):.2f}-{max(figures):.2f}"


def _render_delays(delays: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"injected delays: {delays['setting_ms']:g} ms on {DELAY_METHOD} toward the Agent, "
        f"{delays['requests']} per variant, one in flight (ms)",
        f"{'variant':<8} {'base p50':>9} {'base p99':>9} {'obs p50':>9} {'obs p99':>9} "
        f"{'excess p50':>11} {'p99':>7} {'max':>7}",
    ]
    for variant, fig in delays["variants"].items():
        base, observed, excess = fig["baseline"], fig["observed"], fig["excess"]
        lines.append(
            f"{variant:<8} {base['p50_ms']:>9.3f} {base['p99_ms']:>9.3f} "
            f"{observed['p50_ms']:>9.3f} {observed['p99_ms']:>9.3f} "
            f"{excess['p50_ms']:>11.3f} {excess['p99_ms']:>7.3f} {excess['max_ms']:>7.3f}"
        )
        if "background_per_second" in fig:
            lines.append(f"{'':<8} with {fig['background_per_second']:.0f} notifications/s beside")
    lines.append("excess: observed - setting - baseline p50 (baseline: the same proxy, no delay)")
    return lines


def _kib(value: float | None, unit: str = "MiB") -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f} MiB" if unit == "MiB" else f"{value:.1f} KiB"


def _render_ws(ws: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"{ws['links']} WebSocket links through one proxy, in front of one WebSocket Agent",
    ]
    if "skipped" in ws:
        return [*lines, f"  not run: {ws['skipped']}"]
    everyone = "yes" if ws["established"] == ws["links"] else "no"
    lines.append(
        f"  established {ws['established']}, all open at once: {everyone}, answered right "
        f"{ws['answered']}: {'PASS' if ws['passed'] else 'FAIL'}"
    )
    rows = (
        ("connect + initialize", ws["connect"]),
        (f"{ws['pings_per_link']} pings each, all at once", ws["pings_all_links"]),
        ("one link of N, others idle", ws["one_link_of_n"]),
    )
    for title, fig in rows:
        if fig is None:
            continue
        rate = fig.get("aggregate_per_second", fig["per_second"])
        lines.append(
            f"  {title:<28} p50 {fig['p50_ms']:>8.3f} ms  p99 {fig['p99_ms']:>8.3f} ms  "
            f"{rate:>7.0f}/s"
        )
    proxy = ws["proxy"]
    lines.append(
        f"  proxy RSS {_kib(proxy['rss_before_kib'])} before, {_kib(proxy['rss_all_open_kib'])} "
        f"with all open ({_kib(proxy['rss_per_link_kib'], 'KiB')} a link), peak "
        f"{_kib(proxy['peak_rss_kib'])}; open fds {proxy['fds_before']} before, "
        f"{proxy['fds_all_open']} with all open"
    )
    limit = ws["fd_limit"]
    lines.append(
        f"  RLIMIT_NOFILE {limit['soft']} (hard {limit['hard']}), needed ~{limit['needed']}"
    )
    for failure in ws["failures"]:
        lines.append(f"  failure: {failure}")
    if ws["failure_count"] > len(ws["failures"]):
        lines.append(f"  ... {ws['failure_count']} failures in all")
    return lines
