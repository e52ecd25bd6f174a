"""Fault files: the pydantic models of DESIGN 6, loading from YAML or JSON, and located errors.

A fault file is data: ``rules``, each a ``when`` (which messages), a ``schedule`` (which
occurrences) and a ``do`` (one action of a discriminated union). Every model forbids unknown
fields, so a typo is an error, never a silently ignored key. :func:`parse_fault_file` turns every
problem into a :class:`FaultFileError` that names the file, the line, the rule and the field (the
shell reads the files: :mod:`proxy.shell.fault_files`).
What is valid but worth a word (an old field name, an action that needs Clients on Streamable
HTTP) is a :class:`Note` of :func:`rule_notes`.

A fault file cannot explode: it is at most :data:`MAX_FILE_BYTES`, holds at most
:data:`MAX_RULES` rules (every file of a run together, and the control API's rules too), and
its YAML aliases may add at most :data:`MAX_ALIASED_VALUES` values (each use of an alias copies
what it names: a few hundred bytes of nested aliases would otherwise expand to gigabytes).
"""

from __future__ import annotations

import difflib
import functools
import json
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from proxy.core import acp
from proxy.core.actions import actions
from proxy.core.actions.base import ActionModel, StrictModel
from proxy.core.errors import ConfigError

__all__ = [
    "CLIENT_FAULT",
    "MAX_ALIASED_VALUES",
    "MAX_FILE_BYTES",
    "MAX_RULES",
    "Bursts",
    "FaultFile",
    "FaultFileError",
    "Location",
    "Note",
    "Rule",
    "Schedule",
    "When",
    "dump_rules",
    "fault_file_schema",
    "located_notes",
    "parse_fault_file",
    "parse_rules_text",
    "rule_notes",
    "too_large",
    "validate_rules",
    "validated",
]


MAX_FILE_BYTES = 1024 * 1024
"""The largest fault file read, in bytes (as the control API's largest body)."""
MAX_RULES = 1000
"""The most rules a run holds: every fault file together, or the control API's rule set."""
MAX_ALIASED_VALUES = 10_000
"""The most values a fault file's YAML aliases may add (each use copies what it names)."""


_Model = StrictModel


_GLOB_CLASS = re.compile(r"\[!?\]?[^\]]*\]")


def check_glob(pattern: str) -> str:
    """A glob of ``*``, ``?`` and ``[...]``; an unclosed ``[`` or an empty pattern is an error."""
    if not pattern:
        raise ValueError("a glob cannot be empty (use '*' to match anything)")
    stripped = _GLOB_CLASS.sub("", pattern)
    if "[" in stripped:
        raise ValueError(f"glob {pattern!r} has a '[' that is never closed")
    _dumpable(pattern)
    return pattern


def _dumpable(value: Any) -> Any:
    """``value``, unless it holds a lone surrogate (a YAML or JSON escape such as ``\\ud800``):
    such a string could never be written back as JSON (``GET /api/rules`` shows the rules)."""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a lone surrogate (\\ud800-\\udfff) cannot be written back") from None
    return value


class When(_Model):
    """Which messages a rule matches; every field must match (all default to anything)."""

    direction: Literal["to_agent", "to_client", "any"] = Field(
        "any", description="toward the Agent or toward the Client"
    )
    kind: Literal["request", "notification", "response", "error", "any"] = Field(
        "any", description="the message's kind (an `error` is an answer carrying `error`)"
    )
    method: str = Field("*", description="glob; for a response or error, the method it answers")
    session: str = Field("*", description="glob on params.sessionId (a response: its request's)")
    idempotency_key: Literal["present", "absent", "any"] = Field(
        "any", description="whether params.idempotencyKey is present (and not null)"
    )
    params: dict[str, Any] | None = Field(
        None,
        description="subset match: every key given must be present with a matching value; "
        "a list matches when each given element matches some element",
    )

    _globs = field_validator("method", "session")(check_glob)
    _params = field_validator("params")(_dumpable)


class Bursts(_Model):
    """Matches that fire in bursts, as packets are lost on a real link: the Gilbert-Elliott model
    of ``tc netem loss gemodel`` (its names and meanings). A rule is in a good or a bad state;
    at each match that the rest of its schedule lets fire it moves on (good to bad with ``p``,
    bad to good with ``r``) and the match
    fires with the chance of the state it was in: ``1-h`` in the bad one, ``1-k`` in the good
    one. With the defaults (``1-h`` 1, ``1-k`` 0), bursts last ``1/r`` matches on average, the
    gaps between them ``1/p``, and ``p/(p+r)`` of the matches fire."""

    p: float = Field(ge=0.0, le=1.0, description="chance of going from the good state to the bad")
    r: float = Field(ge=0.0, le=1.0, description="chance of going from the bad state to the good")
    one_minus_h: float = Field(
        1.0, alias="1-h", ge=0.0, le=1.0, description="chance that a match fires in the bad state"
    )
    one_minus_k: float = Field(
        0.0, alias="1-k", ge=0.0, le=1.0, description="chance that a match fires in the good state"
    )


class Schedule(_Model):
    """Which of a rule's matches fire (all optional; by default every match fires)."""

    nth: list[PositiveInt] | None = Field(None, description="fire on these matches (1 = first)")
    after: NonNegativeInt = Field(0, description="skip the first N matches")
    times: PositiveInt | None = Field(None, description="fire at most N times")
    every: PositiveInt | None = Field(None, description="fire on every Nth match (after `after`)")
    probability: float = Field(1.0, ge=0.0, le=1.0, description="chance that a due match fires")
    bursts: Bursts | None = Field(
        None,
        description="fire in bursts (Gilbert-Elliott, netem's `gemodel`) rather than each match "
        "on its own; with `probability`, both must draw a fire",
    )
    start_ms: NonNegativeFloat | None = Field(None, description="active from this time on")
    stop_ms: NonNegativeFloat | None = Field(None, description="active until this time")

    @field_validator("nth")
    @classmethod
    def _nth_not_empty(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise ValueError("nth lists at least one match number")
        return value

    @model_validator(mode="after")
    def _window(self) -> Schedule:
        if self.start_ms is not None and self.stop_ms is not None and self.stop_ms <= self.start_ms:
            raise ValueError("stop_ms must be later than start_ms")
        return self


CLIENT_FAULT = "_meta.acpFault"
"""The name a fault a Client asks for goes by in logs, metrics, the trace and the report
(:mod:`proxy.core.client_faults`); no rule of a file or the control API may take it."""


class Rule(_Model):
    """One fault: which messages, which occurrences, what happens."""

    name: str = Field(
        min_length=1,
        max_length=200,
        description="unique in a run; names the rule in logs, metrics, the trace and the API",
    )

    @field_validator("name")
    @classmethod
    def _not_the_client_s(cls, name: str) -> str:
        """The name faults a Client asks for go by is theirs alone
        (:mod:`proxy.core.client_faults` gives it to the rule it makes, after validation)."""
        if name == CLIENT_FAULT:
            raise ValueError(f"{CLIENT_FAULT!r} names the faults a Client asks for: pick another")
        return name

    when: When = Field(When(), description="which messages the rule matches")
    schedule: Schedule = Field(Schedule(), description="which of its matches fire")
    do: ActionModel
    """The action and its parameters: one of the registered actions' models."""
    continue_: bool = Field(
        False, alias="continue", description="let later rules act on the same message too"
    )
    enabled: bool = Field(
        True,
        description="false: the rule is kept (listed, its counters too) but matches nothing, "
        "counts nothing and never fires, until it is enabled again (PATCH /api/rules/{name})",
    )


class FaultFile(_Model):
    """A whole fault file."""

    version: Literal[1] = Field(description="the format's version: 1")
    seed: int | None = Field(None, description="seed of every random draw; same seed, same faults")
    rules: list[Rule] = Field(
        max_length=MAX_RULES,
        description="the rules, in the order they are tried (none: a file that injects nothing, "
        "e.g. one watched with --watch that rules are added to later)",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> FaultFile:
        self._unique(self.rules)
        return self

    @staticmethod
    def _unique(rules: Sequence[Rule]) -> None:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} is used twice")
            seen.add(rule.name)


def fault_file_schema() -> dict[str, Any]:
    """The JSON Schema of a fault file, for editors."""
    schema = FaultFile.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "acp-fault-proxy fault file"
    return schema


@dataclass(frozen=True, slots=True)
class Note:
    """Something valid in a rule that its author should hear of when it is loaded."""

    rule: str
    field: str
    message: str
    needs_http: bool = False
    """The rule acts only on Clients that connect over Streamable HTTP: moot on such a listener,
    a rule that can never fire on any other."""

    def __str__(self) -> str:
        return f"rule {self.rule!r}: {self.field}: {self.message}"


HTTP_ONLY = "fires only when Clients connect over Streamable HTTP (--listen http://...)"
"""Why a rule whose action needs an HTTP listener (``http_status``, ``close_stream``) may never
fire."""


def rule_notes(rules: Iterable[Rule]) -> list[Note]:
    """The notes of ``rules``, in order: a method that looks misspelt, actions that need Clients
    on Streamable HTTP, and what each action says of its parameters (``sever``'s old ``when``)."""
    notes = []
    for rule in rules:
        misspelt = _misspelt_method(rule.when.method)
        if misspelt is not None:
            notes.append(Note(rule.name, "when.method", misspelt))
        bursts = rule.schedule.bursts
        if (
            bursts is not None
            and bursts.one_minus_k == 0
            and (bursts.p == 0 or bursts.one_minus_h == 0)
        ):
            notes.append(Note(rule.name, "schedule.bursts", "it never fires (p, 1-h and 1-k)"))
        action = actions[rule.do.action]
        if action.needs_http:
            notes.append(Note(rule.name, "do.action", f"{action.name} {HTTP_ONLY}", True))
        for field, message in action.notes(rule.do):
            notes.append(Note(rule.name, field, message))
    return notes


def located_notes(text: str, name: str) -> list[tuple[Location, bool]]:
    """The notes of the rules of the valid fault file ``name`` (its ``text``), each located at
    the field it is about (file, line, rule, field), and whether it is only that the rule needs
    Clients on Streamable HTTP (:attr:`Note.needs_http`: moot where they connect so)."""
    rules = parse_fault_file(text, name).rules
    index = {rule.name: number for number, rule in enumerate(rules)}
    tree = _yaml_lines(text)
    return [
        (
            Location(
                file=name,
                line=_line_of(tree, ("rules", index[note.rule], *note.field.split("."))),
                rule=note.rule,
                field=note.field,
                message=note.message,
            ),
            note.needs_http,
        )
        for note in rule_notes(rules)
    ]


def _misspelt_method(method: str) -> str | None:
    """What to say of a ``when.method`` that names no ACP method but is close to one: it is
    valid (an extension's method, a later version's) but never matches that one."""
    if method in acp.METHODS or any(char in method for char in "*?["):
        return None
    close = difflib.get_close_matches(method, sorted(acp.METHODS), n=1, cutoff=0.8)
    if not close:
        return None
    return f"{method!r} is no method of ACP (did you mean {close[0]!r}?): it never matches that one"


def _suggestion(loc: Sequence[int | str], root: type[BaseModel]) -> str:
    """What to say of the unknown field at ``loc`` (pydantic's, union tags and all): the field of
    its own model it is close to (`` (did you mean 'ms'?)``), or the model that has a field of
    that name (`` (a field of delay, not of slice)``), or nothing."""
    if not loc or not isinstance(key := loc[-1], str):
        return ""
    model = _model_at(loc[:-1], root)
    own = sorted(info.alias or name for name, info in model.model_fields.items())
    close = difflib.get_close_matches(key, own, n=1, cutoff=0.75)
    close = close or [name for name in own if name.startswith(key) and len(key) >= 3][:1]
    if close:
        return f" (did you mean {close[0]!r}?)"
    for other, title in _models():
        if other is not model and key in _names(other):
            return f" (a field of {title}, not of {_title(model)})"
    return ""


def _model_at(loc: Sequence[int | str], root: type[BaseModel]) -> type[BaseModel]:
    """The model of the object at ``loc`` (a location pydantic reports) in a ``root``."""
    parts = [part for part in loc if isinstance(part, str)]
    if len(parts) >= 2 and parts[-2] == "do" and parts[-1] in actions:
        model: type[BaseModel] = actions[parts[-1]].model
        return model
    if not parts:
        return root
    models: dict[str, type[BaseModel]] = {
        "when": When,
        "schedule": Schedule,
        "bursts": Bursts,
        "rules": Rule,
    }
    return models.get(parts[-1], root)


def _models() -> list[tuple[type[BaseModel], str]]:
    """Every model of a fault file, with what to call it."""
    found: list[tuple[type[BaseModel], str]] = [
        (When, "when"),
        (Schedule, "schedule"),
        (Bursts, "schedule.bursts"),
        (Rule, "a rule"),
    ]
    found += [(action.model, f"{action.name}") for action in actions]
    return found


def _title(model: type[BaseModel]) -> str:
    return next((title for other, title in _models() if other is model), "the file")


def _names(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


# -- loading with located errors ---------------------------------------------------------------


class _Refused(yaml.MarkedYAMLError):
    """YAML whose aliases would expand beyond :data:`MAX_ALIASED_VALUES`, or into themselves."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases that add more than :data:`MAX_ALIASED_VALUES`
    values in all, while composing: before anything is expanded.

    Each node's size (the values it holds once its aliases are expanded) is known when it is
    complete; every alias adds the size of the node it names. The count is exact (the expanded
    document has as many values as the text, plus what the aliases add) and linear in the text.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}
        """Per complete node (by id: every node stays alive in the tree), its expanded size."""
        self._aliased = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if not self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if node is not None:
                self._sizes[id(node)] = self._size(node)
            return node
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call] # (stubs)
        named = super().compose_node(parent, index)
        size = self._sizes.get(id(named))
        if size is None:
            raise _Refused(problem="an alias inside the value it names", problem_mark=mark)
        self._aliased += size
        if self._aliased > MAX_ALIASED_VALUES:
            problem = (
                f"aliases expand to more than {MAX_ALIASED_VALUES:,} values "
                "(each use of an alias copies what it names)"
            )
            raise _Refused(problem=problem, problem_mark=mark)
        return named

    def _size(self, node: yaml.Node) -> int:
        if isinstance(node, yaml.SequenceNode):
            return 1 + sum(self._sizes[id(item)] for item in node.value)
        if isinstance(node, yaml.MappingNode):
            return 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        return 1


_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
"""``1e3`` is a number, as in JSON and YAML 1.2 (YAML 1.1, PyYAML's, wants ``1.0e+3``): fields
are checked strictly, and the text ``"1e3"`` would not be one."""


class Location(BaseModel):
    """Where an error is: file, line (when known), rule and field."""

    model_config = ConfigDict(frozen=True)

    file: str
    line: int | None = None
    rule: str | None = None
    field: str = ""
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        parts = [where]
        if self.rule is not None:
            parts.append(f"rule {self.rule!r}")
        if self.field:
            parts.append(self.field)
        return f"{': '.join(parts)}: {self.message}"


class FaultFileError(ConfigError):
    """One or more fault files are invalid; ``errors`` locates each problem."""

    def __init__(self, errors: Sequence[Location]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(error) for error in self.errors))


def _field_path(loc: Sequence[int | str]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _yaml_lines(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_BoundedLoader)
    except (yaml.YAMLError, RecursionError):
        return None


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the deepest node along ``loc`` in a composed YAML document (of a
    mapping's member: its key's, where the field is written)."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            member = next((kv for kv in node.value if getattr(kv[0], "value", None) == part), None)
            if member is None:
                break
            key, node = member
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _rule_name(data: Any, loc: Sequence[int | str]) -> tuple[str | None, Sequence[int | str]]:
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        rules = data.get("rules") if isinstance(data, dict) else None
        name = None
        if isinstance(rules, list) and loc[1] < len(rules) and isinstance(rules[loc[1]], dict):
            name = rules[loc[1]].get("name")
        label = str(name) if isinstance(name, str) else f"#{loc[1] + 1}"
        return label, loc[2:]
    return None, loc


def _clean_loc(loc: Sequence[int | str], data: Any) -> list[int | str]:
    """Drop pydantic's union tags from a location (``do.delay.ms`` -> ``do.ms``)."""
    cleaned: list[int | str] = []
    for index, part in enumerate(loc):
        if index > 0 and loc[index - 1] == "do" and part != "action" and part in actions:
            continue
        cleaned.append(part)
    return cleaned


def too_large(name: str) -> FaultFileError:
    message = f"over {MAX_FILE_BYTES:,} bytes: a fault file is at most that"
    return FaultFileError([Location(file=name, message=message)])


def _too_many(rules: Any, name: str, tree: yaml.Node | None = None) -> None:
    """Refuse a list of more than :data:`MAX_RULES` rules before validating any of them."""
    if isinstance(rules, list) and len(rules) > MAX_RULES:
        located = Location(
            file=name,
            line=_line_of(tree, ("rules",)) if tree is not None else None,
            field="rules",
            message=f"{len(rules):,} rules: at most {MAX_RULES:,}",
        )
        raise FaultFileError([located])


def parse_fault_file(text: str, name: str) -> FaultFile:
    """Parse and validate one fault file's text: YAML, or JSON (a subset of YAML) when its name
    ends in ``.json``, which must then be JSON (a trailing comma YAML would accept is refused)."""
    if len(text) > MAX_FILE_BYTES:
        raise too_large(name)
    if name.endswith(".json"):
        _check_json(text, name)
    data = _load_yaml(text, name)
    if not isinstance(data, dict):
        message = "a fault file is a mapping with version and rules"
        raise FaultFileError([Location(file=name, line=1, message=message)])
    if isinstance(data.get("rules"), list) and len(data["rules"]) > MAX_RULES:
        _too_many(data["rules"], name, _yaml_lines(text))
    try:
        return FaultFile.model_validate(data)
    except ValidationError as exc:
        raise _located(exc, data, name, FaultFile, _yaml_lines(text)) from None


def parse_rules_text(text: str, name: str = "rule") -> list[Rule]:
    """Rules written as YAML (or JSON) text: one rule (a mapping), or a list of them, as the
    ``rules`` of a fault file. Errors are located as :func:`parse_fault_file` locates them (the
    line in ``text``, the rule, the field), in a file called ``name``."""
    if len(text) > MAX_FILE_BYTES:
        raise too_large(name)
    data = _load_yaml(text, name)
    tree = _yaml_lines(text)
    if isinstance(data, dict):
        data, tree = [data], _sequence_of(tree)
    if not isinstance(data, list):
        message = "a rule is a mapping with name, when, schedule and do (or a list of them)"
        raise FaultFileError([Location(file=name, line=1, message=message)])
    rules_tree = None if tree is None else _mapping_of("rules", tree)
    _too_many(data, name, rules_tree)
    try:
        return _RuleList.model_validate({"rules": data}).rules
    except ValidationError as exc:
        raise _located(exc, {"rules": data}, name, _RuleList, rules_tree) from None


def _sequence_of(node: yaml.Node | None) -> yaml.Node | None:
    """A YAML sequence holding ``node`` alone (one rule read as a list of rules, its lines kept)."""
    if node is None:
        return None
    return yaml.SequenceNode("tag:yaml.org,2002:seq", [node], node.start_mark, node.end_mark)


def _mapping_of(key: str, node: yaml.Node) -> yaml.Node:
    """A YAML mapping ``{key: node}`` (rules read as a fault file's ``rules``, their lines kept)."""
    name = yaml.ScalarNode("tag:yaml.org,2002:str", key, node.start_mark, node.start_mark)
    return yaml.MappingNode("tag:yaml.org,2002:map", [(name, node)], node.start_mark, node.end_mark)


def _load_yaml(text: str, name: str) -> Any:
    """The plain data of YAML ``text``; its failures located in file ``name``."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: plain data only
    except _Refused as exc:
        mark = exc.problem_mark
        line = None if mark is None else mark.line + 1
        located = Location(file=name, line=line, message=str(exc.problem))
        raise FaultFileError([located]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        problem = getattr(exc, "problem", None) or str(exc)
        located = Location(file=name, line=line, message=f"not YAML: {problem}")
        raise FaultFileError([located]) from None
    except RecursionError:
        raise FaultFileError([Location(file=name, message="not YAML: nested too deeply")]) from None
    except ValueError as exc:  # a value YAML reads but Python cannot (4301 digits, month 13)
        raise FaultFileError([Location(file=name, message=f"invalid value: {exc}")]) from None


def _check_json(text: str, name: str) -> None:
    """Refuse a ``.json`` file that is not JSON, located (YAML reads it next, for its lines)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        message = f"not JSON: {exc.msg} (column {exc.colno})"
        raise FaultFileError([Location(file=name, line=exc.lineno, message=message)]) from None
    except RecursionError:
        raise FaultFileError([Location(file=name, message="not JSON: nested too deeply")]) from None


def _located(
    exc: ValidationError,
    data: Any,
    name: str,
    root: type[BaseModel],
    tree: yaml.Node | None = None,
) -> FaultFileError:
    """Every error of a validation of a ``root``, with its file (line, when known), rule and
    field."""
    errors = []
    for error in exc.errors():
        loc = _clean_loc(error["loc"], data)
        rule, field_loc = _rule_name(data, loc)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = f"unknown field{_suggestion(error['loc'], root)}"
        elif error["type"] == "union_tag_invalid":
            given = error["input"].get("action")
            close = difflib.get_close_matches(str(given), actions.names(), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = (
                f"unknown action {given!r}{hint}; expected one of "
                + (error["ctx"]["expected_tags"])
            )
        errors.append(
            Location(
                file=name,
                line=_line_of(tree, loc) if tree is not None else None,
                rule=rule,
                field=_field_path(field_loc),
                message=message,
            )
        )
    # The model checks names only once all rules parse, and without a place: located here.
    duplicates = _duplicate_names(data, name, tree)
    if duplicates:
        errors = [error for error in errors if not error.message.endswith(" is used twice")]
    errors += duplicates
    return FaultFileError(sorted(errors, key=lambda error: error.line or 0))


def _duplicate_names(data: Any, name: str, tree: yaml.Node | None) -> list[Location]:
    """A rule name used twice, found in the raw data (so in the same pass as any other error)."""
    rules = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rules, list):
        return []
    seen: set[str] = set()
    found = []
    for index, rule in enumerate(rules):
        rule_name = rule.get("name") if isinstance(rule, dict) else None
        if not isinstance(rule_name, str):
            continue
        if rule_name in seen:
            found.append(
                Location(
                    file=name,
                    line=_line_of(tree, ("rules", index, "name")) if tree is not None else None,
                    rule=rule_name,
                    field="name",
                    message=f"rule name {rule_name!r} is used twice",
                )
            )
        seen.add(rule_name)
    return found


class _RuleList(_Model):
    rules: list[Rule]

    @model_validator(mode="after")
    def _unique_names(self) -> _RuleList:
        FaultFile._unique(self.rules)
        return self


def _install(models: tuple[type[ActionModel], ...]) -> None:
    """Make ``do`` the union of every registered action's model (told again after each
    :meth:`~proxy.core.actions.ActionRegistry.register`), so the located errors, the schema and
    the control API know every action, a plugin's too."""
    union: Any = functools.reduce(operator.or_, models)
    described = Field(discriminator="action", description="the action (`action`) and its fields")
    annotation: Any = Annotated[union, described]
    Rule.model_fields["do"] = FieldInfo.from_annotation(annotation)
    for model in (Rule, FaultFile, _RuleList):
        model.model_rebuild(force=True)


actions.subscribe(_install)


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: Any, source: str = "request") -> M:
    """``data`` (plain data, as the control API receives it) as a ``model``; every error located
    as in a fault file (a :class:`FaultFileError` whose file is ``source``)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _located(exc, data, source, model) from None


def validate_rules(data: Any, source: str = "request") -> list[Rule]:
    """Rules given as plain data (the control API): validated as in a fault file, errors located;
    at most :data:`MAX_RULES`."""
    _too_many(data, source)
    return validated(_RuleList, {"rules": data}, source).rules


def dump_rules(rules: Sequence[Rule]) -> list[dict[str, Any]]:
    """Rules as plain data (aliases used), as a fault file or the control API writes them."""
    return [
        json.loads(rule.model_dump_json(by_alias=True, exclude_defaults=True)) for rule in rules
    ]
