"""The many-links check (``proxy.tools.bench.ws_links``), in the short bench's report: every link
open at once and answered right, the proxy's memory and descriptors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tool_runs import BENCH_TEST_TIMEOUT, latency_figures, positive, short_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TEST_TIMEOUT)]


def test_the_websocket_links_were_all_open_at_once_and_answered() -> None:
    report = short_bench()
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
