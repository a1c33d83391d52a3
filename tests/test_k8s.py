"""deploy/k8s and the Dockerfile against the Kubernetes schemas, checkov's policies and the
code they run (`make k8s-check`; `make test` runs it too).

Every overlay is rendered with `kubectl kustomize`; every object is validated strictly
(kubernetes-validate for the Kubernetes API, deploy/k8s/schemas for KEDA's resources);
checkov's Kubernetes policies run over the rendered objects; and what keeps manifests and
code from drifting is asserted: every node the code defines is hosted by a production
Deployment, probes and KEDA triggers name what the services really serve and consume, the
ingress is set up for SSE, images are pinned, every entrypoint exists.

Missing tools fail, never skip: `make k8s-check` installs them (kubectl from Debian's
kubernetes-client when absent; checkov in .venv-tools).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from shared import subjects
from tests.servers import NATS_USERS
from tests.variables import every_variable, service_nodes as code_nodes, variables

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "production")
KUBERNETES_VERSION = "1.32.0"  # the kubectl this repo is checked with; the oldest supported target
CHECKOV = REPO / ".venv-tools" / "bin" / "checkov"
SERVICES = ("router", "retriever", "enricher", "responder")
OPS_PATHS = {"/healthz", "/readyz"}
# checkov policies the manifests do not follow, each with its reason in the skip
# annotation (deploy/k8s/base/checkov-skips.yaml). A new skip is a decision: add it here.
ALLOWED_SKIPS = {"CKV_K8S_35", "CKV_K8S_43"}
SSE_ANNOTATIONS = {
    "nginx.ingress.kubernetes.io/proxy-buffering": "off",
    "nginx.ingress.kubernetes.io/proxy-request-buffering": "off",
}
TIMEOUT_ANNOTATIONS = ("nginx.ingress.kubernetes.io/proxy-read-timeout", "nginx.ingress.kubernetes.io/proxy-send-timeout")


@lru_cache(maxsize=None)
def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl not found: `make k8s-check` installs Debian's kubernetes-client"
    version = json.loads(subprocess.run([found, "version", "--client", "-o", "json"], capture_output=True,
                                        text=True, timeout=30).stdout or "{}")
    kustomize = re.match(r"v(\d+)", version.get("kustomizeVersion", ""))
    assert kustomize and int(kustomize.group(1)) >= 5, (
        f"{found}: kustomize {version.get('kustomizeVersion')!r} is too old for deploy/k8s (components, labels): "
        "kubectl 1.27 or newer is needed")
    return found


@lru_cache(maxsize=None)
def render(overlay: str) -> tuple[dict, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],  # the default load restrictor, as `apply -k`
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, f"kubectl kustomize {overlay}: {out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def objects(overlay: str, kind: str) -> list[dict]:
    return [o for o in render(overlay) if o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> dict:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {kind}/{name}: {len(found)} objects"
    return found[0]


def configmap(overlay: str, prefix: str) -> dict:
    """A generated ConfigMap by its name before the hash suffix."""
    found = [o for o in objects(overlay, "ConfigMap") if re.fullmatch(rf"{prefix}(-[a-z0-9]{{10}})?", o["metadata"]["name"])]
    assert len(found) == 1, f"{overlay}: ConfigMap {prefix}: {len(found)}"
    return found[0]


def workloads(overlay: str) -> list[dict]:
    return [o for o in render(overlay) if o["kind"] in ("Deployment", "StatefulSet", "Job")]


def containers(obj: dict) -> list[dict]:
    spec = obj["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def concierge_env(overlay: str) -> dict[str, str]:
    return configmap(overlay, "concierge-env")["data"]


def service_of(container: dict) -> str | None:
    """`python -m services.<name>` → name."""
    command = container.get("command", []) + container.get("args", [])
    if command[:2] == ["python", "-m"] and command[2].startswith("services."):
        return command[2].split(".", 1)[1]
    return None


def hosted_nodes(deployment: dict) -> set[str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    service = service_of(container)
    selected = (env_of(container).get("NODES") or "").strip()
    if service == "gateway" or service is None:
        return set()
    return set(selected.split(",")) if selected else set(code_nodes()[service])


def port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


# --- the objects are valid --------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_against_its_schema(overlay):
    schemas = {p.name.split("-", 1)[0]: json.loads(p.read_text()) for p in (K8S / "schemas").glob("*.json")}
    errors = []
    for obj in render(overlay):
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].startswith("keda.sh/"):
            schema = schemas.get(obj["kind"].lower())
            assert schema, f"{name}: no schema in deploy/k8s/schemas"
            errors += [f"{name}: {e.json_path}: {e.message}" for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{name}: no schema for {obj['apiVersion']} {obj['kind']}: vendor one in deploy/k8s/schemas")
    assert not errors, "\n".join(errors)


def test_checkov_kubernetes_policies_pass(tmp_path):
    assert CHECKOV.exists(), f"{CHECKOV} missing: run `make k8s-check` (it installs checkov in .venv-tools)"
    files = []
    for overlay in OVERLAYS:
        path = tmp_path / f"{overlay}.yaml"
        path.write_text(yaml.safe_dump_all(render(overlay), sort_keys=False))
        files += ["-f", str(path)]
    out = subprocess.run([str(CHECKOV), *files, "--framework", "kubernetes", "--skip-download",
                          "--output", "json"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    assert out.stdout.strip(), f"checkov printed nothing: {out.stderr[-2000:]}"
    report = json.loads(out.stdout)
    results = report["results"] if isinstance(report, dict) else report[0]["results"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results["failed_checks"]]
    assert not failed, "\n".join(failed)
    skipped = {c["check_id"] for c in results["skipped_checks"]}
    assert skipped <= ALLOWED_SKIPS, f"new checkov skips {skipped - ALLOWED_SKIPS}: justify them in ALLOWED_SKIPS"
    assert all(c["check_result"].get("suppress_comment") for c in results["skipped_checks"]), "every skip needs a reason"
    assert report["summary"]["passed"] > 0 and report["summary"]["resource_count"] > 0, "checkov checked nothing"


# --- manifests and code agree -----------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_node_the_code_defines_is_hosted(overlay):
    hosted: dict[str, list[str]] = {}
    for deployment in objects(overlay, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        service = service_of(container)
        nodes = hosted_nodes(deployment)
        unknown = nodes - set(code_nodes().get(service, ()))
        assert not unknown, f"{deployment['metadata']['name']}: NODES names {unknown}, not nodes of {service}"
        for node in nodes:
            hosted.setdefault(node, []).append(deployment["metadata"]["name"])
    every = {n for nodes in code_nodes().values() for n in nodes}
    assert every - set(hosted) == set(), f"nodes no Deployment hosts: {every - set(hosted)}"
    twice = {n: d for n, d in hosted.items() if len(d) > 1}
    assert not twice, f"nodes hosted by two Deployments (their KEDA triggers would fight): {twice}"


def test_production_runs_answer_writer_on_its_own():
    split = [d for d in objects("production", "Deployment") if hosted_nodes(d) == {"answer_writer"}]
    assert [d["metadata"]["name"] for d in split] == ["responder-answer-writer"]
    selectors = [tuple(sorted(d["spec"]["selector"]["matchLabels"].items())) for d in objects("production", "Deployment")]
    assert len(selectors) == len(set(selectors)), "two Deployments select the same pods"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_target_the_paths_and_ports_the_processes_serve(overlay):
    port = int(concierge_env(overlay)["OPS_PORT"])  # every process's, the gateway's too
    for deployment in objects(overlay, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        name = deployment["metadata"]["name"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] in OPS_PATHS and port_number(container, get["port"]) == port, f"{name} {probe}: {get}"
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/path"] == "/metrics" and int(annotations["prometheus.io/port"]) == port, name


def test_the_gateway_serves_the_paths_its_probes_ask_for():
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings
    from tests.helpers import gateway_paths

    paths = gateway_paths(create_app(GatewaySettings()))
    assert OPS_PATHS <= paths


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_replay_worker_runs_every_node_on_production_prompts_as_its_own_nats_user(overlay):
    """`concierge replay serve` (the operator UI's reruns): one replica, not autoscaled, as
    the `replay` NATS user, with every prompt ConfigMap (a rerun must send the prompts
    production sends) and the knowledge base's directory (a fork's retrieval)."""
    replay = one(overlay, "Deployment", "replay")
    (container,) = replay["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["concierge", "replay", "serve"] and replay["spec"]["replicas"] == 1
    assert env_of(container)["NATS_USER"] == "replay"
    password = next(e for e in container["env"] if e["name"] == "NATS_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert password == {"name": "concierge-nats", "key": "replay"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    prompts = {f"/app/{d.relative_to(REPO)}" for d in [REPO / "shared" / "prompts", *(REPO / "services").glob("*/prompts")]}
    assert prompts <= mounts and concierge_env(overlay)["KB_DIR"] in mounts
    labels = replay["spec"]["template"]["metadata"]["labels"]
    assert labels["concierge.dev/bus-client"] == "true" and labels["concierge.dev/egress"] == "external"
    scaled = {o["spec"]["scaleTargetRef"]["name"] for o in render(overlay) if o["kind"] in ("ScaledObject",
                                                                                            "HorizontalPodAutoscaler")}
    assert "replay" not in scaled and not [o for o in objects(overlay, "PodDisruptionBudget")
                                           if o["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component")
                                           == "replay"]


@pytest.mark.parametrize("overlay", ["production"])
def test_keda_triggers_name_real_streams_and_durable_consumers(overlay):
    namespace = one(overlay, "Namespace", "concierge")["metadata"]["name"]
    monitor = one(overlay, "Service", "nats-headless")
    assert 8222 in [p["port"] for p in monitor["spec"]["ports"]]
    scaled = objects(overlay, "ScaledObject")
    targets = sorted(s["spec"]["scaleTargetRef"]["name"] for s in scaled)
    consumers = sorted(d["metadata"]["name"] for d in objects(overlay, "Deployment") if hosted_nodes(d))
    assert targets == consumers, "one ScaledObject per consumer Deployment"
    for obj in scaled:
        target = one(overlay, "Deployment", obj["spec"]["scaleTargetRef"]["name"])
        assert obj["spec"]["scaleTargetRef"]["kind"] == "Deployment"
        (container,) = target["spec"]["template"]["spec"]["containers"]
        # A partitioned node (RETRIEVER_PARTITIONS: one replica at a time per partition's
        # durable) scales on CPU: its lag is not shared out by more replicas.
        partitioned = {"retrieval"} if int(env_of(container).get("RETRIEVER_PARTITIONS") or 0) > 0 else set()
        by_cpu = [t for t in obj["spec"]["triggers"] if t["type"] == "cpu"]
        assert {t["name"] for t in by_cpu} == partitioned, obj["metadata"]["name"]
        assert all(t["metricType"] == "Utilization" and container["resources"]["requests"]["cpu"] for t in by_cpu)
        triggers = [t for t in obj["spec"]["triggers"] if t["type"] != "cpu"]
        assert {t["type"] for t in triggers} == {"nats-jetstream"}
        # The knowledge sources' pages wait on the BRIEFS work queue: its fetcher scales the
        # retriever on that queue's lag, beside the turn's node on CONV.
        from services.retriever.sources import fetcher

        work_queue = {fetcher.NAME}
        for t in triggers:
            expected = subjects.BRIEFS_STREAM if t["metadata"]["consumer"] in work_queue else subjects.CONV_STREAM
            assert t["metadata"]["stream"] == expected
            assert t["metadata"]["account"] == "$G"  # users in the global account (deploy/nats-server.conf)
            assert t["metadata"]["natsServerMonitoringEndpoint"] == f"nats-headless.{namespace}.svc.cluster.local:8222"
        assert ({t["metadata"]["consumer"] for t in triggers} - work_queue | partitioned
                == hosted_nodes(target)), obj["metadata"]["name"]
    hpa = one(overlay, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert hpa["spec"]["scaleTargetRef"]["name"] not in targets


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_the_manifests_set_is_one_the_code_reads(overlay):
    """Names from what the settings Structs' `from_env`s read (tests/variables.py), so a
    renamed or misspelt variable in a manifest fails here instead of being ignored in a pod."""
    unknown = set(concierge_env(overlay)) - every_variable()
    assert not unknown, f"concierge-env sets variables no process reads: {unknown}"
    errors = []
    for obj in workloads(overlay):
        for container in containers(obj):
            command = container.get("command", []) + container.get("args", [])
            process = service_of(container) or (command[1] if command[:1] == ["concierge"] else None)
            if process is None:
                continue  # NATS, Redis, Qdrant: their own variables
            read = variables().get(process, every_variable())
            referenced = " ".join(e.get("value") or "" for e in container.get("env", []))
            for name in (e["name"] for e in container.get("env", [])):
                if name not in read and f"$({name})" not in referenced:  # $(NAME): composes another one
                    errors.append(f"{obj['metadata']['name']}/{container['name']}: {name}")
    assert not errors, "variables set that the process does not read:\n" + "\n".join(errors)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingress_reaches_only_the_gateway_and_is_set_for_sse(overlay):
    (ingress,) = objects(overlay, "Ingress")
    annotations = ingress["metadata"]["annotations"]
    for key, value in SSE_ANNOTATIONS.items():
        assert annotations.get(key) == value, key
    deadline = float(concierge_env(overlay)["TURN_DEADLINE_S"])
    for key in TIMEOUT_ANNOTATIONS:
        assert float(annotations[key]) > deadline + 10, f"{key} must outlast a turn and its guard"
    backends = {p["backend"]["service"]["name"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    assert backends == {"gateway"}
    gateway_port = int(concierge_env(overlay)["GATEWAY_PORT"])
    assert {p["backend"]["service"]["port"]["name"] for rule in ingress["spec"]["rules"]
            for p in rule["http"]["paths"]} == {"http"}
    service = one(overlay, "Service", "gateway")
    assert [p["port"] for p in service["spec"]["ports"]] == [gateway_port], "the gateway's Service: its HTTP port only"
    assert all(tls.get("secretName") for tls in ingress["spec"]["tls"])
    assert concierge_env(overlay)["TRUSTED_PROXY_HOPS"] == "1"


# What the ingress may publish: what visitors and operators use. /healthz, /readyz, /metrics,
# /docs and /openapi.json stay inside the cluster.
PUBLISHED = {("/v1/", "Prefix"), ("/widget.js", "Exact"), ("/", "Exact"), ("/admin", "Exact"), ("/admin/", "Prefix")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingress_publishes_only_the_visitor_and_operator_paths(overlay):
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings
    from tests.helpers import gateway_paths

    (ingress,) = objects(overlay, "Ingress")
    published = {(p["path"], p["pathType"]) for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    assert published <= PUBLISHED, f"published outside the visitor and operator paths: {published - PUBLISHED}"
    routes = gateway_paths(create_app(GatewaySettings(ops_port=0)))
    for path, kind in published:
        served = [r for r in routes if (r.startswith(path) if kind == "Prefix" else r == path)]
        assert served, f"the ingress publishes {path} ({kind}), which the gateway does not serve"
    private = {"/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"}
    assert not [p for p in private for path, kind in published
                if (p.startswith(path) if kind == "Prefix" else p == path)]


def test_manifest_copies_match_their_sources():
    """deploy/k8s/copies.py: each file a kustomization makes a ConfigMap from is a copy under
    its from-repo/ (the default load restrictor reads nothing outside it), kept identical."""
    spec = importlib.util.spec_from_file_location("k8s_copies", K8S / "copies.py")
    copies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copies)
    assert len(copies.copies()) >= 2 + len(list((REPO / "sites").glob("*.toml")))
    assert not copies.stale(), f"copies that differ from their sources (run `make k8s-copies`): {copies.stale()}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned(overlay):
    for obj in workloads(overlay):
        for container in containers(obj):
            image = container["image"]
            tag = image.rsplit("/", 1)[-1].partition(":")[2]
            assert "@sha256:" in image or (tag and tag != "latest"), f"{obj['metadata']['name']}: {image}"
    dockerfile = (REPO / "Dockerfile").read_text()
    for base in re.findall(r"^ARG PYTHON_IMAGE=(\S+)", dockerfile, re.M):
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_locked_down_and_stop_after_draining(overlay):
    drain = float(concierge_env(overlay)["CONSUMER_DRAIN_TIMEOUT_S"])
    deadline = float(concierge_env(overlay)["TURN_DEADLINE_S"])
    for obj in workloads(overlay):
        pod = obj["spec"]["template"]["spec"]
        name = obj["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False, name
        for container in containers(obj):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"], name
            assert context["capabilities"]["drop"] == ["ALL"], name
        if obj["kind"] != "Deployment":
            continue
        (container,) = pod["containers"]
        pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        needed = pre_stop + (deadline if service_of(container) == "gateway" else drain)
        assert pod["terminationGracePeriodSeconds"] > needed, f"{name}: grace must outlast preStop + drain"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, name
        if service_of(container) == "retriever":
            assert concierge_env(overlay)["KB_DIR"] in mounts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmaps_hold_every_site_and_prompt_file(overlay):
    sites = configmap(overlay, "concierge-sites")["data"]
    assert set(sites) == {p.name for p in (REPO / "sites").glob("*.toml")}
    for directory in [REPO / "shared" / "prompts", *sorted((REPO / "services").glob("*/prompts"))]:
        owner = directory.parent.name
        data = configmap(overlay, f"concierge-prompts-{owner}")["data"]
        assert set(data) == {p.name for p in directory.glob("*.md")}, directory
        for name, text in data.items():
            assert text == (directory / name).read_text(encoding="utf-8")
    router = one(overlay, "Deployment", "router")["spec"]["template"]["spec"]["containers"][0]
    assert concierge_env(overlay)["SITES_DIR"] in {m["mountPath"] for m in router["volumeMounts"]}
    for deployment in objects(overlay, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for mount in container.get("volumeMounts", []):
            if "/prompts" in mount["mountPath"]:
                assert (REPO / Path(mount["mountPath"]).relative_to("/app")).is_dir(), mount["mountPath"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_config_is_valid_and_matches_the_replicas(overlay, tmp_path):
    from cli.harness.supervisor import nats_server_binary

    data = configmap(overlay, "nats-config")["data"]
    assert data["nats-server.conf"] == (REPO / "deploy" / "nats-server.conf").read_text()
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "POD_NAME": "nats-0"}
    env.update({f"NATS_{user.upper()}_PASSWORD": "x" for user in NATS_USERS})
    out = subprocess.run([nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")], capture_output=True,
                         text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    replicas = one(overlay, "StatefulSet", "nats")["spec"]["replicas"]
    routes = re.findall(r"nats://(nats-\d+)\.nats-headless:6222", data["cluster.conf"])
    assert routes == ([f"nats-{i}" for i in range(replicas)] if replicas > 1 else [])
    assert int(concierge_env(overlay)["NATS_REPLICAS"]) <= replicas
    servers = concierge_env(overlay)["NATS_URL"].split(",")
    assert len(servers) == (replicas if replicas > 1 else 1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_referenced_by_name_and_documented(overlay):
    assert not objects(overlay, "Secret"), "Secrets are made by the operator, never rendered from the repo"
    guide = (REPO / "docs" / "deploy.md").read_text()
    text = yaml.safe_dump_all(render(overlay))
    names = set(re.findall(r"secretKeyRef:\n\s+key: \S+\n\s+name: (\S+)", text))
    names |= set(re.findall(r"secretRef:\n\s+name: (\S+)", text))
    names |= {tls["secretName"] for ingress in objects(overlay, "Ingress") for tls in ingress["spec"]["tls"]}
    assert {"concierge-gateway", "concierge-nats", "concierge-tls"} <= names
    undocumented = {n for n in names if f"`{n}`" not in guide}
    assert not undocumented, f"Secrets docs/deploy.md does not list: {undocumented}"


# --- the image ---------------------------------------------------------------------------

def commands() -> set[tuple[str, ...]]:
    found = set()
    for overlay in OVERLAYS:
        for obj in workloads(overlay):
            for container in containers(obj):
                if container["image"].rsplit("/", 1)[-1].startswith("concierge:"):
                    found.add(tuple(container.get("command", []) + container.get("args", [])))
    for line in re.findall(r"^(?:CMD|ENTRYPOINT) (\[.*\])", (REPO / "Dockerfile").read_text(), re.M):
        found.add(tuple(json.loads(line)))
    return found


def test_every_entrypoint_the_image_and_manifests_name_exists():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    seen = commands()
    assert ("python", "-m", "services.gateway") in seen and any(c[0] == "concierge" for c in seen)
    for command in sorted(seen):
        if command[:2] == ("python", "-m"):
            module = command[2]
            assert importlib.util.find_spec(f"{module}.__main__") or importlib.util.find_spec(module), command
        elif command[0] == "concierge":
            module, _, function = scripts["concierge"].partition(":")
            assert callable(getattr(importlib.import_module(module), function))
            out = subprocess.run([sys.executable, "-m", "cli", command[1], "--help"], capture_output=True, text=True,
                                 cwd=REPO, timeout=60)
            assert out.returncode == 0, f"{command}: {out.stderr}"
        else:
            pytest.fail(f"unknown entrypoint {command}")
    for path in re.findall(r"^RUN python (\S+\.py)", (REPO / "Dockerfile").read_text(), re.M):
        assert (REPO / path).is_file(), path


def test_dockerfile_copies_what_the_dockerignore_lets_through():
    allowed = [line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    for source in re.findall(r"^COPY (?!--from)(\S+)", (REPO / "Dockerfile").read_text(), re.M):
        assert any(source == a or source.startswith(a + "/") for a in allowed), f"COPY {source} is dockerignored"
        assert (REPO / source).exists(), source


BLOCK_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("torch", "sentence_transformers"):
            raise ImportError(f"{name}: not in the runtime image")

sys.meta_path.insert(0, NoTorch())
import cli.main, cli.ingest
for service in ("gateway", "router", "retriever", "enricher", "responder"):
    __import__(f"services.{service}.main")
from services.router.local_model import LocalIntentModel
import msgspec
from shared.embeddings import Embedder, EmbeddingSettings
for quantize in (True, False):
    embedder = Embedder(msgspec.structs.replace(EmbeddingSettings.from_env(), quantize=quantize)).load()
    assert embedder.embed(["hello"]).shape == (1, 384)
    LocalIntentModel.load_or_train(embedder)
print("torch" in sys.modules)
"""


def test_the_baked_cache_serves_without_torch():
    """What the Dockerfile does: bake the cache with torch (deploy/bake_models.py), then
    serve without it (the runtime stage uninstalls torch)."""
    env = {k: v for k, v in os.environ.items() if k != "EMBEDDINGS_QUANTIZE"}
    baked = subprocess.run([sys.executable, "deploy/bake_models.py"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=600)
    assert baked.returncode == 0, baked.stderr[-3000:]
    served = subprocess.run([sys.executable, "-c", BLOCK_TORCH], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert served.returncode == 0, served.stderr[-3000:]
    assert served.stdout.strip() == "False"
    assert "retraining" not in served.stderr
