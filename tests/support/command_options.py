"""What the command line declares of each command's options (as typer builds the command): their
least values (``min=``, stated in ``--help``) and their defaults, for the tests that keep them
equal to the options' models. The model is the authority on both; the command line states them
in its help, and cannot import a tool's model for them (it loads no tool until one runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import typer.main

from proxy import cli


@dataclass(frozen=True)
class Ranged:
    """An option of a command with a least value."""

    name: str
    """The parameter's name (the model's field)."""
    flag: str
    minimum: float
    integer: bool

    def below(self) -> float:
        """The nearest value under the least one."""
        return self.minimum - 1 if self.integer else math.nextafter(self.minimum, -math.inf)


def _params(command: str) -> list[Any]:
    return list(typer.main.get_command(cli.app).commands[command].params)  # type: ignore[attr-defined]


def ranged_options(command: str) -> list[Ranged]:
    """The options of ``acp-proxy COMMAND`` that declare a least value (an integer one when the
    least value is an integer and the default is not a float)."""
    found = []
    for param in _params(command):
        minimum = getattr(param, "min", None)
        if minimum is not None:
            integer = isinstance(minimum, int) and not isinstance(param.default, float)
            found.append(Ranged(param.name, param.opts[0], minimum, integer))
    return found


def option_defaults(command: str) -> dict[str, Any]:
    """The defaults of the options of ``acp-proxy COMMAND`` that have one, by parameter name."""
    return {param.name: param.default for param in _params(command) if param.default is not None}


def option_flags(command: str) -> dict[str, bool]:
    """Every flag of ``acp-proxy COMMAND`` (``--trace``, ``--watch``...): whether it takes a value
    (False: a switch)."""
    flags = {}
    for param in _params(command):
        for flag in (*param.opts, *getattr(param, "secondary_opts", ())):
            if flag.startswith("-"):
                flags[flag] = not getattr(param, "is_flag", False)
    return flags
