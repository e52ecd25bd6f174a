"""The reference Client's report for people (``proxy.tools.lab.client.render``): bounded text."""

from __future__ import annotations

from client_lab import judged

from proxy.tools.lab.client import SeenMessage, Submission, render


def test_a_flood_of_copies_is_listed_in_bounded_text() -> None:
    """A hostile Agent's many long messageIds: the JSON has all, the text a few, each cut."""
    ids = [f"{n:03d}" + "x" * 10_000 for n in range(100)]
    seen = [SeenMessage(message_id, "first", 1, 0, 0) for message_id in ids]
    report = judged([Submission("first", "k1")], seen, None)
    assert report.submissions[0].message_ids == ids
    assert report.duplicates == 99
    [line] = [line for line in render(report).splitlines() if "inserted 100 times" in line]
    assert len(line) < 400
    assert line.endswith(" and 95 more")
