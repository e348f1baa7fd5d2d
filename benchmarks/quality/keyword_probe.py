"""Probe: keyword strategies inside Typesense 0.24.1 vs. exact BM25 on LoCoMo.

Starts a bare embedded Typesense in a temp dir, indexes every LoCoMo turn
(content as mapped by :func:`benchmarks.quality.locomo.conversation_memories`,
one tenant per conversation), then for every scored question (categories 1-4)
runs each keyword strategy as ONE ``POST /multi_search`` and scores evidence
recall@5/10/20. A pure-python Okapi BM25 over the same docs is the reference.

    . /tmp/probe/bin/activate
    python -m benchmarks.quality.keyword_probe [--data /work/shared/data/locomo] [--out benchmarks/results/keyword-probe.md]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec

from benchmarks.common import LOCOMO_DATA
from benchmarks.quality.locomo import Conversation, conversation_memories, load_conversations, sessions
from benchmarks.quality.metrics import mean, recall_at_k
from deploy.embedded import EmbeddedTypesense
from indexers.typesense import keyword_query

COLLECTION = "probe"
KS = (5, 10, 20)
IN_FLIGHT = 4
_WORD = re.compile(r"\w+")

# --------------------------------------------------------------------------- tokenization


def ts_tokens(text: str) -> list[str]:
    """Roughly Typesense 0.24's default tokenizer: split on whitespace, drop
    non-alphanumeric characters inside a token, lowercase."""
    out = []
    for w in text.split():
        t = "".join(c for c in w if c.isalnum()).lower()
        if t:
            out.append(t)
    return out


def query_terms(text: str, cap: int) -> list[str]:
    """Keyword-query words (stopwords out, as :func:`keyword_query`), normalized
    like the index does, deduplicated in order, at most ``cap``."""
    seen: list[str] = []
    for t in ts_tokens(keyword_query(text)):
        if t not in seen:
            seen.append(t)
    return seen[:cap]


def bm25_idf(n: int, df: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


# --------------------------------------------------------------------------- exact BM25 reference


class Okapi:
    """Pure-python Okapi BM25 (k1=1.5, b=0.75). ``rank_bm25=True`` uses
    rank_bm25's idf (ln((N-df+.5)/(df+.5)), negatives floored at 0.25 x mean idf);
    otherwise the Lucene idf ln(1 + (N-df+.5)/(df+.5))."""

    def __init__(self, docs: list[tuple[str, list[str]]], *, rank_bm25: bool, k1: float = 1.5, b: float = 0.75):
        self.ids = [d for d, _ in docs]
        self.tfs = [Counter(toks) for _, toks in docs]
        self.lens = [len(toks) for _, toks in docs]
        self.avgdl = sum(self.lens) / len(self.lens)
        self.k1, self.b = k1, b
        n = len(docs)
        df = Counter(t for tf in self.tfs for t in tf)
        if rank_bm25:
            raw = {t: math.log(n - f + 0.5) - math.log(f + 0.5) for t, f in df.items()}
            floor = 0.25 * (sum(raw.values()) / len(raw))
            self.idf = {t: (v if v >= 0 else floor) for t, v in raw.items()}
        else:
            self.idf = {t: bm25_idf(n, f) for t, f in df.items()}

    def rank(self, query: list[str], k: int = 20) -> list[str]:
        scores = []
        for i, tf in enumerate(self.tfs):
            s = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.lens[i] / self.avgdl)
            for q in query:
                f = tf.get(q, 0)
                if f:
                    s += self.idf[q] * f * (self.k1 + 1) / (f + norm)
            scores.append(s)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [self.ids[i] for i in order[:k]]


# --------------------------------------------------------------------------- strategies


@dataclass
class Tenant:
    name: str
    n: int  # documents
    avgdl: float  # mean ts_tokens length


@dataclass
class Strategy:
    name: str
    build: Callable[[str, Tenant], list[dict[str, Any]]]  # question -> searches (without collection/filter)
    rank: Callable[[str, Tenant, list[dict[str, Any]]], list[str]]  # results -> ranked doc ids
    note: str = ""
    collection: str = COLLECTION


def _ids(result: dict[str, Any]) -> list[str]:
    return [h["document"]["id"] for h in result.get("hits", [])]


def single(name: str, note: str = "", per_page: int = 50, **params: Any) -> Strategy:
    base = {"query_by": "content", "prefix": False, "num_typos": 1, "drop_tokens_threshold": per_page}
    base.update(params)

    def build(q: str, t: Tenant) -> list[dict[str, Any]]:
        text = keyword_query(q)
        return [{"q": text, "per_page": per_page, **base}] if text else []

    return Strategy(name, build, lambda q, t, rs: _ids(rs[0]) if rs else [], note)


def per_term(
    name: str,
    *,
    cap: int = 8,
    per_page: int = 250,
    num_typos: int = 0,
    prefix: bool = False,
    tf: str = "none",  # none | exact (true avgdl) | est (avgdl estimated from returned docs)
    k1: float = 1.2,
    b: float = 0.75,
    with_n: bool = True,
    note: str = "",
) -> Strategy:
    """One search per query term; score = sum of idf over terms whose search
    returned the doc (times a BM25 tf/length factor computed from the returned
    content when ``tf`` is not 'none')."""

    def build(q: str, t: Tenant) -> list[dict[str, Any]]:
        searches = [
            {
                "q": term,
                "query_by": "content",
                "prefix": prefix,
                "num_typos": num_typos,
                "drop_tokens_threshold": 0,
                "typo_tokens_threshold": 0 if num_typos == 0 else 1,
                "per_page": per_page,
                "include_fields": "id,content" if tf != "none" else "id",
                "highlight_fields": "none",
            }
            for term in query_terms(q, cap)
        ]
        if searches and with_n:
            searches.append({"q": "*", "per_page": 0})  # found = N of the tenant
        return searches

    def rank(q: str, t: Tenant, results: list[dict[str, Any]]) -> list[str]:
        terms = query_terms(q, cap)
        if not terms:
            return []
        n = results[-1]["found"] if with_n else t.n
        term_results = results[: len(terms)]
        scores: dict[str, float] = defaultdict(float)
        first: dict[str, tuple[int, int]] = {}
        contents: dict[str, list[str]] = {}
        for ti, res in enumerate(term_results):
            for pos, h in enumerate(res.get("hits", [])):
                doc = h["document"]
                first.setdefault(doc["id"], (pos, ti))
                if tf != "none":
                    contents.setdefault(doc["id"], ts_tokens(doc["content"]))
        if tf == "est" and contents:
            avgdl = sum(len(c) for c in contents.values()) / len(contents)
        else:
            avgdl = t.avgdl
        for term, res in zip(terms, term_results):
            idf = bm25_idf(n, res.get("found", 0))
            for h in res.get("hits", []):
                did = h["document"]["id"]
                if tf == "none":
                    scores[did] += idf
                else:
                    toks = contents[did]
                    f = sum(1 for x in toks if x == term) or 1  # typo/prefix match: count once
                    norm = k1 * (1 - b + b * len(toks) / avgdl)
                    scores[did] += idf * f * (k1 + 1) / (f + norm)
        return sorted(scores, key=lambda d: (-scores[d], first[d]))

    return Strategy(name, build, rank, note)


def hybrid(name: str, cap: int = 8, note: str = "") -> Strategy:
    """Per-term idf (+tf) score, ties broken by the current single search's rank."""
    pt = per_term("_", cap=cap, tf="est")
    base = single("_")

    def build(q: str, t: Tenant) -> list[dict[str, Any]]:
        return base.build(q, t) + pt.build(q, t)

    def rank(q: str, t: Tenant, rs: list[dict[str, Any]]) -> list[str]:
        if not rs:
            return []
        b = _ids(rs[0])
        order = {d: i for i, d in enumerate(b)}
        ranked = pt.rank(q, t, rs[1:])
        return _merge(ranked, order)

    return Strategy(name, build, rank, note)


def _merge(ranked: list[str], order: dict[str, int]) -> list[str]:
    # Stable: the per-term ranking decides; a bonus moves docs in the single search's top 10 up by rank.
    pos = {d: i for i, d in enumerate(ranked)}
    return sorted(ranked, key=lambda d: pos[d] - (10 - order[d]) * 0.5 if order.get(d, 99) < 10 else pos[d])


# --------------------------------------------------------------------------- harness


async def run_strategy(
    http: httpx.AsyncClient, s: Strategy, items: list[tuple[Conversation, Any, Tenant]]
) -> tuple[dict[int, float], float, float, int]:
    sem = asyncio.Semaphore(IN_FLIGHT)
    recalls: dict[int, list[float]] = {k: [] for k in KS}
    lat: list[float] = []
    nsearch: list[int] = []

    async def one(conv: Conversation, q: Any, t: Tenant) -> None:
        searches = s.build(q.text, t)
        filt = f"tenant:=`{t.name}`"
        body = {"searches": [{"collection": s.collection, "filter_by": filt, **x} for x in searches]}
        async with sem:
            t0 = time.perf_counter()
            results: list[dict[str, Any]] = []
            if searches:
                r = await http.post("/multi_search", content=msgspec.json.encode(body))
                r.raise_for_status()
                results = msgspec.json.decode(r.content)["results"]
                for res in results:
                    if "error" in res:
                        raise RuntimeError(f"{s.name}: {res}")
            ranked = s.rank(q.text, t, results)
            lat.append((time.perf_counter() - t0) * 1000)
        nsearch.append(len(searches))
        dias = [conv.dia_id(d) for d in ranked]
        for k in KS:
            recalls[k].append(recall_at_k([d for d in dias if d], q.evidence, k))

    await asyncio.gather(*(one(c, q, t) for c, q, t in items))
    return (
        {k: mean(v) for k, v in recalls.items()},
        statistics.median(lat),
        statistics.quantiles(lat, n=20)[18],
        round(mean(nsearch), 1),
    )


def reference(convs: list[Conversation], items, tenants) -> list[tuple[str, dict[int, float]]]:
    out = []
    for label, plain, rb in (
        ("exact BM25, rank_bm25 idf, `Speaker: text` (README reference)", True, True),
        ("exact BM25, rank_bm25 idf, indexed content (with image captions)", False, True),
        ("exact BM25, Lucene idf, indexed content", False, False),
        ("exact BM25, Lucene idf, indexed content, query = per-term terms (stopwords out)", False, "terms"),
        ("exact sum-idf (binary, all docs), query = per-term terms", False, "binary"),
    ):
        recalls: dict[int, list[float]] = {k: [] for k in KS}
        for conv in convs:
            if plain:
                docs = [
                    (t["dia_id"], _WORD.findall(f"{t['speaker']}: {t['text']}".lower()))
                    for _, turns in sessions(conv.raw)
                    for t in turns
                ]
            else:
                tok = ts_tokens if isinstance(rb, str) else (lambda x: _WORD.findall(x.lower()))
                docs = [(m["metadata"]["dia_id"], tok(m["content"])) for m in conversation_memories(conv)]
            bm = Okapi(docs, rank_bm25=rb is True)
            if rb == "binary":
                bm.k1, bm.b = 1e-9, 0.0  # tf saturates at once: score = sum idf
            for q in conv.questions:
                ranked = bm.rank(query_terms(q.text, 8) if isinstance(rb, str) else _WORD.findall(q.text.lower()))
                for k in KS:
                    recalls[k].append(recall_at_k(ranked, q.evidence, k))
        out.append((label, {k: mean(v) for k, v in recalls.items()}))
    return out


def strategies() -> list[Strategy]:
    return [
        single("(a) current: prefix=false, num_typos=1, drop_tokens_threshold=50, per_page=50"),
        single("(c1) drop_tokens_threshold=0", drop_tokens_threshold=0),
        single("(c2) drop_tokens_threshold=250, per_page=250", per_page=250, drop_tokens_threshold=250),
        single("(c3) num_typos=0", num_typos=0),
        single("(c4) prioritize_exact_match=false", prioritize_exact_match=False),
        single("(c5) exhaustive_search=true", exhaustive_search=True),
        single("(c6) prefix=true", prefix=True),
        single("(c7) prioritize_token_position=true", prioritize_token_position=True),
        per_term("(b1) per-term, sum idf, num_typos=0, per_page=250"),
        per_term("(b2) per-term, sum idf, num_typos=1", num_typos=1),
        per_term("(b11) = b2 with prefix=true", num_typos=1, prefix=True),
        per_term("(b12) = b2 with per_page=100", num_typos=1, per_page=100),
        per_term("(b14) = b11 with per_page=100", num_typos=1, prefix=True, per_page=100),
        per_term("(b15) = b11 without the q=* search (N known by caller)", num_typos=1, prefix=True, with_n=False),
        per_term("(b13) = b2 with cap 12 terms", num_typos=1, cap=12),
        per_term("(b3) per-term, sum idf, num_typos=0, per_page=100", per_page=100),
        per_term("(b4) per-term, BM25 tf from returned content, true avgdl", tf="exact"),
        per_term("(b5) per-term, BM25 tf from returned content, avgdl of returned docs", tf="est"),
        per_term("(b6) = b5 with num_typos=1", tf="est", num_typos=1),
        per_term("(b7) = b5 with prefix=true", tf="est", prefix=True),
        per_term("(b8) = b5, cap 12 terms", tf="est", cap=12),
        per_term("(b9) = b5, k1=1.5", tf="est", k1=1.5),
        per_term("(b10) = b5 without the q=* search (N known by caller)", tf="est", with_n=False),
        hybrid("(d1) b5 + current single search's top 10 as a boost"),
        _rev(single("(a') = a, documents imported in reverse order")),
        _rev(per_term("(b2') = b2, documents imported in reverse order", num_typos=1)),
    ]


def _rev(s: Strategy) -> Strategy:
    s.collection = COLLECTION + "_rev"
    return s


def table(rows: list[tuple[str, dict[int, float], str, str, str]]) -> str:
    lines = ["| strategy | R@5 | R@10 | R@20 | p50 ms | p95 ms | searches/request |", "|---|---|---|---|---|---|---|"]
    for name, r, p50, p95, ns in rows:
        lines.append(f"| {name} | {r[5]:.3f} | {r[10]:.3f} | {r[20]:.3f} | {p50} | {p95} | {ns} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    convs = load_conversations(Path(args.data))
    with tempfile.TemporaryDirectory(prefix="kwprobe-") as tmp:
        ts = EmbeddedTypesense(Path(tmp))
        url = ts.start()
        try:
            async with httpx.AsyncClient(base_url=url, headers={"X-TYPESENSE-API-KEY": ts.api_key}, timeout=30) as http:
                r = await http.post(
                    "/collections",
                    json={
                        "name": COLLECTION,
                        "fields": [
                            {"name": "tenant", "type": "string", "facet": True},
                            {"name": "content", "type": "string"},
                        ],
                    },
                )
                r.raise_for_status()
                tenants: dict[str, Tenant] = {}
                lines = []
                for conv in convs:
                    mems = conversation_memories(conv)
                    lens = [len(ts_tokens(m["content"])) for m in mems]
                    tenants[conv.id] = Tenant(conv.tenant, len(mems), sum(lens) / len(lens))
                    lines += [
                        msgspec.json.encode({"id": m["id"], "tenant": conv.tenant, "content": m["content"]}).decode()
                        for m in mems
                    ]
                for name, order in ((COLLECTION, lines), (COLLECTION + "_rev", lines[::-1])):
                    if name != COLLECTION:
                        r = await http.post(
                            "/collections",
                            json={
                                "name": name,
                                "fields": [
                                    {"name": "tenant", "type": "string", "facet": True},
                                    {"name": "content", "type": "string"},
                                ],
                            },
                        )
                        r.raise_for_status()
                    r = await http.post(f"/collections/{name}/documents/import?action=create", content="\n".join(order))
                    r.raise_for_status()
                    bad = [x for x in r.text.splitlines() if '"success":true' not in x]
                    assert not bad, bad[:3]
                items = [(c, q, tenants[c.id]) for c in convs for q in c.questions]
                print(f"{len(lines)} docs, {len(items)} questions", flush=True)
                # warm-up
                await run_strategy(http, strategies()[0], items[:50])
                rows = []
                for s in strategies():
                    rec, p50, p95, ns = await run_strategy(http, s, items)
                    rows.append((s.name, rec, f"{p50:.1f}", f"{p95:.1f}", str(ns)))
                    print(
                        f"{s.name}: R@5 {rec[5]:.3f} R@10 {rec[10]:.3f} R@20 {rec[20]:.3f} p50 {p50:.1f} ms p95 {p95:.1f} ms searches {ns}",
                        flush=True,
                    )
        finally:
            ts.stop()
    for label, rec in reference(convs, items, tenants):
        rows.append((label, rec, "-", "-", "-"))
        print(f"{label}: R@5 {rec[5]:.3f} R@10 {rec[10]:.3f} R@20 {rec[20]:.3f}", flush=True)
    Path(args.table).write_text(table(rows) + "\n")
    print(table(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", type=Path, default=LOCOMO_DATA)
    p.add_argument("--table", default="/tmp/keyword-probe-table.md")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
