"""Static checks of the deployment files under deploy/.

No Docker engine or cluster is needed: the YAML is parsed and cross-checked
(selectors, ports, probes, references between objects), the Braid configs are
validated against the real schema, and the Dockerfile is read line by line.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from config import parse_config
from deploy.embedded import TYPESENSE_SNAPSHOT_INTERVAL_S

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yaml"
CONTAINER_CONFIG = DEPLOY / "braid.container.yaml"
SECRET_EXAMPLE = K8S / "secret.example.yaml"
KUSTOMIZATION = K8S / "kustomization.yaml"

NAMESPACE = "braid"
BRAID_CONFIG_PATH = "/etc/braid/braid.yaml"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "StorageClass", "PersistentVolume"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _pin(package: str) -> str:
    for dep in PYPROJECT["project"]["dependencies"]:
        m = re.fullmatch(rf"{re.escape(package)}(\[[^\]]*\])?==(\S+)", dep)
        if m:
            return m.group(2)
    raise AssertionError(f"{package} is not pinned in pyproject.toml")


# --- YAML -------------------------------------------------------------------------


def _yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in {".yaml", ".yml"})


def _load_all(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def test_there_are_deployment_files() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in _yaml_files()}
    assert {"docker-compose.yaml", "braid.container.yaml", "k8s/kustomization.yaml"} <= names
    assert DOCKERFILE.is_file()


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_yaml_parses(path: Path) -> None:
    docs = _load_all(path)
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is a {type(doc).__name__}, not a mapping"


# --- Kubernetes objects -----------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    file: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.body["kind"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    def __repr__(self) -> str:
        return f"{self.kind}/{self.name} ({self.file})"


def _k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)


def _objects(*, with_secret_example: bool = True) -> list[Obj]:
    out = []
    for path in _k8s_files():
        if path == SECRET_EXAMPLE and not with_secret_example:
            continue
        out.extend(Obj(path.name, doc) for doc in _load_all(path))
    return out


OBJECTS = _objects()


def _of_kind(*kinds: str) -> list[Obj]:
    return [o for o in OBJECTS if o.kind in kinds]


def _one(kind: str, name: str) -> Obj:
    found = [o for o in OBJECTS if o.kind == kind and o.name == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {found}"
    return found[0]


def _pod_spec(workload: Obj) -> dict[str, Any]:
    return workload.body["spec"]["template"]["spec"]


def _containers(workload: Obj) -> list[dict[str, Any]]:
    spec = _pod_spec(workload)
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _template_labels(workload: Obj) -> dict[str, str]:
    return workload.body["spec"]["template"]["metadata"].get("labels", {})


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _port_matches(port: int | str, container: dict[str, Any]) -> bool:
    for p in container.get("ports", []):
        if port == p["containerPort"] or port == p.get("name"):
            return True
    return False


def _braid_config_from_configmap() -> tuple[str, Any]:
    text = _one("ConfigMap", "braid-config").body["data"]["braid.yaml"]
    return text, parse_config(text, source="k8s ConfigMap braid-config")


def test_k8s_objects_have_identity_and_namespace() -> None:
    assert OBJECTS
    for obj in OBJECTS:
        body = obj.body
        assert body.get("apiVersion"), f"{obj.file}: an object has no apiVersion"
        assert body.get("kind"), f"{obj.file}: an object has no kind"
        assert body.get("metadata", {}).get("name"), f"{obj.file}: a {body['kind']} has no metadata.name"
        if obj.kind in CLUSTER_SCOPED:
            assert "namespace" not in body["metadata"], f"{obj} is cluster-scoped"
        else:
            assert body["metadata"].get("namespace") == NAMESPACE, f"{obj} is not in namespace {NAMESPACE}"
    assert _one("Namespace", NAMESPACE)


def test_k8s_names_are_unique() -> None:
    seen = [(o.kind, o.name) for o in OBJECTS]
    assert len(seen) == len(set(seen)), f"duplicate objects: {sorted(seen)}"


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    kust = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kust["kind"] == "Kustomization"
    resources = kust["resources"]
    assert len(resources) == len(set(resources))
    expected = {p.name for p in _k8s_files()} - {SECRET_EXAMPLE.name}
    assert set(resources) == expected
    # The namespace must exist before anything is created in it.
    assert resources[0] == "namespace.yaml"


def test_secret_example_holds_placeholders_only() -> None:
    (secret,) = [o for o in _of_kind("Secret")]
    assert secret.file == SECRET_EXAMPLE.name, "Secrets belong in secret.example.yaml only"
    assert "data" not in secret.body, "use stringData placeholders, never encoded values"
    values = secret.body["stringData"]
    assert values and all(v == "REPLACE_ME" for v in values.values()), values


def test_workload_selectors_match_template_labels() -> None:
    workloads = _of_kind(*WORKLOADS)
    assert {o.name for o in workloads} >= {"braid", "braid-typesense", "braid-postgres"}
    for w in workloads:
        selector = w.body["spec"]["selector"]["matchLabels"]
        assert _selects(selector, _template_labels(w)), f"{w}: selector {selector} misses its own pods"


def test_workloads_do_not_select_each_others_pods() -> None:
    workloads = _of_kind(*WORKLOADS)
    for a in workloads:
        for b in workloads:
            if a is not b:
                sel = a.body["spec"]["selector"]["matchLabels"]
                assert not _selects(sel, _template_labels(b)), f"{a} selects the pods of {b}"


def test_services_select_pods_and_target_existing_ports() -> None:
    services = _of_kind("Service")
    assert services
    for svc in services:
        selector = svc.body["spec"]["selector"]
        pods = [w for w in _of_kind(*WORKLOADS) if _selects(selector, _template_labels(w))]
        assert pods, f"{svc}: selector {selector} matches no workload"
        for port in svc.body["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for w in pods:
                assert any(_port_matches(target, c) for c in _containers(w)), (
                    f"{svc}: targetPort {target!r} is not a container port of {w}"
                )


def test_statefulsets_name_a_headless_service() -> None:
    for sts in _of_kind("StatefulSet"):
        svc = _one("Service", sts.body["spec"]["serviceName"])
        assert svc.body["spec"].get("clusterIP") == "None", f"{svc} governs {sts} and must be headless"
        assert _selects(svc.body["spec"]["selector"], _template_labels(sts))


def test_pod_disruption_budgets_select_a_workload() -> None:
    pdbs = _of_kind("PodDisruptionBudget")
    assert "braid" in {p.name for p in pdbs}
    for pdb in pdbs:
        selector = pdb.body["spec"]["selector"]["matchLabels"]
        assert any(_selects(selector, _template_labels(w)) for w in _of_kind(*WORKLOADS)), pdb
    braid = _one("Deployment", "braid")
    budget = _one("PodDisruptionBudget", "braid").body["spec"]
    assert budget.get("minAvailable", 0) < braid.body["spec"]["replicas"], "the budget would block every drain"


def test_probes_target_existing_ports() -> None:
    for w in _of_kind(*WORKLOADS):
        for c in _containers(w):
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(kind)
                if probe is None:
                    continue
                for handler in ("httpGet", "tcpSocket"):
                    if handler in probe:
                        port = probe[handler]["port"]
                        assert _port_matches(port, c), f"{w} {c['name']} {kind}: no container port {port!r}"


def test_braid_deployment() -> None:
    dep = _one("Deployment", "braid")
    spec = _pod_spec(dep)
    assert dep.body["spec"]["replicas"] == 2
    # A Service named `braid` would otherwise inject BRAID_PORT=tcp://..., which
    # Braid reads as its listening port.
    assert spec.get("enableServiceLinks") is False
    (c,) = spec["containers"]
    _, cfg = _braid_config_from_configmap()
    http = [p for p in c["ports"] if p["containerPort"] == cfg.server.port]
    assert http, f"no container port for server.port {cfg.server.port}"
    for kind in ("readinessProbe", "livenessProbe"):
        get = c[kind]["httpGet"]
        assert get["path"] == "/health", kind
        assert get["port"] in (cfg.server.port, http[0].get("name")), kind
    if "startupProbe" in c:
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
    res = c["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
    env = {e["name"]: e for e in c["env"]}
    for name in ("BRAID_API_KEY", "BRAID_ADMIN_KEY", "PGPASSWORD", "TYPESENSE_API_KEY"):
        assert "secretKeyRef" in env[name].get("valueFrom", {}), f"{name} must come from a Secret"
    assert "BRAID_PORT" not in env
    config_dir = BRAID_CONFIG_PATH.rsplit("/", 1)[0]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert config_dir in mounts, f"the config is not mounted at {config_dir}"
    assert "subPath" not in mounts[config_dir], "a subPath mount never sees ConfigMap updates"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[config_dir]["name"]]["configMap"]["name"] == "braid-config"
    if "BRAID_CONFIG" in env:
        assert env["BRAID_CONFIG"]["value"] == BRAID_CONFIG_PATH
    sc = spec["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == _dockerfile_uid()
    assert dep.body["spec"]["template"]["spec"]["containers"][0]["image"].endswith(
        ":" + PYPROJECT["project"]["version"]
    )


def test_secret_and_configmap_references_resolve() -> None:
    secret_keys = {o.name: set(o.body.get("stringData", {})) | set(o.body.get("data", {})) for o in _of_kind("Secret")}
    configmaps = {o.name: set(o.body.get("data", {})) for o in _of_kind("ConfigMap")}
    for w in _of_kind(*WORKLOADS):
        for c in _containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secret_keys.get(ref["name"], set()), f"{w}: {ref} is not documented"
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in configmaps.get(ref["name"], set()), f"{w}: {ref}"
            names = {v["name"] for v in _pod_spec(w).get("volumes", [])}
            names |= {t["metadata"]["name"] for t in w.body["spec"].get("volumeClaimTemplates", [])}
            for m in c.get("volumeMounts", []):
                assert m["name"] in names, f"{w} {c['name']}: volume {m['name']!r} is not defined"
        for v in _pod_spec(w).get("volumes", []):
            if "configMap" in v:
                cm = v["configMap"]
                assert cm["name"] in configmaps, f"{w}: ConfigMap {cm['name']} does not exist"
                for item in cm.get("items", []):
                    assert item["key"] in configmaps[cm["name"]]


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname, url
    return parts.hostname, parts.port or default_port


def _assert_no_secrets(cfg: Any, where: str) -> None:
    assert urlsplit(cfg.postgres.dsn).password is None, f"{where}: the DSN holds a password (use PGPASSWORD)"
    assert cfg.typesense.api_key is None, f"{where}: typesense.apiKey is a secret (use TYPESENSE_API_KEY)"
    assert not cfg.auth.keys, f"{where}: API keys belong in a Secret"


def test_k8s_braid_config_is_valid_and_names_the_backends() -> None:
    _, cfg = _braid_config_from_configmap()
    assert cfg.server.host == "0.0.0.0"
    assert cfg.postgres.dsn and cfg.typesense.nodes
    _assert_no_secrets(cfg, "braid-config")

    pg_host, pg_port = _host_port(cfg.postgres.dsn, 5432)
    pg_svc = _one("Service", pg_host.split(".")[0])
    assert pg_port in {p["port"] for p in pg_svc.body["spec"]["ports"]}

    # Typesense nodes: each pod of the StatefulSet through its headless Service.
    sts = _one("StatefulSet", "braid-typesense")
    svc_name = sts.body["spec"]["serviceName"]
    replicas = sts.body["spec"]["replicas"]
    assert replicas == 3
    assert sts.body["spec"].get("podManagementPolicy") == "Parallel"
    assert _one("Service", svc_name).body["spec"].get("publishNotReadyAddresses") is True
    hosts = [_host_port(n, 8108) for n in cfg.typesense.nodes]
    assert sorted(h for h, _ in hosts) == [f"{sts.name}-{i}.{svc_name}" for i in range(replicas)]
    (ts,) = _pod_spec(sts)["containers"]
    assert all(_port_matches(port, ts) for _, port in hosts)


def test_typesense_peers_file_matches_the_statefulset() -> None:
    sts = _one("StatefulSet", "braid-typesense")
    (c,) = _pod_spec(sts)["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    assert c["image"] == "typesense/typesense:0.24.1"
    assert args["api-port"] == "8108" and args["peering-port"] == "8107"
    assert _port_matches(8108, c) and _port_matches(8107, c)
    assert args["api-key"] == "$(TYPESENSE_API_KEY)"
    assert args["data-dir"] in {m["mountPath"] for m in c["volumeMounts"]}
    assert args["snapshot-interval-seconds"] == str(TYPESENSE_SNAPSHOT_INTERVAL_S)

    nodes_path = args["nodes"]
    mount = next(m for m in c["volumeMounts"] if nodes_path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert "subPath" not in mount
    volume = next(v for v in _pod_spec(sts)["volumes"] if v["name"] == mount["name"])
    filename = nodes_path.rsplit("/", 1)[1]
    key = next(i["key"] for i in volume["configMap"]["items"] if i["path"] == filename)
    peers = _one("ConfigMap", volume["configMap"]["name"]).body["data"][key].strip().split(",")
    svc = sts.body["spec"]["serviceName"]
    expected = [f"{sts.name}-{i}.{svc}:8107:8108" for i in range(sts.body["spec"]["replicas"])]
    assert peers == expected
    assert all(len(p) < 64 for p in peers), "Raft rejects peer entries of 64 characters or more"


def test_postgres_statefulset() -> None:
    sts = _one("StatefulSet", "braid-postgres")
    (c,) = _pod_spec(sts)["containers"]
    assert c["image"] == "pgvector/pgvector:pg17"
    assert sts.body["spec"]["volumeClaimTemplates"]
    env = {e["name"]: e for e in c["env"]}
    _, cfg = _braid_config_from_configmap()
    dsn = urlsplit(cfg.postgres.dsn)
    assert env["POSTGRES_USER"]["value"] == dsn.username
    assert env["POSTGRES_DB"]["value"] == dsn.path.lstrip("/")
    assert "secretKeyRef" in env["POSTGRES_PASSWORD"]["valueFrom"]
    braid_env = {e["name"]: e for e in _pod_spec(_one("Deployment", "braid"))["containers"][0]["env"]}
    assert braid_env["PGPASSWORD"]["valueFrom"] == env["POSTGRES_PASSWORD"]["valueFrom"]
    data = next(m for m in c["volumeMounts"] if m["name"] == "data")
    assert env["PGDATA"]["value"].startswith(data["mountPath"].rstrip("/") + "/")


# --- container config and compose --------------------------------------------------


def _container_config() -> Any:
    return parse_config(CONTAINER_CONFIG.read_text(encoding="utf-8"), source=str(CONTAINER_CONFIG))


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def test_container_config_is_valid_and_names_the_backends() -> None:
    cfg = _container_config()
    assert cfg.server.host == "0.0.0.0"
    assert cfg.postgres.dsn and cfg.typesense.nodes
    _assert_no_secrets(cfg, CONTAINER_CONFIG.name)


def test_compose_postgres_runs_with_the_embedded_settings() -> None:
    from deploy.embedded import POSTGRES_SETTINGS

    command = _compose()["services"]["postgres"]["command"]
    assert command[0] == "postgres"
    flags = command[1::2]
    assert flags == ["-c"] * len(POSTGRES_SETTINGS)
    assert dict(c.split("=", 1) for c in command[2::2]) == POSTGRES_SETTINGS


def test_compose_dependencies_exist_and_are_healthchecked() -> None:
    services = _compose()["services"]
    assert {"braid", "postgres", "typesense"} <= set(services)
    assert services["postgres"]["image"] == "pgvector/pgvector:pg17"
    assert services["typesense"]["image"] == "typesense/typesense:0.24.1"
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        for dep in deps:
            assert dep in services, f"{name} depends on unknown service {dep}"
            if isinstance(deps, dict) and deps[dep].get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck to wait for"
    deps = services["braid"]["depends_on"]
    assert {d: deps[d]["condition"] for d in deps} == {
        "postgres": "service_healthy",
        "typesense": "service_healthy",
    }


def test_compose_volumes_are_declared() -> None:
    compose = _compose()
    declared = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"


def test_compose_braid_uses_the_container_config_and_backends() -> None:
    compose = _compose()
    services = compose["services"]
    braid = services["braid"]
    build = braid["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE
    assert braid["image"].endswith(":" + PYPROJECT["project"]["version"])

    mounts = {v.split(":")[1]: v.split(":")[0] for v in braid["volumes"]}
    assert (COMPOSE.parent / mounts[BRAID_CONFIG_PATH]).resolve() == CONTAINER_CONFIG
    env = braid["environment"]
    assert env.get("BRAID_CONFIG", BRAID_CONFIG_PATH) == BRAID_CONFIG_PATH
    assert "BRAID_PORT" not in env

    cfg = _container_config()
    published = [str(p).rsplit(":", 1)[-1] for p in braid["ports"]]
    assert str(cfg.server.port) in published

    pg_host, pg_port = _host_port(cfg.postgres.dsn, 5432)
    assert pg_host in services and pg_port == 5432
    pg_env = services["postgres"]["environment"]
    dsn = urlsplit(cfg.postgres.dsn)
    assert pg_env["POSTGRES_USER"] == dsn.username and pg_env["POSTGRES_DB"] == dsn.path.lstrip("/")
    assert env["PGPASSWORD"] == pg_env["POSTGRES_PASSWORD"]

    for node in cfg.typesense.nodes:
        host, port = _host_port(node, 8108)
        assert host in services, f"typesense node {node} is not a compose service"
        command = " ".join(services[host]["command"])
        assert f"--api-port={port}" in command or port == 8108
        assert f"--api-key={env['TYPESENSE_API_KEY']}" in command, "Braid and Typesense disagree on the key"
        assert "--data-dir" in command
        assert f"--snapshot-interval-seconds={TYPESENSE_SNAPSHOT_INTERVAL_S}" in command


# --- Dockerfile -------------------------------------------------------------------


@dataclass(frozen=True)
class Instr:
    stage: int
    op: str
    args: str


def _dockerfile() -> list[Instr]:
    """Instructions with their stage index: comments dropped, continuations joined."""
    out: list[Instr] = []
    stage = -1
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        op, _, args = full.partition(" ")
        op = op.upper()
        if op == "FROM":
            stage += 1
        out.append(Instr(stage, op, args.strip()))
    assert not pending, "the Dockerfile ends inside a line continuation"
    return out


def _final_stage() -> list[Instr]:
    instrs = _dockerfile()
    last = max(i.stage for i in instrs)
    return [i for i in instrs if i.stage == last]


def _env(instrs: list[Instr]) -> dict[str, str]:
    env: dict[str, str] = {}
    for i in instrs:
        if i.op == "ENV":
            for word in shlex.split(i.args):
                key, sep, value = word.partition("=")
                assert sep, f"use ENV key=value, not {i.args!r}"
                env[key] = value
    return env


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def _dockerfile_uid() -> int:
    (user,) = [i.args for i in _final_stage() if i.op == "USER"]
    return int(user.split(":")[0])


def test_dockerfile_base_images() -> None:
    froms = [i.args.split()[0] for i in _dockerfile() if i.op == "FROM"]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms


#: ``pip install [options] .`` or ``".[extra,...]"``: the project itself.
_PROJECT_INSTALL = r'pip install (--\S+ )*("\.\[[\w,-]+\]"|\.)(\s|$)'


def test_dockerfile_installs_torch_cpu_before_the_project() -> None:
    runs = [i for i in _dockerfile() if i.op == "RUN"]
    torch_at = [n for n, i in enumerate(runs) if re.search(r"pip install .*\btorch==", i.args)]
    project_at = [n for n, i in enumerate(runs) if re.search(_PROJECT_INSTALL, i.args)]
    assert torch_at and project_at, "torch or the project is never installed"
    assert torch_at[0] < project_at[0], "torch must be installed before the project"
    torch_run = runs[torch_at[0]].args
    assert f"torch=={_pin('torch')}" in torch_run, "the Dockerfile's torch pin differs from pyproject.toml"
    assert "--index-url" in torch_run
    project_run = runs[project_at[0]].args
    assert '".[traces]"' in project_run, "the image lacks the traces extra: traces.enabled would not start"
    index = [i.args for i in _dockerfile() if i.op == "ARG" and i.args.startswith("TORCH_INDEX_URL=")]
    assert "$" not in torch_run or (index and index[0].rstrip("/").endswith("/whl/cpu"))


def test_dockerfile_exports_the_onnx_model_where_the_runtime_looks() -> None:
    """``embedding.runtime: onnx`` (the default) reads the export from the
    environment's ``share/braid``: the build stage makes it inside the venv
    it hands to the runtime stage, after the project is installed."""
    runs = [i for i in _dockerfile() if i.op == "RUN"]
    export_at = [n for n, i in enumerate(runs) if "python -m indexers.onnx_minilm" in i.args]
    project_at = [n for n, i in enumerate(runs) if re.search(_PROJECT_INSTALL, i.args)]
    assert export_at and project_at, "the image never exports the ONNX model"
    # After the project install: a later RUN, or later in the same one.
    run = runs[export_at[0]].args
    if export_at[0] == project_at[0]:
        installed = re.search(_PROJECT_INSTALL, run)
        assert installed is not None and run.index("python -m indexers.onnx_minilm") > installed.start()
    else:
        assert export_at[0] > project_at[0]
    assert runs[export_at[0]].stage < max(i.stage for i in _dockerfile())
    copies = [i.args for i in _final_stage() if i.op == "COPY" and "--from=build" in i.args]
    assert any("/opt/venv" in c for c in copies), "the runtime stage does not take the build's venv"
    assert _env(_final_stage())["PATH"].startswith("/opt/venv/bin")


def test_dockerfile_copies_everything_the_wheel_needs() -> None:
    copies = [i for i in _dockerfile() if i.op == "COPY" and "--from=" not in i.args]
    sources = []
    for i in copies:
        words = [w for w in i.args.split() if not w.startswith("--")]
        for src in words[:-1]:
            assert list(ROOT.glob(src)), f"COPY {src}: not in the repository"
            sources.append(src.rstrip("/"))
    assert "pyproject.toml" in sources
    readme = PYPROJECT["project"].get("readme")
    if isinstance(readme, str):
        assert readme in sources, f"pyproject.toml names {readme}, which the image does not copy"
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        path = package.replace(".", "/")  # a subpackage is copied with its parent's directory
        assert any(s == path or s.startswith(path + "/") or path.startswith(s + "/") for s in sources), (
            f"{package} is not copied"
        )


def test_every_subpackage_is_listed_for_the_wheel() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in listed
        if "." not in top
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert sorted(found - listed) == [], "not in [tool.setuptools] packages, so not in the wheel"


def test_dockerfile_runtime_stage() -> None:
    final = _final_stage()
    env = _env(final)
    assert env["BRAID_HOME"] == "/data"
    assert env["BRAID_CONFIG"] == BRAID_CONFIG_PATH
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "BRAID_PORT" not in env

    (cmd,) = [i for i in final if i.op == "CMD"]
    assert _exec_form(cmd.args) == ["python", "-m", "service"]
    assert not [i for i in final if i.op == "ENTRYPOINT"]

    exposed = {p.split("/")[0] for i in final if i.op == "EXPOSE" for p in i.args.split()}
    assert str(_container_config().server.port) in exposed
    _, k8s_cfg = _braid_config_from_configmap()
    assert str(k8s_cfg.server.port) in exposed

    assert _dockerfile_uid() > 0, "the image must not run as root"

    baked = [i.args.split() for i in final if i.op == "COPY" and "--from=" not in i.args]
    assert ["deploy/braid.container.yaml", BRAID_CONFIG_PATH] in baked


def test_dockerfile_healthcheck_targets_health() -> None:
    (hc,) = [i for i in _final_stage() if i.op == "HEALTHCHECK"]
    _, _, command = hc.args.partition("CMD ")
    argv = _exec_form(command.strip())
    assert argv[:2] == ["python", "-c"]
    code = argv[2]
    compile(code, "<healthcheck>", "exec")
    assert "urllib.request" in code and re.search(r"/health(?![\w/-])", code)
    assert str(_container_config().server.port) in code


@pytest.mark.parametrize("status", [200, 503])
def test_dockerfile_healthcheck_runs(status: int) -> None:
    """Run the HEALTHCHECK command against a stub server on $BRAID_PORT."""
    (hc,) = [i for i in _final_stage() if i.op == "HEALTHCHECK"]
    argv = _exec_form(hc.args.partition("CMD ")[2].strip())
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {**os.environ, "BRAID_PORT": str(server.server_address[1])}
        done = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert paths == ["/health"]
    assert (done.returncode == 0) == (status == 200), done.stderr.decode()
