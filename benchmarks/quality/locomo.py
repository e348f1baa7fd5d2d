"""LoCoMo conversations as Braid memories, and their questions with evidence.

A LoCoMo file (``locomo10_v2`` layout) is one conversation: ``session_N`` turn
lists, ``session_N_date_time`` strings, and a ``qa`` list. The mapping from
conversation to memories lives in :func:`conversation_memories` alone and
reads only the sessions, never ``qa``, ``events_*``, ``*_observation`` or
``*_summary``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from indexers.typesense import STOPWORDS

__all__ = [
    "Conversation",
    "MappingOptions",
    "Question",
    "conversation_memories",
    "load_conversations",
    "parse_session_date",
]

SCORED_CATEGORIES = (1, 2, 3, 4)
_SESSION = re.compile(r"^session_(\d+)$")
_DATE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.I)
_MONTHS = {
    m: i
    for i, m in enumerate(
        (
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ),
        start=1,
    )
}
# Evidence ids as written in the files, including the odd ones ("D:11:26").
_EVIDENCE = re.compile(r"^D:?(\d+):(\d+)$")


@dataclass(frozen=True)
class MappingOptions:
    """How much of the surrounding session each memory's ``context`` holds, and
    whether the benchmark names entities (``--derived-entities``).

    ``context``: up to ``context_before`` preceding and ``context_after``
    following turns of the same session, one per line (preceding first, in
    order). It is indexed for keyword search but never shown in the memory
    block; ``content`` is the turn alone.
    """

    context_before: int = 2
    context_after: int = 1
    #: Name the turn's entities as the benchmark derives them (see
    #: :func:`turn_entities`). Off by default: a memory is sent as an agent
    #: runtime sends a turn (text, speaker, date, session, context), and the
    #: graph knows what Braid extracts itself (``graph.extract``).
    entities: bool = False

    def __post_init__(self) -> None:
        if self.context_before < 0 or self.context_after < 0:
            got = f"got {self.context_before} before, {self.context_after} after"
            raise ValueError(f"context turns must be >= 0, {got}")


@dataclass(frozen=True)
class Question:
    index: int  # position in the file's qa list
    text: str
    category: int
    evidence: frozenset[str]  # normalized dia_ids that name a turn of the conversation


@dataclass(frozen=True)
class Conversation:
    id: str  # the file stem, e.g. "26"
    raw: dict[str, Any]
    questions: tuple[Question, ...]
    dropped_evidence: tuple[str, ...]  # evidence entries naming no turn
    unscored: int  # questions of categories 1-4 left with no evidence

    @property
    def tenant(self) -> str:
        return f"locomo-{self.id}"

    def memory_id(self, dia_id: str) -> str:
        return f"{self.tenant}:{dia_id}"

    def dia_id(self, memory_id: str) -> str | None:
        prefix = f"{self.tenant}:"
        return memory_id[len(prefix) :] if memory_id.startswith(prefix) else None


def parse_session_date(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> 2023-05-08 13:56 UTC."""
    m = _DATE.match(text)
    if m is None or m.group(5).lower() not in _MONTHS:
        raise ValueError(f"unrecognized session date: {text!r}")
    hour, minute, ampm, day, month, year = m.groups()
    h = int(hour) % 12 + (12 if ampm.lower() == "pm" else 0)
    return datetime(int(year), _MONTHS[month.lower()], int(day), h, int(minute), tzinfo=UTC)


def sessions(conv: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """``[(N, turns)]`` in session order, for the non-empty ``session_N`` lists."""
    found = []
    for key, value in conv.items():
        m = _SESSION.match(key)
        if m and isinstance(value, list) and value:
            found.append((int(m.group(1)), value))
    return sorted(found, key=lambda s: s[0])


def _turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [image: {turn['blip_caption']}]"
    return text


_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*[A-Za-z]")
_PROPER = re.compile(r"\b[A-Z][a-zA-Z]+(?:\s+[A-Z][a-zA-Z]+)+\b")
_ENTITY_STOP = STOPWORDS | frozenset(
    """
    also just like really much many more most thanks thank yeah yes okay great good
    glad sure know think thing things stuff that's it's i'm you're i've i'll we're
    they're what's there's been being have going doing feel feeling felt lots
    always every even ever still well wow hey awesome amazing cool totally
    """.split()
)
#: Most entities named per memory (the API's limit).
MAX_ENTITIES = 64


def turn_entities(turn: dict[str, Any], speakers: frozenset[str]) -> list[str]:
    """What a turn talks about, from its text and image caption alone: its
    multi-word proper names ("Harry Potter") and its content words of four
    letters or more, lower-cased; the speakers' own names are left out.

    A crude stand-in for the entity extraction an agent runtime would run
    (an LLM or NER model); the graph links and seeds on these names.
    """
    text = f"{turn['text']} {turn.get('blip_caption') or ''}"
    found: list[str] = []
    for m in _PROPER.finditer(text):
        name = m.group(0)
        if name not in speakers and name.lower() not in found:
            found.append(name.lower())
    for m in _WORD.finditer(text):
        word = m.group(0).lower().strip("'-")
        if len(word) >= 4 and word not in _ENTITY_STOP and m.group(0) not in speakers:
            if word not in found:
                found.append(word)
    return found[:MAX_ENTITIES]


def conversation_memories(conv: Conversation, options: MappingOptions = MappingOptions()) -> list[dict[str, Any]]:
    """Every turn as one ``POST /v1/memories`` item in the ``session`` tier.

    ``id`` is ``<tenant>:<dia_id>`` (see :meth:`Conversation.dia_id`);
    ``created_at`` is the session's date (UTC); ``speaker`` is who said it;
    ``context`` (left out when empty) is described in :class:`MappingOptions`.
    Reads the sessions only.
    """
    memories = []
    speakers = frozenset(t["speaker"] for _, turns in sessions(conv.raw) for t in turns)
    for n, turns in sessions(conv.raw):
        created = parse_session_date(conv.raw[f"session_{n}_date_time"]).isoformat().replace("+00:00", "Z")
        for i, turn in enumerate(turns):
            around = turns[max(0, i - options.context_before) : i] + turns[i + 1 : i + 1 + options.context_after]
            memory: dict[str, Any] = {
                "id": conv.memory_id(turn["dia_id"]),
                "content": _turn_text(turn),
                "speaker": turn["speaker"],
                "kind": "turn",
                "tier": "session",
                "session_id": f"session_{n}",
                "created_at": created,
                "metadata": {"dia_id": turn["dia_id"], "speaker": turn["speaker"]},
            }
            if around:
                memory["context"] = "\n".join(_turn_text(t) for t in around)
            if options.entities:
                memory["entities"] = turn_entities(turn, speakers)
            memories.append(memory)
    return memories


def _normalize_evidence(raw: list[str], known: set[str]) -> tuple[set[str], list[str]]:
    kept: set[str] = set()
    dropped: list[str] = []
    for entry in raw:
        for part in re.split(r"[;,]", entry):
            m = _EVIDENCE.match(part.strip())
            dia = f"D{m.group(1)}:{m.group(2)}" if m else part.strip()
            if dia in known:
                kept.add(dia)
            else:
                dropped.append(part.strip())
    return kept, dropped


def load_conversations(data: Path) -> list[Conversation]:
    """Every ``*.json`` under ``data``, with its scored questions (categories 1-4).

    Evidence is normalized (``"D8:6; D9:17"`` is two ids, ``"D:11:26"`` is
    ``D11:26``); entries naming no turn are dropped and recorded, and a
    question left with no evidence is not scored.
    """
    conversations = []
    for file in sorted(data.glob("*.json")):
        raw = json.loads(file.read_text())
        known = {t["dia_id"] for _, turns in sessions(raw) for t in turns}
        questions, dropped, unscored = [], [], 0
        for index, qa in enumerate(raw.get("qa", [])):
            if qa.get("category") not in SCORED_CATEGORIES:
                continue
            evidence, bad = _normalize_evidence(qa.get("evidence", []), known)
            dropped += bad
            if evidence:
                questions.append(Question(index, qa["question"], qa["category"], frozenset(evidence)))
            else:
                unscored += 1
        conv_id = re.sub(r"[^A-Za-z0-9_\-]", "_", file.stem)
        conversations.append(Conversation(conv_id, raw, tuple(questions), tuple(dropped), unscored))
    if not conversations:
        raise SystemExit(f"no LoCoMo *.json files under {data}")
    return conversations
