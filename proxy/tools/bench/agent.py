"""The stdio bench Agent: ``python -m proxy.tools.bench.agent`` (no arguments).

It answers every request at once; ``_bench/stream`` (params ``{"count": N}``) first writes N
``session/update`` notifications in one write (:func:`~.messages.updates`), then its answer;
any other request is answered ``{"ok": true, "size": bytes of the request}``; notifications are
ignored. One message per line on stdin and stdout, until stdin ends.

Standard library only (and :mod:`.messages`), so that ``direct`` measures a small Agent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from proxy.tools.bench.messages import STREAM_METHOD, updates

__all__ = ["main", "serve"]

USAGE = "usage: python -m proxy.tools.bench.agent (no arguments: it speaks on stdin and stdout)"


def serve() -> int:
    """Answer every message on stdin until it ends (see the module)."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        if message["method"] == STREAM_METHOD:
            count = int((message.get("params") or {}).get("count", 0))
            out.write(updates(count))
            result: dict[str, object] = {"sent": count}
        else:
            result = {"ok": True, "size": len(line)}
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode())
        out.write(b"\n")
        out.flush()
    return 0


def main(argv: Sequence[str]) -> int:
    """The process: no arguments (else the usage on stderr, status 2)."""
    if argv:
        sys.stderr.write(USAGE + "\n")
        return 2
    return serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
