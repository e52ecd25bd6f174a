"""A scripted stdio peer for the proxy's tests: records every line it reads, acts on a few methods.

Usage: ``python raw_agent.py CAPTURE_FILE [--ignore-eof] [--no-answer METHOD]...``. Every line read from stdin is appended
to CAPTURE_FILE, byte for byte, before anything else happens. Then:

* ``_test/say`` (notification), params ``{"lines": [text...], "b64": [base64...]}``: writes each
  line to stdout as given (so a test can make the Agent send anything, valid or not);
* ``_test/stderr`` (notification), params ``{"text": ...}``: writes the text to stderr;
* ``_test/exit`` (notification), params ``{"code": n}``: exits with status n at once;
* ``_test/env`` (request), params ``{"name": ...}``: answers ``{"value": os.environ.get(name)}``;
* ``_test/pipes`` (request): answers ``{"stdin": bytes, "stdout": bytes}``, what its stdin and
  stdout pipes hold (Linux's ``F_GETPIPE_SZ``; None where either is not a pipe);
* any other request: answered ``{"method": m, "size": bytes of the line}``.

With ``--ignore-eof`` it keeps running after stdin closes, until it is signalled. Requests of a
method named by ``--no-answer`` are never answered (an Agent that hangs on them).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import sys


def write(line: bytes) -> None:
    sys.stdout.buffer.write(line + b"\n")
    sys.stdout.buffer.flush()


def pipe_size(fd: int) -> int | None:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):  # not Linux; not a pipe
        return None


def main() -> int:
    capture_path = sys.argv[1]
    ignore_eof = "--ignore-eof" in sys.argv
    no_answer = {sys.argv[i + 1] for i, arg in enumerate(sys.argv[:-1]) if arg == "--no-answer"}
    with open(capture_path, "ab") as capture:
        for line in sys.stdin.buffer:
            capture.write(line)
            capture.flush()
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, or nested deeper than it reads
                continue
            if not isinstance(message, dict) or not isinstance(message.get("method"), str):
                continue
            method = message["method"]
            params = message.get("params") or {}
            if method == "_test/say":
                for text in params.get("lines", []):
                    write(text.encode("utf-8", "surrogatepass"))
                for data in params.get("b64", []):
                    write(base64.b64decode(data))
            elif method == "_test/stderr":
                sys.stderr.write(params["text"] + "\n")
                sys.stderr.flush()
            elif method == "_test/exit":
                sys.stdout.flush()
                os._exit(params["code"])
            elif "id" in message and method not in no_answer:
                if method == "_test/env":
                    result: dict[str, object] = {"value": os.environ.get(params["name"])}
                elif method == "_test/pipes":
                    result = {"stdin": pipe_size(0), "stdout": pipe_size(1)}
                else:
                    result = {"method": method, "size": len(line.rstrip(b"\n"))}
                reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
                write(json.dumps(reply).encode())
    if ignore_eof:
        signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
