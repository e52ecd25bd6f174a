"""Plugin actions: a package that declares an entry point in ``acp_proxy.actions`` adds an action
that fault files, ``validate``, ``schema`` and the relay know; a bad plugin is one line naming
its package, never a traceback.

The plugin (``tests/support/plugins/acp_proxy_teapot``) is installed for each test as pip would
leave it: the package and a ``dist-info`` with its entry points, in a folder on ``PYTHONPATH``."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from harness import PEERS, fault_file
from tool_runs import acp_proxy

TEAPOT = PEERS.parent / "plugins" / "acp_proxy_teapot"


def install(target: Path, entry: str = "teapot = acp_proxy_teapot:ACTION") -> dict[str, str]:
    """The teapot package and its ``dist-info`` (declaring ``entry``) in ``target``; the
    environment of a process that has it installed."""
    shutil.copytree(TEAPOT, target / "acp_proxy_teapot")
    info = target / "acp_proxy_teapot-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acp-proxy-teapot\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[acp_proxy.actions]\n{entry}\n")
    paths = [str(target), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


TEAPOT_RULE = {"name": "brew", "when": {"method": "_x/tea"}, "do": {"action": "teapot"}}


def test_a_plugin_action_is_known_to_validate_schema_and_the_relay(tmp_path: Path) -> None:
    """Used from a fault file: validated, in the schema, and fired on a real relay (stdio)."""
    env = install(tmp_path / "site")
    faults = fault_file(tmp_path, TEAPOT_RULE)
    checked = acp_proxy("validate", str(faults), env=env)
    assert (checked.returncode, checked.stdout) == (0, "ok: 1 rule in 1 file, no seed\n")
    schema = json.loads(acp_proxy("schema", env=env).stdout)
    assert "teapot" in json.dumps(schema)
    agent = [sys.executable, str(PEERS / "raw_agent.py"), str(tmp_path / "capture")]
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "_x/tea", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "_x/coffee", "params": {}},
    ]
    relayed = acp_proxy(
        "run",
        "--faults",
        str(faults),
        "--",
        *agent,
        env=env,
        stdin="".join(json.dumps(line) + "\n" for line in lines),
    )
    answers = [json.loads(line) for line in relayed.stdout.splitlines()]
    assert answers[0] == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32418, "message": "I'm a teapot"},
    }
    assert answers[1]["id"] == 2
    assert "result" in answers[1]
    assert "fault injected" in relayed.stderr
    assert "rule=brew" in relayed.stderr


def test_without_the_plugin_the_action_is_unknown(tmp_path: Path) -> None:
    """The same file where the package is not installed: a located error, exit 2."""
    faults = fault_file(tmp_path, TEAPOT_RULE)
    checked = acp_proxy("validate", str(faults))
    assert checked.returncode == 2
    assert "unknown action 'teapot'" in checked.stderr


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("teapot = acp_proxy_kettle:ACTION", "cannot be loaded: ModuleNotFoundError"),
        ("teapot = acp_proxy_teapot:Teapot", "is of type ModelMetaclass, not an Action"),
        ("drop = acp_proxy_teapot:DROP", "an action named 'drop' exists already"),
        ("kettle = acp_proxy_teapot:ACTION", "its action is named 'teapot'"),
    ],
)
def test_a_bad_plugin_is_one_line_naming_its_package(
    tmp_path: Path, entry: str, problem: str
) -> None:
    """Missing module, not an Action, a name taken: every command refuses to start (exit 2)
    with one line naming the plugin and its package, and no traceback."""
    env = install(tmp_path / "site", entry)
    if entry.startswith("drop"):
        module = tmp_path / "site" / "acp_proxy_teapot" / "__init__.py"
        module.write_text(
            module.read_text()
            + "\nfrom proxy.core.actions import drop as _drop\nDROP = _drop.ACTION\n"
        )
    done = acp_proxy(
        "validate", str(fault_file(tmp_path, {"name": "x", "do": {"action": "drop"}})), env=env
    )
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    name = entry.split(" = ", maxsplit=1)[0]
    assert line.startswith(f"acp-proxy: plugin action {name!r} of acp-proxy-teapot (")
    assert problem in line
