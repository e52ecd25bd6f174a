"""Fault actions of other packages, found by their entry points: a package that declares

.. code-block:: toml

    [project.entry-points."acp_proxy.actions"]
    teapot = "my_package.teapot:ACTION"

adds the action ``ACTION`` (an :class:`~proxy.core.actions.base.Action`: its model, its
``apply``, its summary) to the registry (:data:`proxy.core.actions.actions`), and fault files,
the control API, ``validate`` and ``schema`` know it, as they know the built-in ones. The
commands that read rules (``run``, ``validate``, ``schema``) load them as they start; a program
that embeds the proxy calls :func:`load_plugin_actions` itself. A plugin that cannot be loaded,
that is no ``Action`` or whose action's name is taken is one located error, naming its package:
those commands do not start (exit 2); the others (``report``, ``--help``) are not concerned.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from proxy.core.actions import ActionRegistry, actions
from proxy.core.actions.base import Action
from proxy.core.errors import ConfigError

__all__ = ["GROUP", "load_plugin_actions"]

GROUP = "acp_proxy.actions"
"""The entry-point group of plugin actions."""

_loaded: set[str] = set()
"""The entry points already loaded into the process's registry (a second call adds nothing)."""


def load_plugin_actions(registry: ActionRegistry = actions) -> list[str]:
    """Register the action of every entry point of :data:`GROUP`, by name; the names of those
    it added. :class:`~proxy.core.errors.ConfigError` names a plugin that cannot be used."""
    added = []
    for entry in sorted(entry_points(group=GROUP), key=lambda found: found.name):
        if entry.value in _loaded:
            continue
        where = _described(entry)
        try:
            action = entry.load()
        except Exception as exc:  # any failure of another package's import is its own
            raise ConfigError(f"{where}: cannot be loaded: {type(exc).__name__}: {exc}") from None
        if not isinstance(action, Action):
            kind = type(action).__name__
            wanted = "an Action (proxy.core.actions.base)"
            raise ConfigError(f"{where}: is of type {kind}, not {wanted}")
        try:
            name = action.name
            if name != entry.name:
                raise ValueError(f"its action is named {name!r}: so must its entry point be")
            registry.register(action)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        _loaded.add(entry.value)
        added.append(action.name)
    return added


def _described(entry: EntryPoint) -> str:
    """The plugin as an error names it: its entry point, its package."""
    package = entry.dist.name if entry.dist is not None else "an unknown package"
    return f"plugin action {entry.name!r} of {package} ({entry.value})"
