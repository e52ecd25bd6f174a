"""The README and ``docs/`` stay true: generated parts current, links whole, commands that run.

* The generated parts of the pages (each command's ``--help``, the fault file's fields and
  actions) are what ``docs/generate.py`` writes from the code now.
* Every registered action has its entry in ``docs/fault-files.md``, every command its help in
  ``docs/cli.md``, every metric the proxy exposes its row in ``docs/metrics.md``.
* Every link between the pages names a page that exists and, with ``#anchor``, one of its headings;
  every file of the project a page names exists.
* Every shell block of the README and of ``docs/`` is run, in order, page by page, in a scratch
  folder holding ``config/`` (and the ``file=NAME`` blocks before it), with this environment's
  ``acp-proxy`` on the ``PATH``: each command must exit 0, or the status its line's comment says
  (``# exit 1``); a ``text shows`` block after it holds lines of what it printed. A block ``sh admin`` runs against a proxy started here (the reference Agent over
  stdio, the control API on a free port in place of ``127.0.0.1:9090``). A block
  ``sh no-run=REASON`` is not run, and its test is skipped saying why (``docs/development.md``,
  "The docs", lists the reasons).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from harness import ROOT, TIMEOUT, ProxyProcess
from md_blocks import Block, blocks, shell_blocks

from proxy.core.actions import actions
from proxy.core.engine import ActiveFaults
from proxy.shell.inflight import DEFAULT_MAX_INFLIGHT_BYTES, InflightBytes
from proxy.shell.metrics import Metrics
from proxy.shell.parsing import Parser

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

NOT_RUN = {
    "agent": "it needs a real Agent (node my-agent.js, python my_agent.py)",
    "docker": "it needs a Docker engine",
    "kubernetes": "it needs a Kubernetes cluster; tests/e2e/test_kubernetes_files.py checks the "
    "manifests",
    "install": "it installs packages into a virtual environment",
    "activate": "it changes the calling shell's PATH; the tests put the environment's commands on "
    "the PATH themselves",
    "long": "it runs for minutes (the test suite, fuzzing)",
    "slow": "it runs every conformance trace, about a minute; "
    "tests/tools/check_agent/test_check_agent_traces.py runs the same",
    "repo": "it rewrites the repository's own files; test_the_generated_parts_are_current "
    "checks the same",
    "browser": "it needs Chromium and rewrites the docs' pictures; "
    "test_the_screenshots_script_runs runs it into a scratch folder",
}
"""Why a block marked ``no-run=REASON`` is not run."""

ADMIN_ADDRESS = "127.0.0.1:9090"
"""The control API's address in the pages' examples: a ``sh admin`` block gets a free port."""


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generator()


# -- the blocks of a page ------------------------------------------------------------------------


_COMMENT = re.compile(r"\s#\s.*$")
_EXIT = re.compile(r"\bexit (\d+)\b")


def commands(block: Block) -> list[tuple[str, int]]:
    """Each command line of a shell block (continuations joined) and the status it must exit
    with: 0, or what its comment says (``# ... exit 1``)."""
    found = []
    pending = ""
    for raw in block.text.splitlines():
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        comment = next(
            (m for m in _COMMENT.finditer(line) if line[: m.start()].count("'") % 2 == 0), None
        )
        status = 0
        if comment is not None:
            said = _EXIT.search(comment.group())
            status = int(said.group(1)) if said else 0
            line = line[: comment.start()]
        found.append((line.strip(), status))
    return found


_VARYING = re.compile(r"^(\d{4}-\d\d-\d\dT\S+|\[\w*|\]|(id|link|session|pid)=\S*)$")
"""Words of a shown output that differ from run to run: times, log levels' brackets, ids."""


def shown_lines(text: str) -> list[re.Pattern[str]]:
    """Each line of a ``text shows`` block as a pattern one line of the output before it must
    match: its words in order, any value where a word varies."""
    return [
        re.compile(
            r"\s+".join(
                r"\S*" if _VARYING.match(word) else re.escape(word) for word in line.split()
            )
        )
        for line in text.splitlines()
        if line.strip()
    ]


def scratch(tmp_path: Path) -> Path:
    """A folder to run a page's blocks in, holding the project's ``config/``."""
    (tmp_path / "config").symlink_to(ROOT / "config", target_is_directory=True)
    return tmp_path


def environment() -> dict[str, str]:
    """This environment, with its ``acp-proxy`` first on the ``PATH`` and no admin token."""
    env = {k: v for k, v in os.environ.items() if k != "ACP_PROXY_ADMIN_TOKEN"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


async def run_command(command: str, cwd: Path) -> tuple[int, str]:
    """``command`` in bash, bounded by the harness's timeout: its status and its output."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=cwd,
        env=environment(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), TIMEOUT * 2)
    except TimeoutError:
        os.killpg(process.pid, 9)
        await process.wait()
        raise AssertionError(f"{command!r} did not end within {TIMEOUT * 2:g} s") from None
    assert process.returncode is not None
    return process.returncode, output.decode("utf-8", "replace")


async def run_block(block: Block, cwd: Path, replace: dict[str, str] | None = None) -> str:
    """Every command of ``block``, in order, each with the status it must exit with; the output
    of the last."""
    output = ""
    for written, expected in commands(block):
        command = written
        for old, new in (replace or {}).items():
            command = command.replace(old, new)
        status, output = await run_command(command, cwd)
        assert status == expected, (
            f"{block.where}: {command!r} exited {status}, not {expected}:\n{output[-4000:]}"
        )
        if block.option("admin") is not None:
            assert '"error"' not in output, f"{block.where}: {command!r}: {output[-2000:]}"
    return output


async def run_admin_block(block: Block, cwd: Path) -> None:
    """``block`` against a running proxy: the reference Agent over stdio, ``--admin`` on a free
    port that replaces the examples' address."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    agent = [sys.executable, "-m", "proxy", "agent"]
    proxy = await ProxyProcess.start(
        agent,
        "--admin",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--trace",
        str(cwd / "admin-run.jsonl"),
        "--faults",
        str(ROOT / "config" / "slow-network.yaml"),
    )
    try:
        url = (await proxy.logged("control API listening"))["url"]
        _ = await run_block(block, cwd, {ADMIN_ADDRESS: url.removeprefix("http://")})
        await proxy.close_stdin()
        await proxy.wait()
    finally:
        await proxy.stop()


# -- the tests ------------------------------------------------------------------------------------


def test_the_generated_parts_are_current() -> None:
    """Each command's help and the fault file reference are what the code generates now."""
    for page in generate.pages():
        text = page.read_text()
        assert generate.regenerate(text) == text, (
            f"docs/{page.name} is out of date: run {generate.COMMAND}"
        )


def test_every_action_has_an_entry_in_the_fault_file_reference() -> None:
    """Each registered action has its heading among the generated actions of fault-files.md."""
    text = (DOCS / "fault-files.md").read_text()
    assert "actions" in generate.generated_names(text)
    region = text[text.index("<!-- BEGIN GENERATED: actions -->") :]
    region = region[: region.index("<!-- END GENERATED: actions -->")]
    for action in actions:
        assert f"### `{action.name}`\n\n" in region, f"no entry for {action.name}"
        assert action.summary[1:] in region


def test_every_command_has_its_help_in_the_cli_reference() -> None:
    """Each command of ``acp-proxy`` has its generated ``--help`` in cli.md."""
    names = generate.generated_names((DOCS / "cli.md").read_text())
    assert "help" in names
    for command in generate.command_names():
        assert f"help:{command}" in names, f"docs/cli.md has no help of {command}"


def test_every_metric_is_documented() -> None:
    """Each metric the proxy exposes is a row of metrics.md, and each row is a metric: the
    metrics of a run, whose bytes in flight are always counted and bounded, whose large
    messages are parsed by workers, and whose faults in progress and held messages are
    counted."""
    metrics = Metrics(
        inflight=InflightBytes(DEFAULT_MAX_INFLIGHT_BYTES),
        parser=Parser(),
        active_faults=ActiveFaults(),
        held=lambda: 0,
    )
    exposed = {
        line.split()[2]
        for line in metrics.exposition().decode().splitlines()
        if line.startswith("# TYPE ")
    }
    text = (DOCS / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(acp_proxy_\w+)` \|", text, re.MULTILINE))
    assert exposed == documented


def test_a_field_without_a_description_is_refused() -> None:
    """The generator refuses to document a field that says nothing (it would be a blank cell)."""
    from pydantic import BaseModel

    class Undescribed(BaseModel):
        ms: float = 0.0

    with pytest.raises(generate.DocsError, match=r"Undescribed\.ms has no description"):
        generate.fields_table(Undescribed)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (outside fenced blocks), repeats numbered as GitHub
    does."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and (match := re.match(r"#{1,6} (.+)", line)):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """The targets of ``page``'s Markdown links outside fenced blocks, with their line."""
    found = []
    inside = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            found += [(number, target) for target in re.findall(r"\]\(([^)\s]+)\)", line)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_links_resolve(page: Path) -> None:
    """Every link to a page of the project names one that exists, and with ``#anchor`` one of
    its headings."""
    for line, target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # another site
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}:{line}: {target}: no such file"
        if anchor:
            assert linked.suffix == ".md", f"{page.name}:{line}: {target}: an anchor of a non-page"
            assert anchor in anchors(linked), f"{page.name}:{line}: {target}: no such heading"


MADE_AT_RUN_TIME = {"fuzz/.work/", "fuzz/.crashes/"}
"""Folders the pages name that a run makes (a fuzzer's memory and its crashes)."""


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_files_named_exist(page: Path) -> None:
    """Every file or folder of the project a page names (``proxy/shell/link.py``, ``config/``)
    exists: a move must not leave the docs pointing at nothing."""
    for named in re.findall(
        r"`((?:proxy|tests|fuzz|config|docker|docs|\.ci)/[^`\s#<*]*)`", page.read_text()
    ):
        if named in MADE_AT_RUN_TIME or not (named.endswith("/") or "." in named.rsplit("/")[-1]):
            continue  # made by a run, or not a path (a method such as proxy/successor)
        assert (ROOT / named).exists(), f"{page.name} names {named}, which does not exist"


def test_every_page_is_linked_from_the_readme() -> None:
    """A page no one links to is a page no one reads."""
    linked = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    for page in DOCS.glob("*.md"):
        assert f"docs/{page.name}" in linked, f"the README does not link docs/{page.name}"


def test_blocks_say_what_they_are() -> None:
    """Every shell block either runs or names a known reason not to; ``file=`` names a file."""
    for page in PAGES:
        for block in shell_blocks(page):
            reason = block.option("no-run")
            assert reason is None or reason in NOT_RUN, f"{block.where}: no-run={reason}?"
            assert set(block.info.split()[1:]) <= {"admin", f"no-run={reason}"}, block.where
            assert commands(block), f"{block.where}: no command"


def test_the_readme_keeps_its_first_two_commands() -> None:
    """The demo, then the tests: the first two blocks (``test_readme.py`` and ``test_demo.py``
    read them), before anything else."""
    first, second = blocks(ROOT / "README.md")[:2]
    assert first.text.strip().endswith(".venv/bin/acp-proxy demo")
    assert second.text.strip().endswith(".venv/bin/pytest")


@pytest.mark.parametrize(
    "block",
    [block for page in PAGES for block in shell_blocks(page) if block.option("no-run")],
    ids=lambda block: block.where,
)
def test_blocks_not_run(block: Block) -> None:
    """A block that cannot run on loopback says why; the test says so too."""
    pytest.skip(f"{block.where} is not run: {NOT_RUN[block.option('no-run') or '']}")


RUN_PAGES = [page for page in PAGES if any(not b.option("no-run") for b in shell_blocks(page))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda page: page.name)
async def test_the_shell_blocks_run(page: Path, tmp_path: Path) -> None:
    """The page's shell blocks run in order, in one scratch folder, each command exiting as the
    page says."""
    cwd = scratch(tmp_path)
    output = ""
    for block in blocks(page):
        name = block.option("file")
        if name:
            (cwd / name).write_text(block.text)
        elif block.language == "text" and block.option("shows") is not None:
            for shown in shown_lines(block.text):
                assert any(shown.search(line) for line in output.splitlines()), (
                    f"{block.where}: no line of the output is like {shown.pattern!r}:\n{output}"
                )
        elif block.language != "sh" or block.option("no-run"):
            continue
        elif block.option("admin") is not None:
            await run_admin_block(block, cwd)
        else:
            output = await run_block(block, cwd)


@pytest.mark.browser
@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="no Chromium on the PATH (apt-get install chromium): the docs' pictures need one",
)
async def test_the_screenshots_script_runs(tmp_path: Path) -> None:
    """``docs/screenshots.py`` takes the dashboard's pictures from a real run (here into a
    scratch folder): a proxy, the reference Client and Agent, Chromium."""
    script = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DOCS / "screenshots.py"),
        "--out",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(script.communicate(), TIMEOUT * 4)
    assert script.returncode == 0, err.decode()
    names = ["dashboard-login.png", "dashboard.png", "dashboard-rules.png", "dashboard-held.png"]
    assert out.decode().splitlines() == [f"wrote {tmp_path / name}" for name in names]
    for name in names:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG\r\n"), name
        assert (DOCS / name).is_file(), f"docs/dashboard.md shows {name}"
