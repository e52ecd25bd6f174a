"""The bench's text report (``proxy.tools.bench.render``) names every target and every check."""

from __future__ import annotations

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, short_bench

from proxy.tools.bench import TARGETS, render
from proxy.tools.bench.ws_targets import WS_TARGETS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TEST_TIMEOUT)]


def test_the_text_report_names_every_target() -> None:
    report = short_bench()
    text = render(report)
    for target in TARGETS:
        assert target in text
    assert "Performance targets (information only" in text
    assert "--short: too few samples for these verdicts to mean anything" in text
    assert report["core"]["build"] in text.splitlines()[0]
    assert "peak RSS" in text
    assert "allocator thresholds fixed" not in text
    fixed = {**report, "config": {**report["config"], "allocator": {"MALLOC_MMAP_THRESHOLD_": "1"}}}
    assert "every process with glibc's allocator thresholds fixed: MALLOC_MMAP_THRESHOLD_=1" in (
        render(fixed)
    )
    assert f"{report['config']['ws_links']} WebSocket links through one proxy" in text
    assert "injected delays: 50 ms" in text
    if not report["targets"]["socat"]["available"]:
        assert "socat: absent" in text
    websocket = text[text.index("Over WebSocket:") :]
    for target in WS_TARGETS:
        assert f"\n{target} " in websocket
    assert "+p50 x websockets" in websocket
    assert "WebSocket stream at least 0.9x the websockets relay's [proxy]" in websocket
    if not report["websocket"]["targets"]["mitmproxy"]["available"]:
        assert "mitmproxy: mitmdump not found on PATH" in websocket
