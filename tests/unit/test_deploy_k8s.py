"""Schema checks of the Kubernetes manifests under deploy/k8s, offline.

Every built-in object (Deployment, StatefulSet, Service, ...) of the base and
of the CloudNativePG overlay (deploy/k8s/cnpg) is validated against the
Kubernetes OpenAPI schemas, converted to JSON Schema, that the
``kubernetes-validate`` package ships (its ``-strict`` variants: an unknown
field is an error). No package on PyPI, npm or Debian ships CloudNativePG's
CRD schema, so the ``Cluster`` gets :func:`cnpg_cluster_errors` instead: a
hand-written check of the fields this repository uses, written from the CRD's
documentation. It is NOT the official schema; its embedded Kubernetes types
(``resources``) do go through the official one.

The overlay is rendered the way kustomize would for the patches it holds
(deletions, and strategic merges of ConfigMaps, whose ``data`` is a plain
map), so the objects checked are the ones ``kubectl apply -k`` would send.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

from config import parse_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CNPG = K8S / "cnpg"

#: The Kubernetes versions validated against: the oldest and newest that
#: kubernetes-validate 1.37.0 ships that the manifests are meant for.
K8S_VERSIONS = ("1.33", "1.37")
CNPG_API = "postgresql.cnpg.io/v1"

Obj = dict[str, Any]


def _load(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _key(obj: Obj) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace", "")


def _kustomization(directory: Path) -> Obj:
    return yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))


def _build(directory: Path) -> list[Obj]:
    """The objects ``kustomize build directory`` emits, for what our kustomizations use."""
    kust = _kustomization(directory)
    assert set(kust) <= {"apiVersion", "kind", "resources", "patches"}, f"{directory}: unhandled fields"
    objects: list[Obj] = []
    for resource in kust["resources"]:
        path = (directory / resource).resolve()
        objects += _build(path) if path.is_dir() else _load(path)
    for patch in kust.get("patches", []):
        assert set(patch) in ({"path"}, {"patch"}), f"{directory}: patch {patch} has a target or options"
        (body,) = _load(directory / patch["path"]) if "path" in patch else [yaml.safe_load(patch["patch"])]
        matches = [i for i, o in enumerate(objects) if _key(o) == _key(body)]
        assert len(matches) == 1, f"{directory}: patch {_key(body)} matches {len(matches)} objects"
        if body.get("$patch") == "delete":
            del objects[matches[0]]
            continue
        # A strategic merge of a ConfigMap is a plain recursive map merge; other
        # kinds have list merge keys this helper does not model.
        assert body["kind"] == "ConfigMap", f"{directory}: only ConfigMap patches are rendered here"
        objects[matches[0]] = _merge(objects[matches[0]], body)
    return objects


def _merge(base: Obj, patch: Obj) -> Obj:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


BASE = _build(K8S)
OVERLAY = _build(CNPG)
SECRET_EXAMPLES = _load(K8S / "secret.example.yaml") + _load(CNPG / "secret.example.yaml")


def _id(obj: Obj) -> str:
    return "{}/{}".format(*_key(obj)[:2])


def _one(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


# --- official Kubernetes schemas -------------------------------------------------------


def _official(obj: Obj, version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def _builtin(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["apiVersion"] != CNPG_API]


_ALL_BUILTIN = {_id(o): o for o in _builtin(BASE + OVERLAY + SECRET_EXAMPLES)}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(_ALL_BUILTIN))
def test_builtin_objects_match_the_official_schema(name: str, version: str) -> None:
    _official(_ALL_BUILTIN[name], version)


def test_every_kind_but_the_cluster_has_an_official_schema() -> None:
    # SchemaNotFoundError would otherwise let an object through unchecked.
    assert {o["kind"] for o in OVERLAY if o["apiVersion"] == CNPG_API} == {"Cluster"}
    kinds = {o["kind"] for o in _builtin(BASE + OVERLAY)}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Namespace"} <= kinds
    with pytest.raises(SchemaNotFoundError):
        _official(_one(OVERLAY, "Cluster", "braid-pg"), K8S_VERSIONS[-1])


def _set(obj: Obj, path: str, value: Any) -> Obj:
    """A copy of ``obj`` with ``value`` at a dotted path (integers index lists)."""
    out = copy.deepcopy(obj)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = out
    for p in parents:
        node = node[p]
    node[last] = value
    return out


def _without(obj: Obj, path: str) -> Obj:
    out = copy.deepcopy(obj)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = out
    for p in parents:
        node = node[p]
    del node[last]
    return out


_BROKEN: dict[str, tuple[Callable[[], Obj], str]] = {
    # A misspelt field: only the strict schemas reject it.
    "unknown field": (lambda: _set(_one(BASE, "Deployment", "braid"), "spec.replica", 2), "replica"),
    "wrong type": (
        lambda: _set(
            _one(BASE, "Deployment", "braid"), "spec.template.spec.containers.0.ports.0.containerPort", "8080"
        ),
        "'8080' is not of type 'integer'",
    ),
    "missing required field": (
        lambda: _without(_one(BASE, "StatefulSet", "braid-typesense"), "spec.selector"),
        "'selector' is a required property",
    ),
    "unknown field deep in a pod template": (
        lambda: _set(
            _one(BASE, "Deployment", "braid"), "spec.template.spec.containers.0.livenessProbe.httpGet.paht", "/health"
        ),
        "paht",
    ),
}


@pytest.mark.parametrize("case", sorted(_BROKEN))
def test_official_schema_rejects_a_broken_copy(case: str) -> None:
    make, message = _BROKEN[case]
    with pytest.raises(ValidationError) as info:
        _official(make(), K8S_VERSIONS[-1])
    assert message in info.value.message


# --- CloudNativePG Cluster: hand-written, NOT the official CRD schema -----------------

# Written from the CloudNativePG v1 API reference (ClusterSpec, BootstrapInitDB,
# StorageConfiguration, PostgresConfiguration, AffinityConfiguration). Only
# these fields are allowed, so a misspelt one fails; a real field missing from
# these lists fails too, and then belongs here.
_SPEC_FIELDS = {
    "affinity",
    "backup",
    "bootstrap",
    "description",
    "enablePDB",
    "enableSuperuserAccess",
    "env",
    "imageName",
    "imagePullPolicy",
    "inheritedMetadata",
    "instances",
    "managed",
    "maxSyncReplicas",
    "minSyncReplicas",
    "monitoring",
    "plugins",
    "postgresql",
    "primaryUpdateMethod",
    "primaryUpdateStrategy",
    "priorityClassName",
    "replicationSlots",
    "resources",
    "startDelay",
    "stopDelay",
    "storage",
    "superuserSecret",
    "switchoverDelay",
    "walStorage",
}
_INITDB_FIELDS = {
    "database",
    "owner",
    "secret",
    "dataChecksums",
    "encoding",
    "localeCType",
    "localeCollate",
    "postInitSQL",
    "postInitApplicationSQL",
    "postInitTemplateSQL",
}
_STORAGE_FIELDS = {"size", "storageClass", "resizeInUseVolumes", "pvcTemplate"}
_POSTGRESQL_FIELDS = {"parameters", "pg_hba", "pg_ident", "shared_preload_libraries", "synchronous"}
_AFFINITY_FIELDS = {
    "enablePodAntiAffinity",
    "topologyKey",
    "podAntiAffinityType",
    "nodeSelector",
    "tolerations",
    "nodeAffinity",
    "additionalPodAffinity",
    "additionalPodAntiAffinity",
}
#: Settings the operator writes itself (listening, replication, archiving,
#: TLS paths): a value here would be ignored or break the instances.
_OPERATOR_PARAMETERS = {
    "listen_addresses",
    "port",
    "unix_socket_directories",
    "archive_command",
    "restore_command",
    "primary_conninfo",
    "primary_slot_name",
    "ssl_cert_file",
    "ssl_key_file",
    "ssl_ca_file",
}
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _unknown(where: str, got: Any, allowed: set[str]) -> list[str]:
    if not isinstance(got, dict):
        return [f"{where}: not a mapping"]
    return [f"{where}.{k}: unknown field" for k in sorted(set(got) - allowed)]


def cnpg_cluster_errors(obj: Obj) -> list[str]:
    """What is wrong with a CloudNativePG ``Cluster``, by the fields used here."""
    errors: list[str] = []
    if obj.get("apiVersion") != CNPG_API or obj.get("kind") != "Cluster":
        return [f"not a {CNPG_API} Cluster"]
    name = obj.get("metadata", {}).get("name", "")
    if not _DNS_LABEL.match(name) or len(name) > 50:
        errors.append(f"metadata.name {name!r}: a DNS label the Services can extend with -rw/-ro/-r")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*errors, "spec: required"]
    errors += _unknown("spec", spec, _SPEC_FIELDS)

    instances = spec.get("instances")
    if not isinstance(instances, int) or isinstance(instances, bool) or instances < 1:
        errors.append("spec.instances: required, an integer >= 1")
    image = spec.get("imageName")
    if image is not None:
        tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
        if not re.match(r"^\d+", tag):
            errors.append(f"spec.imageName {image!r}: the tag must start with the Postgres major version")
    if spec.get("primaryUpdateStrategy", "unsupervised") not in {"unsupervised", "supervised"}:
        errors.append("spec.primaryUpdateStrategy: unsupervised or supervised")
    for flag in ("enableSuperuserAccess",):
        if flag in spec and not isinstance(spec[flag], bool):
            errors.append(f"spec.{flag}: a boolean")

    bootstrap = spec.get("bootstrap", {})
    errors += _unknown("spec.bootstrap", bootstrap, {"initdb", "recovery", "pg_basebackup"})
    if isinstance(bootstrap, dict) and len(bootstrap) > 1:
        errors.append("spec.bootstrap: one method only")
    initdb = bootstrap.get("initdb") if isinstance(bootstrap, dict) else None
    if initdb is not None:
        errors += _unknown("spec.bootstrap.initdb", initdb, _INITDB_FIELDS)
        for field in ("database", "owner"):
            if not isinstance(initdb.get(field, ""), str):
                errors.append(f"spec.bootstrap.initdb.{field}: a string")
        secret = initdb.get("secret")
        if secret is not None and (not isinstance(secret, dict) or set(secret) != {"name"}):
            errors.append("spec.bootstrap.initdb.secret: {name: <Secret>}")
        for field in ("postInitSQL", "postInitApplicationSQL", "postInitTemplateSQL"):
            sqls = initdb.get(field, [])
            if not isinstance(sqls, list) or not all(isinstance(s, str) for s in sqls):
                errors.append(f"spec.bootstrap.initdb.{field}: a list of strings")

    storage = spec.get("storage")
    if storage is None:
        errors.append("spec.storage: the instances need a volume")
    else:
        errors += _unknown("spec.storage", storage, _STORAGE_FIELDS)
        if not _QUANTITY.match(str(storage.get("size", ""))):
            errors.append(f"spec.storage.size {storage.get('size')!r}: a quantity such as 20Gi")

    postgresql = spec.get("postgresql", {})
    errors += _unknown("spec.postgresql", postgresql, _POSTGRESQL_FIELDS)
    for key, value in (postgresql.get("parameters") or {}).items():
        if not isinstance(value, str):
            errors.append(f"spec.postgresql.parameters.{key}: a string (quote {value!r})")
        if key in _OPERATOR_PARAMETERS:
            errors.append(f"spec.postgresql.parameters.{key}: set by the operator")

    affinity = spec.get("affinity", {})
    errors += _unknown("spec.affinity", affinity, _AFFINITY_FIELDS)
    if affinity.get("podAntiAffinityType", "preferred") not in {"preferred", "required"}:
        errors.append("spec.affinity.podAntiAffinityType: preferred or required")

    # spec.resources is core/v1 ResourceRequirements: its types go through the
    # official schema (not strict: the wrapper adds apiVersion and kind), its
    # field names and quantity formats through the checks below, since the
    # official schema accepts any string as a quantity.
    if "resources" in spec:
        wrapper = {"apiVersion": "v1", "kind": "ResourceRequirements", **spec["resources"]}
        try:
            kubernetes_validate.validate(wrapper, K8S_VERSIONS[-1], strict=False)
        except ValidationError as exc:
            errors.append(f"spec.resources: {exc.message}")
        errors += _resources_errors(spec["resources"])
    return errors


def _resources_errors(resources: Any) -> list[str]:
    errors = _unknown("spec.resources", resources, {"requests", "limits", "claims"})
    if errors:
        return errors
    for part in ("requests", "limits"):
        amounts = resources.get(part) or {}
        if not isinstance(amounts, dict):
            errors.append(f"spec.resources.{part}: a mapping")
            continue
        for key, value in amounts.items():
            if not _QUANTITY.match(str(value)):
                errors.append(f"spec.resources.{part}.{key} {value!r}: a quantity")
    return errors


def test_cnpg_cluster_passes_the_hand_written_check() -> None:
    assert cnpg_cluster_errors(_one(OVERLAY, "Cluster", "braid-pg")) == []


_BROKEN_CLUSTER: dict[str, tuple[str, Any, str]] = {
    "misspelt field": ("spec.instance", 3, "spec.instance: unknown field"),
    "instances not a number": ("spec.instances", "3", "spec.instances: required, an integer >= 1"),
    "unquoted number parameter": ("spec.postgresql.parameters.max_connections", 200, "quote 200"),
    "operator's parameter": ("spec.postgresql.parameters.port", "5433", "parameters.port: set by the operator"),
    "bad storage size": ("spec.storage.size", "20 GB", "spec.storage.size '20 GB'"),
    "image without a version tag": ("spec.imageName", "ghcr.io/cloudnative-pg/postgresql:latest", "major version"),
    "bad update strategy": ("spec.primaryUpdateStrategy", "auto", "unsupervised or supervised"),
    "bad bootstrap secret": ("spec.bootstrap.initdb.secret", "braid-postgres-auth", "initdb.secret"),
    "bad resource quantity": ("spec.resources.limits.memory", "4 gigs", "spec.resources.limits.memory"),
    "resources of the wrong type": ("spec.resources.limits", ["4Gi"], "spec.resources"),
}


@pytest.mark.parametrize("case", sorted(_BROKEN_CLUSTER))
def test_cnpg_check_rejects_a_broken_copy(case: str) -> None:
    path, value, message = _BROKEN_CLUSTER[case]
    errors = cnpg_cluster_errors(_set(_one(OVERLAY, "Cluster", "braid-pg"), path, value))
    assert any(message in e for e in errors), errors


def test_cnpg_check_requires_instances() -> None:
    errors = cnpg_cluster_errors(_without(_one(OVERLAY, "Cluster", "braid-pg"), "spec.instances"))
    assert errors == ["spec.instances: required, an integer >= 1"]


# --- the CloudNativePG overlay ---------------------------------------------------------


def test_overlay_lists_its_files() -> None:
    kust = _kustomization(CNPG)
    assert kust["resources"][0] == "../", "the overlay builds on the base"
    listed = set(kust["resources"]) | {p["path"] for p in kust["patches"] if "path" in p}
    files = {p.name for p in CNPG.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert files <= listed, "a file in deploy/k8s/cnpg is not used"
    assert "secret.example.yaml" not in listed, "applying the overlay must never write a placeholder Secret"


def test_overlay_replaces_the_postgres_statefulset_with_the_cluster() -> None:
    base = {_key(o) for o in BASE}
    overlay = {_key(o) for o in OVERLAY}
    assert base - overlay == {("StatefulSet", "braid-postgres", "braid"), ("Service", "braid-postgres", "braid")}
    assert overlay - base == {("Cluster", "braid-pg", "braid")}
    assert "braid-postgres" not in _one(OVERLAY, "ConfigMap", "braid-config")["data"]["braid.yaml"]


def _cluster() -> Obj:
    return _one(OVERLAY, "Cluster", "braid-pg")


def test_cluster_is_a_primary_and_two_replicas_with_pgvector() -> None:
    spec = _cluster()["spec"]
    assert spec["instances"] == 3
    # CloudNativePG's "standard" operand images carry pgvector; "minimal" ones do not.
    assert re.fullmatch(r"ghcr\.io/cloudnative-pg/postgresql:18(\.\d+)?-standard-\w+", spec["imageName"])
    initdb = spec["bootstrap"]["initdb"]
    assert "CREATE EXTENSION IF NOT EXISTS vector" in initdb["postInitApplicationSQL"]
    # Migration v5 (indexers/migrations.py) creates the braid_tenant role as the owner.
    assert f"ALTER ROLE {initdb['owner']} CREATEROLE" in initdb["postInitApplicationSQL"]
    assert spec["affinity"]["topologyKey"] == "kubernetes.io/hostname"
    assert spec["resources"]["requests"] == spec["resources"]["limits"], "Guaranteed QoS"


def _bytes(size: str) -> int:
    m = re.fullmatch(r"(\d+)(kB|MB|GB|Ki|Mi|Gi)", size)
    assert m, size
    unit = {"kB": 1, "Ki": 1, "MB": 2, "Mi": 2, "GB": 3, "Gi": 3}[m.group(2)]
    return int(m.group(1)) * 1024**unit


def test_cluster_memory_settings_fit_the_pod() -> None:
    spec = _cluster()["spec"]
    params = spec["postgresql"]["parameters"]
    limit = _bytes(spec["resources"]["limits"]["memory"])
    shared = _bytes(params["shared_buffers"])
    assert shared <= limit // 2
    assert shared + _bytes(params["effective_cache_size"]) <= limit
    # Three autovacuum workers at their cap, plus shared_buffers and one index build.
    vacuum = 3 * _bytes(params["autovacuum_work_mem"])
    assert shared + vacuum + _bytes(params["maintenance_work_mem"]) <= limit * 3 // 4


def test_bootstrap_secret_is_documented_and_matches_the_owner() -> None:
    initdb = _cluster()["spec"]["bootstrap"]["initdb"]
    (secret,) = [s for s in SECRET_EXAMPLES if s["metadata"]["name"] == initdb["secret"]["name"]]
    assert secret["type"] == "kubernetes.io/basic-auth"
    assert secret["stringData"] == {"username": initdb["owner"], "password": "REPLACE_ME"}
    assert secret["metadata"]["namespace"] == _cluster()["metadata"]["namespace"]


def _overlay_config() -> tuple[str, Any]:
    text = _one(OVERLAY, "ConfigMap", "braid-config")["data"]["braid.yaml"]
    return text, parse_config(text, source="deploy/k8s/cnpg braid-config")


def test_overlay_config_reaches_the_primary_through_rw() -> None:
    _, cfg = _overlay_config()
    cluster = _cluster()
    initdb = cluster["spec"]["bootstrap"]["initdb"]
    dsn = urlsplit(cfg.postgres.dsn)
    assert (dsn.hostname, dsn.port or 5432) == (f"{cluster['metadata']['name']}-rw", 5432)
    assert dsn.username == initdb["owner"] and dsn.path == "/" + initdb["database"]
    assert dsn.password is None, "the password is PGPASSWORD, from braid-secrets"
    # Everything but postgres is the base's config.
    base = parse_config(_one(BASE, "ConfigMap", "braid-config")["data"]["braid.yaml"], source="base")
    assert cfg.typesense == base.typesense and cfg.server == base.server


def test_overlay_config_names_the_replicas_through_ro() -> None:
    text, cfg = _overlay_config()
    ro = f"postgresql://braid@{_cluster()['metadata']['name']}-ro:5432/braid"
    assert cfg.postgres.replica_dsn == ro
    assert f"replicaDsn: {ro}" in text
