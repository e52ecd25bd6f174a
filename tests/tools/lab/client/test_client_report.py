"""The reference Client's verdict (``proxy.tools.lab.client.report``, :func:`judge`), from what was
seen: each user message given to its submission, the duplicates counted."""

from __future__ import annotations

from client_lab import judged

from proxy.tools.lab.client import SeenMessage, Submission, render


def test_a_message_in_chunks_is_put_together_per_stream() -> None:
    """Chunks live and chunks replayed are two streams: the text is not doubled, one message."""
    chunks = [
        SeenMessage("m1", "fir", 1, 0, 0, chunk=True),
        SeenMessage("m1", "st", 1, 0, 0, chunk=True),
        SeenMessage("m1", "fir", 2, 1, 0, chunk=True),
        SeenMessage("m1", "st", 2, 1, 0, chunk=True),
        SeenMessage("m2", "fir", 2, 1, 0, chunk=True),
        SeenMessage("m2", "st", 2, 1, 0, chunk=True),
    ]
    report = judged([Submission("first", "k1", answers=["m1"])], chunks, ["m1", "m2"])
    [first] = report.submissions
    assert first.message_ids == first.history_ids == ["m1", "m2"]  # m2: a copy, replayed
    assert report.duplicates == 1


def test_messages_go_to_the_submission_sent_latest_with_their_text() -> None:
    """Two submissions of one text are two messages, not a duplicate; a late copy of an
    earlier submission, seen while a later one is under way, is the earlier one's."""
    submissions = [
        Submission("same", "k1", answers=["m1"]),
        Submission("other", "k2", answers=["m2"]),
        Submission("same", "k3", answers=["m3"]),
    ]
    seen = [
        SeenMessage("m1", "same", 1, 0, 0),
        SeenMessage("m2", "other", 1, 0, 1),
        SeenMessage("m1b", "same", 1, 0, 1),  # k1 inserted again, late
        SeenMessage("m3", "same", 1, 0, 2),
    ]
    report = judged(submissions, seen, None)
    assert [s.message_ids for s in report.submissions] == [["m1", "m1b"], ["m2"], ["m3"]]
    assert [s.history_ids for s in report.submissions] == [[], [], []]  # not verified
    assert report.duplicates == 1
    assert "#1 inserted 2 times: m1, m1b" in render(report)
