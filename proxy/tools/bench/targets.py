"""The targets: the process trees the bench drives its workloads through, and their commands.

Each target is the stdio bench Agent (:mod:`.agent`) reached

* ``direct``: spawned by the bench itself;
* ``socat``: through a byte relay, ``socat -b 262144 STDIO EXEC:...`` (only with ``socat``);
* ``asyncio``: through the floor of any Python relay (:mod:`.relay`), asyncio streams;
* ``asyncio-protocol``: the same floor written with asyncio protocols (``relay --protocol``);
* ``proxy``: through ``python -m proxy run`` with no rules;
* ``proxy+rules``: the same with :data:`RULES` loaded, evaluated on every message, never firing;
* ``proxy-pure``: ``proxy`` run from a copy of the installed package without its compiled
  modules, when the core is compiled (:func:`proxy.compiled_modules`): the two builds side by
  side.
"""

from __future__ import annotations

import shutil
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import proxy
from proxy.tools.bench.options import BenchOptions

__all__ = [
    "PROCESSES",
    "RULES",
    "RULE_COUNT",
    "TARGETS",
    "agent_argv",
    "pure_copy",
    "quiet_proxy",
    "target_argv",
]

TARGETS = ("direct", "socat", "asyncio", "asyncio-protocol", "proxy", "proxy+rules", "proxy-pure")

PROCESSES = {"direct": "agent", "socat": "socat", "asyncio": "relay", "asyncio-protocol": "relay"}
"""The process whose memory a target's figures give (the bench spawned it); else the proxy."""

RULES = """\
# A realistic rule set that matches nothing the bench sends: every rule is evaluated on every
# message, none fires.
version: 1
seed: 11
rules:
  - name: drop-cancel
    when: {direction: to_agent, kind: notification, method: session/cancel}
    do: {action: drop}
  - name: slow-tool-calls
    when:
      direction: to_client
      kind: notification
      method: session/update
      params: {update: {sessionUpdate: tool_call}}
    do: {action: delay, ms: 50, jitter_ms: 10}
  - name: never-fail-prompts
    when: {direction: to_agent, kind: request, method: session/prompt}
    schedule: {probability: 0.0}
    do: {action: error, code: -32603}
  - name: replay-keyed-prompts
    when: {direction: to_agent, kind: request, method: session/prompt, idempotency_key: present}
    do: {action: duplicate, copies: 1, gap_ms: 20}
  - name: other-sessions-slow
    when: {session: "other-*"}
    do: {action: delay, ms: 40}
  - name: kill-on-write
    when: {direction: to_agent, method: fs/write_text_file}
    do: {action: kill_agent, signal: KILL}
  - name: sever-terminals
    when: {method: "terminal/*"}
    do: {action: sever, side: both}
  - name: garble-loads
    when: {direction: to_client, kind: response, method: session/load}
    schedule: {every: 3}
    do: {action: corrupt, mode: garbage}
  - name: refuse-permissions
    when: {direction: to_client, kind: request, method: session/request_permission}
    do: {action: error, code: -32603, message: "permission service down"}
  - name: lose-resume-answers
    when: {direction: to_client, kind: response, method: session/resume}
    schedule: {nth: [1]}
    do: {action: drop}
  - name: slow-plans
    when:
      direction: to_client
      method: session/update
      params: {update: {sessionUpdate: plan}}
    do: {action: delay, ms: 30}
  - name: restart-on-close
    when: {direction: to_agent, method: session/close}
    do: {action: restart_proxy}
"""
"""The fault file of ``proxy+rules``: every rule evaluated on every message, none firing."""
RULE_COUNT = RULES.count("\n  - name: ")
"""Rules in :data:`RULES` (DESIGN 11 asks for 12)."""


def agent_argv(python: str) -> list[str]:
    """The stdio bench Agent."""
    return [python, "-m", "proxy.tools.bench.agent"]


def quiet_proxy(python: str) -> list[str]:
    """``python -m proxy run`` logging warnings only, before its own options; ``-P``: the
    package is the one installed (or ``proxy-pure``'s copy), never a source tree that happens to
    be the working directory."""
    return [python, "-P", "-m", "proxy", "run", "--log-level", "warning"]


def target_argv(
    target: str, options: BenchOptions, rules: Path, *, pure: Path | None = None
) -> list[str]:
    """The command of ``target``, whose ``proxy+rules`` loads the fault file ``rules`` and whose
    ``proxy-pure`` imports the package from the folder ``pure`` (:func:`pure_copy`)."""
    agent = agent_argv(options.python)
    if target == "direct":
        return agent
    if target == "socat":
        assert options.socat is not None
        return [options.socat, "-b", "262144", "STDIO", "EXEC:" + " ".join(agent)]
    if target == "asyncio":
        return [options.python, "-m", "proxy.tools.bench.relay", "--", *agent]
    if target == "asyncio-protocol":
        return [options.python, "-m", "proxy.tools.bench.relay", "--protocol", "--", *agent]
    proxy = quiet_proxy(options.python)
    if target == "proxy-pure":
        assert pure is not None
        proxy = ["env", f"PYTHONPATH={pure}", *proxy]
    if target == "proxy+rules":
        proxy += ["--faults", str(rules), "--seed", "1"]
    return [*proxy, "--", *agent]


def pure_copy(folder: Path) -> Path:
    """A copy of the installed package in ``folder``, its sources without the compiled modules
    beside them, for ``proxy-pure``: the folder to put first on ``PYTHONPATH``."""
    package = Path(proxy.__file__).parent
    shutil.copytree(
        package,
        folder / "proxy",
        ignore=shutil.ignore_patterns("__pycache__", *(f"*{s}" for s in EXTENSION_SUFFIXES)),
    )
    return folder
