"""Differences between two messages, what changes between runs aside, and the nearest of many."""

from __future__ import annotations

from typing import Any

from proxy.core.matching import MISSING, Difference, Ignore, differences, nearest


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
    candidates = [
        ("far", {"text": "build", "mode": "slow"}),
        ("near", {"text": "deploy", "mode": "slow"}),
        ("also near", {"text": "test", "mode": "fast"}),
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
