"""A small synchronous client for the control API of ``acp-proxy run --admin HOST:PORT``.

The counterpart of Toxiproxy's clients: tests and scripts change a running proxy's rules, act on
its links and read its metrics, trace events, ledger and findings. It uses the standard library
only (``urllib.request``), so it works in any test, synchronous or not (from an event loop, call
it in a thread if the proxy runs on that same loop)::

    from proxy.control import ControlClient

    control = ControlClient("http://127.0.0.1:9000", token="s3cret")
    with control.fault(do="drop", when={"direction": "to_client", "method": "session/prompt"}):
        ...  # the answers to prompts are lost in this block
    assert control.metric("acp_proxy_faults_injected_total", action="drop") == 1

Messages a ``hold`` rule holds (breakpoints) are listed by :meth:`ControlClient.held`, waited
for by :meth:`ControlClient.wait_held` and let go by :meth:`~ControlClient.release_held`,
:meth:`~ControlClient.drop_held` and :meth:`~ControlClient.edit_held` (named apart from
:meth:`~ControlClient.release`, which ends ``stall`` faults)::

    with control.fault(do="hold", when={"direction": "to_agent", "method": "session/prompt"}):
        ...  # the Client sends a prompt
        held = control.wait_held(method="session/prompt")
        control.edit_held(held["id"], {**held["body"], "params": {...}})

Every error answer of the API raises :class:`ControlError` with its HTTP status, its message and,
for rules that do not validate, every located error. Rules are plain data, exactly as in a fault
file (``name``, ``when``, ``schedule``, ``do``, ``continue``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPResponse
from types import TracebackType
from typing import Any, Literal, cast

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ControlClient", "ControlError", "EventStream", "RuleCounters"]

DEFAULT_TIMEOUT = 30.0
"""Seconds a request (or a wait for the next event) may take before :class:`TimeoutError`."""

_fault_names = itertools.count(1)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Direct connections only: an ``http_proxy`` in the environment must not carry control calls."""


class ControlError(Exception):
    """The control API answered with an error (``{"error", "status", "errors"?}``)."""

    def __init__(self, status: int, message: str, errors: Sequence[str] = ()) -> None:
        self.status = status
        """The HTTP status (400 invalid, 401 no token, 404 unknown, 409 duplicate, 413 too big)."""
        self.message = message
        """What went wrong, as the API said it."""
        self.errors = list(errors)
        """Each validation error, located (``request: rule 'x': do.ms: ...``)."""
        detail = "".join(f"\n  {error}" for error in self.errors)
        super().__init__(f"{status}: {message}{detail}")


@dataclass(frozen=True, slots=True)
class RuleCounters:
    """How many messages a rule's ``when`` matched (whether or not an earlier rule acted on
    them), and how many times it fired (it acted)."""

    matched: int
    fired: int


class EventStream:
    """The live trace records of ``GET /api/events``: iterate for each record (a dict).

    Records start with the first event after the stream opened. Iterating raises
    :class:`TimeoutError` when no record (nor keep-alive) came within the client's timeout, or
    once ``deadline`` (a :func:`time.monotonic` time) has passed. Close it (or use it as a context
    manager) to unsubscribe.
    """

    def __init__(self, response: HTTPResponse, deadline: float | None = None) -> None:
        self._response = response
        self._deadline = deadline

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        """The next trace record."""
        data: list[bytes] = []
        while True:
            line = self._response.readline()
            if not line:
                raise StopIteration
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise TimeoutError("no matching record before the deadline")
            line = line.rstrip(b"\r\n")
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
            elif not line and data:
                return cast(dict[str, Any], json.loads(b"\n".join(data)))
            # other fields and ":" comments (keep-alives) are skipped

    def next(self) -> dict[str, Any]:
        """The next trace record (``next(stream)``)."""
        return next(self)

    def until(self, event: str, **fields: Any) -> dict[str, Any]:
        """Skip records until one whose ``event`` and given ``fields`` match; return it."""
        for record in self:
            if record.get("event") == event and all(
                record.get(key) == value for key, value in fields.items()
            ):
                return record
        raise EOFError("the event stream ended")

    def close(self) -> None:
        """Stop listening."""
        self._response.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class ControlClient:
    """A client of one proxy's control API (``http://HOST:PORT``, as ``--admin`` logged it)."""

    def __init__(
        self, base_url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """``token``: the ``--admin-token`` (sent as a bearer token); ``timeout`` in seconds."""
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"ControlClient({self.base_url!r})"

    # -- plumbing ------------------------------------------------------------------------------

    def _open(
        self, method: str, path: str, data: bytes | None, timeout: float | None = None
    ) -> HTTPResponse:
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )
        try:
            wait = self.timeout if timeout is None else timeout
            return cast(HTTPResponse, _OPENER.open(request, timeout=wait))
        except urllib.error.HTTPError as exc:
            with exc:
                raise _control_error(exc.code, exc.read()) from None

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None) -> Any:
        """Call ``method path`` (``body`` sent as JSON, or ``raw`` bytes as they are).

        Returns the parsed JSON answer (the text of a non-JSON one); raises :class:`ControlError`
        for an error status.
        """
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        with self._open(method, path, data) as response:
            payload = response.read()
            kind = response.headers.get_content_type()
        if kind == "application/json":
            return json.loads(payload)
        return payload.decode("utf-8")

    # -- health and rules ------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok", "links": N}``, or ``"status": "degraded"`` with
        ``degraded`` saying what failed (``{"trace": "file too large"}``); never needs the token."""
        return cast(dict[str, Any], self.request("GET", "/healthz"))

    def rules(self) -> list[dict[str, Any]]:
        """The rules in force, in order, as plain data (defaults left out)."""
        return cast(list[dict[str, Any]], self.request("GET", "/api/rules")["rules"])

    def counters(self) -> dict[str, RuleCounters]:
        """Per rule name: how often it matched and fired since it was added (or the last reset)."""
        answer = self.request("GET", "/api/rules")["counters"]
        return {name: RuleCounters(c["matched"], c["fired"]) for name, c in answer.items()}

    def set_rules(self, rules: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Replace every rule (counters of rules kept by name carry over); the rules now."""
        return cast(list[dict[str, Any]], self.request("PUT", "/api/rules", list(rules))["rules"])

    def add_rule(self, rule: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Append one rule (its name must be new: else 409); the rules now."""
        return cast(list[dict[str, Any]], self.request("POST", "/api/rules", dict(rule))["rules"])

    def remove_rule(self, name: str) -> list[dict[str, Any]]:
        """Remove the rule named ``name`` (404 when there is none); the rules now."""
        path = "/api/rules/" + urllib.parse.quote(name, safe="")
        return cast(list[dict[str, Any]], self.request("DELETE", path)["rules"])

    def reset(self) -> list[dict[str, Any]]:
        """Back to the fault files' rules, every counter at zero; the rules now."""
        return cast(list[dict[str, Any]], self.request("POST", "/api/reset")["rules"])

    @contextlib.contextmanager
    def fault(
        self,
        rule: Mapping[str, Any] | None = None,
        /,
        *,
        name: str | None = None,
        when: Mapping[str, Any] | None = None,
        schedule: Mapping[str, Any] | None = None,
        do: str | Mapping[str, Any] | None = None,
        continue_: bool = False,
    ) -> Iterator[str]:
        """Apply a rule for one ``with`` block; yields its name; removed on exit, even on error.

        Give a whole rule (``fault({"name": ..., "do": {...}})``) or its parts as keywords;
        ``do`` may be just an action name (``do="drop"``) and a missing name is made up
        (``fault-N``). A rule already gone at exit (a :meth:`reset` in the block) is fine.
        """
        data = dict(rule) if rule is not None else {}
        if do is not None:
            data["do"] = {"action": do} if isinstance(do, str) else dict(do)
        if when is not None:
            data["when"] = dict(when)
        if schedule is not None:
            data["schedule"] = dict(schedule)
        if continue_:
            data["continue"] = True
        if name is not None:
            data["name"] = name
        data.setdefault("name", f"fault-{next(_fault_names)}")
        if "do" not in data:
            raise ValueError("a fault needs an action: do=... (or a rule with 'do')")
        rule_name = str(data["name"])
        self.add_rule(data)
        failed = False
        try:
            yield rule_name
        except BaseException:
            failed = True
            raise
        finally:
            try:
                self.remove_rule(rule_name)
            except (ControlError, OSError) as exc:
                gone = isinstance(exc, ControlError) and exc.status == 404
                if not (gone or failed):  # never hide the block's own exception
                    raise

    # -- actions ----------------------------------------------------------------------------------

    def sever(
        self,
        side: Literal["client", "agent", "both"] = "both",
        close_code: int = 1001,
        link: int | None = None,
    ) -> list[int]:
        """Cut the connection to ``side`` of every link (or of ``link``) now; the links cut."""
        body: dict[str, Any] = {"side": side, "close_code": close_code}
        if link is not None:
            body["link"] = link
        return cast(list[int], self.request("POST", "/api/actions/sever", body)["links"])

    def kill_agent(
        self, signal: str | int = "KILL", respawn: bool = False, link: int | None = None
    ) -> list[int]:
        """Signal the spawned Agent of every link (or of ``link``); ``respawn`` starts a new one.

        Returns the links acted on.
        """
        body: dict[str, Any] = {"signal": signal, "respawn": respawn}
        if link is not None:
            body["link"] = link
        return cast(list[int], self.request("POST", "/api/actions/kill_agent", body)["links"])

    def release(self, link: int | None = None) -> int:
        """End the ``stall`` faults of every link (or of ``link``) now: what they held goes on.
        Returns how many stalls ended (0: nothing was stalled)."""
        body: dict[str, Any] = {} if link is None else {"link": link}
        return cast(int, self.request("POST", "/api/actions/release", body)["stalls"])

    # -- messages hold rules hold -----------------------------------------------------------------

    def held(self, limit: int | None = None) -> list[dict[str, Any]]:
        """``GET /api/held``: the messages ``hold`` rules hold now, oldest first, at most
        ``limit`` of them (the proxy's default: 100; at most 10,000) (``id``, ``link``, ``rule``,
        ``direction``, ``kind``, ``method``, ``jsonrpc_id``, ``body``...; a large message's
        ``body`` is None with ``truncated`` true: see :meth:`held_message`)."""
        path = "/api/held" if limit is None else f"/api/held?limit={int(limit)}"
        return cast(list[dict[str, Any]], self.request("GET", path)["held"])

    def held_message(self, held_id: int) -> dict[str, Any]:
        """``GET /api/held/{id}``: one held message, its ``body`` whole. 404 (:class:`ControlError`)
        for an id never given, 409 for a message held no more."""
        return cast(dict[str, Any], self.request("GET", f"/api/held/{int(held_id)}"))

    def release_held(self, held_id: int) -> dict[str, Any]:
        """Let the held message go on now, as it came; ``{"id", "link", "outcome"}``."""
        return self._settle_held(held_id, "release")

    def drop_held(self, held_id: int) -> dict[str, Any]:
        """Drop the held message (a request is then never answered); ``{"id", "link",
        "outcome"}``."""
        return self._settle_held(held_id, "drop")

    def edit_held(self, held_id: int, body: Any) -> dict[str, Any]:
        """Let the held message go on now as ``body`` (the new JSON-RPC message, as JSON data: of
        the same kind, under the same id as the held ``body``; a request keeps its method); the
        proxy rewrites its id as it would have the original's. 400 when it cannot replace it."""
        return self._settle_held(held_id, "edit", {"body": body})

    def _settle_held(self, held_id: int, act: str, body: Any = None) -> dict[str, Any]:
        return cast(dict[str, Any], self.request("POST", f"/api/held/{int(held_id)}/{act}", body))

    def wait_held(self, timeout: float | None = None, **match: Any) -> dict[str, Any]:
        """The first message held now or from now on whose fields equal ``match`` (as
        :meth:`held` shows them: ``method="session/prompt"``, ``direction="to_client"``,
        ``rule=...``, ``link=...``), its body whole. Waits on the event stream (``held``
        records) for at most about ``timeout`` seconds (default: the client's). A message let go
        (released, dropped, timed out, its link ended) before it could be read is passed over.

        Raises:
            TimeoutError: no matching message was held within ``timeout``.
            EOFError: the event stream ended first (the proxy stopped).
        """
        wait = self.timeout if timeout is None else timeout
        try:
            response = self._open("GET", "/api/events", None, timeout=wait)
            with EventStream(response, deadline=time.monotonic() + wait) as stream:
                for entry in self.held(_LISTED_AT_MOST):  # held before the stream opened
                    if _matches(entry, match):
                        found = self._still_held(int(entry["id"]))
                        if found is not None:
                            return found
                for record in stream:
                    held_id = record.get("held_id")
                    if record.get("event") != "held" or not isinstance(held_id, int):
                        continue
                    found = self._still_held(held_id)
                    if found is not None and _matches(found, match):
                        return found
        except TimeoutError:
            raise TimeoutError(
                f"no message matching {match!r} was held within {wait:g} s"
            ) from None
        raise EOFError("the event stream ended before a matching message was held")

    def _still_held(self, held_id: int) -> dict[str, Any] | None:
        """The held message ``held_id``, whole; None when it is held no more (409)."""
        try:
            return self.held_message(held_id)
        except ControlError as exc:
            if exc.status == 409:
                return None
            raise

    def restart_proxy(self, downtime_ms: float = 0) -> None:
        """Restart the data plane: every connection closed, down ``downtime_ms``, then back."""
        self.request("POST", "/api/actions/restart_proxy", {"downtime_ms": downtime_ms})

    # -- what the proxy knows --------------------------------------------------------------------

    def links(self) -> list[dict[str, Any]]:
        """The running links: ``id``, ``client`` and ``agent`` (transport, pid), and each way
        the requests ``pending`` and the messages a fault has ``held``."""
        return cast(list[dict[str, Any]], self.request("GET", "/api/links")["links"])

    def ledger(self) -> list[dict[str, Any]]:
        """The ledger of keyed prompts the proxy judged (DESIGN 7), one entry each."""
        return cast(list[dict[str, Any]], self.request("GET", "/api/ledger")["ledger"])

    def findings(self) -> list[dict[str, Any]]:
        """The rules of the idempotency RFD the proxy has seen broken, one finding each."""
        return cast(list[dict[str, Any]], self.request("GET", "/api/findings")["findings"])

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return str(self.request("GET", "/metrics"))

    def metric(self, name: str, /, **labels: str) -> float:
        """The value of sample ``name`` (``acp_proxy_messages_total``, ``..._count``) now.

        Samples whose labels include every given label are summed (so
        ``metric("acp_proxy_messages_total", direction="to_agent")`` counts every kind and
        method); 0 when there is none.
        """
        total = 0.0
        for family in text_string_to_metric_families(self.metrics()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(key) == value for key, value in labels.items()
                ):
                    total += sample.value
        return total

    def events(self) -> EventStream:
        """Subscribe to ``GET /api/events``: the trace records from now on, as they happen."""
        response = self._open("GET", "/api/events", None)
        return EventStream(response)


_LISTED_AT_MOST = 10_000
"""The most held messages ``GET /api/held`` lists at once (its ``limit``'s bound)."""


def _matches(entry: Mapping[str, Any], match: Mapping[str, Any]) -> bool:
    """Whether ``entry`` (a held message, a trace record) has every field of ``match``."""
    return all(entry.get(key) == value for key, value in match.items())


def _control_error(status: int, body: bytes) -> ControlError:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return ControlError(status, body.decode("utf-8", "replace") or f"HTTP {status}")
    errors = data.get("errors")
    return ControlError(
        int(data.get("status", status)),
        str(data.get("error", f"HTTP {status}")),
        [str(error) for error in errors] if isinstance(errors, list) else (),
    )
