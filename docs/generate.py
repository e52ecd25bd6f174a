"""The generated parts of the docs, from the code that defines them.

* ``docs/cli.md``: each command's ``--help``, as typer prints it (at 100 columns); a
  subcommand's part is named with colons (``help:replay:agent``).
* ``docs/fault-files.md``: the fault file's fields and every registered action (its name, its
  summary, its fields with their types, defaults and descriptions), from the pydantic models and
  the action registry (:data:`proxy.core.actions.actions`).

A page marks each generated part by a pair of comments, ``<!-- BEGIN GENERATED: NAME -->`` and
``<!-- END GENERATED: NAME -->``; everything else in it is written by hand. Run from anywhere::

    .venv/bin/python docs/generate.py           # rewrite the generated parts
    .venv/bin/python docs/generate.py --check   # exit 1, naming each page out of date

``tests/e2e/test_docs.py`` runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer.main
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from proxy.cli import app
from proxy.core import faultfile
from proxy.core.actions import actions

DOCS = Path(__file__).resolve().parent
"""The folder of the pages."""
COMMAND = ".venv/bin/python docs/generate.py"
"""How to regenerate the pages, from the project's root."""
HELP_WIDTH = 100
"""The terminal width the help is rendered at (the same whatever terminal runs the generator)."""

_REGION = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[\w:-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(<!-- END GENERATED: (?P=name) -->)",
    re.DOTALL,
)


class DocsError(Exception):
    """A page names a generated part that does not exist, or a model lacks a description."""


# -- the command line ---------------------------------------------------------------------------


def command_names() -> list[str]:
    """Every command of ``acp-proxy``, in the order of its ``--help``."""
    group: Any = typer.main.get_command(app)
    return list(group.commands)


def command_help(command: str) -> str:
    """``acp-proxy COMMAND --help`` (``""``: the top level) as a text block."""
    args = [*command.split(), "--help"]
    done = CliRunner().invoke(
        app, args, prog_name="acp-proxy", terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH
    )
    if done.exit_code != 0:
        raise DocsError(f"acp-proxy {command} --help exited {done.exit_code}: {done.output}")
    lines = [line.rstrip() for line in done.output.strip("\n").splitlines()]
    return "```text\n$ acp-proxy " + " ".join(args) + "\n" + "\n".join(lines) + "\n```\n"


# -- the fault file -----------------------------------------------------------------------------


def _code(value: Any) -> str:
    return "`" + json.dumps(value, ensure_ascii=False) + "`"


def _bounds(schema: dict[str, Any]) -> str:
    parts = []
    if "minimum" in schema:
        parts.append(f">= {_number(schema['minimum'])}")
    if "exclusiveMinimum" in schema:
        parts.append(f"> {_number(schema['exclusiveMinimum'])}")
    if "maximum" in schema:
        parts.append(f"<= {_number(schema['maximum'])}")
    if "minLength" in schema or "maxLength" in schema:
        parts.append(f"{schema.get('minLength', 0)}-{schema.get('maxLength', 'any')} characters")
    if "minItems" in schema or "maxItems" in schema:
        parts.append(f"{schema.get('minItems', 0)}-{_number(schema.get('maxItems', 'any'))} items")
    return ", ".join(parts)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def type_of(schema: dict[str, Any]) -> str:
    """A field's type, read from its JSON Schema (as editors see it), in a few words."""
    if "const" in schema:
        return _code(schema["const"])
    if "enum" in schema:
        return " \\| ".join(_code(value) for value in schema["enum"])
    if "anyOf" in schema:
        kinds = [part for part in schema["anyOf"] if part.get("type") != "null"]
        return " or ".join(type_of(part) for part in kinds)
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name.lower()}](#{name.lower()})"
    if "oneOf" in schema:
        return "one of the [actions](#actions)"
    kind = schema.get("type")
    words = {
        "integer": "integer",
        "number": "number",
        "string": "string",
        "boolean": "boolean",
        "object": "mapping",
    }
    if kind == "array":
        text = "list of " + type_of(schema.get("items", {}))
    elif kind in words:
        text = words[kind]
    else:
        text = "any JSON"
    bounds = _bounds(schema)
    return f"{text} ({bounds})" if bounds else text


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "every field's default"
    return _code(value)


def fields_table(model: type[BaseModel], skip: Iterable[str] = ()) -> str:
    """A Markdown table of ``model``'s fields: name (as written in a file), type, default and
    description. Every field must have a description."""
    schema = model.model_json_schema(by_alias=True)
    properties: dict[str, Any] = schema["properties"]
    rows = []
    for name, field in model.model_fields.items():
        written = field.alias or name
        if written in skip:
            continue
        if not field.description:
            raise DocsError(f"{model.__name__}.{name} has no description (Field(description=...))")
        description = field.description.replace("|", "\\|")
        rows.append(
            f"| `{written}` | {type_of(properties[written])} | {_default(model, name)} "
            f"| {description} |"
        )
    if not rows:
        return "No fields.\n"
    return "| field | type | default | meaning |\n| - | - | - | - |\n" + "\n".join(rows) + "\n"


def action_entries() -> str:
    """One entry per registered action: its name, its summary, what it acts on, its fields."""
    entries = []
    for action in actions:
        text = f"### `{action.name}`\n\n{action.summary[0].upper()}{action.summary[1:]}.\n\n"
        if action.needs_http:
            text += (
                "It acts only on Clients that connect over Streamable HTTP "
                "([HTTP-only actions](#http-only-actions)).\n\n"
            )
        entries.append(text + fields_table(action.model, skip=("action",)))
    return "\n".join(entries)


def fault_file_fields(model_name: str) -> str:
    """The fields table of one model of the fault file (``FaultFile``, ``Rule``, ...)."""
    model = getattr(faultfile, model_name)
    assert isinstance(model, type)
    assert issubclass(model, BaseModel)
    return fields_table(model)


# -- the pages ----------------------------------------------------------------------------------


def generator(name: str) -> Callable[[], str]:
    """What generates the part named ``name``."""
    kind, _, argument = name.partition(":")
    if kind == "help":  # help:replay:agent is acp-proxy replay agent --help
        return lambda: command_help(argument.replace(":", " "))
    if kind == "fields":
        return lambda: fault_file_fields(argument)
    if name == "actions":
        return action_entries
    raise DocsError(f"no generated part is named {name!r}")


def regenerate(text: str) -> str:
    """``text`` with every generated part written anew."""

    def fill(match: re.Match[str]) -> str:
        body = generator(match["name"])()
        return f"{match[1]}{body}{match[4]}"

    return _REGION.sub(fill, text)


def generated_names(text: str) -> list[str]:
    """The names of the generated parts of a page, in order."""
    return [match["name"] for match in _REGION.finditer(text)]


def pages() -> list[Path]:
    """The pages of the docs."""
    return sorted(DOCS.glob("*.md"))


def stale_pages() -> list[Path]:
    """The pages whose generated parts are not what the code generates now."""
    return [page for page in pages() if regenerate(page.read_text()) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated parts, or with ``--check`` report the pages out of date."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is out of date")
    options = parser.parse_args(argv)
    if options.check:
        stale = stale_pages()
        for page in stale:
            print(f"{page.name} is out of date: run {COMMAND}", file=sys.stderr)  # noqa: T201
        return 1 if stale else 0
    for page in pages():
        text = page.read_text()
        new = regenerate(text)
        if new != text:
            page.write_text(new)
            print(f"{page.name} regenerated", file=sys.stderr)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
