"""Fault actions: one module each, registered in one table (DESIGN 6 and 12).

Where a fault is applied: a rule that fires hands its ``do`` to its action here, whose ``apply``
returns effects (:mod:`proxy.core.actions.base`) that the relay folds into the link's commands.
The built-in actions are :mod:`~proxy.core.actions.drop`, :mod:`~proxy.core.actions.delay`,
:mod:`~proxy.core.actions.reorder`, :mod:`~proxy.core.actions.bandwidth`,
:mod:`~proxy.core.actions.error`, :mod:`~proxy.core.actions.duplicate`,
:mod:`~proxy.core.actions.corrupt`, :mod:`~proxy.core.actions.sever`,
:mod:`~proxy.core.actions.kill_agent`, :mod:`~proxy.core.actions.restart_proxy`,
:mod:`~proxy.core.actions.http_status`, :mod:`~proxy.core.actions.close_stream`,
:mod:`~proxy.core.actions.truncate`, :mod:`~proxy.core.actions.slice`,
:mod:`~proxy.core.actions.stall`, :mod:`~proxy.core.actions.hold`,
:mod:`~proxy.core.actions.timeout` and :mod:`~proxy.core.actions.slow_close`.

Adding an action is one module here: its :class:`~proxy.core.actions.base.ActionModel` (the
fields of ``do``), its ``apply``, and an :class:`~proxy.core.actions.base.Action` named
``ACTION``, listed in :data:`BUILTIN`; its test in ``tests/core/actions/``; its entry in the docs
(generated from the model). Another package adds its own with
:meth:`actions.register <ActionRegistry.register>`: the fault file's models, ``acp-proxy schema``,
``validate`` and the control API then know it. The core discovers nothing; the shell registers
the actions other packages declare as entry points (:mod:`proxy.shell.plugins`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Any

from proxy.core.actions import (
    bandwidth,
    close_stream,
    corrupt,
    delay,
    drop,
    duplicate,
    error,
    hold,
    http_status,
    kill_agent,
    reorder,
    restart_proxy,
    sever,
    slice,
    slow_close,
    stall,
    timeout,
    truncate,
)
from proxy.core.actions.base import Action, ActionModel

__all__ = ["BUILTIN", "ActionName", "ActionRegistry", "actions"]

BUILTIN: tuple[Action[Any], ...] = (
    drop.ACTION,
    delay.ACTION,
    reorder.ACTION,
    bandwidth.ACTION,
    error.ACTION,
    duplicate.ACTION,
    sever.ACTION,
    kill_agent.ACTION,
    restart_proxy.ACTION,
    http_status.ACTION,
    close_stream.ACTION,
    corrupt.ACTION,
    truncate.ACTION,
    slice.ACTION,
    stall.ACTION,
    timeout.ACTION,
    slow_close.ACTION,
    hold.ACTION,
)
"""The actions every proxy has, in the order the docs list them."""


class ActionName(enum.StrEnum):
    """The names of the built-in actions (:data:`BUILTIN`), for code that treats some apart (the
    ledger, the report): a typo is a mypy error. Another package's action has a name of its own,
    so a fault's ``action`` is ``ActionName | str`` (:class:`~proxy.core.records.FaultRecord`
    reads a name it does not know as its text)."""

    DROP = "drop"
    DELAY = "delay"
    REORDER = "reorder"
    BANDWIDTH = "bandwidth"
    ERROR = "error"
    DUPLICATE = "duplicate"
    SEVER = "sever"
    KILL_AGENT = "kill_agent"
    RESTART_PROXY = "restart_proxy"
    HTTP_STATUS = "http_status"
    CLOSE_STREAM = "close_stream"
    CORRUPT = "corrupt"
    TRUNCATE = "truncate"
    SLICE = "slice"
    STALL = "stall"
    TIMEOUT = "timeout"
    SLOW_CLOSE = "slow_close"
    HOLD = "hold"


class ActionRegistry:
    """Actions by name. Whoever builds on the set (the fault file's models) subscribes, and is
    told again whenever an action is added."""

    def __init__(self, builtin: tuple[Action[Any], ...]) -> None:
        self._actions: dict[str, Action[Any]] = {}
        self._listeners: list[Callable[[tuple[type[ActionModel], ...]], None]] = []
        for action in builtin:
            self._add(action)

    def __getitem__(self, name: str) -> Action[Any]:
        return self._actions[name]

    def __contains__(self, name: object) -> bool:
        return name in self._actions

    def __iter__(self) -> Iterator[Action[Any]]:
        return iter(self._actions.values())

    def names(self) -> list[str]:
        """Every action's name, in the order they were registered."""
        return list(self._actions)

    def models(self) -> tuple[type[ActionModel], ...]:
        """Every action's model, in order."""
        return tuple(action.model for action in self._actions.values())

    def register(self, action: Action[Any]) -> None:
        """Add ``action``; ``ValueError`` when its name is taken or its model is not one."""
        self._add(action)
        for listener in self._listeners:
            listener(self.models())

    def subscribe(self, listener: Callable[[tuple[type[ActionModel], ...]], None]) -> None:
        """Call ``listener`` with every model now, and again after each :meth:`register`."""
        self._listeners.append(listener)
        listener(self.models())

    def _add(self, action: Action[Any]) -> None:
        if not (isinstance(action.model, type) and issubclass(action.model, ActionModel)):
            raise ValueError(f"{action.model!r} is not an ActionModel")
        name = action.name
        if name in self._actions:
            raise ValueError(f"an action named {name!r} exists already")
        self._actions[name] = action


actions = ActionRegistry(BUILTIN)
"""The registry of this process: the built-in actions and those other packages registered."""
