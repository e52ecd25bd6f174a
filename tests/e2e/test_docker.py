"""The image built and run for real, and the compose stack brought up, used and stopped.

Marked ``docker`` and skipped, saying why, where no Docker engine answers (``docker info``) or no
Compose is installed. On a machine without a registry, ``../shared/tools/docker-sandbox.sh up``
starts an engine with local stand-ins for the base images; export the ``DOCKER_HOST`` it prints.

What runs, in order (the image is built once, for the module):

* ``docker build`` of ``docker/Dockerfile``, tagged as the compose files name it;
* every package in the image is the version ``docker/constraints.txt`` pins (the build is
  reproducible);
* ``acp-proxy demo`` inside the image, confined as ``deploy/kubernetes/`` runs it (a read-only
  root, no capability): the lab's clean verdict;
* a ``/data`` volume the image's user cannot write: one line and its exit status, no traceback;
* ``acp-proxy run --otel`` in the image (the ``otel`` extra is in it), confined likewise: the
  reference Client is answered through it, the collector (a tiny OTLP/HTTP receiver, run in the
  image on a network of the test's own) receives the prompt's span under ``OTEL_SERVICE_NAME``;
  with no collector to reach, the Client is answered all the same; the proxy stops with status
  0 and no traceback either way;
* ``docker/compose.yaml`` up with Compose v2, else v1 (``docker-compose``), alone and with
  ``docker/compose.replicas.yaml``, with a random ``ACP_PROXY_ADMIN_TOKEN``: each proxy's control
  API refuses a request without it; the reference Client goes through each proxy (whose fault
  file loses the first prompt's answer) and is confirmed; Prometheus, which has only the token's
  file to scrape with, reports one fault per proxy through its HTTP API, every target up; the
  stack stops cleanly (every container exits 0) and is removed with its volumes.

The published ports are the compose files' own (127.0.0.1:8000, 8001, 9090, 9092 and 9091).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import ROOT, TIMEOUT

IMAGE = "acp-fault-proxy:dev"
"""The tag docker/compose*.yaml run (their ``image:``), so that ``up`` uses the image built here."""
BUILD_TIMEOUT = 1800.0
"""A build on a slow engine (the sandbox's vfs storage, two CPUs) takes minutes."""
PROJECT = "acp-fault-proxy-test"
"""The compose project of the test (its containers, network and volumes; removed at the end)."""
PROMETHEUS = "http://127.0.0.1:9091"
SCRAPED_WITHIN = 90.0
"""Prometheus scrapes every 5 s: the counter is there within a few scrapes."""

pytestmark = [pytest.mark.docker, pytest.mark.timeout(BUILD_TIMEOUT + 600)]


def _engine() -> str | None:
    """Why no Docker engine can be used here (None: one answers)."""
    if shutil.which("docker") is None:
        return "no docker command"
    try:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "docker info did not answer"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return f"no Docker engine reachable ({said[-1] if said else 'docker info failed'})"
    return None


def _compose() -> list[str] | None:
    """Compose v2 (``docker compose``), else v1 (``docker-compose``); None without either."""
    v2 = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, timeout=TIMEOUT, check=False
    )
    if v2.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    return None


def docker(*arguments: str, timeout: float = TIMEOUT * 4) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *arguments], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built from the repository root as docs/docker.md says."""
    why = _engine()
    if why is not None:
        pytest.skip(f"{why}: ../shared/tools/docker-sandbox.sh up starts one (DOCKER_HOST)")
    done = docker("build", "-f", "docker/Dockerfile", "-t", IMAGE, str(ROOT), timeout=BUILD_TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return IMAGE


def pins() -> dict[str, str]:
    """docker/constraints.txt: normalised name -> version."""
    result = {}
    for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            result[re.sub(r"[-_.]+", "-", name).lower()] = version
    return result


def test_every_package_in_the_image_is_the_pinned_version(image: str) -> None:
    listing = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    done = docker("run", "--rm", "--entrypoint", "python", image, "-c", listing)
    assert done.returncode == 0, done.stderr
    installed = {
        re.sub(r"[-_.]+", "-", name).lower(): version
        for name, version in json.loads(done.stdout).items()
    }
    assert installed.pop("acp-fault-proxy")
    pinned = pins()
    assert {name: pinned.get(name) for name in installed} == installed


CONFINED = [
    *("--read-only", "--tmpfs", "/tmp"),
    *("--cap-drop", "ALL", "--security-opt", "no-new-privileges"),
]
"""As deploy/kubernetes/ runs the image: a read-only root, a memory /tmp, no capability at all."""


def test_the_demo_runs_clean_in_the_image(image: str) -> None:
    """As deploy/kubernetes/ runs it: confined."""
    done = docker("run", "--rm", *CONFINED, image, "demo", timeout=TIMEOUT * 4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every lost answer was retried with its key" in done.stdout


A_PROXY = ["run", "--listen", "ws://0.0.0.0:8000/acp", "--upstream", "ws://agent:7000/acp"]


@pytest.mark.parametrize(
    ("command", "line"),
    [
        (
            ["agent", "--listen", "ws://0.0.0.0:7000/acp", "--store", "/data/sessions"],
            "acp-proxy agent: --store /data/sessions: cannot be written: permission denied",
        ),
        (
            [*A_PROXY, "--trace", "/data/trace.jsonl"],
            "acp-proxy: --trace /data/trace.jsonl: permission denied",
        ),
        (
            [*A_PROXY, "--state", "/data/state.json"],
            "acp-proxy: --state /data/state.json: cannot be written: permission denied",
        ),
    ],
    ids=["agent-store", "run-trace", "run-state"],
)
def test_a_data_volume_the_image_cannot_write_is_one_line(
    image: str, tmp_path: Path, command: list[str], line: str
) -> None:
    """A host folder owned by root mounted as /data (the image runs as uid 10001)."""
    volume = tmp_path / "data"
    (volume / "sessions").mkdir(parents=True)
    volume.chmod(0o755)
    done = docker("run", "--rm", "-v", f"{volume}:/data", image, *command)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", line + "\n")


# -- OpenTelemetry ---------------------------------------------------------------------------

COLLECTOR = """
import http.server, json
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

class Export(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            named = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    said = {a.key: a.value.string_value for a in span.attributes}
                    seen = [named.get("service.name"), span.name, said.get("acp.outcome")]
                    print(json.dumps(seen), flush=True)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *arguments):
        pass

http.server.HTTPServer(("0.0.0.0", 4318), Export).serve_forever()
"""
"""An OTLP/HTTP trace receiver, run by the image's own Python (opentelemetry-proto comes with the
extra): a line ``[service.name, span name, acp.outcome]`` on stdout for each span it receives."""
SERVICE = "acp-proxy-in-docker"
STOPPED_WITHIN = 60
"""``docker stop``'s grace: with no collector, the exporter's retries (OTEL_EXPORTER_OTLP_TIMEOUT,
10 s) hold the last batch's flush that long."""


def client_confirms(url: str) -> None:
    """The reference Client, on this machine, sends a prompt through ``url`` and exits 0 (its
    prompt confirmed)."""
    client = subprocess.run(
        [sys.executable, "-m", "proxy", "client", "-p", "hello", "--connect", url],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 4,
        check=False,
    )
    assert client.returncode == 0, client.stdout + client.stderr


def logged(container: str, text: str, stream: str = "stderr") -> str:
    """The container's log once it holds ``text`` (waiting for it)."""
    deadline = time.monotonic() + TIMEOUT * 2
    while True:
        done = docker("logs", container)
        said = done.stdout if stream == "stdout" else done.stderr
        if text in said:
            return said
        assert time.monotonic() < deadline, (
            f"{container}: no {text!r} in {done.stdout}{done.stderr}"
        )
        time.sleep(0.2)  # docker logs has nothing to wait on: asked again


@pytest.mark.parametrize("collector", [True, False], ids=["collector", "no-collector"])
def test_run_otel_in_the_image_exports_the_spans_and_never_costs_an_answer(
    image: str, collector: bool
) -> None:
    suffix = secrets.token_hex(4)
    network = f"acp-otel-{suffix}"
    receiver, proxy = f"acp-otel-collector-{suffix}", f"acp-otel-proxy-{suffix}"
    # No collector: a port nothing listens on (refused at once, as a collector that is down).
    endpoint = f"http://{receiver}:4318" if collector else "http://127.0.0.1:9"
    try:
        assert docker("network", "create", network).returncode == 0
        if collector:
            run = ["run", "-d", "--name", receiver, "--network", network, *CONFINED]
            started = docker(*run, "--entrypoint", "python", image, "-c", COLLECTOR)
            assert started.returncode == 0, started.stderr
        otel = [f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}", f"OTEL_SERVICE_NAME={SERVICE}"]
        otel.append("OTEL_BSP_SCHEDULE_DELAY=100")
        started = docker(
            *["run", "-d", "--init", "--name", proxy, "--network", network, *CONFINED],
            *["-p", "127.0.0.1::8000", *(word for pair in otel for word in ("-e", pair))],
            *[image, "run", "--otel", "--listen", "ws://0.0.0.0:8000/acp"],
            *["--", "acp-proxy", "agent"],
        )
        assert started.returncode == 0, started.stderr
        logged(proxy, "listening")
        published = docker("port", proxy, "8000/tcp")
        assert published.returncode == 0, published.stderr
        port = published.stdout.split()[0].rpartition(":")[2]

        client_confirms(f"ws://127.0.0.1:{port}/acp")

        # SIGTERM through init: the spans still queued are sent (or given up) before the exit.
        stop = docker("stop", "--time", str(STOPPED_WITHIN), proxy, timeout=STOPPED_WITHIN * 2)
        assert stop.returncode == 0, stop.stderr
        state = docker("inspect", "--format", "{{.State.ExitCode}}", proxy)
        assert state.stdout.strip() == "0", state.stdout + state.stderr
        logs = docker("logs", proxy)
        assert "proxy finished" in logs.stderr
        assert "Traceback" not in logs.stdout + logs.stderr
        if collector:
            received = logged(receiver, '"session/prompt"', "stdout")
            spans = [json.loads(line) for line in received.splitlines()]
            assert [SERVICE, "session/prompt", "answered"] in spans
            assert {span[0] for span in spans} == {SERVICE}
    finally:
        docker("rm", "--force", proxy, receiver)
        docker("network", "rm", network)


# -- the compose stack -----------------------------------------------------------------------


def http(url: str, token: str | None = None) -> tuple[int, Any]:
    """GET ``url``: the status and the JSON body."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


class Stack:
    """Compose files as a project of their own, driven by one Compose command."""

    def __init__(self, compose: list[str], files: tuple[str, ...], token: str) -> None:
        named = [word for name in files for word in ("-f", str(ROOT / "docker" / name))]
        self.compose = [*compose, *named, "-p", PROJECT]
        self.env = {**os.environ, "ACP_PROXY_ADMIN_TOKEN": token}

    def __call__(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.compose, *arguments],
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 10,
            env=self.env,
            check=False,
        )

    def container(self, service: str) -> str:
        done = self("ps", "-q", service)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


# Each file set: its proxies' published ports (the listener, the control API), as the compose
# files publish them.
FILE_SETS = {
    "single": (("compose.yaml",), {"proxy": (8000, 9090)}),
    "replicas": (
        ("compose.yaml", "compose.replicas.yaml"),
        {"proxy": (8000, 9090), "proxy-2": (8001, 9092)},
    ),
}


@pytest.fixture(params=list(FILE_SETS.values()), ids=list(FILE_SETS))
def stack(
    image: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Stack, str, dict[str, Any]]]:
    compose = _compose()
    if compose is None:
        pytest.skip("no Compose: neither docker compose (v2) nor docker-compose (v1)")
    files, proxies = request.param
    token = secrets.token_urlsafe(32)
    stack = Stack(compose, files, token)
    try:
        yield stack, token, proxies
    finally:
        stack("down", "--volumes", "--timeout", "20")


def scraped_faults() -> float | None:
    """The fault counter as Prometheus last scraped it, over every proxy (None before a scrape
    saw a fault)."""
    query = urllib.parse.urlencode({"query": "sum(acp_proxy_faults_injected_total)"})
    status, body = http(f"{PROMETHEUS}/api/v1/query?{query}")
    assert status == 200, body
    results = body["data"]["result"]
    return float(results[0]["value"][1]) if results else None


def test_the_compose_stack_relays_a_client_and_prometheus_counts_the_fault(
    stack: tuple[Stack, str, dict[str, tuple[int, int]]],
) -> None:
    compose, token, proxies = stack
    up = compose("up", "-d")  # returns once the proxies are healthy and Prometheus started
    assert up.returncode == 0, up.stdout + up.stderr

    for listener, admin in proxies.values():
        # The token reached the proxy: the control API refuses a request without it.
        assert http(f"http://127.0.0.1:{admin}/api/rules")[0] == 401
        status, rules = http(f"http://127.0.0.1:{admin}/api/rules", token)
        assert status == 200
        assert [rule["name"] for rule in rules["rules"]]

        # The reference Client through the proxy: the first prompt's answer is lost, retried.
        client_confirms(f"http://127.0.0.1:{listener}/acp")

    # Prometheus scrapes each /metrics with the token (its only way in) and counts the faults.
    deadline = time.monotonic() + SCRAPED_WITHIN
    while (faults := scraped_faults()) is None or faults < len(proxies):
        assert time.monotonic() < deadline, f"Prometheus saw {faults} faults"
        time.sleep(0.5)  # Prometheus' API has nothing to wait on: asked again
    assert faults == len(proxies)  # one lost answer per proxy
    status, targets = http(f"{PROMETHEUS}/api/v1/targets")
    healths = {t["labels"]["instance"]: t["health"] for t in targets["data"]["activeTargets"]}
    assert healths == {f"{name}:9090": "up" for name in proxies}

    # Stopped cleanly: SIGTERM through init, every process exits 0, nothing crashed.
    services = compose("config", "--services").stdout.split()
    containers = {name: compose.container(name) for name in services}
    stop = compose("stop", "--timeout", "20")
    assert stop.returncode == 0, stop.stderr
    for name, container in containers.items():
        state = docker("inspect", "--format", "{{.State.ExitCode}}", container)
        assert state.stdout.strip() == "0", f"{name}: {state.stdout}{state.stderr}"
    logs = compose("logs", "--no-color")
    assert "Traceback" not in logs.stdout
