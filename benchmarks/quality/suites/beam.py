"""BEAM 100K as a quality suite: one tenant per chat, every message a memory.

Data: a folder laid out like ``../shared/data/beam`` (its README), holding
``100K/<n>/`` with ``chat.json`` (or ``chat_trunecated.json``, which is used
when present, as BEAM's own code does) and
``probing_questions/probing_questions.json``. A message's memory id is
``beam-<n>:<message id>``; its ``created_at`` is its session's
``time_anchor`` (UTC midnight) plus its position in the session in seconds,
as an agent runtime records each message's own time; its ``session_id`` is
``batch-<batch_number>``. Every question is asked one day after the chat's
last session date.

Scored categories, per question then averaged (README "How a retrieval
benchmark uses it"):

* ``knowledge_update``: with r_new / r_old the best rank of an
  ``updated_info`` / ``original_info`` message (not returned: infinity),
  ``new_above_old`` = r_new < r_old, ``new@10`` = r_new <= 10, ``pass`` =
  both; a question whose ``updated_info`` is empty or shares an id with
  ``original_info`` is skipped;
* ``contradiction_resolution``: ``both@10``, some ``first_statement`` and
  some ``second_statement`` message in the top 10 (one message may be both);
* ``information_extraction``, ``multi_session_reasoning``,
  ``temporal_reasoning`` (gold = ``first_event`` and ``second_event``):
  ``any@10`` and ``all@10`` of the gold messages.

A question with no gold message is skipped too, and recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..bm25 import OkapiBM25, word_tokens
from ..locomo import MappingOptions
from ..metrics import best_rank, mean, recall_all, recall_any
from ..naive import rrf
from .common import Column, Query, Turn, at_position, turn_memories

__all__ = ["Beam", "BeamQuestion", "Chat", "parse_beam_date", "score_question"]

SCORED = (
    "knowledge_update",
    "contradiction_resolution",
    "information_extraction",
    "multi_session_reasoning",
    "temporal_reasoning",
)
METRICS = {
    "knowledge_update": ("new_above_old", "new@10", "pass"),
    "contradiction_resolution": ("both@10",),
    "information_extraction": ("any@10", "all@10"),
    "multi_session_reasoning": ("any@10", "all@10"),
    "temporal_reasoning": ("any@10", "all@10"),
}
_MONTHS = ("january february march april may june july august september october november december").split()


def parse_beam_date(text: str) -> datetime:
    """``"March-15-2024"`` -> 2024-03-15 00:00 UTC."""
    try:
        month, day, year = text.strip().split("-")
        return datetime(int(year), _MONTHS.index(month.lower()) + 1, int(day), tzinfo=UTC)
    except ValueError:
        raise ValueError(f"unrecognized BEAM date: {text!r}") from None


@dataclass(frozen=True)
class BeamQuestion:
    key: str  # "<chat>/<category>/<index>"
    category: str
    text: str
    #: Gold message ids by role: ``old``/``new``, ``first``/``second``, or ``gold``.
    gold: Mapping[str, frozenset[int]]


@dataclass
class Chat:
    n: str
    file: str
    sessions: list[list[Turn]]
    #: The last session's date.
    last_date: datetime
    questions: list[BeamQuestion] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def tenant(self) -> str:
        return f"beam-{self.n}"

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s]

    @property
    def asked_at(self) -> datetime:
        """One day after the last session's date."""
        return self.last_date + timedelta(days=1)


def _flat(ids: Any) -> Iterable[int]:
    """Message ids from a list that may nest lists (event_ordering)."""
    for item in ids:
        if isinstance(item, list):
            yield from _flat(item)
        else:
            yield int(item)


def _gold(category: str, source: Any) -> dict[str, frozenset[int]]:
    if category == "knowledge_update":
        return {"old": frozenset(_flat(source["original_info"])), "new": frozenset(_flat(source["updated_info"]))}
    if category == "contradiction_resolution":
        return {
            "first": frozenset(_flat(source["first_statement"])),
            "second": frozenset(_flat(source["second_statement"])),
        }
    if category == "temporal_reasoning":
        return {"gold": frozenset(_flat(source["first_event"])) | frozenset(_flat(source["second_event"]))}
    return {"gold": frozenset(_flat(source))}


def _skip_reason(q: BeamQuestion, known: set[int]) -> str | None:
    unknown = sorted(i for ids in q.gold.values() for i in ids if i not in known)
    if unknown:
        return f"{q.key}: ids {unknown} name no message"
    if q.category == "knowledge_update":
        if not q.gold["new"]:
            return f"{q.key}: updated_info is empty"
        if q.gold["new"] & q.gold["old"]:
            return f"{q.key}: updated_info shares {sorted(q.gold['new'] & q.gold['old'])} with original_info"
    if any(not ids for ids in q.gold.values()):
        return f"{q.key}: no gold message"
    return None


def load_chat(folder: Path) -> Chat:
    file = folder / "chat_trunecated.json"
    if not file.exists():
        file = folder / "chat.json"
    raw = json.loads(file.read_text())
    chat = Chat(folder.name, file.name, [], datetime.min.replace(tzinfo=UTC))
    for batch in raw:
        messages = [m for turn in batch["turns"] for m in turn]
        anchor = messages[0].get("time_anchor")
        if not anchor:
            raise SystemExit(f"{file}: batch {batch['batch_number']} has no time_anchor on its first message")
        start = parse_beam_date(anchor)
        sid = f"batch-{batch['batch_number']}"
        chat.sessions.append(
            [
                Turn(f"{chat.tenant}:{m['id']}", m["role"], m["content"], sid, at_position(start, pos), {"id": m["id"]})
                for pos, m in enumerate(messages)
            ]
        )
        chat.last_date = start
    known = {int(t.metadata["id"]) for t in chat.turns}
    probing = json.loads((folder / "probing_questions" / "probing_questions.json").read_text())
    for category in SCORED:
        for index, item in enumerate(probing.get(category, [])):
            gold = _gold(category, item.get("source_chat_ids", []))
            q = BeamQuestion(f"{chat.n}/{category}/{index}", category, item["question"], gold)
            reason = _skip_reason(q, known)
            if reason is None:
                chat.questions.append(q)
            else:
                chat.skipped.append(reason)
    return chat


def score_question(q: BeamQuestion, ranked: Sequence[str], message_id: Mapping[str, int]) -> dict[str, float]:
    """The question's figures (see the module docstring) from its ranking of memory ids."""
    ids = [str(message_id[m]) for m in ranked if m in message_id]
    gold = {role: {str(i) for i in v} for role, v in q.gold.items()}
    if q.category == "knowledge_update":
        r_new, r_old = best_rank(ids, gold["new"]), best_rank(ids, gold["old"])
        above, top = float(r_new < r_old), float(r_new <= 10)
        return {"new_above_old": above, "new@10": top, "pass": above * top}
    if q.category == "contradiction_resolution":
        return {"both@10": float(best_rank(ids, gold["first"]) <= 10 and best_rank(ids, gold["second"]) <= 10)}
    return {"any@10": recall_any(ids, gold["gold"], 10), "all@10": recall_all(ids, gold["gold"], 10)}


class Beam:
    """The suite (see the module docstring); ``limit`` keeps the first chats (by number) only."""

    name = "beam"
    headline: list[Column] = [
        ("knowledge_update", "pass"),
        ("knowledge_update", "new_above_old"),
        ("knowledge_update", "new@10"),
        ("contradiction_resolution", "both@10"),
    ]
    tables = {"per category": [(c, m) for c in SCORED for m in METRICS[c]]}
    #: ``../shared/data/beam/README.md``: naive BM25 (rank_bm25 defaults, lower-cased ``\\w+``).
    reference = {
        "README BM25 (\\w+)": {
            ("knowledge_update", "new_above_old"): 0.421,
            ("knowledge_update", "new@10"): 0.789,
            ("knowledge_update", "pass"): 0.421,
            ("contradiction_resolution", "both@10"): 0.500,
            ("information_extraction", "any@10"): 0.750,
            ("information_extraction", "all@10"): 0.550,
            ("multi_session_reasoning", "any@10"): 0.700,
            ("multi_session_reasoning", "all@10"): 0.100,
            ("temporal_reasoning", "any@10"): 0.950,
            ("temporal_reasoning", "all@10"): 0.550,
        }
    }

    #: LoCoMo's mapping (the API's limit): BEAM's 2,506 messages are written in minutes.
    max_entities = 64
    notes: list[str] = []

    def __init__(self, data: Path, limit: int = 0) -> None:
        self.data = data
        folders = sorted((p for p in (data / "100K").glob("*") if p.is_dir()), key=lambda p: (len(p.name), p.name))
        if not folders:
            raise SystemExit(f"no BEAM chats under {data / '100K'}")
        self.chats = [load_chat(f) for f in folders[: limit or None]]
        self.message_id = {t.id: int(t.metadata["id"]) for c in self.chats for t in c.turns}
        self._asked = [(c, q) for c in self.chats for q in c.questions]

    def tenants(self) -> list[str]:
        return [c.tenant for c in self.chats]

    def memories(
        self, tenant: str, options: MappingOptions, max_chars: int, max_entities: int
    ) -> tuple[list[dict[str, Any]], int]:
        (chat,) = (c for c in self.chats if c.tenant == tenant)
        out: list[dict[str, Any]] = []
        cut = 0
        for session in chat.sessions:
            memories, n = turn_memories(session, options, max_chars, max_entities)
            out += memories
            cut += n
        return out, cut

    def queries(self) -> list[Query]:
        return [Query(q.key, c.tenant, q.text, c.asked_at, q.category) for c, q in self._asked]

    def describe(self) -> dict[str, Any]:
        turns = [t for c in self.chats for t in c.turns]
        return {
            "chats": {c.n: {"file": c.file, "sessions": len(c.sessions), "messages": len(c.turns)} for c in self.chats},
            "messages": len(turns),
            "user_messages": sum(1 for t in turns if t.role == "user"),
            "content_chars": sum(len(t.content) for t in turns),
            "asked": {k: sum(1 for _, q in self._asked if q.category == k) for k in SCORED},
            "skipped": [s for c in self.chats for s in c.skipped],
        }

    def score(self, rankings: Sequence[Sequence[str]]) -> dict[str, Any]:
        rows = [(q, score_question(q, r, self.message_id)) for (_, q), r in zip(self._asked, rankings, strict=True)]
        by_kind = {
            k: {"n": len(sel), **{m: mean(s[m] for s in sel) for m in METRICS[k]}}
            for k in SCORED
            for sel in [[s for q, s in rows if q.category == k]]
        }
        ku, cr = by_kind["knowledge_update"], by_kind["contradiction_resolution"]
        return {
            "overall": {
                "ku_pass": ku["pass"],
                "new_above_old": ku["new_above_old"],
                "new@10": ku["new@10"],
                "contradiction_both@10": cr["both@10"],
            },
            "by_kind": by_kind,
            "per_question": {q.key: s for q, s in rows},
        }

    def naive_rankings(
        self, vectors: Mapping[str, np.ndarray], query_vectors: Sequence[np.ndarray]
    ) -> dict[str, list[list[str]]]:
        out: dict[str, list[list[str]]] = {"bm25": [], "minilm": [], "rrf": []}
        indexes = {}
        for chat in self.chats:
            turns = chat.turns
            indexes[chat.tenant] = (
                [t.id for t in turns],
                OkapiBM25([word_tokens(t.content) for t in turns]),
                np.stack([vectors[t.id] for t in turns]),
            )
        for (chat, q), qv in zip(self._asked, query_vectors, strict=True):
            ids, bm25, doc_vectors = indexes[chat.tenant]
            by_bm25 = [ids[i] for i in bm25.ranking(word_tokens(q.text))]
            by_minilm = [ids[i] for i in np.argsort(-(doc_vectors @ qv), kind="stable")]
            out["bm25"].append(by_bm25)
            out["minilm"].append(by_minilm)
            out["rrf"].append(rrf([by_bm25, by_minilm]))
        return out

    def summary_line(self, report: Mapping[str, Any]) -> str:
        o = report["configs"]["fused"]["overall"]
        return (
            f"beam: ku_pass={o['ku_pass']:.3f} new_above_old={o['new_above_old']:.3f} new@10={o['new@10']:.3f}"
            f" contradiction_both@10={o['contradiction_both@10']:.3f}"
        )
