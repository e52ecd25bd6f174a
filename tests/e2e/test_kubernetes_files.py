"""The Kubernetes manifests in ``deploy/kubernetes/``, validated and followed, without a cluster.

Every object is validated against the Kubernetes OpenAPI schemas of the oldest and the newest
versions checked here (the schemas ``kubernetes-validate`` ships: offline, strict, so an unknown
field fails); the ServiceMonitor, a custom resource whose schema no package here ships, is checked
for the fields the Prometheus Operator requires and for those it is given. Then the wiring is
followed from one object to the other: every ``acp-proxy`` argument is a real option of its
command, the fault file in each ConfigMap loads (as ``acp-proxy validate`` loads it), has the
rules of the file of ``config/`` it copies, and is mounted as a directory (never ``subPath``: the
kubelet does not update such a file) where ``--faults`` reads it with ``--watch``; the admin token comes from a Secret mounted as the ``--admin-token-file``, the
one the ServiceMonitor sends; probes ask ``/healthz`` on the admin port, which Prometheus'
annotations and the Services name; every container has resources and runs as a non-root user
that cannot gain privileges. The sidecar layout keeps its Agent on loopback; the shared proxy
reaches the Agents' Service through an Ingress that pins a session to its replica by cookie.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from command_options import option_flags
from harness import ROOT

from proxy.shell.fault_files import load_fault_files

DEPLOY = ROOT / "deploy" / "kubernetes"
LAYOUTS = ("sidecar", "proxy-deployment")
VERSIONS = ("1.29", "1.37")
"""The oldest and the newest Kubernetes versions the manifests are validated against."""
TOKEN_FILE = "--admin-token-file"
NON_ROOT = 10001  # the image's user (docker/Dockerfile)

Object = dict[str, Any]


def objects(layout: str) -> list[Object]:
    """The objects of a layout's kustomization, in its order."""
    kustomization = yaml.safe_load((DEPLOY / layout / "kustomization.yaml").read_text())
    found: list[Object] = []
    for name in kustomization["resources"]:
        found.extend(doc for doc in yaml.safe_load_all((DEPLOY / layout / name).read_text()) if doc)
    return found


def named(layout: str, kind: str) -> dict[str, Object]:
    return {o["metadata"]["name"]: o for o in objects(layout) if o["kind"] == kind}


def proxy_containers(layout: str) -> list[tuple[Object, Object]]:
    """(the Deployment, its container) of each container that runs ``acp-proxy run``."""
    return [
        (deployment, container)
        for deployment in named(layout, "Deployment").values()
        for container in deployment["spec"]["template"]["spec"]["containers"]
        if container["args"][0] == "run"
    ]


def option(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def options(args: list[str], flag: str) -> list[str]:
    return [args[n + 1] for n, word in enumerate(args) if word == flag]


def test_each_kustomization_lists_every_manifest_of_its_folder() -> None:
    for layout in LAYOUTS:
        kustomization = yaml.safe_load((DEPLOY / layout / "kustomization.yaml").read_text())
        assert kustomization["kind"] == "Kustomization"
        files = {p.name for p in (DEPLOY / layout).glob("*.yaml")} - {"kustomization.yaml"}
        assert sorted(kustomization["resources"]) == sorted(files)
    assert sorted(p.name for p in DEPLOY.iterdir() if p.is_dir()) == sorted(LAYOUTS)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_object_validates_against_the_kubernetes_schemas(layout: str, version: str) -> None:
    checked = 0
    for manifest in objects(layout):
        if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a custom resource: below
        kubernetes_validate.validate(manifest, version, strict=True)
        checked += 1
    assert checked >= 3


def test_the_schema_check_refuses_a_misspelt_field() -> None:
    """Strict: a field the schema does not know fails (so the check above checks)."""
    (deployment, container) = proxy_containers("sidecar")[0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


# The fields of monitoring.coreos.com/v1 ServiceMonitor the Prometheus Operator requires
# (spec.selector; each endpoint's port or targetPort), and the types of those used here.
SERVICE_MONITOR_ENDPOINT = {
    "port": str,
    "path": str,
    "interval": str,
    "authorization": dict,
}


def test_each_service_monitor_selects_the_proxys_service_and_sends_the_token() -> None:
    for layout in LAYOUTS:
        (monitor,) = named(layout, "ServiceMonitor").values()
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
        assert set(monitor["spec"]) == {"selector", "endpoints"}
        labels = monitor["spec"]["selector"]["matchLabels"]
        services = [
            s
            for s in named(layout, "Service").values()
            if labels.items() <= s["metadata"]["labels"].items()
        ]
        (service,) = services
        ports = {p["name"] for p in service["spec"]["ports"]}
        ((deployment, container),) = proxy_containers(layout)
        secret = secret_of_token_file(deployment, container)
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) <= set(SERVICE_MONITOR_ENDPOINT), endpoint
            for field, kind in SERVICE_MONITOR_ENDPOINT.items():
                assert isinstance(endpoint[field], kind), field
            assert endpoint["port"] in ports
            assert endpoint["path"] == "/metrics"
            assert endpoint["authorization"] == {"type": "Bearer", "credentials": secret}


# -- the proxy's container -----------------------------------------------------------------------


def volume_at(deployment: Object, container: Object, path: str) -> tuple[Object, Object]:
    """(the pod's volume, the container's mount) of the mount that holds ``path``."""
    for mount in container["volumeMounts"]:
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            (volume,) = (
                v
                for v in deployment["spec"]["template"]["spec"]["volumes"]
                if v["name"] == mount["name"]
            )
            return volume, mount
    raise AssertionError(f"{container['name']}: {path} is on no volume")


def secret_of_token_file(deployment: Object, container: Object) -> dict[str, str]:
    """{"name", "key"} of the Secret the ``--admin-token-file`` is."""
    path = option(container["args"], TOKEN_FILE)
    volume, mount = volume_at(deployment, container, path)
    assert mount.get("readOnly") is True
    secret = volume["secret"]
    (item,) = (i for i in secret["items"] if f"{mount['mountPath']}/{i['path']}" == path)
    return {"name": secret["secretName"], "key": item["key"]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_argument_is_a_real_option(layout: str) -> None:
    for deployment in named(layout, "Deployment").values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            command, *args = container["args"]
            flags = option_flags(command)
            n = 0
            while n < len(args):
                assert args[n] in flags, (
                    f"{container['name']}: acp-proxy {command} has no {args[n]}"
                )
                n += 2 if flags[args[n]] else 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_fault_file_comes_from_a_configmap_the_proxy_watches(
    layout: str, tmp_path: Path
) -> None:
    ((deployment, container),) = proxy_containers(layout)
    args = container["args"]
    assert "--watch" in args
    faults = option(args, "--faults")
    volume, mount = volume_at(deployment, container, faults)
    assert "subPath" not in mount, "a subPath file is never updated by the kubelet"
    assert mount.get("readOnly") is True
    configmap = named(layout, "ConfigMap")[volume["configMap"]["name"]]
    key = faults.removeprefix(mount["mountPath"].rstrip("/") + "/")
    assert key in configmap["data"]
    written = tmp_path / key
    written.write_text(configmap["data"][key])
    loaded = load_fault_files([written])  # FaultFileError, every error located, if invalid
    # It is a copy of the file of config/ its first line names, and has the same rules.
    origin = re.match(r"# (config/[\w.-]+\.yaml):", configmap["data"][key])
    assert origin, "say which file of config/ it copies"
    assert loaded.rules == load_fault_files([ROOT / origin.group(1)]).rules


@pytest.mark.parametrize("layout", LAYOUTS)
def test_probes_metrics_and_services_name_the_admin_port(layout: str) -> None:
    ((deployment, container),) = proxy_containers(layout)
    args = container["args"]
    admin = option(args, "--admin")
    assert admin.startswith("0.0.0.0:"), "the kubelet and Prometheus come from outside the pod"
    assert "--admin-allow-remote" in args
    assert TOKEN_FILE in args
    port = int(admin.rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["admin"] == port
    assert ports["acp"] == urlsplit(option(args, "--listen")).port
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "admin"}, probe
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (service,) = (
        s
        for s in named(layout, "Service").values()
        if s["spec"]["selector"].items() <= labels.items()
    )
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"acp", "admin"}
    # Clients name the Service: the proxy answers to its names (the namespace from the pod).
    name = service["metadata"]["name"]
    assert options(args, "--allow-host") == [
        name,
        f"{name}.$(POD_NAMESPACE)",
        f"{name}.$(POD_NAMESPACE).svc",
        f"{name}.$(POD_NAMESPACE).svc.cluster.local",
    ]
    (env,) = container["env"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_container_has_resources_and_runs_unprivileged(layout: str) -> None:
    for deployment in named(layout, "Deployment").values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == NON_ROOT
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            resources = container["resources"]
            assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            # The only places it writes: volumes (the trace, the store, temporary files).
            targets = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
            assert "/tmp" in targets
            assert "/data" in targets


def test_the_sidecar_keeps_its_agent_on_loopback() -> None:
    ((deployment, proxy),) = proxy_containers("sidecar")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (agent,) = (c for c in containers if c["args"][0] == "agent")
    listen = urlsplit(option(agent["args"], "--listen"))
    upstream = urlsplit(option(proxy["args"], "--upstream"))
    assert listen.hostname == upstream.hostname == "127.0.0.1"
    assert (listen.scheme, listen.port, listen.path) == (
        upstream.scheme,
        upstream.port,
        upstream.path,
    )
    assert "ports" not in agent  # nothing outside the pod reaches it
    assert "exec" in agent["readinessProbe"]  # the kubelet cannot reach a loopback port
    assert deployment["spec"]["replicas"] == 1


def test_the_shared_proxy_reaches_the_agents_through_a_cookie_affinity() -> None:
    ((deployment, proxy),) = proxy_containers("proxy-deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (ingress,) = named("proxy-deployment", "Ingress").values()
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/affinity"] == "cookie"
    assert annotations["nginx.ingress.kubernetes.io/session-cookie-name"]
    ((path,),) = [rule["http"]["paths"] for rule in ingress["spec"]["rules"]]
    backend = path["backend"]["service"]
    agents = named("proxy-deployment", "Service")[backend["name"]]
    (port,) = (p for p in agents["spec"]["ports"] if p["name"] == backend["port"]["name"])
    upstream = urlsplit(option(proxy["args"], "--upstream"))
    assert upstream.scheme == "http"  # every request carries the cookie
    assert upstream.hostname == "ingress-nginx-controller.ingress-nginx.svc.cluster.local"
    assert upstream.path == path["path"]
    agent_deployments = [
        d
        for d in named("proxy-deployment", "Deployment").values()
        if agents["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    (agents_deployment,) = agent_deployments
    assert agents_deployment["spec"]["replicas"] > 1
    (agent,) = agents_deployment["spec"]["template"]["spec"]["containers"]
    listen = urlsplit(option(agent["args"], "--listen"))
    assert listen.hostname == "0.0.0.0"
    assert listen.path == upstream.path
    assert {c["name"]: c["containerPort"] for c in agent["ports"]}[
        port["targetPort"]
    ] == listen.port
