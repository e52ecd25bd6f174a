"""The proxy's own exceptions: a small tree, for errors of ours or of our configuration.

What a peer sends wrong is never an exception: it is an observation (see
:mod:`proxy.core.commands`).
"""

from __future__ import annotations

import os

__all__ = ["ConfigError", "OptionError", "ProxyError", "StartupError", "at_least", "os_cause"]


class ProxyError(Exception):
    """Root of the proxy's exceptions."""


class ConfigError(ProxyError):
    """A fault file, an option or a control-API request is invalid; the message says where."""


class OptionError(ConfigError, ValueError):
    """An option of a command is invalid, or clashes with another: the options' model says so
    when it is built, and the command line prints the message as a usage error (exit 2).

    ``option`` names the option (``--trace``, ``AGENT_CMD``) when the message does not.
    """

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


def at_least(option: str, value: float, minimum: float) -> None:
    """Refuse an option's value below ``minimum`` (or not a number): an :class:`OptionError`
    whose message names the option (``--max-links must be at least 1 (got 0)``)."""
    if not value >= minimum:
        raise OptionError(f"{option} must be at least {minimum} (got {value})")


class StartupError(ProxyError):
    """The proxy could not start: what an option names cannot be used (an address in use, a file
    that cannot be written or read). Its message is one line: the option, what it names, why."""

    def __init__(self, option: str, value: str, cause: str) -> None:
        super().__init__(f"{option} {value}: {cause}")
        self.option = option
        self.value = value
        self.cause = cause


class UnusableFileError(StartupError):
    """A file an option names is there but cannot be used as it is (a directory, a recording that
    appending to would spoil): the one line of a :class:`StartupError`, but the command line was
    wrong, so a usage error's status (2)."""


def os_cause(exc: OSError) -> str:
    """Why a system call failed, in a few words (``address already in use``), without the
    errno number, nor the address that the caller names anyway."""
    if exc.errno is not None and exc.errno > 0:
        text = os.strerror(exc.errno)
    else:  # a resolver's error (its own numbers), or several errors at once
        text = exc.strerror or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]
