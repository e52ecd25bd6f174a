"""A stdio Agent for the no-data-dropped tests: numbers what it writes, records what it reads.

Usage: ``python seq_agent.py``. Every message it writes toward the Client carries ``out``, its
position in the Agent's output (``params.out`` on requests and notifications, ``result.out`` on
answers); every message the Client sends carries ``seq`` (``params.seq``, or ``result.seq`` on
the Client's answers) and the Agent records each ``[kind, seq, mark]`` it reads, in order. A
``mark`` (``params.mark``) is what a fault rule of the test targets; the Agent copies it along.

* ``initialize`` (request): answered ``{"protocolVersion": 1}`` (outside the numbering);
* ``_seq/note`` (notification): recorded;
* ``_seq/ask`` (request): recorded and answered ``{"out": n, "seq": seq, "mark": m}``, where
  ``m`` is ``dup-answer`` for an answer to a request marked ``dup`` (the proxy relays only the
  first answer of a duplicated request), else null;
* ``_seq/burst`` (notification), params ``{"items": [[kind, mark], ...]}``: recorded, then one
  message per item toward the Client: ``note`` a ``_seq/note`` notification, ``ask`` a
  ``_seq/ask`` request (id ``a<out>``), each with ``{"out": n, "mark": mark}``;
* ``_seq/drain`` (notification): recorded, then ``_seq/drained`` toward the Client with
  ``{"out": n, "mark": params.mark}``;
* ``_seq/report`` (request): recorded, then answered ``{"out": n, "received": [...], "written":
  [[out, kind, mark], ...]}``: everything read, and everything written including this answer
  (``kind`` ``answer`` for answers, whose mark is null);
* an answer from the Client: recorded as ``["answer", result.seq, result.to]`` (``to``: the
  ``out`` of the request it answers).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    stdout = sys.stdout.buffer
    written: list[list[Any]] = []
    received: list[list[Any]] = []

    def write(message: dict[str, Any], kind: str | None = None, mark: Any = None) -> None:
        if kind is not None:
            written.append([len(written), kind, mark])
        stdout.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    for line in sys.stdin.buffer:
        message = json.loads(line)
        method = message.get("method")
        params = message.get("params") or {}
        if method is None:
            result = message.get("result") or {}
            received.append(["answer", result.get("seq"), result.get("to")])
        elif method == "initialize":
            write({"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": 1}})
        else:
            kind = "ask" if "id" in message else "note"
            received.append([kind, params.get("seq"), params.get("mark")])
            if method == "_seq/ask":
                mark = "dup-answer" if params.get("mark") == "dup" else None
                result = {"out": len(written), "seq": params.get("seq"), "mark": mark}
                write({"jsonrpc": "2.0", "id": message["id"], "result": result}, "answer", mark)
            elif method == "_seq/burst":
                for item_kind, mark in params["items"]:
                    out = len(written)
                    item: dict[str, Any] = {"jsonrpc": "2.0"}
                    if item_kind == "ask":
                        item["id"] = f"a{out}"
                    item["method"] = f"_seq/{item_kind}"
                    item["params"] = {"out": out, "mark": mark}
                    write(item, item_kind, mark)
            elif method == "_seq/drain":
                drained = {"out": len(written), "mark": params.get("mark")}
                message = {"jsonrpc": "2.0", "method": "_seq/drained", "params": drained}
                write(message, "note", drained["mark"])
            elif method == "_seq/report":
                out = len(written)
                written.append([out, "answer", None])
                result = {"out": out, "received": received, "written": written}
                write({"jsonrpc": "2.0", "id": message["id"], "result": result})
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
