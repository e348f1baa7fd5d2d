"""Configuration: the msgspec schema and the default ``braid.yaml``."""

from .errors import BraidError, ConfigError
from .holder import ConfigHolder
from .loader import DEFAULT_CONFIG_PATH, config_path, load_config, parse_config
from .schema import (
    FIXED_SECTIONS,
    NAME_PATTERN,
    RESTART_SECTIONS,
    ApiKey,
    AuthConfig,
    BraidConfig,
    EmbeddingConfig,
    GraphConfig,
    LimitsConfig,
    PostgresConfig,
    QueryConfig,
    RrfConfig,
    ServerConfig,
    SyncConfig,
    TierConfig,
    TypesenseConfig,
    is_safe_name,
)
from .sources import (
    SourceConfig,
    TypesenseSourceConfig,
    register_source_config,
    source_defaults,
    unregister_source_config,
)

__all__ = [
    "BraidError",
    "ConfigHolder",
    "register_source_config",
    "source_defaults",
    "unregister_source_config",
    "FIXED_SECTIONS",
    "RESTART_SECTIONS",
    "ApiKey",
    "AuthConfig",
    "BraidConfig",
    "ConfigError",
    "DEFAULT_CONFIG_PATH",
    "EmbeddingConfig",
    "GraphConfig",
    "LimitsConfig",
    "NAME_PATTERN",
    "PostgresConfig",
    "QueryConfig",
    "RrfConfig",
    "ServerConfig",
    "SourceConfig",
    "SyncConfig",
    "TierConfig",
    "TypesenseConfig",
    "TypesenseSourceConfig",
    "config_path",
    "is_safe_name",
    "load_config",
    "parse_config",
]
