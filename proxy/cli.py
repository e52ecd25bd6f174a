"""The command line (typer; names from DESIGN 3): it parses options and dispatches.

Each command turns its options into the options' model of its tool (which checks them: an
:class:`~proxy.core.errors.OptionError` is a usage error, exit 2), imports the tool when it runs
(``acp-proxy run`` loads nothing of :mod:`proxy.tools`), and exits with the status the tool
returns (:func:`_command`, the one place that turns either into an exit).

An option's default and least value (``min=``) are its model's, stated here for ``--help`` (and
refused here first). A tool's cannot be imported for that (no tool is loaded until one runs):
they are written again, and ``tests/tools/test_tool_options.py`` keeps them equal to the model's
(``tests/shell/test_run_options.py`` and ``tests/shell/test_defaults.py`` for ``run``'s).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec

import typer
from typer.core import TyperArgument, TyperCommand

from proxy import __version__, core_build
from proxy.core.errors import ConfigError, OptionError
from proxy.core.relay import DEFAULT_MAX_PENDING
from proxy.shell.admin import ADMIN_TOKEN_ENV
from proxy.shell.allocator import tune_allocator
from proxy.shell.app import RunOptions, run_main
from proxy.shell.collector import tune_collector
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
from proxy.shell.fault_files import schema_main, validate_main
from proxy.shell.inflight import DEFAULT_MAX_INFLIGHT_BYTES
from proxy.shell.limits import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_EVENT_SUBSCRIBERS,
    DEFAULT_MAX_HELD,
    DEFAULT_MAX_LINKS,
    DEFAULT_MAX_SESSIONS,
    Limits,
)
from proxy.shell.log import configure_logging, get_logger
from proxy.shell.plugins import load_plugin_actions
from proxy.shell.tls import agent_tls

if TYPE_CHECKING:
    from typer import _click as click  # the click typer carries (0.29)

__all__ = ["app", "main"]

app = typer.Typer(
    name="acp-proxy",
    help="A fault-injecting JSON-RPC relay for the Agent Client Protocol.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: flags without a type, option names beside their help at any width
    # (rich's table gives `<bool>` to every flag and a narrow help column at 80 columns).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class LogFormatChoice(enum.StrEnum):
    """How log lines (always on stderr) are rendered."""

    console = "console"
    json = "json"


class LogLevelChoice(enum.StrEnum):
    """The least severe log level printed."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


LogFormatOption = Annotated[
    LogFormatChoice, typer.Option(help="Log rendering (logs always go to stderr).")
]
LogLevelOption = Annotated[LogLevelChoice, typer.Option(help="Least severe level logged.")]
ResultsJsonOption = Annotated[bool, typer.Option("--json", help="Print the results as JSON.")]
"""The checkers' ``--json``."""
JunitOption = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Also write JUnit XML to this file.", dir_okay=False),
]
"""The checkers' ``--junit FILE``."""
TlsCertOption = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="The certificate in PEM, for --listen https:// or wss://."),
]
TlsKeyOption = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="The private key of --tls-cert in PEM."),
]
TlsCaOption = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="Verify a wss:// or https:// Agent against the CAs of this PEM bundle (not "
        "the system's trust store).",
    ),
]


Options = ParamSpec("Options")


class _Command(TyperCommand):
    """A command whose help names each argument by its placeholder alone: typer appends the
    parameter's Python type (``FILE <list[Path]>``), which says nothing to a user."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                arguments.append((param.metavar or record[0], record[1]))
            else:
                options.append(record)
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _command(
    name: str | None = None, *, on: typer.Typer = app, **settings: Any
) -> Callable[[Callable[Options, int]], Callable[Options, NoReturn]]:
    """Register a command of ``acp-proxy`` (typer's ``app.command``) that runs a tool: the status
    its function returns is the exit status, and an :class:`~proxy.core.errors.OptionError` raised
    while it builds the tool's options is a usage error (the command's usage, then the message
    naming the option, exit 2)."""

    def register(command: Callable[Options, int]) -> Callable[Options, NoReturn]:
        @functools.wraps(command)
        def run_tool(*args: Options.args, **kwargs: Options.kwargs) -> NoReturn:
            try:
                status = command(*args, **kwargs)
            except OptionError as exc:
                raise typer.BadParameter(str(exc), param_hint=exc.option) from None
            raise typer.Exit(status)

        on.command(name, cls=_Command, **settings)(run_tool)
        return run_tool

    return register


def _version(value: bool) -> None:
    if value:
        typer.echo(f"acp-proxy {__version__} ({core_build()})")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """A fault-injecting JSON-RPC relay for the Agent Client Protocol."""


def _plugins() -> None:
    """Register the actions other packages declare (:mod:`proxy.shell.plugins`), for the commands
    that read rules (``run``, ``validate``, ``schema``): one that cannot be used ends the
    command with one line naming it (exit 2), and leaves the others (``report``, ``--help``)
    untouched."""
    try:
        load_plugin_actions()
    except ConfigError as exc:
        typer.echo(f"acp-proxy: {exc}", err=True)
        raise typer.Exit(2) from None


@_command(
    context_settings={"allow_interspersed_args": False},
    no_args_is_help=False,
)
def run(
    ctx: typer.Context,
    agent_cmd: Annotated[
        list[str] | None,
        typer.Argument(metavar="-- AGENT_CMD", help="The Agent to spawn, with its arguments."),
    ] = None,
    listen: Annotated[
        str,
        typer.Option(
            metavar="ADDRESS",
            help="Where Clients connect: stdio, http://HOST:PORT/PATH (also accepts the "
            "WebSocket upgrade) or ws://HOST:PORT/PATH; https:// or wss:// for TLS (with "
            "--tls-cert and --tls-key). Port 0 picks a free port (logged).",
        ),
    ] = "stdio",
    upstream: Annotated[
        str,
        typer.Option(
            metavar="ADDRESS",
            help="Where the Agent is: stdio (spawn AGENT_CMD for each Client connection), "
            "http://HOST:PORT/PATH or ws://HOST:PORT/PATH; https:// or wss:// for TLS (verified "
            "against the system's trust store, or --tls-ca).",
        ),
    ] = "stdio",
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="The listener's certificate in PEM (then any intermediates), for --listen "
            "https:// or wss://; checked before anything starts (readable, not expired).",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="The private key of --tls-cert in PEM, without a passphrase.",
        ),
    ] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Verify an https:// or wss:// Agent's certificate against the CAs of this PEM "
            "bundle (not the system's trust store).",
        ),
    ] = None,
    tls_insecure: Annotated[
        bool,
        typer.Option(
            "--tls-insecure",
            help="Do not verify an https:// or wss:// Agent's certificate nor its name "
            "(logged as a warning): for a test Agent with a throwaway certificate only.",
        ),
    ] = False,
    keep_upstream: Annotated[
        bool,
        typer.Option(
            "--keep-upstream",
            help="Conductor mode: the Agent's connection outlives its Client; the next Client "
            "takes it over and its initialize is answered from the first answer.",
        ),
    ] = False,
    faults: Annotated[
        list[Path] | None,
        typer.Option(
            "--faults",
            metavar="FILE",
            help="Fault file (YAML or JSON); may be given more than once.",
            dir_okay=False,
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(metavar="N", help="Seed of every random draw (overrides the files' seed)."),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option("--watch", help="Reload the fault files on change; keep the last good ones."),
    ] = False,
    state: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Keep rule counters in this file across restarts of the proxy.",
            dir_okay=False,
            readable=False,  # checked when read: one line and the status of a failed start
        ),
    ] = None,
    admin: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="HOST:PORT of the control API and /metrics (port 0 picks one, logged).",
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            metavar="TOKEN",
            help=f"Bearer token every control route but /healthz requires (or {ADMIN_TOKEN_ENV}, "
            "or --admin-token-file). Given on the command line it is visible to other local "
            "users (ps): prefer the variable or the file.",
            show_default=False,
        ),
    ] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help=f"Read the control API's bearer token from this file (one line); the file wins "
            f"over the variable {ADMIN_TOKEN_ENV}.",
            dir_okay=False,
        ),
    ] = None,
    admin_allow_remote: Annotated[
        bool,
        typer.Option("--admin-allow-remote", help="Let --admin bind to a non-loopback address."),
    ] = False,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            metavar="NAME[:PORT]",
            help="A Host name the listener and the control API answer to besides their bound "
            "address (a DNS or container name); repeatable.",
        ),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            metavar="ORIGIN",
            help="A web origin (https://app.example) whose pages may use the listener; "
            "repeatable. '*' lets any page the user opens drive the Agent: dangerous.",
        ),
    ] = None,
    admin_allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--admin-allow-origin",
            metavar="ORIGIN",
            help="A web origin whose pages may use the control API; repeatable.",
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Append a JSON line per message, fault and connection event to this file.",
        ),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Record every message both ways, body included, to this JSON Lines file "
            "(gzip-compressed when its name ends in .gz), for acp-proxy replay.",
        ),
    ] = None,
    redact: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PATTERN",
            help="Replace what this names in the recording: a JSON path such as "
            "params.prompt[*].text, or a regular expression searched in string values (not "
            "one that matches the empty string); repeatable.",
        ),
    ] = None,
    otel: Annotated[
        bool,
        typer.Option(
            "--otel",
            help="Export a span per request over OTLP/HTTP (OTEL_* variables; the otel extra).",
        ),
    ] = False,
    otel_propagate: Annotated[
        bool,
        typer.Option(
            "--otel-propagate",
            help="--otel, and each forwarded request carries its span in _meta.traceparent.",
        ),
    ] = False,
    max_message_bytes: Annotated[
        int,
        typer.Option(
            metavar="BYTES", min=1, help="Largest message accepted from a peer, in bytes."
        ),
    ] = DEFAULT_MAX_MESSAGE_BYTES,
    pipe_bytes: Annotated[
        int,
        typer.Option(
            metavar="BYTES",
            min=0,
            help="Room asked of each pipe between a stdio proxy and its Client and Agent "
            "(Linux; at most what the system allows, never less than its own 64 KiB; 0: the "
            "system's own).",
        ),
    ] = PIPE_BYTES,
    max_pending: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            help="Requests one peer may have unanswered per link; past it a request is "
            "answered -32603 instead of being relayed.",
        ),
    ] = DEFAULT_MAX_PENDING,
    max_inflight_bytes: Annotated[
        int,
        typer.Option(
            metavar="BYTES",
            min=1,
            help="Bytes read from peers and not yet taken by their destinations, across the "
            "proxy; past it reading waits and a POST that does not fit is answered 503.",
        ),
    ] = DEFAULT_MAX_INFLIGHT_BYTES,
    max_active_faults: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            min=0,
            help="Faults in progress at once across the proxy (messages held, copies spaced, "
            "commands delayed); past it a rule that would start one does not act, counted in "
            "acp_proxy_faults_overflow_total. Default: no cap.",
        ),
    ] = None,
    max_held: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            help="Messages hold rules may hold at once across the proxy; past it a hold rule "
            "does not act (the message goes on), counted in acp_proxy_faults_overflow_total.",
        ),
    ] = DEFAULT_MAX_HELD,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Answer invalid messages (-32700/-32600) instead of forwarding them untouched.",
        ),
    ] = False,
    allow_client_faults: Annotated[
        bool,
        typer.Option(
            "--allow-client-faults",
            help="Let a Client's request ask for its own fault in params._meta.acpFault (an "
            "action and its fields, as a rule's do); the hint is taken out before it goes on.",
        ),
    ] = False,
    agent_grace: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=0,
            help="Seconds the Agent gets to exit before SIGTERM, then SIGKILL.",
        ),
    ] = AGENT_GRACE,
    connect_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds to reach a network Agent (TCP connect and WebSocket handshake).",
        ),
    ] = CONNECT_TIMEOUT,
    initialize_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds the Agent has to answer initialize; then the Client gets an error.",
        ),
    ] = INITIALIZE_TIMEOUT,
    http_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds one POST or DELETE to an HTTP Agent may take, answer included.",
        ),
    ] = HTTP_TIMEOUT,
    shutdown_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=0,
            help="Seconds the links get to end after SIGTERM or SIGINT before they are cut "
            "(a second signal cuts them at once).",
        ),
    ] = SHUTDOWN_TIMEOUT,
    max_links: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            help="Client connections served at once on a listener (each with its Agent process "
            "or upstream connection); one more is refused with 503 before any Agent starts.",
        ),
    ] = DEFAULT_MAX_LINKS,
    idle_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds an HTTP Client connection may stay idle (no request, no stream it "
            "reads, no request of its awaiting an answer); then it is ended, its Agent stopped.",
        ),
    ] = DEFAULT_IDLE_TIMEOUT,
    max_sessions: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            help="Sessions one HTTP connection may name (a Client's; session streams toward an "
            "HTTP Agent); past them a Client's POST or GET is refused with 429.",
        ),
    ] = DEFAULT_MAX_SESSIONS,
    header_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds a TCP connection to the listener or the control API has to send a "
            "complete request head (after it opens, or after its previous response).",
        ),
    ] = DEFAULT_HEADER_TIMEOUT,
    max_event_subscribers: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            help="GET /api/events streams at once; one more gets 503.",
        ),
    ] = DEFAULT_MAX_EVENT_SUBSCRIBERS,
    log_format: LogFormatOption = LogFormatChoice.console,
    log_level: LogLevelOption = LogLevelChoice.info,
) -> int:
    """Relay Clients to an Agent, injecting the faults of the fault files.

    The usual stdio use: the Client launches the proxy as if it were the Agent,
    acp-proxy run -- node my-agent.js
    """
    configure_logging(log_format.value, log_level.value)
    get_logger("proxy.cli").debug("allocator thresholds", outcome=tune_allocator())
    _warn_of_proxy_options(agent_cmd or (), ctx)
    _plugins()
    options = RunOptions.from_command_line(
        agent_argv=agent_cmd or (),
        listen=listen,
        upstream=upstream,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca=tls_ca,
        tls_insecure=tls_insecure,
        keep_upstream=keep_upstream,
        admin=admin,
        admin_token=admin_token,
        admin_token_file=admin_token_file,
        admin_allow_remote=admin_allow_remote,
        allow_hosts=allow_host or (),
        allow_origins=allow_origin or (),
        admin_allow_origins=admin_allow_origin or (),
        trace=trace,
        record=record,
        redact=redact or (),
        otel=otel,
        otel_propagate=otel_propagate,
        max_message_bytes=max_message_bytes,
        pipe_bytes=pipe_bytes,
        strict=strict,
        allow_client_faults=allow_client_faults,
        agent_grace=agent_grace,
        connect_timeout=connect_timeout,
        initialize_timeout=initialize_timeout,
        http_timeout=http_timeout,
        shutdown_timeout=shutdown_timeout,
        limits=Limits(
            max_links=max_links,
            idle_timeout=idle_timeout,
            max_sessions=max_sessions,
            header_timeout=header_timeout,
            max_event_subscribers=max_event_subscribers,
            max_pending=max_pending,
            max_inflight_bytes=max_inflight_bytes,
            max_active_faults=max_active_faults,
            max_held=max_held,
        ),
        faults=faults or (),
        seed=seed,
        watch=watch,
        state=state,
    )
    threshold, frozen = tune_collector()  # last: what start-up made is frozen
    get_logger("proxy.cli").debug(
        "garbage collector tuned", young_threshold=threshold, frozen_objects=frozen
    )
    return run_main(options)


def _warn_of_proxy_options(agent_argv: Sequence[str], ctx: typer.Context) -> None:
    """Warn of each argument of the Agent that is an option of ``run``: everything after ``--``
    goes to the Agent, and an Agent that ignores unknown options would run, say, untraced."""
    if Path(agent_argv[0] if agent_argv else "").name == "acp-proxy" or (
        list(agent_argv[1:3]) == ["-m", "proxy"]
    ):
        return  # a proxy in front of a proxy: its options are its own
    ours = {name for param in ctx.command.params for name in param.opts}
    for argument in agent_argv[1:]:
        name = argument.split("=", 1)[0]
        if name.startswith("--") and name in ours:
            get_logger("proxy.cli").warning(
                "an argument of the Agent is an option of acp-proxy run; the proxy's options go "
                "before --",
                argument=name,
            )


@_command()
def agent(
    listen: Annotated[
        str,
        typer.Option(
            metavar="ADDRESS",
            help="stdio, ws://HOST:PORT/PATH or http://HOST:PORT/PATH (wss://, https:// for "
            "TLS, with --tls-cert and --tls-key).",
        ),
    ] = "stdio",
    store: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Keep sessions (messages with their keys) in this directory.",
            file_okay=False,
        ),
    ] = None,
    no_dedupe: Annotated[
        bool, typer.Option("--no-dedupe", help="Ignore idempotency keys: a known-bad Agent.")
    ] = False,
    turn_ms: Annotated[
        float, typer.Option(metavar="MS", min=0, help="How long a turn runs.")
    ] = 50.0,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    fail_prompts: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            help="Answer the first N prompts -32603, inserting nothing (the keys stay unused).",
        ),
    ] = 0,
    log_format: LogFormatOption = LogFormatChoice.console,
    log_level: LogLevelOption = LogLevelChoice.warning,
) -> int:
    """The reference ACP v2 Agent: implements the idempotency RFD fully (or not, --no-dedupe)."""
    from proxy.tools.lab.agent import AgentOptions, agent_main

    configure_logging(log_format.value, log_level.value)
    options = AgentOptions.from_command_line(
        listen=listen,
        tls_cert=tls_cert,
        tls_key=tls_key,
        store=store,
        dedupe=not no_dedupe,
        turn_ms=turn_ms,
        fail_prompts=fail_prompts,
    )
    return agent_main(options)


class TransportChoice(enum.StrEnum):
    """How the checker reaches the proxy in front of the Agent."""

    stdio = "stdio"
    ws = "ws"
    http = "http"


@_command("check-agent")
def check_agent_command(
    agent_cmd: Annotated[
        list[str], typer.Argument(metavar="-- AGENT_CMD", help="The Agent to check.")
    ],
    transport: Annotated[
        TransportChoice, typer.Option(help="Between the checker and the proxy.")
    ] = TransportChoice.stdio,
    as_json: ResultsJsonOption = False,
    junit: JunitOption = None,
    trace: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            "--trace",
            metavar="T0..T7",
            help="Check only this RFD trace (not a trace file); repeatable: --only T1 --only T3.",
        ),
    ] = None,
    answer_timeout: Annotated[
        float,
        typer.Option(metavar="SECONDS", min=0.1, help="Seconds to wait for an expected answer."),
    ] = 5.0,
    startup_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=0.1,
            help="Seconds an Agent just started (or restarted) has to answer initialize.",
        ),
    ] = 30.0,
    # The verdicts say what went wrong; the checker's own connections' warnings repeat it.
    log_level: LogLevelOption = LogLevelChoice.error,
) -> int:
    """Run the idempotency RFD's conformance traces T0-T7 against an Agent.

    Exit 0 when every trace passed (or was skipped for a missing capability), 1 on a FAIL, 2 when
    a trace could not be checked, when every trace was skipped, or when the Agent cannot be run.
    """
    from proxy.tools.check_agent import CheckOptions, check_agent_main

    configure_logging("console", log_level.value)
    options = CheckOptions.from_command_line(
        agent_argv=agent_cmd,
        transport=transport.value,
        answer_timeout=answer_timeout,
        startup_timeout=startup_timeout,
        traces=trace or (),
    )
    return check_agent_main(options, as_json=as_json, junit=junit)


@_command("check-client", context_settings={"allow_interspersed_args": False})
def check_client_command(
    client_cmd: Annotated[
        list[str],
        typer.Argument(
            metavar="-- CLIENT_CMD",
            help="The Client to check; {agent} (or {agent-json}, or {url} with --listen) names "
            "the Agent it is given.",
        ),
    ],
    listen: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="Serve the Agent at http://127.0.0.1:0/acp or ws://... for a network Client "
            "({url} in its command).",
        ),
    ] = None,
    prompts: Annotated[
        int, typer.Option(metavar="N", min=1, help="How many prompts the Client sends in a run.")
    ] = 1,
    retry_window: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", min=0.1, help="Seconds after a loss within which a resend counts."
        ),
    ] = 30.0,
    client_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=0.1,
            help="Seconds a run of the Client may last before it is stopped and judged.",
        ),
    ] = 60.0,
    as_json: ResultsJsonOption = False,
    junit: JunitOption = None,
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            metavar="C0..C7",
            help="Check only this scenario; repeatable: --only C1 --only C5.",
        ),
    ] = None,
    log_level: LogLevelOption = LogLevelChoice.error,
) -> int:
    """Run a Client through the idempotency RFD's Client scenarios C0-C7 and judge its retries.

    Exit 0 when no scenario failed, 1 on a FAIL, 2 when nothing could be checked (every scenario
    skipped or not checkable) or on a usage error (the Client's command names no Agent, or cannot
    be run).
    """
    from proxy.tools.check_client import ClientCheckOptions, check_client_main

    configure_logging("console", log_level.value)
    options = ClientCheckOptions.from_command_line(
        client_argv=client_cmd,
        listen=listen,
        prompts=prompts,
        retry_window=retry_window,
        client_timeout=client_timeout,
        scenarios=scenario or (),
    )
    return check_client_main(options, as_json=as_json, junit=junit)


@_command(
    context_settings={"allow_interspersed_args": False},
    no_args_is_help=False,
    help="The reference ACP v2 Client: one idempotency key per prompt, resent after failures."
    "\n\nEvery user message seen for a prompt counts, live and replayed, on every connection: "
    "more than one messageId for a prompt is a duplicate insert, as the proxy's ledger judges "
    "it.\n\nExit 0 when every prompt was confirmed and inserted exactly once; 1 on a flaw (a "
    "prompt inserted more than once or never confirmed, the session lost, the Agent gone for "
    "good); 2 on a usage error, or when nothing could be checked (the Agent cannot be started "
    "or reached, or is not an ACP v2 Agent).",
)
def client(
    agent_cmd: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- AGENT_CMD",
            help="The Agent to spawn over stdio (typically acp-proxy run ... -- AGENT); "
            "started again when it exits.",
        ),
    ] = None,
    connect: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS",
            help="ws://HOST:PORT/PATH or http://HOST:PORT/PATH of an Agent instead (wss://, "
            "https:// in TLS).",
        ),
    ] = None,
    tls_ca: TlsCaOption = None,
    prompt: Annotated[
        list[str] | None,
        typer.Option(
            "--prompt", "-p", metavar="TEXT", help="A prompt to submit (its own key); repeatable."
        ),
    ] = None,
    answer_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds to wait for an answer before resending.",
        ),
    ] = 10.0,
    max_attempts: Annotated[
        int,
        typer.Option(metavar="N", min=1, help="Requests per prompt (and tries per reconnection)."),
    ] = 5,
    cwd: Annotated[
        str | None,
        typer.Option(metavar="DIR", help="The session's working directory (default: this one)."),
    ] = None,
    follow_trace: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="The --trace of the proxy in front of the Agent (used by this Client alone): an "
            "answer it says is lost times out at once, so a busy machine's slow answers are "
            "not taken for lost ones.",
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    no_key: Annotated[
        bool,
        typer.Option(
            "--no-key", help="Misbehave on purpose (for check-client's tests): send no key."
        ),
    ] = False,
    reuse_key: Annotated[
        bool,
        typer.Option(
            "--reuse-key",
            help="Misbehave on purpose (for check-client's tests): one key for every prompt.",
        ),
    ] = False,
    key_from_text: Annotated[
        bool,
        typer.Option(
            "--key-from-text",
            help="Misbehave on purpose (for check-client's tests): a key derived from the "
            "prompt's text.",
        ),
    ] = False,
    log_format: LogFormatOption = LogFormatChoice.console,
    log_level: LogLevelOption = LogLevelChoice.warning,
) -> int:
    from proxy.tools.lab.client import ClientOptions, client_main
    from proxy.tools.lab.client.options import KeyMode

    configure_logging(log_format.value, log_level.value)
    flags: list[tuple[str, KeyMode, bool]] = [
        ("--no-key", "none", no_key),
        ("--reuse-key", "reuse", reuse_key),
        ("--key-from-text", "from_text", key_from_text),
    ]
    misbehaviours = [(flag, mode) for flag, mode, given in flags if given]
    if len(misbehaviours) > 1:
        raise OptionError(f"{' and '.join(flag for flag, _ in misbehaviours)}: give one at most")
    secure = connect is not None and connect.startswith(("wss://", "https://"))
    options = ClientOptions(
        agent_argv=tuple(agent_cmd or ()),
        connect=connect,
        tls=agent_tls(secure=secure, ca=tls_ca),
        prompts=tuple(prompt or ("hello",)),
        answer_timeout=answer_timeout,
        max_attempts=max_attempts,
        cwd=cwd or str(Path.cwd()),
        follow_trace=follow_trace,
        keys=misbehaviours[0][1] if misbehaviours else "fresh",
    )
    return client_main(options, as_json=json_output)


@_command(
    context_settings={"allow_interspersed_args": False},
    no_args_is_help=False,
    help="The embedded default: the reference Client, the proxy with faults, the reference "
    "Agent (or the Agent given after --, spawned over stdio by the proxy).\n\nExit 0 when "
    "the run is clean; 1 when it found a flaw (a finding of the proxy, or the Client saw a "
    "prompt inserted twice, unconfirmed, or a session the Agent lost when killed); 2 on a usage "
    "error, or when nothing could be checked (the Agent cannot be run, or is not an ACP v2 "
    "Agent).",
)
def demo(
    agent_cmd: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- AGENT_CMD",
            help="Another Agent to run the demo against, with its arguments.",
        ),
    ] = None,
    bad_agent: Annotated[
        bool, typer.Option("--bad-agent", help="Use an Agent that ignores idempotency keys.")
    ] = False,
    keep: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR", help="Keep the run's files (trace, store, fault file) in this directory."
        ),
    ] = None,
    answer_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds the Client waits for an answer the proxy did not lose before it "
            "resends (an answer the proxy drops is resent at once; an Agent that answers "
            "prompts slowly needs more).",
        ),
    ] = 10.0,
) -> int:
    from proxy.tools.lab.demo import DemoOptions, demo_main

    configure_logging("console", "critical")  # the Client's report says why it stopped
    options = DemoOptions(
        bad_agent=bad_agent,
        agent_argv=tuple(agent_cmd or ()),
        directory=keep,
        answer_timeout=answer_timeout,
    )
    return demo_main(options)


@_command()
def report(
    traces: Annotated[
        list[Path],
        typer.Argument(
            metavar="TRACE", help="JSONL traces (--trace), e.g. one per proxy; merged by time."
        ),
    ],
    json_output: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Write the report as a self-contained HTML page (instead of the text; "
            "with --json, as well as the JSON).",
        ),
    ] = None,
) -> int:
    """Summarize traces: faults, messages, prompts, keys, retries, findings (over every node).

    Exit 1 when there is a finding other than unkeyed_resend (a warning); 2 for an unreadable file.
    """
    from proxy.tools.report.command import print_report

    return print_report(traces, as_json=json_output, html=html)


@_command()
def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    short: Annotated[
        bool, typer.Option("--short", help="Tiny counts, for CI: checks it runs, not speed.")
    ] = False,
    requests: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="Ping-pong requests per round.")
    ] = None,
    notifications: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="session/update notifications per round.")
    ] = None,
    prompts: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="64 KiB prompts per round.")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option(metavar="N", min=1, help="Rounds, each in fresh processes.")
    ] = None,
    memory_check: Annotated[
        int,
        typer.Option(
            min=0, metavar="N", help="Also send N messages through the proxy, watching its RSS."
        ),
    ] = 0,
    ws_links: Annotated[
        int | None,
        typer.Option(
            min=0,
            metavar="N",
            help="Concurrent WebSocket links through one proxy (default 1000; 0: none).",
        ),
    ] = None,
    delays: Annotated[
        int | None,
        typer.Option(
            min=0, metavar="M", help="Delayed requests per variant of the injected-delay check."
        ),
    ] = None,
    no_socat: Annotated[
        bool, typer.Option("--no-socat", help="Leave out the byte-relay (socat) column.")
    ] = False,
    no_websocket: Annotated[
        bool,
        typer.Option(
            "--no-websocket",
            help="Leave out the WebSocket columns (direct, websockets relay, mitmproxy, proxy).",
        ),
    ] = False,
    no_mitmproxy: Annotated[
        bool, typer.Option("--no-mitmproxy", help="Leave out the mitmproxy WebSocket column.")
    ] = False,
    fixed_allocator: Annotated[
        bool,
        typer.Option(
            "--fixed-allocator",
            help="Run every process with glibc's allocator thresholds fixed at the proxy's "
            "(the floors' figures without the page faults of glibc's moving ones).",
        ),
    ] = False,
) -> int:
    """Measure the proxy against a direct connection and a byte relay (the performance targets).

    Timings are reported, PASS/MISS per target, never turned into the exit status.
    """
    from proxy.tools.bench import bench_main, make_options

    options = make_options(
        short=short,
        requests=requests,
        notifications=notifications,
        prompts=prompts,
        rounds=rounds,
        memory_check=memory_check,
        ws_links=ws_links,
        delays=delays,
        socat=not no_socat,
        websocket=not no_websocket,
        mitmproxy=not no_mitmproxy,
        fixed_allocator=fixed_allocator,
    )
    return bench_main(options, as_json=json_output)


@_command()
def validate(
    files: Annotated[
        list[Path], typer.Argument(metavar="FILE", help="Fault files to check.", dir_okay=False)
    ],
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="A note fails the check too (exit 1): for CI, where it is a mistake."
        ),
    ] = False,
) -> int:
    """Check fault files: exit 0, or 2 with every error located (file, line, rule, field).

    What is valid but worth a word (an action that fires only for Clients on Streamable HTTP, an
    old field name, a method that looks misspelt) is a located note on stderr; the verdict goes
    to stdout. With --strict a note fails the check: exit 1.
    """
    _plugins()
    return validate_main(files, strict=strict)


@_command()
def schema() -> int:
    """Print the JSON Schema of fault files (for editors)."""
    _plugins()
    return schema_main()


replay_app = typer.Typer(
    help="Play a recorded session again (acp-proxy run --record FILE): as the Agent, or as the "
    "Client against a live Agent.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(replay_app, name="replay")

IgnoreOption = Annotated[
    list[str] | None,
    typer.Option(
        metavar="PATH",
        help="A JSON path not compared (params.cwd, result._meta.*), besides ids, session and "
        "message ids, idempotency keys, times and cwd; repeatable.",
    ),
]
SpeedOption = Annotated[
    float,
    typer.Option(
        metavar="N",
        min=0,
        help="Replay at N times the recorded pace; 0: every message at once.",
    ),
]


@_command("agent", on=replay_app)
def replay_agent(
    recording: Annotated[
        Path, typer.Argument(metavar="FILE", help="The recording (.jsonl or .jsonl.gz).")
    ],
    listen: Annotated[
        str,
        typer.Option(
            metavar="ADDRESS", help="stdio, ws://HOST:PORT/PATH or http://HOST:PORT/PATH."
        ),
    ] = "stdio",
    ignore: IgnoreOption = None,
    strict_order: Annotated[
        bool,
        typer.Option("--strict-order", help="Requests must come in the recorded order."),
    ] = False,
    dedupe: Annotated[
        bool,
        typer.Option(
            "--dedupe",
            help="Honour idempotencyKey as the RFD asks: a retried prompt gets the original "
            "messageId and inserts nothing.",
        ),
    ] = False,
    speed: SpeedOption = 1.0,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    log_format: LogFormatOption = LogFormatChoice.console,
    log_level: LogLevelOption = LogLevelChoice.warning,
) -> int:
    """An Agent that answers as the recorded one did.

    Each request is matched to a recorded request of the same method by its params (what
    changes between runs aside); the recorded answer, and what the Agent sent after it, go back
    with this run's ids. A request that matches none gets a JSON-RPC error naming the nearest
    recorded request and the difference. Exit 2 when the recording cannot be used.
    """
    from proxy.tools.replay.agent import ReplayAgentOptions, replay_agent_main

    configure_logging(log_format.value, log_level.value)
    options = ReplayAgentOptions.from_command_line(
        recording=recording,
        listen=listen,
        tls_cert=tls_cert,
        tls_key=tls_key,
        ignore=tuple(ignore or ()),
        strict_order=strict_order,
        dedupe=dedupe,
        speed=speed,
    )
    return replay_agent_main(options)


@_command(
    "client",
    on=replay_app,
    no_args_is_help=False,  # options may follow FILE; the Agent's command follows --
)
def replay_client(
    recording: Annotated[
        Path, typer.Argument(metavar="FILE", help="The recording (.jsonl or .jsonl.gz).")
    ],
    agent_cmd: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- AGENT_CMD", help="The Agent to spawn over stdio, once per recorded link."
        ),
    ] = None,
    connect: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="Reach the Agent at this ws:// or http:// URL instead (wss://, https:// in TLS).",
        ),
    ] = None,
    tls_ca: TlsCaOption = None,
    ignore: IgnoreOption = None,
    speed: SpeedOption = 0.0,
    timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            min=MIN_TIMEOUT,
            help="Seconds to wait for each message the recorded Agent sent.",
        ),
    ] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the differences as JSON.")] = False,
    log_format: LogFormatOption = LogFormatChoice.console,
    log_level: LogLevelOption = LogLevelChoice.warning,
) -> int:
    """Drive a live Agent with the recorded Client's messages and say where its answers differ.

    Requests of the Agent are answered as recorded. Each difference is a line: the recorded
    line, the method, the path, the recorded value and the new one. Exit 0 when nothing differs
    (ids, session and message ids, keys, times, cwd and --ignore paths aside), 1 when something
    does, 2 when the recording cannot be used or the Agent cannot be reached.
    """
    from proxy.tools.replay.client import ReplayClientOptions, replay_client_main

    configure_logging(log_format.value, log_level.value)
    secure = connect is not None and connect.startswith(("wss://", "https://"))
    options = ReplayClientOptions(
        recording=recording,
        agent_argv=tuple(agent_cmd or ()),
        connect=connect,
        tls=agent_tls(secure=secure, ca=tls_ca),
        ignore=tuple(ignore or ()),
        speed=speed,
        timeout=timeout,
    )
    return replay_client_main(options, as_json=as_json)


def main() -> None:
    """Console-script entry point."""
    app()
