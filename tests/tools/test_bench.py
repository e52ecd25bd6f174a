"""``acp-proxy bench`` in its short mode: the report is complete and well-formed.

No figure is compared to a limit here: timings belong to the bench's own report (DESIGN 11), never
to a test's verdict.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import TIMEOUT

from proxy.shell.fault_files import load_fault_files
from proxy.tools.bench import DELAY_RULES, RULES, TARGETS, WORKLOADS, render

pytestmark = pytest.mark.slow

STATUSES = {"PASS", "MISS", "SKIP"}


def bench(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.tools.bench", "--short", "--json", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 6,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return bench()


def positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_every_target_and_workload_is_reported(report: dict[str, Any]) -> None:
    assert report["mode"] == "short"
    assert report["errors"] == {}
    assert set(report["targets"]) == set(TARGETS)
    socat_present = shutil.which("socat") is not None
    for name, target in report["targets"].items():
        if name == "socat" and not socat_present:
            assert target["available"] is False
            assert "socat" in target["reason"]
            assert "workloads" not in target
            continue
        assert target["available"] is True, name
        assert set(target["workloads"]) == set(WORKLOADS), name
        assert positive(target["peak_rss_kib"]), name
        ping, stream, prompt = (target["workloads"][w] for w in ("ping", "stream", "prompt64k"))
        for latency in (ping, prompt):
            for key in ("p50_ms", "p99_ms", "mean_ms", "per_second"):
                assert positive(latency[key]), (name, key)
            assert latency["p50_ms"] <= latency["p99_ms"]
        assert ping["count"] == report["config"]["requests"] * report["config"]["rounds"]
        assert prompt["count"] == report["config"]["prompts"] * report["config"]["rounds"]
        assert positive(prompt["mib_per_second"])
        assert stream["count"] == report["config"]["notifications"] * report["config"]["rounds"]
        assert positive(stream["seconds"])
        assert positive(stream["per_second"])


def test_every_relay_is_compared_to_direct(report: dict[str, Any]) -> None:
    """Added latency may be negative (noise in a short run), but it is a finite number."""
    relays = [t for t in TARGETS if t != "direct" and report["targets"][t]["available"]]
    assert "proxy" in relays
    assert "proxy+rules" in relays
    for target in relays:
        versus = report["comparisons"][target]["direct"]
        for workload in ("ping", "prompt64k"):
            for key in ("added_p50_ms", "added_p99_ms"):
                assert math.isfinite(versus[workload][key])
            assert positive(versus[workload]["p50_ratio"])
        assert positive(versus["stream"]["throughput_ratio"])
        if target != "socat":
            socat = report["targets"]["socat"]["available"]
            assert ("socat" in report["comparisons"][target]) == socat


def test_the_design_targets_are_checked(report: dict[str, Any]) -> None:
    checks = report["design_targets"]
    assert {check["status"] for check in checks} <= STATUSES
    names = {(check["name"], check["target"]) for check in checks}
    for target in ("proxy", "proxy+rules"):
        assert ("ping added p50 within 2x socat's", target) in names
        assert ("stream throughput at least 50% of direct", target) in names
        assert ("64 KiB prompt added p50 under 0.5 ms", target) in names
    assert ("memory flat over a long run", "proxy+rules") in names
    assert ("1,000 concurrent WebSocket links", "proxy") in names
    assert ("injected delays within +2 ms at p99", "proxy, idle") in names
    assert ("injected delays within +2 ms at p99", "proxy, busy") in names
    for check in checks:
        if check["status"] == "SKIP":
            assert check["note"]
        else:
            assert math.isfinite(check["value"])
            assert math.isfinite(check["limit"])
    if not report["targets"]["socat"]["available"]:
        relative = [c for c in checks if c["name"].startswith("ping added")]
        assert all(check["status"] == "SKIP" for check in relative)


def test_the_text_report_names_every_target(report: dict[str, Any]) -> None:
    text = render(report)
    for target in TARGETS:
        assert target in text
    assert "Performance targets (information only" in text
    assert "peak RSS" in text
    assert f"{report['config']['ws_links']} WebSocket links through one proxy" in text
    assert "injected delays: 50 ms" in text
    if not report["targets"]["socat"]["available"]:
        assert "socat: absent" in text


def latency_figures(figures: dict[str, Any], count: int) -> None:
    assert figures["count"] == count
    for key in ("min_ms", "p50_ms", "p99_ms", "mean_ms", "per_second"):
        assert positive(figures[key]), key
    assert figures["min_ms"] <= figures["p50_ms"] <= figures["p99_ms"]


def test_the_websocket_links_were_all_open_at_once_and_answered(report: dict[str, Any]) -> None:
    ws = report["ws_links"]
    links = report["config"]["ws_links"]
    assert links > 0
    assert (ws["links"], ws["established"], ws["answered"]) == (links, links, links)
    assert ws["passed"] is True
    assert (ws["failures"], ws["failure_count"]) == ([], 0)
    latency_figures(ws["connect"], links)
    latency_figures(ws["pings_all_links"], links * ws["pings_per_link"])
    latency_figures(ws["one_link_of_n"], report["config"]["requests"])
    for key in ("connect", "pings_all_links"):
        assert positive(ws[key]["wall_seconds"])
        assert positive(ws[key]["aggregate_per_second"])
    assert ws["fd_limit"]["soft"] >= ws["fd_limit"]["needed"]
    proxy = ws["proxy"]
    if Path("/proc/self/fd").exists():
        # While every link was open the proxy held a socket to its Client and one to the Agent.
        assert proxy["fds_all_open"] - proxy["fds_before"] >= 2 * links
        for key in ("rss_before_kib", "rss_all_open_kib", "peak_rss_kib"):
            assert positive(proxy[key]), key
        assert math.isfinite(proxy["rss_per_link_kib"])
    [check] = [c for c in report["design_targets"] if c["name"].endswith("WebSocket links")]
    assert check["status"] == "SKIP"  # a short run opens fewer than 1,000 links
    assert f"only {links} links run (all open at once and answered)" in check["note"]


def test_injected_delays_are_measured_idle_and_busy(report: dict[str, Any]) -> None:
    delays = report["delays"]
    setting = report["config"]["delay_ms"]
    count = report["config"]["delays"]
    assert delays["setting_ms"] == setting > 0
    assert delays["requests"] == count > 0
    assert set(delays["variants"]) == {"idle", "busy"}
    for variant in delays["variants"].values():
        latency_figures(variant["baseline"], count)
        latency_figures(variant["observed"], count)
        # The rule fired on every marked request: none came back sooner than it was held.
        assert variant["observed"]["min_ms"] >= setting
        excess = variant["excess"]
        assert excess["count"] == count
        for key in ("p50_ms", "p99_ms", "max_ms", "mean_ms"):
            assert math.isfinite(excess[key]), key
        assert excess["p50_ms"] <= excess["p99_ms"] <= excess["max_ms"]
    assert positive(delays["variants"]["busy"]["background_per_second"])
    checks = [c for c in report["design_targets"] if c["name"].startswith("injected delays")]
    assert {c["target"] for c in checks} == {"proxy, idle", "proxy, busy"}
    assert {c["status"] for c in checks} <= {"PASS", "MISS"}


def test_the_memory_check_samples_the_proxy() -> None:
    """Without socat, links or delays on request; the long-run check, tiny, reports its samples."""
    report = bench(
        "--no-socat", "--memory-check", "2000", "--requests", "5", "--ws-links", "0", "--delays", "0"
    )  # fmt: skip
    assert (report["ws_links"], report["delays"]) == (None, None)
    left_out = [c for c in report["design_targets"] if c["status"] == "SKIP"]
    assert {"1,000 concurrent WebSocket links", "injected delays within +2 ms at p99"} <= {
        c["name"] for c in left_out
    }
    assert report["targets"]["socat"]["available"] is False
    memory = report["memory_check"]
    assert memory["messages"] >= 2000
    assert len(memory["samples"]) >= 8
    assert all(positive(sent) and positive(rss) for sent, rss in memory["samples"])
    assert positive(memory["growth_ratio"])
    assert isinstance(memory["flat"], bool)
    check = next(c for c in report["design_targets"] if c["name"].startswith("memory"))
    assert check["status"] in {"PASS", "MISS"}


def test_the_rule_sets_are_valid_fault_files(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    loaded = load_fault_files([path])
    rules, seed = loaded.rules, loaded.seed
    assert len(rules) >= 5
    assert seed is not None
    path.write_text(DELAY_RULES)
    [rule] = load_fault_files([path]).rules
    assert rule.do.action == "delay"
    assert rule.when.method == "_bench/delayed"


def test_counts_below_one_are_refused() -> None:
    from proxy.tools.bench import make_options

    with pytest.raises(ValueError, match="--requests"):
        make_options(requests=0)
    with pytest.raises(ValueError, match="--memory-check"):
        make_options(memory_check=-1)
    with pytest.raises(ValueError, match="--ws-links"):
        make_options(ws_links=-1)
    with pytest.raises(ValueError, match="--delays"):
        make_options(delays=-1)
    assert (make_options(ws_links=0).ws_links, make_options(delays=0).delays) == (0, 0)
    short = make_options(short=True, prompts=3, socat=False)
    assert (short.short, short.prompts, short.socat) == (True, 3, None)
