"""The soak's traffic: a fixed number of clients sharing one fixed request
rate, each sending a mix of recalls, writes and deletes, and checking every
answer on the way.

Each client owns the ids it writes (``<tenant>-c<client>-<n>``) and is the
only one to rewrite or delete them, one request at a time, so the last
acknowledged state of every id is known: :class:`Book` keeps it for the
final check against Postgres and Typesense. A write or delete whose answer
never came (timeout, 5xx) leaves its ids *uncertain*: not checked.

Every answer is checked against the served OpenAPI schema (the documented
status codes' bodies); every recall is checked for ids of another tenant
(leaks) and for an id listed twice (duplicates).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema_rs
import msgspec

__all__ = ["Book", "Done", "Mix", "SchemaCheck", "queries", "run_clients"]

_decode = msgspec.json.Decoder().decode

NAMES = (
    "Alice Bob Carmen Dmitri Elena Farid Grace Hiro Ines Jonas Kwame Lena Mateo Nadia Omar "
    "Priya Quentin Rosa Sven Tamar Umar Vera Wen Ximena Yusuf Zoe"
).split()
ACTIVITIES = (
    "repaired|painted|sold|borrowed|bought|lost|found|photographed|cleaned|measured|"
    "wrapped|delivered|tested|rebuilt|catalogued"
).split("|")
THINGS = (
    "a red bicycle|the garden shed|an old violin|the kitchen table|a ceramic vase|a sailing boat|"
    "the attic window|a leather jacket|a vintage camera|the piano|a wool blanket|a telescope|"
    "the front door|a chess set|a copper kettle|the bookshelf|a mountain tent|a silver watch"
).split("|")
PLACES = ("Lisbon Oslo Kyoto Nairobi Lima Tallinn Hanoi Porto Quito Dakar Bergen Tbilisi Cusco Malmo Tunis").split()


def queries(n: int, seed: int) -> list[str]:
    """``n`` distinct recall queries over the vocabulary of the writes. A few
    hundred: the service's query-embedding cache (4096) holds them all after
    warm-up, so they do not look like growth later."""
    rng = random.Random(seed)
    shapes = (
        "what did {name} do with {thing}",
        "who {act} {thing}",
        "{thing} in {place}",
        "when was {thing} {act} in {place}",
        "what happened to {thing} that {name} had",
        "{name} {place}",
    )
    out: set[str] = set()
    while len(out) < n:
        out.add(
            rng.choice(shapes).format(
                name=rng.choice(NAMES), act=rng.choice(ACTIVITIES), thing=rng.choice(THINGS), place=rng.choice(PLACES)
            )
        )
    return sorted(out)


@dataclass(frozen=True)
class Mix:
    """Shares of the three operations and of recall shapes."""

    recall: float = 0.70
    write: float = 0.25
    delete: float = 0.05
    #: Recall sources: fused (None) or one source alone, with these weights.
    sources: tuple[tuple[tuple[str, ...] | None, float], ...] = (
        (None, 0.6),
        (("typesense",), 0.15),
        (("pgvector",), 0.15),
        (("graph",), 0.10),
    )
    #: Share of write batches that also rewrite one of the client's live ids.
    rewrite: float = 0.1
    #: Share of recalls filtered to one of the client's sessions.
    session_filter: float = 0.1

    def describe(self) -> str:
        src = ", ".join(f"{'+'.join(s) if s else 'fused'} {w:.0%}" for s, w in self.sources)
        return (
            f"{self.recall:.0%} recalls ({src}; top_k 5/10/20; {self.session_filter:.0%} session-filtered), "
            f"{self.write:.0%} writes of 1-5 memories with client-chosen ids ({self.rewrite:.0%} also rewrite "
            f"an own id), {self.delete:.0%} deletes of own memories"
        )


class Done(msgspec.Struct, array_like=True):
    """One finished request: seconds since the start at its end, what, answer, ms."""

    t: float
    op: str
    status: int  # 0: no answer (timeout or connection error)
    ms: float


@dataclass
class Book:
    """What every client was told, for the final check and the counts."""

    #: Acknowledged, not deleted: (tenant, id) -> content last acknowledged.
    live: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Deletes acknowledged (and not written again since).
    deleted: set[tuple[str, str]] = field(default_factory=set)
    #: Ids whose last write or delete got no answer: not checked.
    uncertain: set[tuple[str, str]] = field(default_factory=set)
    done: list[Done] = field(default_factory=list)
    leaks: int = 0
    duplicates: int = 0
    schema_failures: int = 0
    #: 201 answers whose ids differ from the ids sent.
    wrong_ids: int = 0
    #: How late requests started against their slot in the fixed rate (s).
    lag: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)


class SchemaCheck:
    """The bodies of documented answers, validated against the served OpenAPI schema."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self._validators: dict[tuple[str, str, int], Any] = {}
        components = openapi.get("components", {})
        for path, ops in openapi["paths"].items():
            for method, op in ops.items():
                for status, answer in op.get("responses", {}).items():
                    schema = answer.get("content", {}).get("application/json", {}).get("schema")
                    if schema is None or not status.isdigit():
                        continue
                    root = {**schema, "components": components}
                    self._validators[(method.upper(), path, int(status))] = jsonschema_rs.Draft202012Validator(root)

    def failures(self, method: str, path: str, status: int, body: Any) -> list[str]:
        """Schema errors of one answer ([] when its status is undocumented:
        that is counted as an error by status, not as a schema failure)."""
        validator = self._validators.get((method, path, status))
        if validator is None:
            return []
        return [e.message for e in validator.iter_errors(body)]


class _Pacer:
    """Slots of a fixed total rate, handed out in order to whichever client asks."""

    def __init__(self, rate: float, start: float, end: float) -> None:
        self.rate, self.start, self.end, self.k = rate, start, end, 0

    def next(self) -> float | None:
        """The next slot; None once the slots or the wall-clock time run out
        (an overloaded run ends on time and sends fewer requests)."""
        slot = self.start + self.k / self.rate
        if slot >= self.end or time.monotonic() >= self.end:
            return None
        self.k += 1
        return slot


async def _client(
    index: int,
    tenant: str,
    headers: dict[str, str],
    url: str,
    pacer: _Pacer,
    book: Book,
    schema: SchemaCheck,
    mix: Mix,
    pool: list[str],
    seed: int,
    t0: float,
) -> None:
    rng = random.Random(seed * 1000 + index)
    mine: list[str] = []  # this client's live ids (mirrors book.live)
    seq = 0

    def session() -> str:
        return f"c{index}-s{rng.randrange(8)}"

    weights = [w for _, w in mix.sources]
    choices = [s for s, _ in mix.sources]

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as http:
        while True:
            slot = pacer.next()
            if slot is None:
                return
            now = time.monotonic()
            if slot > now:
                await asyncio.sleep(slot - now)
            book.lag.append(max(0.0, time.monotonic() - slot))
            roll = rng.random()
            if roll < mix.delete and mine:
                mid = mine.pop(rng.randrange(len(mine)))
                key = (tenant, mid)
                status, body = await _send(
                    http, book, schema, "DELETE", "/v1/memories/{memory_id}", f"/v1/memories/{mid}", None, "delete", t0
                )
                if status == 404:
                    # Left in book.live: the final check counts it as lost.
                    book.note(f"delete of acknowledged {mid} answered 404")
                elif status == 200:
                    book.live.pop(key, None)
                    book.deleted.add(key)
                else:
                    book.live.pop(key, None)
                    book.uncertain.add(key)
            elif roll < mix.delete + mix.write:
                batch = []
                for _ in range(rng.randint(1, 5)):
                    seq += 1
                    batch.append(f"{tenant}-c{index}-{seq}")
                rewrite = [mine.pop(rng.randrange(len(mine)))] if mine and rng.random() < mix.rewrite else []
                memories = []
                for mid in batch + rewrite:
                    name, place = rng.choice(NAMES), rng.choice(PLACES)
                    content = (
                        f"{name} {rng.choice(ACTIVITIES)} {rng.choice(THINGS)} in {place} (note {mid}, version {seq})"
                    )
                    memories.append(
                        {
                            "id": mid,
                            "content": content,
                            "session_id": session(),
                            "speaker": name,
                            "entities": [name, place],
                            "tags": [place.lower()],
                        }
                    )
                for mid in rewrite:
                    book.live.pop((tenant, mid), None)
                status, body = await _send(
                    http, book, schema, "POST", "/v1/memories", "/v1/memories", {"memories": memories}, "write", t0
                )
                if status == 201:
                    sent = [m["id"] for m in memories]
                    if not isinstance(body, dict) or body.get("ids") != sent:
                        book.wrong_ids += 1
                        book.note(f"write of {sent} answered ids {body!r:.200}")
                    for m in memories:
                        key = (tenant, m["id"])
                        book.live[key] = m["content"]
                        book.deleted.discard(key)
                        mine.append(m["id"])
                else:
                    # New ids without an answer are simply not checked; a rewrite's id is uncertain.
                    book.uncertain.update((tenant, mid) for mid in rewrite)
            else:
                req: dict[str, Any] = {"query": rng.choice(pool), "top_k": rng.choice((5, 10, 20))}
                sources = rng.choices(choices, weights)[0]
                if sources is not None:
                    req["sources"] = list(sources)
                if rng.random() < mix.session_filter:
                    req["session_id"] = session()
                status, body = await _send(http, book, schema, "POST", "/v1/recall", "/v1/recall", req, "recall", t0)
                if status == 200 and isinstance(body, dict):
                    ids = [str(i.get("id")) for i in body.get("items", []) if isinstance(i, dict)]
                    foreign = [i for i in ids if not i.startswith(f"{tenant}-c")]
                    if foreign:
                        book.leaks += len(foreign)
                        book.note(f"recall of {tenant} returned {foreign[:3]}")
                    if len(ids) != len(set(ids)):
                        book.duplicates += len(ids) - len(set(ids))
                        book.note(f"recall of {tenant} listed an id twice: {ids}")


async def _send(
    http: httpx.AsyncClient,
    book: Book,
    schema: SchemaCheck,
    method: str,
    route: str,
    path: str,
    body: Any,
    op: str,
    t0: float,
) -> tuple[int, Any]:
    start = time.monotonic()
    try:
        r = await http.request(method, path, json=body)
    except httpx.HTTPError as exc:
        end = time.monotonic()
        book.done.append(Done(end - t0, op, 0, (end - start) * 1000))
        book.note(f"{op}: no answer ({type(exc).__name__})")
        return 0, None
    end = time.monotonic()
    book.done.append(Done(end - t0, op, r.status_code, (end - start) * 1000))
    try:
        answer = _decode(r.content)
    except msgspec.DecodeError:
        book.schema_failures += 1
        book.note(f"{op} {r.status_code}: body is not JSON: {r.text[:100]!r}")
        return r.status_code, None
    problems = schema.failures(method, route, r.status_code, answer)
    if problems:
        book.schema_failures += 1
        book.note(f"{op} {r.status_code}: schema: {problems[0][:200]}")
    if r.status_code >= 400:
        book.note(f"{op} {r.status_code}: {r.text[:200]}")
    return r.status_code, answer


async def run_clients(
    *,
    url: str,
    headers: dict[str, dict[str, str]],
    clients: int,
    rate: float,
    seconds: float,
    mix: Mix,
    schema: SchemaCheck,
    pool: list[str],
    seed: int,
    book: Book,
    t0: float,
) -> None:
    """``clients`` clients, spread over the tenants, until ``seconds`` after ``t0``."""
    tenants = list(headers)
    pacer = _Pacer(rate, t0, t0 + seconds)
    await asyncio.gather(
        *(
            _client(
                i,
                tenants[i % len(tenants)],
                headers[tenants[i % len(tenants)]],
                url,
                pacer,
                book,
                schema,
                mix,
                pool,
                seed,
                t0,
            )
            for i in range(clients)
        )
    )
