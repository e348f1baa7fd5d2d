"""``braid keys``: create, list, rotate and revoke API keys.

Braid stores no key, only SHA-256 digests, in two places:

- the config file's ``auth.keys`` (``{tenant, role, sha256}``): read again on
  every reload (``POST /admin/config/reload`` or SIGHUP), so keys there are
  added and removed without a restart. ``create``, ``rotate`` and ``revoke``
  edit this file (comments and layout kept: ruamel.yaml), check that the
  result is still a valid config before writing it, and with ``--reload``
  ask the service to reload. The shipped default config is never edited:
  they need ``--config`` or ``BRAID_CONFIG``.
- ``$BRAID_HOME/keys.json``: the embedded default agent and admin keys
  (tenant ``auth.defaultTenant``), read at start only. ``rotate`` of one of
  those writes a new digest there; the service takes it at its next start
  (``BRAID_API_KEY`` / ``BRAID_ADMIN_KEY``, when set, win over the file).

A new key is printed once, alone on stdout (``KEY=$(braid keys create ...)``);
everything else goes to stderr. Keys are chosen by a digest prefix (8+ hex
digits) as ``braid keys list`` shows them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..client import DEFAULT_URL
from ._common import ADMIN_KEY, URL, connect, err, fail, out, reporting
from ._common import app as root

__all__ = ["KeyEntry", "app", "entries", "new_key"]

app = typer.Typer(help="Create, list, rotate and revoke API keys (digests only are stored).", no_args_is_help=True)
root.add_typer(app, name="keys", rich_help_panel="Admin")

CONFIG = Annotated[
    Path | None,
    typer.Option("--config", envvar="BRAID_CONFIG", help="The service's YAML config.", dir_okay=False),
]
HOME = Annotated[Path, typer.Option("--home", envvar="BRAID_HOME", help="The service's data directory.")]
RELOAD = Annotated[bool, typer.Option("--reload", help="Ask the service to reload its config (needs --admin-key).")]


def new_key(role: str) -> str:
    """A fresh key, like the ones the service generates."""
    return f"braid_{role}_{secrets.token_urlsafe(24)}"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyEntry:
    sha256: str
    tenant: str
    role: str
    #: ``config`` (auth.keys), ``keys.json`` or ``environment``.
    where: str
    #: Held in clear in the config (``key:``) rather than as a digest.
    clear: bool = False
    #: Index in auth.keys, or the role in keys.json.
    slot: int | str = 0


def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    return yaml


def _config_file(config: Path | None, *, writing: bool) -> Path:
    from config import DEFAULT_CONFIG_PATH

    if config is not None:
        return config
    if writing:
        fail(
            "no config file to write the key to: pass --config or set BRAID_CONFIG "
            f"(the shipped default {DEFAULT_CONFIG_PATH} is not edited)"
        )
    return DEFAULT_CONFIG_PATH


def _load(path: Path) -> Any:
    try:
        data = _yaml().load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    except Exception as exc:  # ruamel's YAMLError and its kin
        fail(f"{path} is not valid YAML: {exc}")
    if data is None:
        from ruamel.yaml.comments import CommentedMap

        data = CommentedMap()
    if not hasattr(data, "get"):
        fail(f"{path}: the top level must be a mapping")
    return data


def _save(path: Path, data: Any) -> None:
    """Write ``data`` back, only if it is still a valid Braid config."""
    from config import ConfigError, parse_config

    buffer = io.StringIO()
    _yaml().dump(data, buffer)
    text = buffer.getvalue()
    try:
        parse_config(text, source=str(path))
    except ConfigError as exc:
        fail(f"not written, the result would not be a valid config: {exc}")
    _replace(path, text, path.stat().st_mode & 0o7777 if path.exists() else None)


def _replace(path: Path, text: str, mode: int | None) -> None:
    """Write ``path`` whole through a temporary file beside it (with ``mode``
    when given), so it holds the old text or the new one, never part."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


def _keys_list(data: Any) -> Any:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    auth = data.get("auth")
    if auth is None:
        auth = data["auth"] = CommentedMap()
    keys = auth.get("keys")
    if keys is None or (not keys and getattr(keys, "fa", None) is not None and keys.fa.flow_style()):
        keys = auth["keys"] = CommentedSeq()  # `keys: []` becomes a block list
    if keys is not None and not isinstance(keys, list):
        fail("auth.keys must be a list")
    return keys


def _add_key(path: Path, data: Any, tenant: str, role: str) -> str:
    """A new key, its digest appended to the config's auth.keys and the config saved."""
    from ruamel.yaml.comments import CommentedMap

    key = new_key(role)
    entry = CommentedMap(tenant=tenant, role=role, sha256=digest(key))
    entry.fa.set_flow_style()
    _keys_list(data).append(entry)
    _save(path, data)
    return key


def _show(key: str, done: str) -> None:
    """What was done (stderr), then the new key, once, alone on stdout."""
    err.print(f"{done}; shown only now:")
    out.print(key, markup=False)


def entries(config_data: Any, home: Path) -> list[KeyEntry]:
    """Every key the service would know: config, keys.json, environment."""
    found: list[KeyEntry] = []
    auth = config_data.get("auth") or {}
    for i, k in enumerate(auth.get("keys") or []):
        if not hasattr(k, "get"):
            continue
        clear = k.get("key")
        sha = k.get("sha256") or (digest(str(clear)) if clear is not None else "")
        found.append(
            KeyEntry(str(sha), str(k.get("tenant")), str(k.get("role", "agent")), "config", clear is not None, i)
        )
    tenant = str(auth.get("defaultTenant", "default"))
    stored = _read_keys_json(home)
    for role, env in (("agent", "BRAID_API_KEY"), ("admin", "BRAID_ADMIN_KEY")):
        if os.environ.get(env):
            found.append(KeyEntry(digest(os.environ[env]), tenant, role, f"environment {env}", slot=role))
        entry = stored.get(role)
        if isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
            found.append(KeyEntry(entry["sha256"], tenant, role, "keys.json", slot=role))
        elif isinstance(entry, str):
            found.append(KeyEntry(digest(entry), tenant, role, "keys.json", clear=True, slot=role))
    return found


def _read_keys_json(home: Path) -> dict[str, Any]:
    path = home / "keys.json"
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"cannot read {path}: {exc}")
    return value if isinstance(value, dict) else {}


def _find(found: list[KeyEntry], prefix: str) -> KeyEntry:
    prefix = prefix.strip().lower()
    if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
        fail(f"{prefix!r} is not a digest prefix: give at least 8 hex digits as `braid keys list` shows them")
    matches = [e for e in found if e.sha256.startswith(prefix) and not e.where.startswith("environment")]
    if not matches:
        fail(f"no key whose digest starts with {prefix} (see `braid keys list`)")
    if len(matches) > 1:
        fail(f"{len(matches)} keys have digests starting with {prefix}; give more digits")
    return matches[0]


def _reload(url: str, admin_key: str | None, edited: Path) -> None:
    with reporting(url), connect(url, admin_key) as client:
        answer = client.reload_config()
    if Path(answer.path).resolve() != edited.resolve():
        err.print(f"[yellow]the service reloaded {answer.path}, not {edited}: the key change is not in force[/]")
    else:
        err.print(f"reloaded {answer.path}: the change is in force")


def _tell_reload(reload: bool, url: str, admin_key: str | None, path: Path) -> None:
    if reload:
        _reload(url, admin_key, path)
    else:
        err.print("it takes effect when the service reloads its config: `kill -HUP`, or this command with --reload")


@app.command("list")
def list_keys(config: CONFIG = None, home: HOME = Path(".braid")) -> None:
    """The keys the service knows, as digests, with their tenant and role."""
    path = _config_file(config, writing=False)
    found = entries(_load(path), home)
    table = Table(title=f"keys ({path}, {home / 'keys.json'})", title_justify="left")
    for column in ("sha256", "tenant", "role", "where"):
        table.add_column(column, overflow="fold")
    for e in found:
        where = e.where + (" (in clear: replace with its sha256)" if e.clear else "")
        table.add_row(e.sha256, e.tenant, e.role, where)
    out.print(table)
    if not found:
        err.print("no keys: the service generates its embedded default keys at its first start")


@app.command()
def create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts on.")],
    role: Annotated[str, typer.Option(help="agent or admin.")] = "agent",
    config: CONFIG = None,
    reload: RELOAD = False,
    url: URL = DEFAULT_URL,
    admin_key: ADMIN_KEY = None,
) -> None:
    """Make a new key: its digest goes into the config's auth.keys, the key
    itself is printed once on stdout."""
    if role not in ("agent", "admin"):
        fail(f"--role must be agent or admin, not {role!r}")
    path = _config_file(config, writing=True)
    key = _add_key(path, _load(path), tenant, role)
    _show(key, f"added a {role} key for tenant {tenant} to {path} (sha256 {digest(key)[:16]}…)")
    _tell_reload(reload, url, admin_key, path)


@app.command()
def rotate(
    prefix: Annotated[str, typer.Argument(help="Digest prefix of the key to replace (8+ hex digits).")],
    config: CONFIG = None,
    home: HOME = Path(".braid"),
    reload: RELOAD = False,
    url: URL = DEFAULT_URL,
    admin_key: ADMIN_KEY = None,
) -> None:
    """Make a new key for the same tenant and role. A config key keeps working
    beside the new one until `braid keys revoke` (move the agents over
    between the two); an embedded default key is replaced in keys.json, in
    force at the service's next start."""
    path = _config_file(config, writing=False)
    data = _load(path)
    old = _find(entries(data, home), prefix)
    if old.where == "keys.json":
        key = new_key(old.role)
        stored = _read_keys_json(home)
        stored[str(old.slot)] = {"sha256": digest(key)}
        target = home / "keys.json"
        _replace(target, json.dumps(stored, indent=2), 0o600)
        _show(key, f"replaced the embedded {old.role} key in {target}")
        err.print("the service reads keys.json at start: restart it for the new key (the old one works until then)")
        env = "BRAID_API_KEY" if old.role == "agent" else "BRAID_ADMIN_KEY"
        if os.environ.get(env):
            err.print(f"[yellow]{env} is set: a service started with it uses that key, not keys.json[/]")
        return
    path = _config_file(config, writing=True)
    key = _add_key(path, data, old.tenant, old.role)
    _show(key, f"added a new {old.role} key for tenant {old.tenant} to {path}")
    err.print(
        f"the old key ({old.sha256[:16]}…) stays valid: once the agents use the new one, `braid keys revoke {old.sha256[:16]}`"
    )
    _tell_reload(reload, url, admin_key, path)


@app.command()
def revoke(
    prefix: Annotated[str, typer.Argument(help="Digest prefix of the key to remove (8+ hex digits).")],
    config: CONFIG = None,
    home: HOME = Path(".braid"),
    reload: RELOAD = False,
    url: URL = DEFAULT_URL,
    admin_key: ADMIN_KEY = None,
) -> None:
    """Remove a key from the config's auth.keys."""
    path = _config_file(config, writing=True)
    data = _load(path)
    old = _find(entries(data, home), prefix)
    if old.where != "config":
        fail(f"the key {old.sha256[:16]}… is an embedded default key ({old.where}): rotate it instead")
    del _keys_list(data)[int(old.slot)]
    _save(path, data)
    err.print(f"removed the {old.role} key {old.sha256[:16]}… of tenant {old.tenant} from {path}")
    _tell_reload(reload, url, admin_key, path)
