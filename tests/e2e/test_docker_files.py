"""The deployment files in ``docker/`` say what the proxy can do, statically checked.

No Docker engine is needed: the compose files, the Prometheus configurations and the Dockerfile
are parsed, every ``acp-proxy`` command in them is checked against the real command line
(``python -m proxy SUBCOMMAND --help``), the fault files they mount are validated by
``python -m proxy validate``, and the wiring between services (upstream, admin port, published
ports, Prometheus targets, mounts) is followed from one file to the other.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[2]
DOCKER = ROOT / "docker"
BASE = "compose.yaml"
REPLICAS = "compose.replicas.yaml"
# Each compose file set, with the Prometheus configuration its prometheus service mounts.
FILE_SETS = {"single": (BASE,), "replicas": (BASE, REPLICAS)}
# What the Dockerfile may copy from the build context (the repository root).
COPIED = {"pyproject.toml", "README.md", "proxy/", "config/", "docker/constraints.txt"}
TOKEN = "ACP_PROXY_ADMIN_TOKEN"
EXACT_VERSION = re.compile(r"\d+\.\d+\.\d+")


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / name).read_text())
    assert isinstance(data, dict), name
    return data


def volume(spec: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume ``SOURCE:TARGET[:MODE]``."""
    source, target, *_ = spec.split(":")
    return source, target


def merge(files: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The services of compose files layered as ``docker compose -f A -f B`` layers them (the
    keys these files use: mappings merge, volumes by target, everything else is replaced)."""
    services: dict[str, dict[str, Any]] = {}
    for name in files:
        for service, config in load(name)["services"].items():
            merged = dict(services.get(service, {}))
            for key, value in config.items():
                if key == "volumes" and key in merged:
                    by_target = {volume(v)[1]: v for v in merged[key]}
                    by_target.update({volume(v)[1]: v for v in value})
                    merged[key] = list(by_target.values())
                elif isinstance(value, dict) and isinstance(merged.get(key), dict):
                    merged[key] = {**merged[key], **value}
                else:
                    merged[key] = value
            services[service] = merged
    return services


def is_ours(config: dict[str, Any]) -> bool:
    """A service running the project's image (its command is an acp-proxy subcommand)."""
    return "build" in config or str(config.get("image", "")).startswith("acp-fault-proxy")


def option(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def port_of(address: str) -> int:
    """The port of ``HOST:PORT`` or of a URL."""
    if "://" in address:
        port = urlsplit(address).port
        assert port is not None, address
        return port
    return int(address.rsplit(":", 1)[1])


def published(config: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """Container port -> (host address, host port) of a service's ``ports``."""
    result: dict[int, tuple[str, int]] = {}
    for spec in config.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"{spec}: give the host address (127.0.0.1:HOST:CONTAINER)"
        result[int(parts[2])] = (parts[0], int(parts[1]))
    return result


def proxies(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: config
        for name, config in services.items()
        if is_ours(config) and config["command"][0] == "run"
    }


def prometheus_config(services: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The Prometheus configuration file mounted into the prometheus service."""
    mounts = dict(volume(v)[::-1] for v in services["prometheus"]["volumes"])
    source = mounts["/etc/prometheus/prometheus.yml"]
    path = (DOCKER / source).resolve()
    assert path.is_file(), source
    return load(path.relative_to(DOCKER).as_posix())


@functools.cache
def help_text(subcommand: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", subcommand, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"acp-proxy {subcommand}: {done.stderr}"
    return done.stdout


def test_compose_files_parse_and_every_service_has_an_image_or_a_build() -> None:
    for files in FILE_SETS.values():
        for name, config in merge(files).items():
            assert "image" in config or "build" in config, f"{files}: {name}"
            if "build" in config:
                build = config["build"]
                assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == (
                    DOCKER / "Dockerfile"
                ).resolve(), name
            else:
                image = str(config["image"])
                assert not image.endswith(":latest"), image
                assert EXACT_VERSION.search(image.rpartition(":")[2]), f"{image}: pin a version"
    base = merge((BASE,))
    assert {"agent", "proxy", "prometheus"} <= set(base)


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_every_command_uses_real_subcommands_and_options(files: tuple[str, ...]) -> None:
    checked = 0
    for name, config in merge(files).items():
        if not is_ours(config):
            continue
        command = config["command"]
        assert isinstance(command, list), f"{name}: give the command as a list"
        subcommand, *arguments = command
        assert "--" not in arguments, f"{name}: the agent is reached over the network"
        text = help_text(subcommand)
        for argument in arguments:
            if argument.startswith("--"):
                flag = argument.split("=", 1)[0]
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                    f"{name}: acp-proxy {subcommand} has no {flag}"
                )
                checked += 1
    assert checked


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_each_proxy_relays_to_its_own_agent(files: tuple[str, ...]) -> None:
    services = merge(files)
    agents = {n: c for n, c in services.items() if is_ours(c) and c["command"][0] == "agent"}
    upstreams = []
    for name, config in proxies(services).items():
        upstream = urlsplit(option(config["command"], "--upstream"))
        assert upstream.hostname in agents, f"{name}: no agent service {upstream.hostname}"
        listen = urlsplit(option(agents[upstream.hostname]["command"], "--listen"))
        assert listen.scheme == upstream.scheme, name
        assert (listen.port, listen.path) == (upstream.port, upstream.path), name
        assert listen.hostname == "0.0.0.0", f"{upstream.hostname}: reachable from the network"
        upstreams.append(upstream.hostname)
    # One proxy per agent replica, and no agent without its proxy.
    assert sorted(upstreams) == sorted(agents)


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_mounts_exist_and_named_volumes_are_declared(files: tuple[str, ...]) -> None:
    declared = set().union(*(load(f).get("volumes", {}) for f in files))
    for name, config in merge(files).items():
        for spec in config.get("volumes", []):
            source, _ = volume(spec)
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name}: {source}"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
        if is_ours(config):
            targets = [volume(v)[1] for v in config.get("volumes", [])]
            for flag in ("--trace", "--store", "--state"):
                if flag in config["command"]:
                    path = option(config["command"], flag)
                    assert any(path.startswith(t + "/") for t in targets), (
                        f"{name}: {flag} {path} is not on a volume"
                    )


def test_the_mounted_fault_files_are_in_config_and_validate() -> None:
    files = set()
    for name, config in proxies(merge(FILE_SETS["replicas"])).items():
        mounts = {target: source for source, target in map(volume, config["volumes"])}
        command = config["command"]
        given = [command[i + 1] for i, word in enumerate(command) if word == "--faults"]
        assert given, f"{name}: no --faults"
        for faults in given:
            assert faults in mounts, f"{name}: {faults} is not mounted"
            path = (DOCKER / mounts[faults]).resolve()
            assert path.parent == (ROOT / "config").resolve(), f"{name}: {mounts[faults]}"
            assert path.is_file(), f"{name}: {mounts[faults]}"
            files.add(str(path))
    assert files
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "validate", *sorted(files)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_prometheus_scrapes_every_proxys_admin_port(files: tuple[str, ...]) -> None:
    services = merge(files)
    expected = {
        f"{name}:{port_of(option(config['command'], '--admin'))}"
        for name, config in proxies(services).items()
    }
    config = prometheus_config(services)
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job.get("scrape_interval", config["global"]["scrape_interval"]) == "5s"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == expected
    # A target's name is the Host of each scrape: the proxy must answer to it (--allow-host).
    for name, config in proxies(services).items():
        command = config["command"]
        allowed = [command[n + 1] for n, word in enumerate(command) if word == "--allow-host"]
        assert name in allowed, f"{name}: Prometheus asks for {name}, not in --allow-host"


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_published_ports_bind_loopback_and_match_the_listeners(files: tuple[str, ...]) -> None:
    services = merge(files)
    host_ports = []
    for name, config in services.items():
        for container, (address, host) in published(config).items():
            assert address == "127.0.0.1", f"{name}: {container} published on {address}"
            host_ports.append(host)
    assert len(host_ports) == len(set(host_ports)), f"a host port twice: {host_ports}"
    for name, config in proxies(services).items():
        command = config["command"]
        admin = option(command, "--admin")
        assert admin.startswith("0.0.0.0:"), f"{name}: Prometheus must reach --admin"
        assert "--admin-allow-remote" in command, name
        ports = published(config)
        assert port_of(option(command, "--listen")) in ports, name
        assert port_of(admin) in ports, name
        # The healthcheck asks the admin port's /healthz.
        check = " ".join(config["healthcheck"]["test"])
        assert f"127.0.0.1:{port_of(admin)}/healthz" in check, name
    assert published(services["prometheus"]) == {9090: ("127.0.0.1", 9091)}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_base_is_pinned_user_is_not_root_and_entry_point_is_the_proxy() -> None:
    instructions = dockerfile()
    args = dict(
        a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a
    )  # global ARGs with a default
    stages: list[str] = []
    for instruction, arguments in instructions:
        if instruction != "FROM":
            continue
        words = arguments.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
        if image not in stages:
            tag = image.partition("@")[0].rpartition("/")[2].partition(":")[2]
            assert tag, f"{image}: pin the base image"
            assert "latest" not in tag, image
            assert EXACT_VERSION.match(tag), f"{image}: pin a full version (X.Y.Z)"
        if len(words) == 3 and words[1].upper() == "AS":
            stages.append(words[2])
    assert len(stages) >= 2, "multi-stage: build, then runtime"
    # The last stage is the image: its last USER is not root.
    last = max(i for i, (instruction, _) in enumerate(instructions) if instruction == "FROM")
    users = [a for i, a in instructions[last:] if i == "USER"]
    assert users, "the runtime stage sets a USER"
    assert users[-1].split(":")[0] not in {"root", "0"}
    final = dict(instructions[last:])  # the last of each instruction
    assert json.loads(final["ENTRYPOINT"]) == ["acp-proxy"]
    assert json.loads(final["CMD"]) == ["--help"]


def test_dockerfile_copies_only_the_project_files_and_no_test_dependencies() -> None:
    copied = set()
    for instruction, arguments in dockerfile():
        assert instruction != "ADD", "COPY, not ADD"
        if instruction == "COPY" and not arguments.startswith("--from"):
            *sources, _ = arguments.split()
            copied.update(sources)
        if instruction == "RUN":
            assert "[test]" not in arguments
            assert not re.search(r"\b(pytest|mypy|ruff)\b", arguments), arguments
    assert copied <= COPIED, copied - COPIED
    for source in copied:
        assert (ROOT / source).exists(), source


def test_the_compose_files_suit_compose_v1_and_v2() -> None:
    """No top-level ``name:`` (Compose v1 refuses it): docker/.env names the project, for both."""
    for name in (BASE, REPLICAS):
        assert "name" not in load(name), f"{name}: a top-level name: is refused by Compose v1"
    settings = dict(
        line.split("=", 1)
        for line in (DOCKER / ".env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert settings == {"COMPOSE_PROJECT_NAME": "acp-fault-proxy"}


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_the_admin_token_reaches_every_proxy_and_prometheus(files: tuple[str, ...]) -> None:
    """The token is required (compose stops without it), passed into each proxy, and handed to
    Prometheus as the file its scrape configuration reads."""
    services = merge(files)
    required = re.compile(rf"^\$\{{{TOKEN}:\?[^}}]+\}}$")
    for name, config in proxies(services).items():
        assert required.match(config["environment"][TOKEN]), f"{name}: {TOKEN} not required"
    prometheus = services["prometheus"]
    assert required.match(prometheus["environment"][TOKEN])
    (job,) = prometheus_config(services)["scrape_configs"]
    token_file = job["authorization"]["credentials_file"]
    assert job["authorization"]["type"] == "Bearer"
    entrypoint = " ".join(prometheus["entrypoint"])
    assert f"printf '%s' \"$${TOKEN}\" > {token_file}" in entrypoint
    assert "exec /bin/prometheus" in entrypoint
    assert str(Path(token_file).parent) in prometheus["tmpfs"]


def pinned() -> dict[str, str]:
    """docker/constraints.txt: each package's normalised name and its exact version."""
    pins: dict[str, str] = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, separator, version = line.partition("==")
            assert separator, f"{line}: pin an exact version"
            assert str(Version(version)) == version, f"{line}: pin an exact version"
            pins[canonicalize_name(name)] = version
    return pins


def test_the_constraints_pin_every_dependency_and_the_build_uses_them() -> None:
    """Every dependency of the project (and the build backend) has an exact version, one the
    project accepts; the Dockerfile copies the file and points pip at it."""
    pins = pinned()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = [Requirement(r) for r in project["project"]["dependencies"]]
    requirements += [Requirement(r) for r in project["build-system"]["requires"]]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement}: not pinned"
        assert requirement.specifier.contains(pins[name]), f"{requirement}: {pins[name]}"
    instructions = dockerfile()
    assert ("COPY", "docker/constraints.txt ./") in instructions
    env = " ".join(arguments for instruction, arguments in instructions if instruction == "ENV")
    assert "PIP_CONSTRAINT=/src/constraints.txt" in env
