"""Config overrides for tuning runs: ``--set dotted.key=yaml_value`` and ``--sweep FILE.yaml``.

``--set sources.graph.weight=0.5`` (repeatable) is applied to the YAML config
before the service starts. A sweep file is a YAML list of override sets; each
is a mapping of dotted keys to values, or ``{name: ..., set: {dotted: value}}``
to name it::

    - {name: graph-half, set: {sources.graph.weight: 0.5}}
    - {rrf.k: 30}

The suite ingests once; then for each set (after a ``base`` row with none)
the service's config file is rewritten as the base config plus the set and
reloaded (``POST /admin/config/reload``), and only the fused recalls are
asked again, with ``track: false`` so that no row's recalls change the usage
counts the next row sees. A set that the reload refuses, or whose keys take
effect only after a restart or a reindex, stops the sweep with the reason.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import httpx

    from .service import TenantService

__all__ = ["SweepSet", "apply_sets", "load_sweep", "parse_set", "reload_config", "run_sweep"]

Override = tuple[str, Any]


@dataclass(frozen=True)
class SweepSet:
    name: str
    sets: tuple[Override, ...]


def parse_set(text: str) -> Override:
    """``"sources.graph.weight=0.5"`` -> ``("sources.graph.weight", 0.5)`` (the value read as YAML)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ValueError(f"expected dotted.key=yaml_value, got {text!r}")
    return key, yaml.safe_load(value)


def apply_sets(config: Mapping[str, Any], sets: Sequence[Override]) -> dict[str, Any]:
    """A deep copy of ``config`` with each dotted key set (missing mappings are
    created; the service refuses unknown keys when it reads the file)."""
    out = copy.deepcopy(dict(config))
    for key, value in sets:
        node = out
        *path, last = key.split(".")
        for i, part in enumerate(path):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"cannot set {key}: {'.'.join(path[: i + 1])} is {child!r}, not a mapping")
            node = child
        node[last] = value
    return out


def load_sweep(path: Path) -> list[SweepSet]:
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{path}: a sweep file is a non-empty YAML list of override sets")
    sets = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item:
            raise ValueError(f"{path}: set {i} is not a mapping of dotted keys to values")
        named = set(item) == {"name", "set"}
        overrides = item["set"] if named else item
        if not isinstance(overrides, dict) or not overrides:
            raise ValueError(f"{path}: set {i} has no overrides")
        pairs = tuple((str(k), v) for k, v in overrides.items())
        name = str(item["name"]) if named else ", ".join(f"{k}={v}" for k, v in pairs)
        sets.append(SweepSet(name, pairs))
    return sets


async def reload_config(client: httpx.AsyncClient, svc: TenantService, config: Mapping[str, Any]) -> None:
    """Write ``config`` as the service's config file and reload it; SystemExit
    when the reload is refused or names keys that need a restart or a reindex."""
    svc.write_config(config)
    r = await client.post("/admin/config/reload", headers=svc.admin_headers)
    if r.status_code != 200:
        raise SystemExit(f"config reload refused ({r.status_code}): {r.json().get('detail', r.text)}")
    body = r.json()
    later = [*body.get("restart_required", []), *body.get("reindex_required", [])]
    if later:
        raise SystemExit(f"config reload: keys that take effect only after a restart or a reindex: {', '.join(later)}")


async def run_sweep(
    client: httpx.AsyncClient,
    svc: TenantService,
    sets: Sequence[SweepSet],
    fused: Callable[[], Awaitable[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """``[{name, sets, score}]``: a ``base`` row, then one per set, each scored by
    ``fused()`` after its reload; the base config is put back at the end."""
    rows = []
    for sweep_set in [SweepSet("base", ()), *sets]:
        print(f"sweep: {sweep_set.name}", file=sys.stderr, flush=True)
        await reload_config(client, svc, apply_sets(svc.config, sweep_set.sets))
        rows.append({"name": sweep_set.name, "sets": dict(sweep_set.sets), "score": await fused()})
    await reload_config(client, svc, svc.config)
    return rows
