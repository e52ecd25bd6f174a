"""Logging: structlog, configured once, to stderr only (in stdio mode stdout is the protocol).

``console`` renders for people, ``json`` one object per line for machines. Long values are
shortened (:func:`shorten`) so a 10 MiB prompt never lands in a log line.
"""

from __future__ import annotations

import enum
import logging
import sys
from typing import Any, Literal, TextIO

import structlog

__all__ = ["LogFormat", "configure_logging", "get_logger", "shorten"]

LogFormat = Literal["console", "json"]

MAX_LOG_SIZE = 200
"""Characters of a payload kept in a log line."""
MAX_ERROR_SIZE = 2000
"""Characters of an ``error`` field kept: the proxy's own words (a fault file's located error
names every valid choice), whole, yet bounded where they quote what a peer sent."""


def shorten(value: object, limit: int = MAX_LOG_SIZE) -> str:
    """``value`` as text, cut to ``limit`` characters with the full length noted."""
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def _plain_values(_: Any, __: str, event_dict: structlog.typing.EventDict) -> Any:
    """Enums as their values; long strings and bytes shortened (an ``error`` less so)."""
    for key, value in event_dict.items():
        if isinstance(value, enum.Enum):
            event_dict[key] = value.value
        elif key != "event" and isinstance(value, str | bytes):
            limit = MAX_ERROR_SIZE if key == "error" else MAX_LOG_SIZE
            if len(value) > limit:
                event_dict[key] = shorten(value, limit)
    return event_dict


def configure_logging(
    fmt: LogFormat = "console", level: str = "info", stream: TextIO | None = None
) -> None:
    """Send every log line to ``stream`` (stderr by default) at ``level`` and above."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _plain_values,
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # One write per line: the Agent shares stderr, and with unbuffered streams
        # (PYTHONUNBUFFERED) print() writes the newline apart, so lines could interleave.
        logger_factory=structlog.WriteLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    """A logger whose lines carry ``component=name``."""
    # Lazy: the configuration in force when a line is logged applies, not the one at import time.
    return structlog.get_logger(component=name)


# Until a command configures logging, never let structlog's default (stdout) be used.
if not structlog.is_configured():
    configure_logging()
