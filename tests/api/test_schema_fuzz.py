"""Schemathesis against the OpenAPI schema Braid serves: every operation, with
positive and negative data, once with an agent key, once with an admin key and
once with a key Braid does not know. No answer may be a 500, and every answer
must be documented: its status code, its content type and its body.

Braid runs for real (``python -m service``) on the session's Postgres and
Typesense, as a deployment would, and the schema is the one it serves.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from benchmarks.faults.ledger import Ledger, Scenario
from deploy.embedded import EmbeddedPostgres, EmbeddedTypesense, free_port

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
AGENT_KEY = "fuzz-agent-key-0123456789abcdef"
ADMIN_KEY = "fuzz-admin-key-0123456789abcdef"
UNKNOWN_KEY = "fuzz-unknown-key-0123456789abcdef"

#: Generated cases per operation and data mode; hypothesis stops early when an
#: operation has fewer distinct requests (GET /health has one).
EXAMPLES = 40
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: A 503 is Braid's documented "a backend is unavailable, retry after Retry-After"
#: (checked below); any other 5xx is a server error.
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503"]}}}
)
OPERATIONS = {
    "POST /v1/memories",
    "DELETE /v1/memories/{memory_id}",
    "GET /v1/memories/{memory_id}",
    "GET /v1/memories",
    "POST /v1/graph",
    "DELETE /v1/graph/relations",
    "DELETE /v1/graph/entities/{name}",
    "POST /v1/recall",
    "POST /admin/reindex",
    "GET /admin/reindex/{job_id}",
    "POST /admin/config/reload",
    "GET /admin/stats",
    "GET /health",
}
#: No body and a free string path (or nothing at all): nothing to make invalid.
NOTHING_TO_NEGATE = {
    "GET /v1/memories/{memory_id}",
    "DELETE /v1/graph/entities/{name}",
    "GET /admin/reindex/{job_id}",
    "POST /admin/config/reload",
    "GET /health",
}
ADMIN_OPERATIONS = {
    "POST /admin/reindex",
    "GET /admin/reindex/{job_id}",
    "POST /admin/config/reload",
    "GET /admin/stats",
}


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def unhandled(self) -> list[str]:
        """What the service logged for each 500: the request and the exception."""
        lines = self.log.read_text(errors="replace").splitlines()
        found = []
        for i, line in enumerate(lines):
            if "unhandled error on" in line:
                # Past the "Traceback" line, the first unindented line is the exception.
                exc = next((later for later in lines[i + 2 :] if later and not later[0].isspace()), "")
                found.append(f"{line} -> {exc}")
        return found


@pytest.fixture(scope="module")
def served(postgres: EmbeddedPostgres, typesense: EmbeddedTypesense) -> Iterator[Served]:
    home = Path(tempfile.mkdtemp(prefix="braid-fuzz-"))
    home.chmod(0o755)
    db = f"braid_fuzz_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    config = home / "braid.yaml"
    config.write_text(
        f"postgres:\n  dsn: '{postgres.dsn().replace('/postgres?', f'/{db}?')}'\n"
        f"typesense:\n  nodes: ['{typesense.url}']\n  apiKey: '{typesense.api_key}'\n"
        f"  collection: {db}\n"
        "auth:\n  keys:\n"
        f"    - {{key: {AGENT_KEY}, tenant: t1, role: agent}}\n"
        f"    - {{key: {ADMIN_KEY}, tenant: t1, role: admin}}\n"
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    env.update(BRAID_HOME=str(home), BRAID_PORT=str(port), BRAID_CONFIG=str(config))
    log = home / "service.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    served = Served(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"service not healthy after 120 s:\n{log.read_text()}"
            try:
                if httpx.get(f"{served.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield served
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class Tally:
    requests: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    #: (operation, status) -> answers, for the assertions on who reached what.
    answers: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    server_errors: int = 0
    #: Answers that failed a conformance check (status, content type, body).
    schema_failures: int = 0
    #: One reproducible report per (operation, status, failed checks): the first seen.
    failures: dict[tuple[str, int, str], str] = field(default_factory=dict)
    #: Operations for which schemathesis could make no invalid request.
    no_negative: set[str] = field(default_factory=set)


def fuzz(url: str, key: str) -> Tally:
    """Every operation of the served schema, with positive then negative data."""
    schema = schemathesis.openapi.from_url(f"{url}/schema/openapi.json", config=CONFIG)
    auth = {"Authorization": f"Bearer {key}"}
    tally = Tally()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        fuzz_operation(operation, GenerationMode.POSITIVE, url, auth, session, tally)
        try:
            fuzz_operation(operation, GenerationMode.NEGATIVE, url, auth, session, tally)
        except Unsatisfiable:
            tally.no_negative.add(operation.label)
    return tally


def fuzz_operation(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    url: str,
    auth: dict[str, str],
    session: requests.Session,
    tally: Tally,
) -> None:
    # Positive data starts with the schema's own request examples (a valid write,
    # graph and recall whatever hypothesis draws after them), then generates.
    examples = operation.get_strategies_from_examples(headers=auth) if mode is GenerationMode.POSITIVE else []
    for strategy in [*examples, operation.as_strategy(generation_mode=mode, headers=auth)]:
        _run_cases(operation, mode, strategy, url, auth, session, tally)


def _run_cases(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    strategy: Any,
    url: str,
    auth: dict[str, str],
    session: requests.Session,
    tally: Tally,
) -> None:
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        # Failures are collected, not raised: nothing to shrink.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: schemathesis.Case) -> None:
        if mode is GenerationMode.POSITIVE:
            _pair_embedding_model(case.body)
        response = case.call(base_url=url, session=session, timeout=60)
        tally.requests += 1
        tally.statuses[response.status_code] += 1
        tally.answers[(operation.label, response.status_code)] += 1
        if response.status_code == 503 and "Retry-After" not in response.headers and operation.label != "GET /health":
            tally.schema_failures += 1
            tally.failures.setdefault(
                (operation.label, 503, "no Retry-After"),
                f"{operation.label} [{mode.value} data]: 503 without Retry-After: {response.text}\n"
                f"    {case.as_curl_command(headers=auth, base_url=url)}",
            )
        try:
            case.validate_response(response, checks=CHECKS, headers=auth)
        except FailureGroup as group:
            kinds = sorted({type(f).__name__ for f in group.exceptions})
            tally.server_errors += int(response.status_code >= 500 and response.status_code != 503)
            tally.schema_failures += int(bool(set(kinds) - {"ServerError"}))
            tally.failures.setdefault(
                (operation.label, response.status_code, ", ".join(kinds)),
                f"{operation.label} [{mode.value} data]\n{group.message}",
            )

    run()


def _pair_embedding_model(body: Any) -> None:
    """Drop an ``embedding_model`` generated without its ``embedding`` (a 400
    by design, which the schema cannot say): otherwise nearly every generated
    batch of memories carries one somewhere, and no valid write is made.
    tests/api/test_embedding_versions.py covers that 400."""
    if not isinstance(body, dict):
        return
    items = body.get("memories") if isinstance(body.get("memories"), list) else [body]
    for item in items:
        if isinstance(item, dict) and "embedding" not in item:
            item.pop("embedding_model", None)


@pytest.mark.parametrize(
    ("who", "key"),
    # The admin run last: the reindex jobs it starts keep Postgres busy after it.
    [("agent key", AGENT_KEY), ("unknown key", UNKNOWN_KEY), ("admin key", ADMIN_KEY)],
    ids=["agent", "unknown", "admin"],
)
def test_every_endpoint_documented_and_no_500(served: Served, ledger: Ledger, who: str, key: str) -> None:
    started = time.monotonic()
    tally = fuzz(served.url, key)
    statuses = dict(sorted(tally.statuses.items()))
    ledger.record(
        Scenario(
            kind="bad input",
            name=f"schemathesis: every endpoint, {who}",
            injected=tally.requests,
            load=f"{EXAMPLES} positive + {EXAMPLES} negative cases per operation, one at a time",
            requests=tally.requests,
            errors=sum(n for s, n in statuses.items() if s >= 400) - tally.server_errors,
            server_errors=tally.server_errors,
            schema_failures=tally.schema_failures,
            outcome=f"answers by status {statuses}; {len(tally.failures)} distinct failures"
            f" in {time.monotonic() - started:.0f} s",
        )
    )
    reports = "\n".join(tally.failures.values())
    logged = "\n".join(served.unhandled())
    assert not tally.failures, f"{reports}\nservice log:\n{logged}"
    assert tally.server_errors == 0 and tally.schema_failures == 0

    reached = {op for op, _ in tally.answers}
    assert reached == OPERATIONS
    assert tally.no_negative == NOTHING_TO_NEGATE
    assert tally.requests >= len(OPERATIONS) * EXAMPLES
    if key == UNKNOWN_KEY:
        # Nothing but the health check answers without a known key. (A body that
        # is not JSON at all gets its 400 first: Litestar reads the body before
        # the key is checked.)
        assert {(o, s) for o, s in tally.answers if s < 400} == {("GET /health", 200)}, statuses
        assert {o for o, s in tally.answers if s == 401} == OPERATIONS - {"GET /health"}
        return
    # The generated data got past validation to the engine, not only into 400s.
    for op in ("POST /v1/memories", "POST /v1/graph", "POST /v1/recall"):
        assert any(200 <= s < 300 for o, s in tally.answers if o == op), (op, statuses)
    if key == AGENT_KEY:
        # An agent key never gets past an admin endpoint's door.
        assert not [(o, s) for o, s in tally.answers if o in ADMIN_OPERATIONS and s < 400]
    else:
        assert tally.answers[("POST /admin/reindex", 202)] > 0
        assert tally.answers[("POST /admin/config/reload", 200)] > 0
        assert tally.answers[("GET /admin/stats", 200)] > 0
