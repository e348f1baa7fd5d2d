"""Reading ``braid.yaml`` into a validated :class:`BraidConfig`."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import yaml

from .errors import ConfigError
from .schema import BraidConfig, TierConfig
from .sources import parse_sources

__all__ = ["ConfigError", "DEFAULT_CONFIG_PATH", "config_path", "load_config", "parse_config"]

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "braid.yaml"


def config_path() -> Path:
    """The file in force: ``$BRAID_CONFIG`` if set, else the shipped default."""
    env = os.environ.get("BRAID_CONFIG")
    return Path(env).expanduser() if env else DEFAULT_CONFIG_PATH


def parse_config(text: str, *, source: str = "<string>") -> BraidConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    tiers = raw.get("tiers")
    if isinstance(tiers, dict):
        # Checked one by one first, so an error names the tier (`$.tiers.session.m`).
        for name, tier in tiers.items():
            try:
                msgspec.convert(tier, TierConfig, strict=True)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"{source}: {_rebase(str(exc), f'$.tiers.{name}')}") from None
    raw = dict(raw)
    rrf = raw.get("rrf")
    legacy = None
    if isinstance(rrf, dict) and "weights" in rrf:
        rrf = dict(rrf)
        legacy = rrf.pop("weights")
        raw["rrf"] = rrf
    try:
        sources = parse_sources(raw.pop("sources", None), legacy)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        cfg = msgspec.convert(raw, BraidConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return msgspec.structs.replace(cfg, sources=sources)


def _rebase(message: str, prefix: str) -> str:
    """Put a nested validation error's path under ``prefix``."""
    if " - at `$" in message:
        head, _, path = message.rpartition(" - at `$")
        return f"{head} - at `{prefix}{path}"
    return f"{message} - at `{prefix}`"


def load_config(path: Path | str | None = None) -> BraidConfig:
    file = Path(path) if path is not None else config_path()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None
    return parse_config(text, source=str(file))
