"""The long-run memory check (``proxy.tools.bench.memory``): a tiny run reports its samples."""

from __future__ import annotations

import pytest
from tool_runs import bench, positive

pytestmark = pytest.mark.slow


def test_the_memory_check_samples_the_proxy() -> None:
    """Without socat, WebSocket columns, links or delays on request; the long-run check, tiny,
    reports its samples."""
    report = bench(
        "--no-socat", "--no-websocket", "--memory-check", "2000", "--requests", "5",
        "--ws-links", "0", "--delays", "0",
    )  # fmt: skip
    assert (report["websocket"], report["ws_links"], report["delays"]) == (None, None, None)
    left_out = [c for c in report["design_targets"] if c["status"] == "SKIP"]
    assert {"1,000 concurrent WebSocket links", "injected delays within +2 ms at p99"} <= {
        c["name"] for c in left_out
    }
    websocket = [c for c in report["design_targets"] if "WebSocket stream" in c["name"]]
    assert websocket
    assert all(c["note"] == "left out (--no-websocket)" for c in websocket)
    assert report["targets"]["socat"]["available"] is False
    memory = report["memory_check"]
    assert memory["messages"] >= 2000
    assert len(memory["samples"]) >= 8
    assert all(positive(sent) and positive(rss) for sent, rss in memory["samples"])
    assert positive(memory["growth_ratio"])
    assert isinstance(memory["flat"], bool)
    check = next(c for c in report["design_targets"] if c["name"].startswith("memory"))
    assert check["status"] in {"PASS", "MISS"}
