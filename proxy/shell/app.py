"""The composition root: wires a proxy run from options; callable from tests without the CLI.

:class:`RunOptions` is the model of ``acp-proxy run``'s options (it refuses a value out of its
range; its :meth:`~RunOptions.from_command_line` checks the command line's values), :func:`run_main`
the command's entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import secrets
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.core.commands import Restart
from proxy.core.engine import FaultEngine
from proxy.core.errors import (
    ConfigError,
    OptionError,
    StartupError,
    UnusableFileError,
    at_least,
    os_cause,
)
from proxy.core.events import Direction, Side
from proxy.core.faultfile import FaultFileError, Note
from proxy.core.ledger import Ledger
from proxy.core.redact import Redactor
from proxy.core.relay import MetaFor, Relay
from proxy.shell.admin import AdminServer, Runtime, admin_token_from, check_admin_host
from proxy.shell.defaults import (
    AGENT_GRACE,
    CONNECT_TIMEOUT,
    DEFAULT_MAX_MESSAGE_BYTES,
    HTTP_TIMEOUT,
    INITIALIZE_TIMEOUT,
    MIN_TIMEOUT,
    PIPE_BYTES,
    SHUTDOWN_TIMEOUT,
)
from proxy.shell.endpoint import Signalable
from proxy.shell.fault_files import (
    LoadedFaults,
    load_fault_files,
    print_fault_file_errors,
    watch_fault_files,
)
from proxy.shell.hostport import authority, parse_host_port
from proxy.shell.inflight import InflightBytes
from proxy.shell.limits import DEFAULT_LIMITS, Limits
from proxy.shell.link import Link, LinkState
from proxy.shell.log import get_logger
from proxy.shell.metrics import Metrics
from proxy.shell.observers import Fanout, LogObserver, Observer, Tally
from proxy.shell.origin_policy import Allowances, parse_allowed_host, parse_allowed_origin
from proxy.shell.parsing import Parser
from proxy.shell.recorder import RecordWriter
from proxy.shell.server import (
    STDIO,
    Address,
    NetworkProxy,
    UpstreamFactory,
    parse_address,
    upstream_factory,
)
from proxy.shell.state import StateFile, StateSaver
from proxy.shell.tls import agent_tls, check_listener, check_upstream, listener_tls, warn_insecure
from proxy.shell.trace import EventFeed, TraceWriter
from proxy.shell.transports.stdio import AgentProcess, open_client_stdio

if TYPE_CHECKING:  # imported only with --otel (the optional extra)
    from proxy.shell.otel import Tracing

__all__ = [
    "Ready",
    "RunOptions",
    "build_engine",
    "run",
    "run_main",
    "run_network",
    "run_stdio",
]

log = get_logger("proxy.app")

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_UNREACHABLE = 1
"""A stdio proxy could not reach its network Agent, or lost it."""
EXIT_CANNOT_START = 1
"""The proxy could not start (:class:`~proxy.core.errors.StartupError`: one line on stderr)."""
EXIT_BAD_FAULT_FILE = 2
"""A fault file is invalid: the run is refused before anything starts (its errors on stderr)."""
EXIT_UNUSABLE_FILE = 2
"""A file an option names cannot be used as it is (:class:`~proxy.core.errors.UnusableFileError`:
one line on stderr, a usage error)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What ``acp-proxy run`` was asked to do."""

    agent_argv: tuple[str, ...]
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    pipe_bytes: int = PIPE_BYTES
    """The room asked of each pipe between a stdio proxy and its Client and Agent (0: the
    system's own; :data:`~proxy.shell.defaults.PIPE_BYTES`)."""
    strict: bool = False
    allow_client_faults: bool = False
    """A Client's request may ask for its own fault (``_meta.acpFault``:
    :mod:`proxy.core.client_faults`)."""
    agent_grace: float = AGENT_GRACE
    """Seconds the Agent gets to exit after stdin closes (or a signal) before SIGTERM/SIGKILL."""
    faults: tuple[Path, ...] = ()
    seed: int | None = None
    """Overrides the fault files' seed."""
    watch: bool = False
    state: Path | None = None
    listen: Address = STDIO
    upstream: Address = STDIO
    keep_upstream: bool = False
    """Conductor mode: an Agent connection outlives its Client and serves the next one."""
    admin: tuple[str, int] | None = None
    """Host and port of the control API and /metrics."""
    admin_token: str | None = None
    admin_allow_remote: bool = False
    allow_hosts: tuple[str, ...] = ()
    """``Host`` names admitted by the listener and the control API beyond their bound address."""
    allow_origins: tuple[str, ...] = ()
    """Web origins admitted by the listener beyond its own (``*``: every page)."""
    admin_allow_origins: tuple[str, ...] = ()
    """Web origins admitted by the control API beyond its own."""
    trace: Path | None = None
    """The JSONL trace file (appended to; ``-`` is stdout)."""
    record: Path | None = None
    """The recording of every message's body (:mod:`proxy.shell.recorder`); ``.gz``: compressed."""
    redact: tuple[str, ...] = ()
    """Patterns of what the recording replaces before writing (:mod:`proxy.core.redact`)."""
    connect_timeout: float = CONNECT_TIMEOUT
    """Seconds to reach a network Agent (TCP connect, WebSocket handshake)."""
    initialize_timeout: float = INITIALIZE_TIMEOUT
    """Seconds the Agent has to answer ``initialize`` before the Client gets an error."""
    http_timeout: float = HTTP_TIMEOUT
    """Seconds one POST (or DELETE) to an HTTP Agent may take, answer included."""
    shutdown_timeout: float = SHUTDOWN_TIMEOUT
    """Seconds the links get to end after SIGTERM or SIGINT before they are cut."""
    limits: Limits = DEFAULT_LIMITS
    """What one peer can make the proxy hold (links, idle time, sessions, header time, event
    subscribers, pending requests, bytes in flight)."""
    otel: bool = False
    """A span per request, exported over OTLP/HTTP (:mod:`proxy.shell.otel`)."""
    otel_propagate: bool = False
    """Each forwarded request carries its span's ``traceparent`` in ``params._meta``."""
    listen_tls: ssl.SSLContext | None = None
    """The listener's certificate (``--tls-cert``, ``--tls-key``): required by an ``https://`` or
    ``wss://`` listener, refused with any other."""
    upstream_tls: ssl.SSLContext | None = None
    """How an ``https://`` or ``wss://`` Agent is verified (``--tls-ca``, ``--tls-insecure``;
    None: the system's trust store); refused with any other upstream."""

    def __post_init__(self) -> None:
        check_listener(
            self.listen.url, secure=self.listen.secure, served=self.listen_tls is not None
        )
        check_upstream(secure=self.upstream.secure, verified=self.upstream_tls is not None)
        at_least("--max-message-bytes", self.max_message_bytes, 1)
        at_least("--pipe-bytes", self.pipe_bytes, 0)
        at_least("--agent-grace", self.agent_grace, 0)
        at_least("--connect-timeout", self.connect_timeout, MIN_TIMEOUT)
        at_least("--initialize-timeout", self.initialize_timeout, MIN_TIMEOUT)
        at_least("--http-timeout", self.http_timeout, MIN_TIMEOUT)
        at_least("--shutdown-timeout", self.shutdown_timeout, 0)

    @classmethod
    def from_command_line(
        cls,
        *,
        agent_argv: Sequence[str] = (),
        listen: str = "stdio",
        upstream: str = "stdio",
        admin: str | None = None,
        admin_token: str | None = None,
        admin_token_file: Path | None = None,
        admin_allow_remote: bool = False,
        allow_hosts: Sequence[str] = (),
        allow_origins: Sequence[str] = (),
        admin_allow_origins: Sequence[str] = (),
        trace: Path | None = None,
        record: Path | None = None,
        redact: Sequence[str] = (),
        faults: Sequence[Path] = (),
        environ: Mapping[str, str] | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        tls_ca: Path | None = None,
        tls_insecure: bool = False,
        **settings: Any,
    ) -> RunOptions:
        """The options of ``acp-proxy run`` from the values its command line gave, checked.

        Addresses are parsed, the Host and origin allowances checked, the control API's address
        and token checked (the token from ``admin_token``, ``admin_token_file`` or the variable
        :data:`~proxy.shell.admin.ADMIN_TOKEN_ENV` of ``environ``, default ``os.environ``), the
        TLS files read and checked (:mod:`proxy.shell.tls`), and options that exclude each other
        refused: :class:`~proxy.core.errors.OptionError` says what is wrong, before anything
        starts. ``settings`` are the other fields, as given.
        """
        try:
            listen_at = parse_address(listen, option="--listen")
            upstream_at = parse_address(upstream, option="--upstream")
            listen_tls = listener_tls(
                listen_at.url, secure=listen_at.secure, cert=tls_cert, key=tls_key
            )
            upstream_tls = agent_tls(secure=upstream_at.secure, ca=tls_ca, insecure=tls_insecure)
            for host in allow_hosts:
                parse_allowed_host(host)
            for origin in allow_origins:
                parse_allowed_origin(origin)
            for origin in admin_allow_origins:
                parse_allowed_origin(origin, option="--admin-allow-origin")
            admin_at = None
            if admin is not None:
                admin_at = parse_host_port(admin, option="--admin")
                check_admin_host(admin_at[0], allow_remote=admin_allow_remote)
                admin_token = admin_token_from(admin_token, admin_token_file, environ)
        except OptionError:
            raise
        except ConfigError as exc:
            raise OptionError(str(exc)) from None
        if trace is not None and str(trace) == "-" and listen_at.scheme == "stdio":
            raise OptionError(
                "in stdio mode stdout is the protocol channel; give the trace a file",
                option="--trace",
            )
        if record is not None and str(record) == "-":
            raise OptionError("give the recording a file", option="--record")
        if redact and record is None:
            raise OptionError("--redact applies to a recording: give --record FILE", "--redact")
        Redactor.of(redact)  # each pattern checked now
        if upstream_at.scheme == "stdio" and not agent_argv:
            raise OptionError("give the Agent command after --", option="AGENT_CMD")
        if upstream_at.scheme != "stdio" and agent_argv:
            raise OptionError(
                "an Agent command makes sense only with --upstream stdio", option="AGENT_CMD"
            )
        return cls(
            agent_argv=tuple(agent_argv),
            listen=listen_at,
            upstream=upstream_at,
            admin=admin_at,
            admin_token=admin_token,
            admin_allow_remote=admin_allow_remote,
            allow_hosts=tuple(allow_hosts),
            allow_origins=tuple(allow_origins),
            admin_allow_origins=tuple(admin_allow_origins),
            trace=trace,
            record=record,
            redact=tuple(redact),
            faults=tuple(faults),
            listen_tls=listen_tls,
            upstream_tls=upstream_tls,
            **settings,
        )


def build_engine(options: RunOptions, loaded: LoadedFaults) -> FaultEngine:
    """The fault engine of a run: the rules ``loaded`` from its files, seeded (a random seed is
    logged). Each rule loaded, from the files, a reload or the control API, has its notes logged."""
    rules = loaded.rules
    seed = options.seed if options.seed is not None else loaded.seed
    if seed is None:
        seed = secrets.randbelow(2**32)
        if rules:
            log.info("no seed given; pass --seed to reproduce this run", seed=seed)
    listener = options.listen.scheme
    return FaultEngine(
        rules,
        random.Random(seed),
        listener=listener,
        on_note=functools.partial(_log_note, listener),
        client_faults=options.allow_client_faults,
        max_active_faults=options.limits.max_active_faults,
        max_held=options.limits.max_held,
    )


def _log_note(listener: str, note: Note) -> None:
    """A warning for one note of a rule just loaded."""
    if note.needs_http:
        why = f"{note.message}; they connect over {listener}"
        log.warning("a rule can never fire here", rule=note.rule, why=why)
    else:
        log.warning("a rule needs a change", rule=note.rule, field=note.field, note=note.message)


class _Links:
    """The running links, as the control API and the gauges of pending requests and held
    messages see them."""

    def __init__(self) -> None:
        self.runtime: Runtime | None = None

    def pending(self, direction: Direction) -> int:
        links = self.runtime.links() if self.runtime is not None else []
        return sum(link.relay.pending(direction) for link in links)

    def held(self) -> int:
        links = self.runtime.links() if self.runtime is not None else []
        return sum(len(link.relay.held_messages()) for link in links)


class _OneLink:
    """The runtime of a stdio Client: one link (none before the Agent is started), restarted
    by the link itself."""

    def __init__(self) -> None:
        self.link: Link | None = None

    def links(self) -> list[Link]:
        link = self.link
        return [] if link is None or link.state is LinkState.ENDED else [link]

    def restart(self, downtime: float) -> None:
        for link in self.links():
            link.inject([Restart(downtime)])


@dataclass(slots=True)
class _Experiment:
    """What every run shares: the engine, the observers, metrics, trace, the control API."""

    faults: LoadedFaults
    engine: FaultEngine
    observer: Fanout
    tally: Tally
    connect_upstream: UpstreamFactory
    metrics: Metrics
    feed: EventFeed
    links: _Links
    trace: TraceWriter | None
    recorder: RecordWriter | None
    ledger: Ledger
    saver: StateSaver | None
    inflight: InflightBytes
    parser: Parser
    tracing: Tracing | None = None
    propagate: bool = False
    """Each forwarded request carries its span's ``traceparent`` (``--otel-propagate``)."""
    observe_after_write: bool = False
    """No observer is read from outside the process before the event loop turns again (no
    trace, recording, state file, OpenTelemetry or embedding program's observer): a message
    relayed as it is read may be observed after its bytes are written
    (:class:`~proxy.shell.link.Link`)."""

    @property
    def meta_for(self) -> MetaFor | None:
        """What each relay writes into the ``_meta`` of the requests it forwards, if anything."""
        return self.tracing.meta_for if self.tracing is not None and self.propagate else None

    def close(self) -> None:
        """Close the trace (again: it may be), stop the parsing workers, send the last spans."""
        if self.trace is not None:
            self.trace.close()
        if self.recorder is not None:
            self.recorder.close()
        self.parser.close()
        if self.tracing is not None:
            self.tracing.close()

    def degraded(self) -> dict[str, str]:
        """What no longer works as asked, and why (``/healthz``): the trace, the state file."""
        failures = {
            "trace": self.trace.failure if self.trace is not None else None,
            "record": self.recorder.failure if self.recorder is not None else None,
            "state": self.saver.failure if self.saver is not None else None,
        }
        return {name: failure for name, failure in failures.items() if failure is not None}


def _experiment(options: RunOptions, observer: Observer | None) -> _Experiment:
    """The experiment of a run; :class:`~proxy.core.errors.FaultFileError` when a fault file is
    bad, :class:`~proxy.core.errors.StartupError` when its trace or state file cannot be used."""
    faults = load_fault_files(options.faults)
    engine = build_engine(options, faults)
    links = _Links()
    inflight = InflightBytes(options.limits.max_inflight_bytes)
    parser = Parser()
    metrics = Metrics(
        pending=links.pending,
        inflight=inflight,
        parser=parser,
        active_faults=engine.active,
        held=links.held,
    )
    tally = metrics.tally  # counted once: the closing log line and the metrics read it
    feed = EventFeed(max_subscribers=options.limits.max_event_subscribers, observer=metrics)

    def failed(file: str) -> Callable[[str], None]:
        return lambda _cause: metrics.write_failures.labels(file).inc()

    fanout = Fanout([])
    ledger = Ledger(time.time, emit=fanout.observe)
    saver = None
    if options.state is not None:  # checked first: a run that cannot start writes no trace
        saver = StateSaver(engine, ledger, StateFile(options.state), on_failure=failed("state"))
        saver.restore()
    trace = None
    if options.trace is not None:
        trace = TraceWriter(options.trace, on_failure=failed("trace"))
    recorder = None
    if options.record is not None:
        recorder = RecordWriter(
            options.record,
            Redactor.of(options.redact, key=secrets.token_bytes(32)),  # keys the ids' digests
            observer=metrics,
            on_failure=failed("record"),
        )
    observers: list[Observer] = [LogObserver(), metrics, feed, ledger]
    if trace is not None:
        observers.append(trace)
    if recorder is not None:
        observers.append(recorder)
    if saver is not None:
        observers.append(saver)
    tracing = _tracing() if options.otel or options.otel_propagate else None
    if tracing is not None:
        observers.append(tracing)
    if observer is not None:
        observers.append(observer)
    connect = upstream_factory(
        options.upstream,
        options.agent_argv,
        limit=options.max_message_bytes,
        grace=options.agent_grace,
        pipe_bytes=options.pipe_bytes if options.listen.scheme == "stdio" else 0,
        connect_timeout=options.connect_timeout,
        http_timeout=options.http_timeout,
        max_sessions=options.limits.max_sessions,
        observer=fanout,
        parser=parser,
        tls=options.upstream_tls,
    )
    warn_insecure(options.upstream_tls, options.upstream.url)
    fanout.extend(observers)
    only_ours = all(each is None for each in (trace, recorder, saver, tracing, observer))
    return _Experiment(
        faults,
        engine,
        fanout,
        tally,
        connect,
        metrics,
        feed,
        links,
        trace,
        recorder,
        ledger,
        saver,
        inflight,
        parser,
        tracing,
        options.otel_propagate,
        observe_after_write=only_ours,
    )


def _tracing() -> Tracing:
    """The run's OpenTelemetry tracing; :class:`StartupError` without the optional extra."""
    try:
        from proxy.shell.otel import Tracing  # noqa: PLC0415 - only with --otel
    except ImportError as exc:
        raise StartupError(
            "--otel", "needs OpenTelemetry", f"pip install 'acp-fault-proxy[otel]' ({exc})"
        ) from None
    return Tracing()


@contextlib.asynccontextmanager
async def _serving(
    options: RunOptions, experiment: _Experiment, runtime: Runtime, *, serve: bool = True
) -> AsyncIterator[AdminServer | None]:
    """The control API and the watcher around a run; the trace closed after it (``serve``
    false: the control API listens, and answers once told to).

    :class:`~proxy.core.errors.StartupError` when the control API cannot listen."""
    experiment.links.runtime = runtime
    try:
        admin = None
        if options.admin is not None:
            admin = AdminServer(
                runtime,
                experiment.engine,
                experiment.metrics,
                experiment.feed,
                initial_rules=experiment.faults.rules,
                token=options.admin_token,
                ledger=experiment.ledger.summary,
                findings=lambda: experiment.ledger.findings,
                degraded=experiment.degraded,
                allowances=Allowances(options.allow_hosts, options.admin_allow_origins),
                header_timeout=options.limits.header_timeout,
                max_message_bytes=options.max_message_bytes,
            )
            try:
                await admin.start(*options.admin, serve=serve)
            except OSError as exc:
                await admin.stop()
                raise StartupError("--admin", authority(*options.admin), os_cause(exc)) from None
        watcher = None
        if options.watch and options.faults:
            watcher = asyncio.get_running_loop().create_task(
                watch_fault_files(experiment.faults, experiment.engine, experiment.observer)
            )
        try:
            yield admin
        finally:
            if admin is not None:
                await admin.stop()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if experiment.saver is not None:
                experiment.saver.save()  # what was learnt since the last change of counters
    finally:
        experiment.close()


def run_main(options: RunOptions) -> int:
    """``acp-proxy run``: run the proxy as ``options`` say, until it ends; the exit status.

    A run refused before anything starts says why on stderr: each error of an invalid fault file
    on a line of its own (status 2), or the one line of a failed start (status 1; 2 when a file
    the command line names cannot be used as it is).
    """
    try:
        return asyncio.run(run(options))
    except FaultFileError as exc:
        print_fault_file_errors(exc)
        return EXIT_BAD_FAULT_FILE
    except StartupError as exc:
        sys.stderr.write(f"acp-proxy: {exc}\n")
        unusable = isinstance(exc, UnusableFileError)
        return EXIT_UNUSABLE_FILE if unusable else EXIT_CANNOT_START


async def run(options: RunOptions, observer: Observer | None = None) -> int:
    """Run the proxy as ``options`` say; return the exit status."""
    if options.listen.scheme == "stdio":
        return await run_stdio(options, observer)
    return await run_network(options, observer)


@dataclass(frozen=True, slots=True)
class Ready:
    """Where a started proxy serves (port 0 resolved)."""

    listen_url: str
    admin_url: str | None


async def run_network(
    options: RunOptions,
    observer: Observer | None = None,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[Ready], None] | None = None,
) -> int:
    """Serve Clients on a listener until ``stop`` is set (default: SIGINT or SIGTERM); return 0.

    Every connection gets a link. ``on_ready`` hears the bound addresses once serving (and again
    whenever ``restart_proxy`` brings the listener back). Stopping ends every link (see
    :class:`~proxy.shell.server.NetworkProxy`); a second signal cuts them at once.
    """
    loop = asyncio.get_running_loop()
    experiment = _experiment(options, observer)
    signals = stop is None
    stop = stop or asyncio.Event()
    hurry = asyncio.Event()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("second signal received; cutting every link now", signal=name)
            hurry.set()
        else:
            log.info("signal received; shutting down", signal=name)
            stop.set()

    if signals:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
    proxy = NetworkProxy(
        options.listen,
        experiment.connect_upstream,
        experiment.engine,
        experiment.observer,
        strict=options.strict,
        limit=options.max_message_bytes,
        origin=loop.time(),
        keep_upstream=options.keep_upstream,
        initialize_timeout=options.initialize_timeout,
        shutdown_timeout=options.shutdown_timeout,
        allowances=Allowances(options.allow_hosts, options.allow_origins),
        limits=options.limits,
        max_pending=options.limits.max_pending,
        inflight=experiment.inflight,
        parser=experiment.parser,
        meta_for=experiment.meta_for,
        tls=options.listen_tls,
        observe_after_write=experiment.observe_after_write,
    )
    try:
        async with _serving(options, experiment, proxy) as admin:

            def ready(listen_url: str) -> None:
                if on_ready is not None:
                    on_ready(Ready(listen_url, admin.url if admin is not None else None))

            await proxy.serve(stop, ready, hurry=hurry)
    finally:
        if signals:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
    log.info("proxy finished", **experiment.tally.summary())
    return 0


async def run_stdio(options: RunOptions, observer: Observer | None = None) -> int:
    """Relay stdin/stdout to the upstream until one side ends; return the exit status.

    With a spawned Agent the status is the Agent's, as a shell would report it; 0 when the Client
    closed stdin and the Agent had to be stopped; 127 or 126 when the Agent command cannot be
    run. With a network upstream: 0 when the Client ended or a signal stopped the proxy, 1 when
    the connection was lost. :class:`~proxy.core.errors.StartupError` when the trace or the state
    file cannot be used, or the control API cannot listen (each before the Agent is started).

    SIGINT and SIGTERM are passed on to a spawned Agent (its process group), and the link ends as
    when the Agent leaves: what it still writes reaches the Client, then the Client's stdout is
    closed. Its stdin stays open for ``agent_grace`` seconds (no EOF races the signal), then is
    closed. After ``shutdown_timeout`` seconds, or at a second signal, the link
    is cut and the Agent killed.
    """
    experiment = _experiment(options, observer)
    try:
        status = await _relay_stdio(options, experiment)
    finally:
        experiment.close()
    log.info("proxy finished", exit_status=status, **experiment.tally.summary())
    return status


async def _relay_stdio(options: RunOptions, experiment: _Experiment) -> int:
    """The link of a stdio Client, from starting the Agent to its exit status. The control API
    listens first (when it cannot, no Agent was started), and answers once the link is there
    (``control API listening``): a request never finds the link missing."""
    one = _OneLink()
    async with _serving(options, experiment, one, serve=False) as admin:
        return await _relay_stdio_link(options, experiment, one, admin)


async def _relay_stdio_link(
    options: RunOptions, experiment: _Experiment, one: _OneLink, admin: AdminServer | None
) -> int:
    """Start the Agent and relay the stdio Client to it (the link given to ``one``), the
    control API answering from then on."""
    loop = asyncio.get_running_loop()
    try:
        agent = await experiment.connect_upstream({}, None)
    except FileNotFoundError:
        log.error("agent command not found", command=options.agent_argv[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        log.error("agent command is not executable", command=options.agent_argv[0])
        return EXIT_NOT_EXECUTABLE
    except Exception as exc:
        log.error("could not connect to the agent", error=str(exc) or type(exc).__name__)
        return EXIT_UNREACHABLE
    client = await open_client_stdio(limit=options.max_message_bytes, pipe_bytes=options.pipe_bytes)
    origin = loop.time()
    ids: dict[Direction, Iterator[int]] = {direction: itertools.count() for direction in Direction}
    tokens = itertools.count()  # the link's timers, numbered across its relays
    link = one.link = Link(
        lambda cached: Relay(
            strict=options.strict,
            engine=experiment.engine,
            origin=origin,
            ids=ids,
            tokens=tokens,
            initialize_timeout=options.initialize_timeout,
            max_pending=options.limits.max_pending,
            meta_for=experiment.meta_for,
        ),
        {Side.CLIENT: client, Side.AGENT: agent},
        experiment.observer,
        connect_agent=functools.partial(experiment.connect_upstream, {}, None),
        inflight=experiment.inflight,
        parser=experiment.parser,
        observe_after_write=experiment.observe_after_write,
    )

    deadline: asyncio.TimerHandle | None = None

    def cut(event: str, **fields: str) -> None:
        log.warning(event, **fields)
        link.abort()

    def on_signal(signum: int) -> None:
        nonlocal deadline
        name = signal.Signals(signum).name
        if deadline is not None:
            cut("second signal received; cutting the link now", signal=name)
            return
        log.info("signal received; passing it to the agent", signal=name)
        current = link.endpoints[Side.AGENT]
        if isinstance(current, Signalable):
            current.signal(signum)
            # As under a shell: the Agent ends as it chooses to, its stdin open for its grace.
            link.shutdown(after=options.agent_grace)
        else:
            link.shutdown()
        deadline = loop.call_later(
            options.shutdown_timeout, cut, "the link did not end in time; cutting it"
        )

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        if admin is not None:
            await admin.serve()
        await link.run()
        final = link.endpoints[Side.AGENT]
        if isinstance(final, AgentProcess):
            status = await final.wait()
            if final.stopped_by_proxy and link.closed_first is Side.CLIENT:
                status = 0
        else:
            stopped = link.closed_first is Side.CLIENT or deadline is not None
            status = 0 if stopped else EXIT_UNREACHABLE
    finally:
        if deadline is not None:
            deadline.cancel()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return status
