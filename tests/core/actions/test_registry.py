"""The registry of fault actions: every module is an action, registered, modelled, tested."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError

import proxy.core.actions as package
from proxy.core.actions import BUILTIN, ActionName, ActionRegistry, actions
from proxy.core.actions.base import Action, ActionModel, Effect, Fault, Stop
from proxy.core.faultfile import fault_file_schema

MODULES = sorted(name for _, name, _ in pkgutil.iter_modules(package.__path__) if name != "base")


def test_every_action_module_is_registered_with_its_model_and_a_test() -> None:
    """One module per action: it defines ``ACTION``, whose name is the module's, registered among
    the built-ins; its model validates as a rule's ``do``; it has a test file of its own."""
    assert [action.name for action in BUILTIN] == actions.names()
    assert sorted(actions.names()) == MODULES
    for name in MODULES:
        module = importlib.import_module(f"proxy.core.actions.{name}")
        action = module.ACTION
        assert isinstance(action, Action)
        assert action.name == name
        assert actions[name] is action
        assert issubclass(action.model, ActionModel)
        assert action.summary
        assert (Path(__file__).parent / f"test_{name}.py").is_file(), f"no test of {name}"


def test_the_names_of_the_built_in_actions_are_the_registry_s() -> None:
    """``ActionName`` (what the ledger and the report compare against) names each built-in
    action, in the registry's order, and nothing else."""
    assert [name.value for name in ActionName] == [action.name for action in BUILTIN]


def test_the_fault_file_schema_knows_every_action() -> None:
    """``acp-proxy schema`` lists each action's model."""
    definitions = fault_file_schema()["$defs"]
    for action in actions:
        assert action.model.__name__ in definitions


class Slow(ActionModel):
    """A plugin's action, as another package would declare it."""

    action: Literal["slow_test_plugin"]
    factor: int = 2


def _slow(_params: Slow, _fault: Fault) -> list[Effect]:
    return [Stop("dropped")]


def test_an_action_registered_later_is_known_to_rules_and_the_schema() -> None:
    """What another package registers is validated (with located errors) like a built-in one."""
    registry = ActionRegistry(BUILTIN)
    seen: list[int] = []
    registry.subscribe(lambda models: seen.append(len(models)))
    registry.register(Action(Slow, _slow, "a test plugin"))
    assert seen == [len(BUILTIN), len(BUILTIN) + 1]
    assert "slow_test_plugin" in registry
    with pytest.raises(ValueError, match="exists already"):
        registry.register(Action(Slow, _slow, "twice"))


PLUGIN = """
from typing import Literal
from proxy.core.actions import actions
from proxy.core.actions.base import Action, ActionModel, Stop
from proxy.core.faultfile import FaultFileError, fault_file_schema, validate_rules

class Slow(ActionModel):
    action: Literal["slow"]
    factor: int = 2

actions.register(Action(Slow, lambda params, fault: [Stop("dropped")], "a plugin"))
[rule] = validate_rules([{"name": "s", "do": {"action": "slow", "factor": 3}}])
print(type(rule.do).__name__, rule.do.factor)
try:
    validate_rules([{"name": "s", "do": {"action": "slow", "factor": "x"}}])
except FaultFileError as exc:
    print(exc)
print("Slow" in fault_file_schema()["$defs"])
"""


def test_the_process_registry_rebuilds_the_rule_models() -> None:
    """Registered in the process's registry (in a process of its own here), an action is valid in
    a rule, its errors located, and the schema shows it."""
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines() == [
        "Slow 3",
        "request: rule 's': do.factor: Input should be a valid integer",
        "True",
    ]


def test_an_action_model_must_name_one_action() -> None:
    """The model's ``action`` is a Literal of one name."""

    class Nameless(ActionModel):
        action: str

    with pytest.raises(TypeError, match="Literal of one string"):
        _ = Action(Nameless, _slow, "no name").name  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Slow.model_validate({"action": "slow_test_plugin", "unknown": 1})
