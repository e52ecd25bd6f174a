"""Running the scenarios: one run of the Client per setup the chosen scenarios need (scenarios
that need the same setup share it), then every scenario judged, each turned into a
:class:`~proxy.tools.verdicts.Result` whatever happens."""

from __future__ import annotations

import tempfile
from pathlib import Path

from proxy.shell.log import get_logger
from proxy.tools.check_client.options import ClientCheckOptions
from proxy.tools.check_client.run import Run, run_once
from proxy.tools.check_client.scenarios import AGAIN, SCENARIOS, SETUPS, Context, silent
from proxy.tools.verdicts import Error, Fail, Result, Skip, Status

__all__ = ["check_client"]

log = get_logger("proxy.check")


async def check_client(options: ClientCheckOptions) -> list[Result]:
    """Run the Client once per setup the scenarios need, and judge every scenario."""
    needed = list(dict.fromkeys(SCENARIOS[name].setup for name in options.scenarios))
    if len(needed) < max(SCENARIOS[name].runs for name in options.scenarios):
        needed.append(AGAIN)  # C0 alone: the same text submitted in two runs
    runs: dict[str, Run] = {}
    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}  # not run: the Client failed before it reached the Agent
    with tempfile.TemporaryDirectory(prefix="acp-check-client-") as directory:
        for name in needed:
            if gave_up := _never_reached(runs, options.client_timeout):
                skipped[name] = gave_up  # the same Client, the same end: not run again
                continue
            setup = SETUPS[name]
            try:
                runs[name] = await run_once(
                    options, name, setup.rules, Path(directory) / name, setup.agent_args
                )
            except Error as exc:
                failed[name] = str(exc)
            except Exception as exc:  # a bug of the checker: told, never a traceback
                log.exception("the run itself failed", setup=name)
                failed[name] = f"checker error: {type(exc).__name__}: {exc}"
            log.info("run done", setup=name, failed=failed.get(name))
    every = list(runs.values())
    results = []
    for name in options.scenarios:
        scenario = SCENARIOS[name]
        result = Result(name, scenario.title, Status.PASS)
        run = runs.get(scenario.setup)
        if run is None:
            if scenario.setup in skipped:
                result.status, result.reason = Status.SKIP, skipped[scenario.setup]
            else:
                result.status, result.reason = Status.ERROR, failed[scenario.setup]
            results.append(result)
            continue
        if run.observed.unreadable is not None:  # a trace too large (or no trace) to judge
            result.status, result.reason = Status.ERROR, run.observed.unreadable
            result.seconds = run.seconds
            results.append(result)
            continue
        context = Context(run, every, options.retry_window, options.client_timeout, options.prompts)
        try:
            result.reason = scenario.judge(context)
        except Fail as exc:
            result.status, result.reason = Status.FAIL, str(exc)
        except Skip as exc:
            result.status, result.reason = Status.SKIP, str(exc)
        except Error as exc:
            result.status, result.reason = Status.ERROR, str(exc)
        except Exception as exc:  # a bug of the checker (or what a Client did that it missed)
            log.exception("the judgement itself failed", scenario=name)
            result.status = Status.ERROR
            result.reason = f"checker error: {type(exc).__name__}: {exc}"
        result.seconds = run.seconds
        results.append(result)
    return results


def _never_reached(runs: dict[str, Run], timeout: float) -> str | None:
    """Why the next runs are not made: a run whose Client failed (or hung) before it started
    the Agent at all; the next would end the same."""
    for run in runs.values():
        if run.observed.start is None and run.exit_status != 0:
            return f"not run: in the {run.setup} run, {silent(run, timeout)}"
    return None
