"""Running the traces: one after the other, each with a proxy and an Agent of its own, each
turned into a :class:`~proxy.tools.verdicts.Result` whatever happens."""

from __future__ import annotations

import time

from proxy.shell.log import get_logger
from proxy.tools.check_agent.lab import open_lab
from proxy.tools.check_agent.options import CheckOptions
from proxy.tools.check_agent.traces import TRACES
from proxy.tools.verdicts import Error, Fail, Result, Skip, Status

__all__ = ["check_agent"]

log = get_logger("proxy.check")


async def check_agent(options: CheckOptions) -> list[Result]:
    """Run the traces one after the other, each with a proxy and an Agent of its own."""
    results = []
    skip_all: Skip | None = None
    for name in options.traces:
        title, run = TRACES[name]
        started = time.monotonic()
        result = Result(name, title, Status.PASS)
        if skip_all is not None:  # what every trace needs is missing: said once, not run again
            result.status, result.reason = Status.SKIP, f"{skip_all} (not run)"
            results.append(result)
            continue
        try:
            async with open_lab(options) as lab:
                try:
                    result.reason = await run(lab)
                    echoed = lab.keys_echoed()
                    if echoed:
                        raise Fail(f"the Agent echoed keys: {echoed}")
                except Fail as exc:
                    result.status, result.reason = Status.FAIL, str(exc)
                    if exc.diagnose:
                        said = await lab.diagnosis()
                        result.reason += f"; the proxy says: {said}" if said else ""
                if lab.transport != options.transport:
                    result.title += f" (over {lab.transport}: a reconnect needs a listener)"
        except Skip as exc:
            result.status, result.reason = Status.SKIP, str(exc)
            if exc.every_trace:
                skip_all = exc
        except Error as exc:
            result.status, result.reason = Status.ERROR, str(exc)
        except Exception as exc:  # a bug of the checker (or what an Agent did that it missed)
            log.exception("the check itself failed", trace=name)
            result.status, result.reason = (
                Status.ERROR,
                f"checker error: {type(exc).__name__}: {exc}",
            )
        result.seconds = round(time.monotonic() - started, 3)
        log.info("trace done", trace=name, status=result.status, reason=result.reason)
        results.append(result)
    return results
