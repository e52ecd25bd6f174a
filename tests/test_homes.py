"""Every module of the package has an obvious test home.

The tests mirror the package: ``proxy/<folder>/<name>.py`` is tested in
``tests/<folder>/test_<name>.py``. A module tested elsewhere (a small helper exercised through the
module that uses it, a transport tested through the listener or a real process) is named in
:data:`ELSEWHERE` with its home, so that a reader finds its tests and a new module without any
test fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from harness import ROOT

PACKAGE = ROOT / "proxy"
TESTS = ROOT / "tests"

ELSEWHERE: dict[str, str] = {
    # the public faces
    "cli.py": "e2e/test_cli.py",
    "control.py": "shell/test_control.py",
    "embedded.py": "shell/test_parent_death.py",
    "pytest_plugin.py": "e2e/test_pytest_plugin.py",
    # the core
    "core/actions/__init__.py": "core/actions/test_registry.py",
    "core/actions/base.py": "core/actions/test_registry.py",
    "core/acp.py": "shell/test_metrics.py",
    "core/commands.py": "core/test_relay.py",
    "core/errors.py": "shell/test_startup.py",
    "core/events.py": "core/test_relay.py",
    "core/held.py": "core/actions/test_hold.py",
    "core/invalid.py": "core/test_relay.py",
    "core/observations.py": "core/test_records.py",
    # the shell
    "shell/admin.py": "shell/test_control.py",
    "shell/app.py": "shell/test_startup.py",
    "shell/fault_files.py": "shell/test_control.py",
    "shell/hostport.py": "e2e/test_cli.py",
    "shell/link.py": "shell/test_link_states.py",
    "shell/observers.py": "shell/test_metrics.py",
    "shell/server.py": "shell/test_shutdown.py",
    "shell/state.py": "shell/test_startup.py",
    "shell/writable.py": "shell/test_startup.py",
    "shell/transports/cookies.py": "shell/test_network.py",
    "shell/transports/guarded_site.py": "shell/test_limits.py",
    "shell/transports/http_listener.py": "shell/test_http_listener.py",
    "shell/transports/http_upstream.py": "shell/test_http_sessions.py",
    "shell/transports/orphans.py": "shell/test_parent_death.py",
    "shell/transports/pipes.py": "shell/test_stdio.py",
    "shell/transports/stdio.py": "shell/test_stdio.py",
    "shell/transports/websocket.py": "shell/test_http_listener.py",
    # the tools
    "tools/__init__.py": "tools/test_tool_options.py",
    "tools/bench/agent.py": "tools/bench/test_bench_children.py",
    "tools/bench/messages.py": "tools/bench/test_bench_workloads.py",
    "tools/bench/options.py": "tools/bench/test_bench_command.py",
    "tools/bench/processes.py": "tools/bench/test_bench_targets.py",
    "tools/bench/relay.py": "tools/bench/test_bench_children.py",
    "tools/bench/run.py": "tools/bench/test_bench_command.py",
    "tools/bench/ws_agent.py": "tools/bench/test_bench_children.py",
    "tools/bench/ws_driver.py": "tools/bench/test_bench_ws_targets.py",
    "tools/bench/ws_relay.py": "tools/bench/test_bench_ws_targets.py",
    "tools/check_agent/options.py": "tools/test_tool_options.py",
    "tools/check_client/command.py": "tools/check_client/test_check_client_scenarios.py",
    "tools/check_client/options.py": "tools/test_tool_options.py",
    "tools/check_client/run.py": "tools/check_client/test_check_client_scenarios.py",
    "tools/check_client/runner.py": "tools/check_client/test_check_client_scenarios.py",
    "tools/check_agent/runner.py": "tools/check_agent/test_check_agent_command.py",
    "tools/check_agent/traces/held_prompts.py": "tools/check_agent/test_check_agent_traces.py",
    "tools/check_agent/traces/invalid_keys.py": "tools/check_agent/test_check_agent_traces.py",
    "tools/check_agent/traces/key_scope.py": "tools/check_agent/test_check_agent_traces.py",
    "tools/check_agent/traces/lost_answers.py": "tools/check_agent/test_check_agent_traces.py",
    "tools/verdicts.py": "tools/check_agent/test_check_agent_output.py",
    "tools/lab/agent.py": "tools/lab/test_reference_agent.py",
    "tools/report/__init__.py": "tools/report/test_report.py",
    "tools/report/command.py": "tools/report/test_report_html.py",
    "tools/report/keys.py": "tools/report/test_report.py",
    "tools/report/load.py": "tools/report/test_report.py",
    "tools/report/model.py": "tools/report/test_report.py",
    "tools/report/prompts.py": "tools/report/test_report.py",
    "tools/report/summary.py": "tools/report/test_report.py",
    "tools/report/tables.py": "tools/report/test_report.py",
    "tools/report/text.py": "tools/report/test_report.py",
}
"""Modules (relative to ``proxy/``) whose tests are not at the mirrored place: where they are."""


def holds_code(path: Path) -> bool:
    """Whether a package's ``__init__.py`` defines anything (more than imports and ``__all__``)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return True
        if isinstance(node, ast.Assign) and not all(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return True
    return False


def modules() -> list[str]:
    """Every module of the package that holds code of its own, relative to ``proxy/``."""
    return sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__main__.py"
        and (path.name != "__init__.py" or (path.parent != PACKAGE and holds_code(path)))
    )


def mirrors(module: str) -> list[Path]:
    """Where the tests of ``module`` go when they mirror it (a package's own code: by its name):
    ``test_<name>.py``, or ``test_<package>_<name>.py`` (pytest needs test files' names unique)."""
    path = Path(module)
    if path.name == "__init__.py":
        path = path.parent.with_suffix(".py")
    folder = TESTS / path.parent
    return [folder / f"test_{path.name}", folder / f"test_{path.parent.name}_{path.name}"]


def mirrored(module: str) -> bool:
    """Whether ``module`` has its tests at a mirrored place."""
    return any(candidate.exists() for candidate in mirrors(module))


def test_every_module_has_a_test_home() -> None:
    homeless = [m for m in modules() if not mirrored(m) and m not in ELSEWHERE]
    assert not homeless, (
        f"modules with no test home: {homeless}; add tests/<folder>/test_<name>.py, or name where "
        "they are tested in ELSEWHERE"
    )


def test_every_home_named_elsewhere_is_current() -> None:
    known = set(modules())
    gone = [m for m in ELSEWHERE if m not in known]
    assert not gone, f"ELSEWHERE names modules that no longer exist: {gone}"
    missing = {m: home for m, home in ELSEWHERE.items() if not (TESTS / home).exists()}
    assert not missing, f"ELSEWHERE names test files that do not exist: {missing}"
    both = [m for m in ELSEWHERE if mirrored(m)]
    assert not both, f"these modules have mirrored tests now; remove them from ELSEWHERE: {both}"
