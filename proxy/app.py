"""The composition root: wires a proxy run from options; callable from tests without the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from proxy.endpoint import Endpoint
from proxy.events import Direction, Side
from proxy.faultfile import load_fault_files
from proxy.faults import FaultEngine
from proxy.link import Link
from proxy.log import get_logger
from proxy.observers import Fanout, LogObserver, Observer, Tally
from proxy.relay import Relay
from proxy.state import StateFile, StateSaver
from proxy.transports.stdio import AgentProcess, open_client_stdio, spawn_agent
from proxy.watch import watch_fault_files

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "RunOptions", "build_engine", "run_stdio"]

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
    faults: tuple[Path, ...] = ()
    seed: int | None = None
    """Overrides the fault files' seed."""
    watch: bool = False
    state: Path | None = None


def build_engine(options: RunOptions) -> FaultEngine:
    """The fault engine of a run: rules from the files, seeded (a random seed is logged)."""
    rules, file_seed = load_fault_files(options.faults) if options.faults else ([], None)
    seed = options.seed if options.seed is not None else file_seed
    if seed is None:
        seed = secrets.randbelow(2**32)
        if rules:
            log.info("no seed given; pass --seed to reproduce this run", seed=seed)
    return FaultEngine(rules, random.Random(seed))


async def run_stdio(options: RunOptions, observer: Observer | None = None) -> int:
    """Relay stdin/stdout to a spawned Agent until one side ends; return the exit status.

    The status is the Agent's, as a shell would report it; 0 when the Client closed stdin and the
    Agent had to be stopped; 127 or 126 when the Agent command cannot be run. Fault files must
    have been validated by the caller (:func:`build_engine` raises on a bad one).
    """
    loop = asyncio.get_running_loop()
    engine = build_engine(options)
    tally = Tally()
    observers: list[Observer] = [tally, LogObserver()]
    if options.state is not None:
        saver = StateSaver(engine, StateFile(options.state))
        saver.restore()
        observers.append(saver)
    if observer is not None:
        observers.append(observer)
    fanout = Fanout(observers)

    async def connect_agent() -> Endpoint:
        return await spawn_agent(
            options.agent_argv, limit=options.max_message_bytes, grace=options.agent_grace
        )

    try:
        agent = await connect_agent()
    except FileNotFoundError:
        log.error("agent command not found", command=options.agent_argv[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        log.error("agent command is not executable", command=options.agent_argv[0])
        return EXIT_NOT_EXECUTABLE
    client = await open_client_stdio(limit=options.max_message_bytes)
    origin = loop.time()
    ids: dict[Direction, Iterator[int]] = {direction: itertools.count() for direction in Direction}
    link = Link(
        lambda: Relay(strict=options.strict, engine=engine, origin=origin, ids=ids),
        {Side.CLIENT: client, Side.AGENT: agent},
        fanout,
        connect_agent=connect_agent,
    )

    def on_signal(signum: int) -> None:
        log.info("signal received; passing it to the agent", signal=signal.Signals(signum).name)
        current = link.endpoints[Side.AGENT]
        if isinstance(current, AgentProcess):
            current.signal(signum)
        link.close(Side.AGENT)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    watcher = None
    if options.watch and options.faults:
        watcher = loop.create_task(watch_fault_files(options.faults, engine, fanout))
    try:
        await link.run()
        final = link.endpoints[Side.AGENT]
        assert isinstance(final, AgentProcess)
        status = await final.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if final.stopped_by_proxy and link.closed_first is Side.CLIENT:
        status = 0
    log.info("proxy finished", exit_status=status, **tally.summary())
    return status
