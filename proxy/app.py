"""The composition root: wires a proxy run from options; callable from tests without the CLI."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass

from proxy.events import Side
from proxy.link import Link
from proxy.log import get_logger
from proxy.observers import Fanout, LogObserver, Observer, Tally
from proxy.relay import Relay
from proxy.transports.stdio import open_client_stdio, spawn_agent

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "RunOptions", "run_stdio"]

log = get_logger("proxy.app")

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""DESIGN 10: the default bound on one message, on every transport."""

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What ``acp-proxy run`` was asked to do."""

    agent_argv: tuple[str, ...]
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    strict: bool = False
    agent_grace: float = 5.0
    """Seconds the Agent gets to exit after stdin closes (or a signal) before SIGTERM/SIGKILL."""


async def run_stdio(options: RunOptions, observer: Observer | None = None) -> int:
    """Relay stdin/stdout to a spawned Agent until one side ends; return the exit status.

    The status is the Agent's, as a shell would report it; 0 when the Client closed stdin and the
    Agent had to be stopped; 127 or 126 when the Agent command cannot be run.
    """
    loop = asyncio.get_running_loop()
    try:
        agent = await spawn_agent(
            options.agent_argv, limit=options.max_message_bytes, grace=options.agent_grace
        )
    except FileNotFoundError:
        log.error("agent command not found", command=options.agent_argv[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        log.error("agent command is not executable", command=options.agent_argv[0])
        return EXIT_NOT_EXECUTABLE
    client = await open_client_stdio(limit=options.max_message_bytes)
    tally = Tally()
    observers: list[Observer] = [tally, LogObserver()]
    if observer is not None:
        observers.append(observer)
    link = Link(
        Relay(strict=options.strict),
        {Side.CLIENT: client, Side.AGENT: agent},
        Fanout(observers),
    )

    def on_signal(signum: int) -> None:
        log.info("signal received; passing it to the agent", signal=signal.Signals(signum).name)
        agent.signal(signum)
        link.close(Side.AGENT)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await link.run()
        status = await agent.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if agent.stopped_by_proxy and link.closed_first is Side.CLIENT:
        status = 0
    log.info("proxy finished", exit_status=status, **tally.summary())
    return status
