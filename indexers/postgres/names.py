"""Entity names: how they compare, and the names a text could mention."""

from __future__ import annotations

import re

__all__ = ["entity_text", "name_candidates", "normalize_name"]

_WORD_RE = re.compile(r"\w+", re.UNICODE)
#: Stripped from the ends of a whitespace token ("Node.js," -> "Node.js"); not `+` or `#`.
_EDGE_PUNCT = ".,;:!?\"'`()[]{}<>«»“”‘’"


def normalize_name(name: str) -> str:
    """Entity names are unique per tenant, case- and space-insensitively."""
    return " ".join(name.split()).casefold()


def name_candidates(text: str, *, max_words: int = 4) -> list[str]:
    """Normalised 1..max_words-grams of ``text``: the names it could mention.

    Grams are taken over its words (``\\w+``) and over its whitespace tokens
    trimmed of surrounding punctuation, so names with inner punctuation
    (``Node.js``, ``C++``) are found as well.
    """
    tokens = (t.strip(_EDGE_PUNCT) for t in text.split())
    grams: set[str] = set()
    for words in (
        [w.casefold() for w in _WORD_RE.findall(text)],
        [t.casefold() for t in tokens if t],
    ):
        grams.update(" ".join(words[i : i + n]) for n in range(1, max_words + 1) for i in range(len(words) - n + 1))
    return sorted(grams)


def entity_text(name: str, summary: str | None) -> str:
    """The text an entity's embedding is made of: its name, and its summary if it has one."""
    return f"{name}: {summary}" if summary else name
