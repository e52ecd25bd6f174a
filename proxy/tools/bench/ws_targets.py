"""The WebSocket targets: the same workloads as over stdio, with a WebSocket Client
(:mod:`.ws_driver`), through the WebSocket bench Agent (:mod:`.ws_agent`) reached

* ``direct``: the bench connects to the Agent itself;
* ``websockets``: through the floor of any WebSocket relay written with ``websockets``
  (:mod:`.ws_relay`: one upstream connection per Client, messages copied, nothing parsed);
* ``mitmproxy``: through ``mitmdump --mode reverse:http://AGENT`` (only when ``mitmdump`` is on
  ``PATH``: the bench never installs it; the report says when it is absent);
* ``proxy``: through ``python -m proxy run --listen ws://127.0.0.1:0/acp --upstream ws://AGENT``.

A round on a target starts the Agent, then the relaying process in front of it (each says where
it listens), drives the workloads in a thread, reads the peak memory of the process it measures
(the Agent for ``direct``, else the relay) and stops both.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from proxy.tools.bench.options import BenchOptions
from proxy.tools.bench.processes import Server, children_maxrss_kib, proc_kib
from proxy.tools.bench.workloads import Samples, exercise
from proxy.tools.bench.ws_driver import BlockingWsPeer
from proxy.tools.bench.ws_links import ws_argv

__all__ = ["WS_PROCESSES", "WS_TARGETS", "ws_agent_argv", "ws_round", "ws_target_argv"]

WS_TARGETS = ("direct", "websockets", "mitmproxy", "proxy")

WS_PROCESSES = {"direct": "ws_agent", "websockets": "ws_relay", "mitmproxy": "mitmdump"}
"""The process whose memory a WebSocket target's figures give; else the proxy."""


def ws_agent_argv(python: str) -> list[str]:
    """The WebSocket bench Agent."""
    return [python, "-m", "proxy.tools.bench.ws_agent"]


def ws_target_argv(target: str, options: BenchOptions, agent_url: str) -> list[str] | None:
    """The command of the process ``target`` puts in front of the Agent at ``agent_url``
    (``None`` for ``direct``)."""
    if target == "direct":
        return None
    if target == "websockets":
        return [options.python, "-m", "proxy.tools.bench.ws_relay", agent_url]
    if target == "mitmproxy":
        assert options.mitmdump is not None
        agent = urlsplit(agent_url)
        return [
            *(options.mitmdump, "--mode", f"reverse:http://{agent.netloc}"),
            *("--listen-host", "127.0.0.1", "--listen-port", "0", "--flow-detail", "0"),
        ]
    return ws_argv(options, agent_url)


def _drive(url: str, options: BenchOptions, samples: Samples) -> None:
    peer = BlockingWsPeer(url)
    try:
        exercise(peer, options, samples)
    finally:
        peer.close()


async def ws_round(target: str, options: BenchOptions, samples: Samples) -> None:
    """One round on one WebSocket target, in fresh processes (see the module)."""
    agent = await Server.start(ws_agent_argv(options.python))
    try:
        argv = ws_target_argv(target, options, agent.url)
        relay = None if argv is None else await Server.start(argv)
        measured = relay or agent
        try:
            await asyncio.to_thread(_drive, measured.url, options, samples)
            peak = proc_kib(measured.process.pid, "VmHWM")
        finally:
            if relay is not None:
                await relay.stop()
    finally:
        await agent.stop()
    samples.peak_rss_kib = max(samples.peak_rss_kib, peak or children_maxrss_kib())
