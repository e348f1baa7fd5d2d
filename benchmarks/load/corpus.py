"""A reproducible synthetic corpus for the load benchmark.

Everything comes from one seeded ``numpy`` generator, so a size and a seed
always give the same memories, relations and queries:

* one big tenant with ``size`` memories and ``small_tenants`` tenants with
  ``small_size`` memories each;
* short texts built from templates over a per-tenant vocabulary of people,
  places, projects, verbs and dates; 70 % tier ``session`` (with a speaker and
  a session id), 30 % tier ``rag``; 1-3 entity names taken from the text;
* 384-d L2-normalised vectors drawn around ``clusters`` Gaussian centres, so
  nearest-neighbour search is not trivially easy for HNSW;
* a few hundred graph relations per tenant;
* ``queries`` queries on the big tenant: template text about a corpus memory,
  vector = that memory's vector perturbed and re-normalised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

__all__ = ["BIG_TENANT", "DIM", "Corpus", "Tenant", "build_corpus", "describe"]

DIM = 384
BIG_TENANT = "big"

FIRST = (
    "Alex Sam Maya Jonas Priya Liam Noor Elena Tomas Aiko Omar Grace Felix Ines Ravi Zoe "
    "Hugo Lena Marco Nadia Oskar Rosa Theo Yara Caleb Dana Emil Freya Ivan Julia Kofi Lucia "
    "Mateo Nina Pavel Quinn Rhea Soren Tara Viktor"
).split()
LAST = (
    "Okafor Lindqvist Moreau Tanaka Novak Haddad Costa Berg Ibarra Kowalski Mensah Rossi "
    "Sato Varga Weber Young Zhang Adler Brandt Celik Duarte Eriksen Farah Gallo Hoang Iversen"
).split()
PLACES = (
    "Lisbon Oslo Nairobi Kyoto Denver Porto Krakow Austin Lyon Tallinn Seoul Dublin Quito "
    "Ghent Malmo Leeds Bergen Utrecht Valencia Turin Halifax Tucson Aarhus Brno Cork Bilbao "
    "Graz Perth Adelaide Toulouse"
).split()
PROJECTS = (
    "Atlas Beacon Cobalt Delta Ember Falcon Granite Harbor Indigo Juniper Keystone Lantern "
    "Meridian Nimbus Orchid Polaris Quartz Raven Sierra Tundra Umbra Vertex Willow Xenon "
    "Yukon Zephyr Aurora Basalt Cedar Dune"
).split()
VERBS = (
    "reviewed shipped postponed demoed debugged planned cancelled estimated documented "
    "refactored benchmarked migrated approved questioned presented tested"
).split()
TOPICS = (
    "the billing flow|the onboarding checklist|the search latency|the quarterly budget|"
    "the data migration|the mobile release|the hiring plan|the security audit|the API limits|"
    "the design review|the backup policy|the customer feedback|the launch timeline|"
    "the pricing page|the load tests|the incident report"
).split("|")
RELATIONS = ("works_on", "lives_in", "manages", "mentors", "depends_on", "visited", "leads", "knows")

TEMPLATES = (
    "{person} {verb} {topic} for project {project} in {place} on {date}.",
    "On {date} {person} and {other} {verb} {topic} of {project}.",
    "{person} said project {project} {verb} {topic} after the trip to {place}.",
    "Note from {place}: {person} {verb} {topic}; {other} will follow up by {date}.",
    "{project} status: {topic} {verb} by {person}, next review {date}.",
    "{person} prefers to discuss {topic} with {other} before {project} moves to {place}.",
)
QUERY_TEMPLATES = (
    "what did {person} say about {project}",
    "who {verb} {topic} for {project}",
    "when did {person} go to {place}",
    "{topic} {project} {place}",
    "what happened with {topic} on {date}",
)
START = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass
class Tenant:
    name: str
    memories: list[dict[str, Any]]
    vectors: np.ndarray  # (n, DIM) float32, unit rows
    entities: list[dict[str, Any]]
    relations: list[dict[str, Any]]


@dataclass
class Corpus:
    seed: int
    size: int
    tenants: list[Tenant]
    queries: list[dict[str, Any]]  # {"text", "target"} on the big tenant
    query_vectors: np.ndarray  # (q, DIM) float32, unit rows
    clusters: int
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def big(self) -> Tenant:
        return self.tenants[0]

    @property
    def total(self) -> int:
        return sum(len(t.memories) for t in self.tenants)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _vocab(rng: np.random.Generator) -> dict[str, list[str]]:
    people = sorted({f"{rng.choice(FIRST)} {rng.choice(LAST)}" for _ in range(160)})
    return {
        "people": people[:120],
        "places": list(rng.choice(PLACES, size=20, replace=False)),
        "projects": list(rng.choice(PROJECTS, size=20, replace=False)),
    }


def _slots(rng: np.random.Generator, vocab: dict[str, list[str]]) -> dict[str, str]:
    person, other = rng.choice(vocab["people"], size=2, replace=False)
    day = START + timedelta(days=int(rng.integers(0, 700)))
    return {
        "person": str(person),
        "other": str(other),
        "place": str(rng.choice(vocab["places"])),
        "project": str(rng.choice(vocab["projects"])),
        "verb": str(rng.choice(VERBS)),
        "topic": str(rng.choice(TOPICS)),
        "date": f"{day.day} {day:%B %Y}",
        "_created": day.isoformat().replace("+00:00", "Z"),
    }


def _tenant(
    name: str,
    n: int,
    rng: np.random.Generator,
    centres: np.ndarray,
    relations: int,
    noise: float,
) -> tuple[Tenant, list[dict[str, str]]]:
    vocab = _vocab(rng)
    assign = rng.integers(0, len(centres), size=n)
    vectors = _unit(centres[assign] + rng.standard_normal((n, DIM)) * noise / np.sqrt(DIM))
    tiers = np.where(rng.random(n) < 0.7, "session", "rag")
    memories, slots = [], []
    for i in range(n):
        s = _slots(rng, vocab)
        text = TEMPLATES[int(rng.integers(0, len(TEMPLATES)))].format(**s)
        names = [s["person"], s["project"], s["place"]]
        ents = [x for x in names if x in text][: int(rng.integers(1, 4))]
        m: dict[str, Any] = {
            "id": f"{name}-{i:07d}",
            "content": text,
            "tier": str(tiers[i]),
            "kind": "note",
            "created_at": s["_created"],
            "entities": ents,
        }
        if m["tier"] == "session":
            m["speaker"] = s["person"]
            m["session_id"] = f"s{i // 40:05d}"
        memories.append(m)
        slots.append(s)
    entities = (
        [{"name": p, "type": "person"} for p in vocab["people"]]
        + [{"name": p, "type": "place"} for p in vocab["places"]]
        + [{"name": p, "type": "project"} for p in vocab["projects"]]
    )
    everything = [e["name"] for e in entities]
    rels = []
    for _ in range(relations):
        a, b = rng.choice(everything, size=2, replace=False)
        rels.append(
            {
                "source": str(a),
                "relation": str(rng.choice(RELATIONS)),
                "target": str(b),
                "weight": round(float(rng.uniform(0.2, 1.0)), 3),
            }
        )
    return Tenant(name, memories, vectors, entities, rels), slots


def build_corpus(
    size: int,
    *,
    seed: int = 7,
    small_tenants: int = 50,
    small_size: int = 200,
    clusters: int = 200,
    noise: float = 1.0,
    queries: int = 500,
    query_noise: float = 0.3,
    relations: int = 300,
) -> Corpus:
    """The corpus for ``size`` memories in the big tenant (see module docstring)."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.standard_normal((clusters, DIM)))
    big, slots = _tenant(BIG_TENANT, size, rng, centres, relations, noise)
    tenants = [big]
    for t in range(small_tenants):
        tenants.append(_tenant(f"t{t:02d}", small_size, rng, centres, relations, noise)[0])
    targets = rng.integers(0, size, size=queries)
    qvec = _unit(big.vectors[targets] + rng.standard_normal((queries, DIM)) * query_noise / np.sqrt(DIM))
    qs = []
    for q, target in enumerate(targets):
        s = slots[int(target)]
        text = QUERY_TEMPLATES[q % len(QUERY_TEMPLATES)].format(**s)
        qs.append({"text": text, "target": big.memories[int(target)]["id"]})
    params = {
        "small_tenants": small_tenants,
        "small_size": small_size,
        "clusters": clusters,
        "noise": noise,
        "query_noise": query_noise,
        "relations_per_tenant": relations,
    }
    return Corpus(seed, size, tenants, qs, qvec, clusters, params)


def describe(corpus: Corpus) -> str:
    p = corpus.params
    return (
        f"seed {corpus.seed}; tenant `{BIG_TENANT}` with {corpus.size} memories plus "
        f"{p['small_tenants']} tenants x {p['small_size']} ({corpus.total} memories in all); "
        f"~70% tier `session` (speaker, session id), ~30% `rag`; 1-3 entities per memory; "
        f"{p['relations_per_tenant']} graph relations per tenant; {DIM}-d unit vectors around "
        f"{corpus.clusters} Gaussian centres (noise norm ~{p['noise']}); "
        f"{len(corpus.queries)} queries = template text + a corpus vector perturbed by noise norm ~{p['query_noise']}"
    )
