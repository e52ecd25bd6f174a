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

from proxy.bench import RULES, TARGETS, WORKLOADS, render
from proxy.faultfile import load_fault_files

STATUSES = {"PASS", "MISS", "SKIP"}


def bench(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "proxy.bench", "--short", "--json", *args],
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
    assert "DESIGN 11 targets" in text
    assert "peak RSS" in text
    if not report["targets"]["socat"]["available"]:
        assert "socat: absent" in text


def test_the_memory_check_samples_the_proxy() -> None:
    """Without socat on request; the long-run check, at a tiny size, reports its samples."""
    report = bench("--no-socat", "--memory-check", "2000", "--requests", "5")
    assert report["targets"]["socat"]["available"] is False
    memory = report["memory_check"]
    assert memory["messages"] >= 2000
    assert len(memory["samples"]) >= 8
    assert all(positive(sent) and positive(rss) for sent, rss in memory["samples"])
    assert positive(memory["growth_ratio"])
    assert isinstance(memory["flat"], bool)
    check = next(c for c in report["design_targets"] if c["name"].startswith("memory"))
    assert check["status"] in {"PASS", "MISS"}


def test_the_rule_set_is_a_valid_fault_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    rules, seed = load_fault_files([path])
    assert len(rules) >= 5
    assert seed is not None


def test_counts_below_one_are_refused() -> None:
    from proxy.bench import make_options

    with pytest.raises(ValueError, match="--requests"):
        make_options(requests=0)
    with pytest.raises(ValueError, match="--memory-check"):
        make_options(memory_check=-1)
    short = make_options(short=True, prompts=3, socat=False)
    assert (short.short, short.prompts, short.socat) == (True, 3, None)
