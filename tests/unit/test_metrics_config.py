"""The `metrics` and `traces` config sections: defaults, and errors that name the key."""

from __future__ import annotations

import pytest

from config import RESTART_SECTIONS, ConfigError, MetricsConfig, TracesConfig, parse_config


def test_defaults() -> None:
    cfg = parse_config("")
    assert cfg.metrics == MetricsConfig(enabled=True, path="/metrics", auth="none")
    assert cfg.traces == TracesConfig(
        enabled=False, exporter="otlp", endpoint=None, service_name="braid", sample_ratio=1.0
    )
    # Both are built once, at start-up: a reload names their changes as needing a restart.
    assert {"metrics", "traces"} <= set(RESTART_SECTIONS)


def test_camel_case_keys() -> None:
    cfg = parse_config(
        "metrics: {path: /internal/metrics, auth: admin}\n"
        "traces: {enabled: true, endpoint: 'http://collector:4318/v1/traces', serviceName: braid-eu, sampleRatio: 0.25}"
    )
    assert cfg.metrics == MetricsConfig(path="/internal/metrics", auth="admin")
    assert cfg.traces == TracesConfig(
        enabled=True, endpoint="http://collector:4318/v1/traces", service_name="braid-eu", sample_ratio=0.25
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "metrics: {path: /v1/metrics}",
            "path '/v1/metrics' is inside /v1, which the API serves; choose another, such as '/metrics' - at `$.metrics`",
        ),
        (
            "metrics: {path: /health}",
            "path '/health' is inside /health, which the API serves; choose another, such as '/metrics' - at `$.metrics`",
        ),
        (
            "metrics: {path: /admin/}",
            "path '/admin/' is inside /admin, which the API serves; choose another, such as '/metrics' - at `$.metrics`",
        ),
        ("metrics: {path: /}", "path must name a route of its own, such as '/metrics', not '/' - at `$.metrics`"),
        (
            "metrics: {path: metrics}",
            "Expected `str` matching regex '^/[A-Za-z0-9_\\\\-./]{0,200}$' - at `$.metrics.path`",
        ),
        ("metrics: {auth: bearer}", "Invalid enum value 'bearer' - at `$.metrics.auth`"),
        ("metrics: {port: 9100}", "Object contains unknown field `port` - at `$.metrics`"),
        ("traces: {exporter: zipkin}", "Invalid enum value 'zipkin' - at `$.traces.exporter`"),
        (
            "traces: {exporter: console, endpoint: 'http://collector:4318/v1/traces'}",
            "endpoint applies to exporter `otlp` only, not `console` - at `$.traces`",
        ),
        (
            "traces: {endpoint: 'collector:4318'}",
            "Expected `str` matching regex '^https?://\\\\S+$' - at `$.traces.endpoint`",
        ),
        ("traces: {sampleRatio: 1.5}", "Expected `float` <= 1.0 - at `$.traces.sampleRatio`"),
        ("traces: {serviceName: ''}", "Expected `str` of length >= 1 - at `$.traces.serviceName`"),
    ],
)
def test_errors_name_the_bad_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="braid.yaml")
    assert str(info.value) == f"braid.yaml: {message}"
