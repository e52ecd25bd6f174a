"""The tables of a report summary, for both renderings: the text and the page.

Each table of the summary is its column titles and rows of cell values (``None``: no value), so
that the text (:mod:`proxy.tools.report.text`) and the page (:mod:`proxy.tools.report.html`) only
format them. ``names`` names each node (:func:`short_names`; a node it lacks is shown as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from proxy.core.records import JsonValue
from proxy.tools.report.model import KeyRow, Summary

__all__ = [
    "Cell",
    "Table",
    "connections_table",
    "faults_table",
    "findings_phrase",
    "findings_table",
    "held_table",
    "keys_note",
    "keys_table",
    "not_relayed_table",
    "plural",
    "prompts_note",
    "prompts_table",
    "relayed_table",
    "retries_table",
    "short_names",
    "totals_rows",
]


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 word``, ``2 words`` (or ``many``)."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def _at(seconds: float | None) -> str:
    return "-" if seconds is None else f"+{seconds:.3f}s"


def findings_phrase(summary: Summary) -> str:
    """The findings of a summary in a few words (``0 findings`` when clean)."""
    found = summary["findings"]
    count, failing = found["count"], found["failing"]
    if count == 0:
        return "0 findings"
    checks = ", ".join(f"{check} x{n}" for check, n in found["by_check"].items())
    if failing == 0:
        return f"{plural(count, 'finding')}, warnings only ({checks})"
    return f"{plural(count, 'finding')}, {failing} failing ({checks})"


def short_names(nodes: Iterable[str]) -> dict[str, str]:
    """Each node's shortest path suffix that no other node shares (``a.jsonl``, ``x/t.jsonl``)."""
    parts = {node: Path(node).parts or (node,) for node in nodes}
    deepest = max((len(p) for p in parts.values()), default=1)
    for depth in range(1, deepest + 1):
        names = {node: "/".join(p[-depth:]) for node, p in parts.items()}
        if len(set(names.values())) == len(names):
            return names
    return {node: node for node in parts}


# Each table of the summary, as its column titles and rows of cell values (``None``: no value),
# for both renderers: the text here (``_table``) and the page (``proxy.tools.report.html``) only
# format them. ``names`` names each node (:func:`short_names`; a node it lacks is shown as it is).

Cell = str | int | float | None
"""A table's cell: text, a number, or no value."""
Table = tuple[list[str], list[list[Cell]]]
"""A table: its column titles and its rows."""


def _nodes(names: Mapping[str, str], nodes: Iterable[str]) -> str:
    return ", ".join(names.get(node, node) for node in nodes)


def totals_rows(summary: Summary, *, runs_and_reloads: bool = False) -> list[list[str]]:
    """The totals, a ``[name, text]`` row each.

    ``runs_and_reloads`` adds the proxy runs, and the rule reloads when there were any, after the
    restarts.
    """
    totals, prompts = summary["totals"], summary["prompts"]
    retries, restarts = summary["retries"], summary["restarts"]
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in prompts["by_outcome"].items())
    retry_text = plural(retries["count"], "retry", "retries")
    if retries["across_nodes"]:
        retry_text += f" ({retries['across_nodes']} across nodes)"
    restart_text = str(totals["restarts"])
    if restarts["by_what"]:
        kinds = ", ".join(f"{what} x{n}" for what, n in restarts["by_what"].items())
        abandoned = plural(restarts["abandoned_requests"], "request")
        restart_text += f" ({kinds}; {abandoned} abandoned)"
    messages = (
        f"{totals['messages_relayed']} relayed ({totals['bytes_relayed']} bytes), "
        f"{totals['messages_not_relayed']} not relayed"
    )
    if totals["messages_held"]:
        messages += (
            f", {totals['messages_held']} held by rules "
            f"({totals['messages_held_sent']} sent when released)"
        )
    rows = [
        ["messages", messages],
        ["faults", f"{totals['faults']} injected"],
        [
            "connections",
            f"{totals['connections_opened']} opened, {totals['connections_closed']} closed",
        ],
        ["restarts", restart_text],
    ]
    if runs_and_reloads:
        rows.append(["proxy runs", str(restarts["proxy_runs"])])
        reloads = ", ".join(f"{result} x{n}" for result, n in summary["reloads"].items())
        if reloads:
            rows.append(["reloads", reloads])
    rows += [
        [
            "prompts",
            plural(totals["prompts"], "attempt")
            + (f" ({outcomes})" if outcomes else "")
            + f", {retry_text}",
        ],
        ["findings", findings_phrase(summary)],
    ]
    return rows


def faults_table(summary: Summary, names: Mapping[str, str]) -> Table:
    """The faults injected, by rule and action."""
    return ["rule", "action", "count", "nodes"], [
        [f["rule"], f["action"], f["count"], _nodes(names, f["nodes"])]
        for f in summary["faults"]["by_rule"]
    ]


def relayed_table(summary: Summary) -> Table:
    """The messages relayed, by direction, kind and method."""
    return ["direction", "kind", "method", "count", "bytes", "p50 ms", "max ms"], [
        [
            m["direction"],
            m["kind"],
            m["method"],
            m["count"],
            m["bytes"],
            None if m["duration_ms"] is None else m["duration_ms"]["median"],
            None if m["duration_ms"] is None else m["duration_ms"]["max"],
        ]
        for m in summary["messages"]["relayed"]
    ]


def not_relayed_table(summary: Summary) -> Table:
    """The messages not relayed, by disposition."""
    return ["disposition", "direction", "kind", "method or reason", "count"], [
        [m["disposition"], m["direction"], m["kind"], m["method"] or m["reason"], m["count"]]
        for m in summary["messages"]["not_relayed"]
    ]


def held_table(summary: Summary) -> Table:
    """The messages rules held (``delay``, spaced ``duplicate`` copies), by rule: how many, how
    many were sent when released, how long they were held."""
    headers = ["direction", "kind", "method", "rules", "held", "sent", "not sent", "p50 ms"]
    return [*headers, "max ms"], [
        [
            m["direction"],
            m["kind"],
            m["method"],
            m["rules"],
            m["count"],
            m["sent"],
            m["not_sent"],
            None if m["delay_ms"] is None else m["delay_ms"]["median"],
            None if m["delay_ms"] is None else m["delay_ms"]["max"],
        ]
        for m in summary["messages"]["held"]
    ]


def connections_table(summary: Summary) -> Table:
    """The connections opened and closed, by side and transport."""
    return ["side", "transport", "opened", "closed"], [
        [c["side"], c["transport"], c["opened"], c["closed"]] for c in summary["connections"]
    ]


def prompts_table(summary: Summary, names: Mapping[str, str]) -> Table:
    """The prompts per session, by outcome."""
    headers = [
        "session",
        "attempts",
        "answered",
        "errors",
        "lost",
        "unanswered",
        "retries",
        "nodes",
        "keys in findings",
    ]
    return headers, [
        [
            s["session"],
            s["attempts"],
            s["answered"],
            s["errors"],
            s["lost"],
            s["unanswered"],
            s["retries"],
            _nodes(names, s["nodes"]),
            ", ".join(s["keys_in_findings"]) or None,
        ]
        for s in summary["prompts"]["sessions"]
    ]


def prompts_note(summary: Summary) -> str:
    """The injected copies of prompts and the answers to them swallowed (empty when none)."""
    prompts = summary["prompts"]
    extra = []
    if prompts["copies"]:
        extra.append(plural(prompts["copies"], "injected copy", "injected copies"))
    if prompts["swallowed_answers"]:
        extra.append(f"{plural(prompts['swallowed_answers'], 'answer')} to copies swallowed")
    return ", ".join(extra)


def retries_table(
    summary: Summary,
    names: Mapping[str, str],
    *,
    id_text: Callable[[JsonValue], str],
    timeline_rows: Mapping[int, int] | None = None,
) -> Table:
    """The retries, each id written by ``id_text``.

    With ``timeline_rows`` (the timeline row of each retry, by its index in the summary's list),
    the table has the columns ``row`` (``#N``) and ``retries id`` (the id of the attempt retried).
    """
    headers = [
        "at",
        "row",
        "session",
        "node",
        "link",
        "id",
        "retries id",
        "after",
        "lost on",
        "delay ms",
        "same size",
        "outcome",
    ]
    rows: list[list[Cell]] = []
    for index, r in enumerate(summary["retries"]["list"]):
        number = None if timeline_rows is None else timeline_rows.get(index)
        lost_on = names.get(r["lost_node"], r["lost_node"])
        rows.append(
            [
                _at(r["at_s"]),
                "-" if number is None else f"#{number}",
                r["session"],
                names.get(r["node"], r["node"]),
                r["link"],
                id_text(r["id"]),
                id_text(r["lost_id"]),
                r["after"],
                lost_on + (" (other node)" if r["across_nodes"] else ""),
                r["delay_ms"],
                {True: "yes", False: "no", None: "-"}[r["same_size"]],
                r["outcome"],
            ]
        )
    if timeline_rows is None:
        keep = [i for i, title in enumerate(headers) if title not in ("row", "retries id")]
        return [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]
    return headers, rows


def keys_table(summary: Summary, names: Mapping[str, str]) -> Table:
    """The idempotency keys worth a look: retried, seen by several nodes, or given several
    messages or prompts (the others are counted by :func:`keys_note`)."""
    return ["at", "session", "key", "attempts", "nodes", "prompts", "messageIds", "verdict"], [
        [
            _at(k["at_s"]),
            k["session"],
            k["key"],
            k["attempts"],
            _nodes(names, k["nodes"]),
            k["prompts"],
            ", ".join(k["message_ids"]) or None,
            k["verdict"],
        ]
        for k in summary["keys"]["list"]
        if _notable(k)
    ]


def _notable(key: KeyRow) -> bool:
    return bool(key["retries"]) or len(key["nodes"]) > 1 or key["verdict"] == "duplicate"


def keys_note(summary: Summary) -> str:
    """The keys in all, and how many :func:`keys_table` leaves out (each one attempt, one node)."""
    keys = summary["keys"]
    plain = sum(1 for key in keys["list"] if not _notable(key))
    text = (
        f"{plural(keys['count'], 'key')}: {keys['retried']} retried, "
        f"{keys['across_nodes']} seen by several nodes, "
        f"{plural(keys['duplicates'], 'duplicate')}"
    )
    if plain:
        text += f"; {plain} not listed (one attempt, one node, at most one messageId)"
    return text


def findings_table(
    summary: Summary, names: Mapping[str, str], *, check_first: bool = False
) -> Table:
    """The findings in time order; ``check_first`` puts the check before the time."""
    rows: list[list[Cell]] = []
    for f in summary["findings"]["list"]:
        at, check = _at(f["at_s"]), f["check"] + (" (warning)" if f["warning"] else "")
        first: list[Cell] = [check, at] if check_first else [at, check]
        rows.append([*first, f["session"], f["key"], _nodes(names, f["nodes"]), f["detail"]])
    titles = ["check", "at"] if check_first else ["at", "check"]
    return [*titles, "session", "key", "node", "detail"], rows
