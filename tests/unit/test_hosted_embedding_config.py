"""``embedding.provider`` and ``embedding.openai``: what the config accepts,
the errors that name the bad key, and the pure helpers of the hosted provider
(the registry, ``Retry-After``, the server's error message)."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from config import ConfigError, OpenAIEmbeddingConfig, parse_config
from indexers.embedders import PROVIDERS
from indexers.embedding import open_local
from indexers.hosted_embedding import _server_message, open_openai, retry_after

GOOD = "embedding:\n  provider: openai\n  openai:\n    baseUrl: http://127.0.0.1:8000/v1\n    model: e5-small\n"


def error(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    return str(err.value)


def test_local_is_the_default_and_openai_needs_no_other_key() -> None:
    assert parse_config("").embedding.provider == "local"
    assert parse_config("").embedding.openai is None
    hosted = parse_config(GOOD).embedding.openai
    assert hosted == OpenAIEmbeddingConfig(base_url="http://127.0.0.1:8000/v1", model="e5-small")
    assert (hosted.api_key_env, hosted.batch, hosted.timeout_ms, hosted.retries, hosted.retry_max_wait_ms) == (
        None,
        64,
        10_000,
        3,
        5000,
    )
    assert (hosted.query_prefix, hosted.document_prefix, hosted.query_input_type, hosted.dimensions) == (
        "",
        "",
        None,
        None,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "embedding: {provider: openai}",
            "<string>: provider `openai` needs an `openai` section with `baseUrl` and `model` - at `$.embedding`",
        ),
        (
            "embedding: {provider: openai, openai: {model: e5}}",
            "<string>: Object missing required field `baseUrl` - at `$.embedding.openai`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1'}}",
            "<string>: Object missing required field `model` - at `$.embedding.openai`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'localhost:8000/v1', model: e5}}",
            "<string>: baseUrl must be an http(s) URL such as `https://api.openai.com/v1`, got "
            "'localhost:8000/v1' - at `$.embedding.openai`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1', model: ''}}",
            "<string>: Expected `str` of length >= 1 - at `$.embedding.openai.model`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1', model: e5, apiKeyEnv: 'sk-abc'}}",
            "<string>: Expected `str` matching regex '^[A-Za-z_][A-Za-z0-9_]{0,127}(?!\\\\n)$' - at "
            "`$.embedding.openai.apiKeyEnv`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1', model: e5, apiKey: sk-abc}}",
            "<string>: Object contains unknown field `apiKey` - at `$.embedding.openai`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1', model: e5, batch: 0}}",
            "<string>: Expected `int` >= 1 - at `$.embedding.openai.batch`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1', model: e5, retries: 11}}",
            "<string>: Expected `int` <= 10 - at `$.embedding.openai.retries`",
        ),
        (
            "embedding: {provider: openai, openai: {baseUrl: 'http://h/v1', model: e5, dimensions: 1536}}",
            "<string>: openai.dimensions (1536) must equal dim (384) - at `$.embedding`",
        ),
        ("embedding: {provider: hosted}", "<string>: Invalid enum value 'hosted' - at `$.embedding.provider`"),
    ],
)
def test_bad_hosted_config_names_the_key(text: str, message: str) -> None:
    assert error(text) == message


def test_the_registry_maps_every_provider_of_the_schema() -> None:
    assert PROVIDERS == {"local": open_local, "openai": open_openai}


def response(status: int = 503, headers: dict[str, str] | None = None, body: bytes = b"") -> httpx.Response:
    return httpx.Response(status, headers=headers, content=body)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after(response(headers={"Retry-After": "7"})) == 7.0
    assert retry_after(response(headers={"Retry-After": "0.5"})) == 0.5
    assert retry_after(response(headers={"Retry-After": "-3"})) == 0.0
    assert retry_after(response()) is None
    assert retry_after(response(headers={"Retry-After": "soon"})) is None
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    wait = retry_after(response(headers={"Retry-After": later}))
    assert wait is not None and 100 < wait <= 120
    past = email.utils.formatdate(time.time() - 120, usegmt=True)
    assert retry_after(response(headers={"Retry-After": past})) == 0.0


def test_the_servers_message_is_what_an_error_answer_says() -> None:
    assert _server_message(response(body=b'{"error": {"message": "Rate limit reached", "type": "x"}}')) == (
        "Rate limit reached"
    )
    assert _server_message(response(body=b'{"error": "overloaded"}')) == "overloaded"
    assert _server_message(response(body=b'{"detail": "Not Found"}')) == "Not Found"
    assert _server_message(response(body=b"<html>bad gateway</html>")) == "<html>bad gateway</html>"
    assert _server_message(response(502)) == "Bad Gateway"
