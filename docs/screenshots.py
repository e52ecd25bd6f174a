"""The screenshots of ``docs/dashboard.md``, taken from a real run of the proxy.

A proxy listens for WebSocket Clients in front of the reference Agent, with a token and the ready
fault file ``config/lose-first-prompt-response.yaml``; Chromium (driven by Playwright) opens its
dashboard and logs in; the reference Client then sends two keyed prompts, the answer to the first
is lost and the Client resends it under its key. The pictures: the login page, the dashboard with
the retry clicked, the rules panel with a misspelt rule's located error, and a prompt a ``hold``
rule added from the page holds (a breakpoint), released from its card. Run from anywhere::

    .venv/bin/python docs/screenshots.py               # rewrite docs/dashboard*.png
    .venv/bin/python docs/screenshots.py --out DIR     # write them to DIR instead

It needs Chromium (``--chromium PATH``; by default the ``chromium`` on the ``PATH``).
``tests/e2e/test_docs.py`` runs it into a scratch folder.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from playwright.sync_api import ViewportSize, expect, sync_playwright

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
ACP_PROXY = [sys.executable, "-m", "proxy"]
FAULTS = ROOT / "config" / "lose-first-prompt-response.yaml"
VIEWPORT: ViewportSize = {"width": 1400, "height": 860}
WAIT_MS = 60_000
"""The longest wait for anything the page should show."""
TYPO_RULE = "name: slow-updates\nwhen: {method: session/update}\ndo: {action: delya, ms: 20}\n"
HOLD_RULE = (
    "name: breakpoint\n"
    "when: {direction: to_agent, method: session/prompt}\n"
    "do: {action: hold, timeout_ms: 600000}\n"
)


def _logged(stderr: IO[bytes]) -> Iterator[dict[str, object]]:
    """The JSON log lines of a process, as they come."""
    for line in stderr:
        if line.startswith(b"{"):
            yield json.loads(line)


def start_proxy(token: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """The proxy, its control API's URL and its WebSocket listener's URL."""
    proxy = subprocess.Popen(
        [
            *ACP_PROXY,
            "run",
            "--listen",
            "ws://127.0.0.1:0/acp",
            "--admin",
            "127.0.0.1:0",
            "--faults",
            str(FAULTS),
            "--log-format",
            "json",
            "--",
            *ACP_PROXY,
            "agent",
        ],
        env={**os.environ, "ACP_PROXY_ADMIN_TOKEN": token},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proxy.stderr is not None
    urls: dict[object, str] = {}
    for record in _logged(proxy.stderr):
        if record.get("event") in ("control API listening", "listening"):
            urls[record["event"]] = str(record["url"])
        if len(urls) == 2:
            break
    else:
        raise SystemExit(f"the proxy ended before it listened (status {proxy.wait()})")
    # Its later logs are read away, so that it never blocks on a full pipe.
    threading.Thread(target=proxy.stderr.read, daemon=True).start()
    return proxy, urls["control API listening"], urls["listening"]


def take(out: Path, chromium: str) -> list[Path]:
    """Run the scene and write its pictures into ``out``; their paths."""
    token = secrets.token_urlsafe(24)
    proxy, admin, listen = start_proxy(token)
    shots = [
        out / "dashboard-login.png",
        out / "dashboard.png",
        out / "dashboard-rules.png",
        out / "dashboard-held.png",
    ]
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium)
            page = browser.new_page(viewport=VIEWPORT, locale="en-US")
            page.set_default_timeout(WAIT_MS)
            page.goto(admin + "/")
            page.locator("main").screenshot(path=shots[0])
            page.fill("#token", token)
            page.click("#login button")
            expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
            subprocess.run(
                [
                    *ACP_PROXY,
                    "client",
                    "--connect",
                    listen,
                    "--answer-timeout",
                    "1",
                    "-p",
                    "Plan the release",
                    "-p",
                    "Write the changelog",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=WAIT_MS / 1000,
            )
            retry = page.locator(".row.retry").first
            retry.wait_for()
            expect(page.locator("#rules td.fired")).to_have_text("1", timeout=WAIT_MS)
            retry.click()
            page.screenshot(path=shots[1])
            page.fill("#rule-text", TYPO_RULE)
            page.click("#add-rule button")
            page.locator("#rule-errors li.error").first.wait_for()
            page.locator("#rules-panel").screenshot(path=shots[2])
            page.fill("#rule-text", HOLD_RULE)
            page.click("#add-rule button")
            expect(page.locator("#rules")).to_contain_text("breakpoint")
            client = subprocess.Popen(
                [*ACP_PROXY, "client", "--connect", listen, "-p", "Fix the flaky test"],
                stdout=subprocess.DEVNULL,
            )
            try:
                card = page.locator("#held .held-card").first
                card.wait_for()
                page.locator("#held-panel").screenshot(path=shots[3])
                card.get_by_role("button", name="Release", exact=True).click()
                assert client.wait(WAIT_MS / 1000) == 0
            finally:
                client.kill()
                client.wait()
            browser.close()
    finally:
        proxy.terminate()
        proxy.wait(WAIT_MS / 1000)
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="the folder of the pictures")
    parser.add_argument("--chromium", default=shutil.which("chromium"), help="Chromium's path")
    args = parser.parse_args(argv)
    if args.chromium is None:
        parser.error("no chromium on the PATH: give --chromium PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    for shot in take(args.out, args.chromium):
        print(f"wrote {shot}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
