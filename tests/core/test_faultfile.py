"""Fault files: what loads, and broken files refused with every error located (exit status 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from harness import ROOT
from tool_runs import acp_proxy

from proxy.core.actions.delay import Delay
from proxy.core.actions.kill_agent import KillAgent
from proxy.core.actions.sever import Sever
from proxy.core.faultfile import (
    MAX_ALIASED_VALUES,
    MAX_FILE_BYTES,
    MAX_RULES,
    FaultFileError,
    Note,
    Rule,
    dump_rules,
    fault_file_schema,
    parse_fault_file,
    parse_rules_text,
    rule_notes,
    validate_rules,
)
from proxy.shell.fault_files import load_fault_files

GOOD = """\
version: 1
seed: 7
rules:
  - name: lose-first-keyed-prompt-response
    when:
      direction: to_client
      kind: response
      method: session/prompt
      session: "*"
      idempotency_key: present
      params: {}
    schedule:
      nth: [1]
    do:
      action: drop
  - name: slow
    do: {action: delay, ms: 5, jitter_ms: 2}
    continue: true
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(FaultFileError) as caught:
        parse_fault_file(text, "f.yaml")
    return [str(error) for error in caught.value.errors]


def test_a_complete_file_loads() -> None:
    """Every documented field is accepted and defaults fill the rest."""
    parsed = parse_fault_file(GOOD, "f.yaml")
    assert parsed.seed == 7
    first, second = parsed.rules
    assert first.when.direction == "to_client"
    assert first.schedule.nth == [1]
    assert first.continue_ is False
    assert isinstance(second.do, Delay)
    assert (second.do.ms, second.do.jitter_ms, second.continue_) == (5, 2, True)
    assert second.when.method == "*"


def test_json_files_load_too() -> None:
    """JSON is accepted as well as YAML."""
    text = json.dumps({"version": 1, "rules": [{"name": "d", "do": {"action": "drop"}}]})
    assert parse_fault_file(text, "f.json").rules[0].name == "d"


def test_signals_by_name_or_number() -> None:
    """kill_agent takes KILL, SIGTERM or a number."""
    for value, number in (("KILL", 9), ("SIGTERM", 15), (2, 2), ("term", 15)):
        rule = Rule.model_validate({"name": "k", "do": {"action": "kill_agent", "signal": value}})
        assert isinstance(rule.do, KillAgent)
        assert rule.do.signal == number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "version: 1\nrules:\n  - name: a\n    do: {action: explode}\n",
            "f.yaml:4: rule 'a': do: unknown action 'explode'; expected one of 'drop'",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do: {action: dorp}\n",
            "f.yaml:4: rule 'a': do: unknown action 'dorp' (did you mean 'drop'?); expected one",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do:\n      action: delay\n      ms: -5\n",
            "f.yaml:6: rule 'a': do.ms: Input should be greater than or equal to 0",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do:\n      action: delay\n      ms: soon\n",
            "f.yaml:6: rule 'a': do.ms: Input should be a valid number",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when:\n      methd: x\n    do: {action: drop}\n",
            "f.yaml:5: rule 'a': when.methd: unknown field (did you mean 'method'?)",
        ),
        (  # a number is a number: not a boolean, not a text
            "version: 1\nrules:\n  - name: a\n    do: {action: bandwidth, bytes_per_second: true}\n",
            "f.yaml:4: rule 'a': do.bytes_per_second: Input should be a valid integer",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    schedule: {times: '2'}\n    do: {action: drop}\n",
            "f.yaml:4: rule 'a': schedule.times: Input should be a valid integer",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do: {action: delay, ms: '5'}\n",
            "f.yaml:4: rule 'a': do.ms: Input should be a valid number",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    schedule: {bursts: {p: 0.1, r: 0.2, times: 1}}\n"
            "    do: {action: drop}\n",
            "f.yaml:4: rule 'a': schedule.bursts.times: unknown field (a field of schedule, not "
            "of schedule.bursts)",
        ),
        (  # a field of another action is named as such, not suggested as itself
            "version: 1\nrules:\n  - name: a\n    do: {action: delay, ms: 1, gap_us: 3}\n",
            "f.yaml:4: rule 'a': do.gap_us: unknown field (a field of slice, not of delay)",
        ),
        (  # suggested from the action's own fields, a prefix too
            "version: 1\nrules:\n  - name: a\n    do: {action: bandwidth, bytes_per_second: 1, burst: 3}\n",
            "f.yaml:4: rule 'a': do.burst: unknown field (did you mean 'burst_bytes'?)",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do: {action: slice, average_size: 5, gap_ms: 3}\n",
            "f.yaml:4: rule 'a': do.gap_ms: unknown field (did you mean 'gap_us'?)",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when: {method: 'session/[prompt'}\n    do: {action: drop}\n",
            "rule 'a': when.method: glob 'session/[prompt' has a '[' that is never closed",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    when: {session: ''}\n    do: {action: drop}\n",
            "rule 'a': when.session: a glob cannot be empty",
        ),
        ("version: 2\nrules: []\n", "f.yaml:1: version: Input should be 1"),
        ("rules: []\n", "version: Field required"),
        (
            "version: 1\nrules:\n  - do: {action: drop}\n",
            "f.yaml:3: rule '#1': name: Field required",
        ),
        (
            "version: 1\nrules:\n  - {name: a, do: {action: drop}}\n  - {name: a, do: {action: drop}}\n",
            "f.yaml:4: rule 'a': name: rule name 'a' is used twice",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    schedule: {probability: 1.5, nth: []}\n    do: {action: drop}\n",
            "rule 'a': schedule.probability: Input should be less than or equal to 1",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    schedule: {start_ms: 10, stop_ms: 5}\n    do: {action: drop}\n",
            "rule 'a': schedule: stop_ms must be later than start_ms",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do: {action: kill_agent, signal: NOPE}\n",
            "rule 'a': do.signal: 'NOPE' is not a signal name",
        ),
        (
            "version: 1\nrules:\n  - name: a\n    do: {action: http_status, status: 200}\n",
            "rule 'a': do.status: Input should be greater than or equal to 400",
        ),
        ("version: 1\nrules:\n  - name: [unclosed\n", "f.yaml:4: not YAML"),
        ("- just\n- a list\n", "f.yaml:1: a fault file is a mapping with version and rules"),
    ],
)
def test_broken_files_are_located(text: str, expected: str) -> None:
    """Each error names the file, the line, the rule and the field."""
    assert any(expected in error for error in errors_of(text)), errors_of(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\nrules: " + "[" * 1000 + "]" * 1000, "f.yaml: not YAML: nested too deeply"),
        ("version: 1\nseed: " + "9" * 5000 + "\nrules: []\n", "f.yaml: invalid value: Exceeds"),
        (
            "version: 1\nrules:\n  - {name: a, do: {action: delay, ms: .inf}}\n",
            "rule 'a': do.ms: Input should be a finite number",
        ),
        (
            "version: 1\nrules:\n  - {name: a, do: {action: error, data: !!set {x}}}\n",
            "rule 'a': do: the error answer cannot be written as JSON",
        ),
        (
            "version: 1\nrules:\n  - {name: a, do: {action: error, code: " + "1" * 30 + "}}\n",
            "rule 'a': do: the error answer cannot be written as JSON",
        ),
        (
            'version: 1\nrules:\n  - {name: a, do: {action: error, message: "\\ud800"}}\n',
            "rule 'a': do: the error answer cannot be written as JSON",
        ),
        (
            "version: 1\nrules:\n  - {name: a, do: {action: sever, close_code: 1005}}\n",
            "rule 'a': do.close_code: 1005 cannot be sent in a close frame",
        ),
        (
            "version: 1\nrules:\n  - {name: a, do: {action: restart_proxy, downtime_ms: 3600001}}\n",
            "rule 'a': do.downtime_ms: Input should be less than or equal to 3600000",
        ),
        (
            'version: 1\nrules:\n  - {name: a, when: {method: "\\udc00*"}, do: {action: drop}}\n',
            "rule 'a': when.method: a lone surrogate",
        ),
        (
            'version: 1\nrules:\n  - {name: a, when: {params: {"\\ud800": 1}}, do: {action: drop}}\n',
            "rule 'a': when.params: a lone surrogate",
        ),
    ],
)
def test_files_no_rule_could_use_are_located_errors(text: str, expected: str) -> None:
    """Nesting or numbers beyond what Python reads, infinite times, error answers and strings that
    cannot be written are errors of the file, never an exception, a rule that fails when it fires
    or rules that GET /api/rules cannot show."""
    assert any(expected in error for error in errors_of(text)), errors_of(text)


def test_every_error_is_reported_at_once() -> None:
    """Several broken rules give several errors, not just the first."""
    text = "version: 1\nrules:\n  - name: a\n    do: {action: nope}\n  - name: b\n    do: {action: delay}\n"
    errors = errors_of(text)
    assert len(errors) == 2
    assert "rule 'a'" in errors[0]
    assert "rule 'b': do.ms: Field required" in errors[1]


def test_an_unknown_field_is_located_at_its_key_with_the_field_it_resembles() -> None:
    """A misspelt field is reported on the line its key is written (not its value's), with the
    field it is close to; one close to no field gets no guess."""
    text = "version: 1\nrule:\n  - name: a\n    do: {action: drop}\nrules: []\n"
    assert errors_of(text) == ["f.yaml:2: rule: unknown field (did you mean 'rules'?)"]
    text = "version: 1\nrules:\n  - name: a\n    do: {action: drop}\n    zebra: 1\n"
    assert errors_of(text) == ["f.yaml:5: rule 'a': zebra: unknown field"]


def rules_text_errors(text: str) -> list[str]:
    with pytest.raises(FaultFileError) as caught:
        parse_rules_text(text)
    return [str(error) for error in caught.value.errors]


def test_rules_written_as_text_are_located_as_in_a_file() -> None:
    """One rule (a mapping) or a list of them, in YAML or JSON: each error on its line of the
    text, with its rule and field, as ``validate`` gives a fault file's."""
    one = "name: slow\nwhen:\n  method: session/prompt\ndo:\n  action: delya\n  ms: 10\n"
    [error] = rules_text_errors(one)
    assert error.startswith(
        "rule:4: rule 'slow': do: unknown action 'delya' (did you mean 'delay'?)"
    )
    [rule] = parse_rules_text(one.replace("delya", "delay"))
    assert rule.name == "slow"
    assert rule.do.action == "delay"
    listed = "- name: a\n  do: {action: drop}\n- name: b\n  do: {action: drop}\n  whne: {}\n"
    assert rules_text_errors(listed) == [
        "rule:5: rule 'b': whne: unknown field (did you mean 'when'?)"
    ]
    assert rules_text_errors("name: [a\n") == [
        "rule:2: not YAML: expected ',' or ']', but got '<stream end>'"
    ]
    assert rules_text_errors(
        "- {name: a, do: {action: drop}}\n- {name: a, do: {action: drop}}\n"
    ) == ["rule:2: rule 'a': name: rule name 'a' is used twice"]
    assert rules_text_errors("just text") == [
        "rule:1: a rule is a mapping with name, when, schedule and do (or a list of them)"
    ]
    assert [r.name for r in parse_rules_text('[{"name": "j", "do": {"action": "drop"}}]')] == ["j"]


def test_a_json_file_must_be_json() -> None:
    """A ``.json`` fault file is read as JSON: a trailing comma (which YAML accepts) is refused,
    located; the same text named ``.yaml`` loads."""
    text = '{"version": 1,\n "rules": [{"name": "a", "do": {"action": "drop"}},]\n}\n'
    with pytest.raises(FaultFileError) as caught:
        parse_fault_file(text, "f.json")
    [error] = caught.value.errors
    assert str(error) == "f.json:2: not JSON: Expecting value (column 52)"
    assert [rule.name for rule in parse_fault_file(text, "f.yaml").rules] == ["a"]
    good = '{"version": 1, "rules": [{"name": "a", "do": {"action": "drop"}}]}'
    assert [rule.name for rule in parse_fault_file(good, "f.json").rules] == ["a"]


@pytest.mark.parametrize(
    ("rule", "note"),
    [
        (
            {"schedule": {"bursts": {"p": 0, "r": 0.5}}, "do": {"action": "drop"}},
            "schedule.bursts: it never fires (p, 1-h and 1-k)",
        ),
        (
            {"do": {"action": "delay", "ms": 5, "distribution": "normal"}},
            "do.distribution: without jitter_ms every delay is ms: no law to draw",
        ),
        (
            {"do": {"action": "delay", "ms": 5, "jitter_ms": 1, "correlation": 0.25}},
            "do.correlation: a percent: did you mean 25 (not a fraction)?",
        ),
        (
            {"do": {"action": "error", "data": "text"}},
            "do.data: not an object: the error is sent without data.acpFault (attribute: false "
            "says so)",
        ),
    ],
)
def test_settings_that_do_nothing_or_likely_not_what_was_meant_are_noted(
    rule: dict[str, Any], note: str
) -> None:
    """Valid, so not refused (the control API and files keep them), but said: bursts that never
    fire, a law or a correlation without a deviation, a correlation written as a fraction, an
    error data that cannot be attributed."""
    found = [str(n) for n in rule_notes(validate_rules([{"name": "a", **rule}]))]
    assert f"rule 'a': {note}" in found
    quiet = [{"name": "q", "do": {"action": "delay", "ms": 5, "jitter_ms": 1, "correlation": 25}}]
    assert rule_notes(validate_rules(quiet)) == []


def test_a_method_close_to_an_acp_method_is_noted() -> None:
    """``session/promt`` is valid (a glob) but matches no ACP method: a note names the method it
    resembles. An ACP method, a glob, an extension method and one close to none get no note."""

    def notes(method: str) -> list[str]:
        rule = {"name": "a", "when": {"method": method}, "do": {"action": "drop"}}
        return [str(note) for note in rule_notes(validate_rules([rule]))]

    assert notes("session/promt") == [
        "rule 'a': when.method: 'session/promt' is no method of ACP (did you mean "
        "'session/prompt'?): it never matches that one"
    ]
    for method in ("session/prompt", "session/*", "_zed/inspect", "fs/read_text_file", "x/y"):
        assert notes(method) == []


def test_a_repeated_name_is_reported_with_the_other_errors() -> None:
    """A name used twice is found in the same pass as a broken rule, located at the repeat."""
    text = (
        "version: 1\nrules:\n  - {name: a, do: {action: drop}}\n  - name: a\n"
        "    do: {action: drop}\n  - name: b\n    do: {action: delay}\n"
    )
    errors = errors_of(text)
    assert errors == [  # in the order of their lines
        "f.yaml:4: rule 'a': name: rule name 'a' is used twice",
        "f.yaml:7: rule 'b': do.ms: Field required",
    ]
    rules = [{"name": "a", "do": {"action": "drop"}}, {"name": "a", "do": {"action": "nope"}}]
    with pytest.raises(FaultFileError) as raised:
        validate_rules(rules)
    assert "rule name 'a' is used twice" in str(raised.value)


def test_several_files_concatenate_and_names_stay_unique(tmp_path: Path) -> None:
    """Rules of several files apply in order; the first seed wins; a repeated name is an error."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.json"
    first.write_text("version: 1\nrules:\n  - {name: one, do: {action: drop}}\n")
    second.write_text(
        '{"version": 1, "seed": 4, "rules": [{"name": "two", "do": {"action": "drop"}}]}'
    )
    loaded = load_fault_files([first, second])
    rules, seed = loaded.rules, loaded.seed
    assert [rule.name for rule in rules] == ["one", "two"]
    assert seed == 4
    second.write_text('{"version": 1, "rules": [{"name": "one", "do": {"action": "drop"}}]}')
    with pytest.raises(FaultFileError, match="already used in"):
        load_fault_files([first, second])


def test_no_rule_may_take_the_name_of_a_client_s_fault() -> None:
    """``_meta.acpFault`` names the faults a Client asks for, in logs and the report alone."""
    with pytest.raises(FaultFileError, match="names the faults a Client asks for"):
        validate_rules([{"name": "_meta.acpFault", "do": {"action": "drop"}}])


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    """An unreadable file is named in the error, with why in a few words (no errno, no repr)."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FaultFileError) as raised:
        load_fault_files([missing])
    assert [str(error) for error in raised.value.errors] == [
        f"{missing}: cannot read it: no such file or directory"
    ]


def test_a_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    """The byte that is not UTF-8 is named, not the codec's message."""
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"version: 1\nrules: []\n\xff\n")
    with pytest.raises(FaultFileError) as raised:
        load_fault_files([bad])
    assert [str(error) for error in raised.value.errors] == [
        f"{bad}: not UTF-8 text: byte 22 cannot be decoded"
    ]


def test_rules_round_trip_through_plain_data() -> None:
    """Dumped rules (aliases, no defaults) load back to the same rules."""
    parsed = parse_fault_file(GOOD, "f.yaml")
    dumped = dump_rules(parsed.rules)
    assert dumped[1]["continue"] is True
    assert [Rule.model_validate(item) for item in dumped] == parsed.rules


def test_schema_describes_every_action() -> None:
    """The JSON Schema names each action and forbids extra fields."""
    text = json.dumps(fault_file_schema())
    for action in (
        "drop",
        "delay",
        "error",
        "duplicate",
        "sever",
        "kill_agent",
        "restart_proxy",
        "http_status",
        "close_stream",
        "corrupt",
    ):
        assert f'"const": "{action}"' in text
    assert '"additionalProperties": false' in text


def test_validate_command(tmp_path: Path) -> None:
    """validate: 0 and a grammatical verdict on stdout for good files; 2 with every located
    error on stderr (and nothing on stdout) for bad ones."""
    good, one, bad = tmp_path / "good.yaml", tmp_path / "one.json", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    one.write_text('{"version": 1, "rules": [{"name": "only", "do": {"action": "drop"}}]}')
    bad.write_text("version: 1\nrules:\n  - name: x\n    do: {action: delay, ms: -1}\n")
    done = acp_proxy("validate", str(good))
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok: 2 rules in 1 file, seed 7\n", "")
    done = acp_proxy("validate", str(one))
    assert (done.returncode, done.stdout) == (0, "ok: 1 rule in 1 file, no seed\n")
    done = acp_proxy("validate", str(good), str(one))
    assert (done.returncode, done.stdout) == (0, "ok: 3 rules in 2 files, seed 7\n")
    done = acp_proxy("validate", str(good), str(bad))
    assert done.returncode == 2
    assert f"{bad}:4: rule 'x': do.ms: Input should be greater than or equal to 0" in done.stderr
    assert done.stdout == ""


def test_validate_notes_rules_that_need_http_and_old_names(tmp_path: Path) -> None:
    """validate accepts, with a note each located at its field, the HTTP-only actions (it does
    not know where Clients will connect), sever's old `when` and a method that looks misspelt;
    with --strict a note fails the check (exit 1), but not one that an action needs HTTP."""
    path = tmp_path / "notes.yaml"
    path.write_text(
        "version: 1\nrules:\n"
        "  - {name: fail-post, do: {action: http_status, status: 503}}\n"
        "  - {name: cut-stream, do: {action: close_stream}}\n"
        "  - {name: cut, do: {action: sever, side: client, when: after}}\n"
        "  - {name: quiet, do: {action: sever, side: client, moment: after}}\n"
        "  - name: typo\n"
        "    when:\n"
        "      method: session/promt\n"
        "    do: {action: drop}\n"
    )
    done = acp_proxy("validate", str(path))
    assert (done.returncode, done.stdout) == (0, "ok: 5 rules in 1 file, no seed\n")
    http = "fires only when Clients connect over Streamable HTTP (--listen http://...)"
    notes = [
        f"note: {path}:3: rule 'fail-post': do.action: http_status {http}",
        f"note: {path}:4: rule 'cut-stream': do.action: close_stream {http}",
        f"note: {path}:5: rule 'cut': do.when: 'when' is the old name of 'moment' (before or "
        "after forwarding); rename it",
        f"note: {path}:9: rule 'typo': when.method: 'session/promt' is no method of ACP (did you "
        "mean 'session/prompt'?): it never matches that one",
    ]
    assert done.stderr.splitlines() == notes
    strict = acp_proxy("validate", "--strict", str(path))
    assert (strict.returncode, strict.stdout) == (1, "FAIL: 2 notes (--strict)\n")  # not HTTP
    assert strict.stderr.splitlines() == notes
    clean = tmp_path / "clean.yaml"
    clean.write_text("version: 1\nrules:\n  - {name: quiet, do: {action: drop}}\n")
    assert acp_proxy("validate", "--strict", str(clean)).returncode == 0
    for_http = tmp_path / "http.yaml"  # validate cannot know where Clients connect
    for_http.write_text(
        "version: 1\nrules:\n  - {name: p, do: {action: http_status, status: 503}}\n"
    )
    assert acp_proxy("validate", "--strict", str(for_http)).returncode == 0


def test_run_refuses_a_bad_file_before_starting(tmp_path: Path) -> None:
    """run exits 2 with the located error and never starts the Agent."""
    bad, marker = tmp_path / "bad.yaml", tmp_path / "agent-ran"
    bad.write_text("version: 1\nrules:\n  - name: x\n    do: {action: sever, side: nowhere}\n")
    done = acp_proxy(
        "run", "--faults", str(bad), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"
    )
    assert done.returncode == 2
    assert "rule 'x': do.side: Input should be 'client', 'agent' or 'both'" in done.stderr
    assert not marker.exists()


def test_schema_command_prints_json() -> None:
    """schema prints a JSON Schema document on stdout."""
    done = acp_proxy("schema")
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema["title"] == "acp-fault-proxy fault file"
    assert "rules" in schema["properties"]


# -- sever's moment ------------------------------------------------------------------------------


def test_sever_moment_and_its_old_name() -> None:
    """`moment` says when a sever cuts; `when` still works, noted; both at once is an error; the
    rule is written back (and described by the schema) with `moment` only."""
    [new, old] = validate_rules(
        [
            {"name": "new", "do": {"action": "sever", "moment": "after"}},
            {"name": "old", "do": {"action": "sever", "when": "after"}},
        ]
    )
    assert isinstance(new.do, Sever)
    assert isinstance(old.do, Sever)
    assert (new.do.moment, old.do.moment) == ("after", "after")
    assert (new.do.old_name, old.do.old_name) == (False, True)
    assert dump_rules([old]) == [{"name": "old", "do": {"action": "sever", "moment": "after"}}]
    assert [note.rule for note in rule_notes([new, old])] == ["old"]
    with pytest.raises(FaultFileError) as both:
        validate_rules(
            [{"name": "b", "do": {"action": "sever", "when": "after", "moment": "after"}}]
        )
    assert str(both.value) == "request: rule 'b': do: give 'moment' only ('when' is its old name)"
    text = "version: 1\nrules:\n  - name: s\n    do:\n      action: sever\n      when: later\n"
    assert errors_of(text) == ["f.yaml:6: rule 's': do.when: Input should be 'before' or 'after'"]
    sever = fault_file_schema()["$defs"]["Sever"]["properties"]
    assert "moment" in sever
    assert "when" not in sever


def test_notes_of_http_only_actions() -> None:
    """http_status and close_stream rules carry a note that they need Clients on HTTP."""
    rules = validate_rules(
        [
            {"name": "s", "do": {"action": "http_status", "status": 502}},
            {"name": "d", "do": {"action": "drop"}},
            {"name": "c", "do": {"action": "close_stream"}},
        ]
    )
    notes = rule_notes(rules)
    assert [(note.rule, note.field, note.needs_http) for note in notes] == [
        ("s", "do.action", True),
        ("c", "do.action", True),
    ]
    assert all(isinstance(note, Note) for note in notes)


# -- fault files cannot explode ------------------------------------------------------------------


def laughs(levels: int, length: int) -> str:
    """A "billion laughs": each level an alias list of nine of the level below, the last used in
    a rule's params; padded with a comment to ``length`` bytes."""
    lines = ["version: 1", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    lines += [
        "rules:",
        f"  - {{name: laugh, when: {{params: {{x: *l{levels - 1}}}}}, do: {{action: drop}}}}",
    ]
    text = "\n".join(lines) + "\n"
    padding = length - len(text.encode())
    assert padding >= 2
    return text + "#" * (padding - 1) + "\n"


@pytest.mark.parametrize(("length", "levels"), [(432, 6), (602, 9)])
def test_alias_bombs_are_refused_at_the_alias(length: int, levels: int) -> None:
    """Issue 13.5: the 432- and 602-byte alias bombs (9**6 and 9**9 values once expanded) are
    refused while the YAML is read, at the alias that crosses the bound, before any expansion."""
    text = laughs(levels, length)
    assert len(text.encode()) == length
    errors = errors_of(text)
    bound = f"{MAX_ALIASED_VALUES:,}"
    # l1 to l3 add 9 * (10 + 91 + 820) = 8,289 values; l4's first *l3 (7,381 more) crosses it
    assert errors == [
        f"f.yaml:6: aliases expand to more than {bound} values "
        "(each use of an alias copies what it names)"
    ]


def test_a_recursive_alias_is_refused() -> None:
    """An alias inside the node it names would be a structure without end."""
    assert errors_of("version: 1\nx: &a [1, *a]\nrules: []\n") == [
        "f.yaml:2: an alias inside the value it names"
    ]


def test_aliases_within_the_bound_load() -> None:
    """Sharing a `when` between rules through an alias (the use aliases are for) still works."""
    text = (
        "version: 1\nrules:\n"
        "  - {name: a, when: &prompt {kind: request, method: session/prompt}, do: {action: drop}}\n"
        "  - {name: b, when: *prompt, do: {action: delay, ms: 5}}\n"
    )
    first, second = parse_fault_file(text, "f.yaml").rules
    assert first.when == second.when
    assert second.when.method == "session/prompt"


def many_rules(count: int) -> str:
    return "version: 1\nrules:\n" + "".join(
        f"  - {{name: r{n}, do: {{action: drop}}}}\n" for n in range(count)
    )


def test_at_most_max_rules(tmp_path: Path) -> None:
    """A file, the files of a run together, and the control API's rules hold at most MAX_RULES
    rules; one more is refused, located, before any rule is validated."""
    assert len(parse_fault_file(many_rules(MAX_RULES), "f.yaml").rules) == MAX_RULES
    assert errors_of(many_rules(MAX_RULES + 1)) == ["f.yaml:2: rules: 1,001 rules: at most 1,000"]
    half = tmp_path / "half.yaml"
    half.write_text(many_rules(MAX_RULES // 2 + 1))
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            {
                "version": 1,
                "rules": [{"name": f"o{n}", "do": {"action": "drop"}} for n in range(500)],
            }
        )
    )
    with pytest.raises(FaultFileError) as together:
        load_fault_files([half, other])
    assert str(together.value) == f"{half}, {other}: 1,001 rules in all: at most 1,000"
    data = [{"name": f"r{n}", "do": {"action": "nope"}} for n in range(MAX_RULES + 1)]
    with pytest.raises(FaultFileError) as api:
        validate_rules(data)
    assert [str(error) for error in api.value.errors] == [
        "request: rules: 1,001 rules: at most 1,000"
    ]


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    """A fault file over MAX_FILE_BYTES is refused, read no further than the bound (a device
    that never ends included)."""
    large = tmp_path / "large.yaml"
    large.write_text(many_rules(1) + "#" * MAX_FILE_BYTES + "\n")
    message = f"over {MAX_FILE_BYTES:,} bytes: a fault file is at most that"
    with pytest.raises(FaultFileError) as refused:
        load_fault_files([large])
    assert str(refused.value) == f"{large}: {message}"
    with pytest.raises(FaultFileError) as endless:
        load_fault_files(["/dev/zero"])
    assert str(endless.value) == f"/dev/zero: {message}"
    assert errors_of("#" * (MAX_FILE_BYTES + 1)) == [f"f.yaml: {message}"]


def test_a_file_without_rules_is_valid_and_injects_nothing(tmp_path: Path) -> None:
    """``rules: []`` is a fault file that injects nothing (a start for --watch), not an error."""
    path = tmp_path / "none.yaml"
    path.write_text("version: 1\nrules: []\n")
    assert load_fault_files([path]).rules == []


def test_the_json_schema_accepts_what_the_proxy_accepts() -> None:
    """The schema editors validate with (``acp-proxy schema``) takes every ready fault file and
    the forms a field accepts beyond its stored type (a signal by name), and refuses what the
    proxy refuses."""
    schema = fault_file_schema()
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted((ROOT / "config").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        parse_fault_file(path.read_text(), path.name)
        assert not list(validator.iter_errors(data)), path.name
    for signal_value in ("KILL", "SIGTERM", 15):
        rule = {"name": "k", "do": {"action": "kill_agent", "signal": signal_value}}
        data = {"version": 1, "rules": [rule]}
        validate_rules(data["rules"])
        assert not list(validator.iter_errors(data)), signal_value
    wrong = {"version": 1, "rules": [{"name": "k", "do": {"action": "dorp"}}]}
    assert list(validator.iter_errors(wrong))


def test_numbers_written_as_yaml_and_json_write_them_are_numbers() -> None:
    """``1e3`` is a number (as in JSON and YAML 1.2), ``2.0`` a whole one for a count; a
    signal's name is still a name."""
    text = (
        "version: 1\nrules:\n"
        "  - name: a\n    do: {action: delay, ms: 1e3}\n"
        "  - name: b\n    do: {action: duplicate, copies: 2.0}\n"
        "  - name: c\n    do: {action: kill_agent, signal: TERM}\n"
    )
    rules = parse_fault_file(text, "f.yaml").rules
    assert [rule.do.model_dump(exclude={"action"}) for rule in rules][:2] == [
        {"ms": 1000.0, "jitter_ms": 0.0, "distribution": "uniform", "correlation": 0.0},
        {"copies": 2, "gap_ms": 0.0},
    ]
    assert rules[2].do.model_dump()["signal"] == 15
