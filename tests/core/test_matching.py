"""Differences between two messages, what changes between runs aside, and the nearest of many."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.errors import OptionError
from proxy.core.matching import MISSING, Difference, Ignore, differences, nearest, stands_for
from proxy.core.redact import REDACTED


def test_ids_keys_sessions_and_times_are_never_differences() -> None:
    """The members that change from run to run are skipped at any depth."""
    recorded = {
        "id": 1,
        "params": {
            "sessionId": "a",
            "idempotencyKey": "k1",
            "cwd": "/tmp/x",
            "update": {"messageId": "m1", "timestamp": 5, "text": "same"},
        },
    }
    got = {
        "id": "7",
        "params": {
            "sessionId": "b",
            "idempotencyKey": "k2",
            "cwd": "/tmp/y",
            "update": {"messageId": "m2", "timestamp": 6, "text": "same"},
        },
    }
    assert differences(recorded, got) == ([], 0)


def test_each_difference_has_its_path_and_both_values() -> None:
    """A changed value, a member missing on one side, an element more: each with its path."""
    recorded = {"result": {"stopReason": "end_turn", "gone": 1, "list": [1]}}
    got = {"result": {"stopReason": "cancelled", "list": [1, 2], "new": True}}
    found, count = differences(recorded, got)
    assert count == 4
    assert found == [
        Difference("result.stopReason", "end_turn", "cancelled"),
        Difference("result.gone", 1, MISSING),
        Difference("result.list[1]", MISSING, 2),
        Difference("result.new", MISSING, True),
    ]
    assert found[1].to_json() == {"path": "result.gone", "recorded": 1}


def test_a_number_is_not_its_text_nor_a_boolean() -> None:
    """1 and "1", 1 and true differ: types are compared too."""
    found, _ = differences({"a": 1, "b": 1}, {"a": "1", "b": True})
    assert [d.path for d in found] == ["a", "b"]


def test_ignored_paths_are_skipped_with_everything_below() -> None:
    """--ignore paths, with * and [*], cover the members they name and what is under them."""
    ignore = Ignore(["params.meta", "params.items[*].at", "result.*"])
    recorded = {"params": {"meta": {"a": 1}, "items": [{"at": 1, "v": 1}]}, "result": {"x": 1}}
    got: dict[str, Any] = {
        "params": {"meta": {"a": 2}, "items": [{"at": 2, "v": 1}]},
        "result": {"x": 2},
    }
    assert differences(recorded, got, ignore) == ([], 0)
    got["params"]["items"][0]["v"] = 2
    found, _ = differences(recorded, got, ignore)
    assert [d.path for d in found] == ["params.items[0].v"]


def test_nearest_is_the_one_with_fewest_differences() -> None:
    """The first candidate with the fewest differences wins; an exact one stops the search."""
    got = {"text": "deploy", "mode": "fast"}
    candidates: list[tuple[str, dict[str, str], list[str]]] = [
        ("far", {"text": "build", "mode": "slow"}, []),
        ("near", {"text": "deploy", "mode": "slow"}, []),
        ("also near", {"text": "test", "mode": "fast"}, []),
    ]
    best = nearest(got, candidates)
    assert best is not None
    assert best[0] == "near"
    assert best[1] == [Difference("mode", "slow", "fast")]
    assert nearest(got, []) is None


def test_the_listed_differences_are_bounded() -> None:
    """Thousands of differences: 20 listed, all counted."""
    found, count = differences(list(range(1000)), list(range(1, 1001)))
    assert (len(found), count) == (20, 1000)


def test_a_redacted_value_matches_what_this_run_sends_there() -> None:
    """The marker alone (a path redaction) stands for any value; a string holding it for a
    string in which each marker is any text; only where the message says it redacted."""
    recorded = {
        "params": {
            "clientCapabilities": REDACTED,
            "prompt": [{"text": f"hello my key is {REDACTED} ok"}],
            "both": f"a {REDACTED} b {REDACTED}",
        }
    }
    got: dict[str, Any] = {
        "params": {
            "clientCapabilities": {"fs": {"readTextFile": True}},
            "prompt": [{"text": "hello my key is sk-ABCdef123456 ok"}],
            "both": "a x b y z",
        }
    }
    where = ["params.clientCapabilities", "params.prompt[0].text", "params.both"]
    assert differences(recorded, got, redacted=where) == ([], 0)
    found, _ = differences(recorded, got)  # not said to be redacted: the marker is text
    assert [d.path for d in found] == where
    got["params"]["prompt"][0]["text"] = "goodbye my key is sk-ABC ok"
    got["params"]["both"] = "a x c y"
    found, _ = differences(recorded, got, redacted=where)
    assert [d.path for d in found] == ["params.prompt[0].text", "params.both"]


def test_a_member_left_out_is_still_a_difference() -> None:
    """The marker stands for a value, not for none."""
    found, _ = differences({"a": REDACTED}, {}, redacted=["a"])
    assert found == [Difference("a", REDACTED, MISSING)]


@pytest.mark.parametrize(
    ("recorded", "got", "same"),
    [
        (REDACTED, None, True),
        (f"{REDACTED}", "", True),
        (f"x{REDACTED}", "x", True),
        (f"x{REDACTED}y", "xy", True),
        (f"x{REDACTED}y", "xay", True),
        (f"x{REDACTED}y", "xa", False),
        (f"xy{REDACTED}yz", "xyz", False),  # the ends may not overlap
        (f"{REDACTED}a{REDACTED}a{REDACTED}", "aa", True),
        (f"{REDACTED}a{REDACTED}a{REDACTED}", "a", False),
        (f"k={REDACTED}", 5, False),
    ],
)
def test_each_marker_is_any_text(recorded: str, got: Any, same: bool) -> None:
    """Matched left to right: the first part a prefix, the last a suffix, the others in order."""
    assert stands_for(recorded, got) is same


def test_a_redacted_request_is_matched_under_params() -> None:
    """A replay compares ``params`` under their path: the message's redacted paths apply."""
    found, count = differences(
        {"text": REDACTED}, {"text": "secret"}, under=("params",), redacted=["params.text"]
    )
    assert (found, count) == ([], 0)


def test_a_bad_ignore_path_names_ignore() -> None:
    """``--ignore 'sk-['``: the error names --ignore, not --redact."""
    with pytest.raises(OptionError) as caught:
        Ignore(["sk-["])
    assert caught.value.option == "--ignore"
