"""The README's promises stay true: its set-up commands are the ones CI runs."""

from __future__ import annotations

from harness import ROOT
from md_blocks import shell_blocks


def test_ci_runs_the_readmes_test_command() -> None:
    """The second command of the README (install and test) is what .ci/run executes."""
    install_and_test = shell_blocks(ROOT / "README.md")[1].text.strip()
    assert install_and_test.startswith(
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]'"
    )
    assert install_and_test.endswith(".venv/bin/pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if line.startswith("python3 -m venv"))
    # CI adds lint and type checks between installing and testing.
    assert command.startswith(install_and_test.removesuffix(" && .venv/bin/pytest"))
    assert command.endswith(" && .venv/bin/pytest")
