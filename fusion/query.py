"""Query analysis: the speakers and calendar dates a recall query names.

``"What did Caroline paint in July 2023?"`` asks about memories Caroline
said, from July 2023, about painting. The names and dates are structure, not
topic: left in the searched text they pull the keyword and vector searches
towards every memory that mentions Caroline or a month. :func:`analyze_query`
takes them out of the text the sources search and hands them to the
post-fusion factors (:mod:`fusion.factors`) instead.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable
from datetime import date, timedelta

import msgspec

__all__ = ["QueryPlan", "addressed", "analyze_query", "asks_current", "date_ranges", "other_party", "relative_ranges"]

_MONTHS = {
    name: number for number, full in enumerate(calendar.month_name) if full for name in (full.lower(), full[:3].lower())
}
_MONTH = r"(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(\d{4})"
# Most specific first: a span taken by one pattern is not read again by a later one.
_PATTERNS = (
    ("dmy", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?:,\s*|\s+){_YEAR}\b", re.I)),
    ("mdy", re.compile(rf"\b{_MONTH}\s+{_DAY}(?:,\s*|\s+){_YEAR}\b", re.I)),
    ("my", re.compile(rf"\b{_MONTH}(?:,\s*|\s+)(?:of\s+)?{_YEAR}\b", re.I)),
    ("y", re.compile(r"\b(?:in\s+)?(19\d\d|20\d\d)\b", re.I)),
)
_SPACES = re.compile(r"\s+")

# Words that set a question's tense: its first one decides (see asks_current).
# "has"/"have" are not among them: "What has Maria done?" asks what happened.
_PRESENT = "is are am 's 're do does don't doesn't can should will shall".split()
_PAST = "was were did didn't had 'd used".split()
_TENSE = re.compile(r"(?<![\w'])(" + "|".join(re.escape(w) for w in _PRESENT + _PAST) + r")(?![\w'])", re.I)
_NOW = re.compile(r"\b(current|currently|now|latest|these days|at the moment|still)\b", re.I)
#: The first person singular: "I", "I'm", "me", "my", "mine", "myself".
_SELF = re.compile(r"(?<![\w'])(?:i|me|my|mine|myself)(?!\w)", re.I)
#: The query asks what the one it talks to said or did ("what did you
#: recommend", "you told me"): about the other party's words, not its own.
_YOURS = re.compile(
    r"(?<![\w'])(?:"
    r"you(?:'ve|'d| have| had)?\s+(?:\w+\s+)?(?:said|told|mentioned|suggested|recommended|gave|provided|listed"
    r"|shared|explained|described|wrote|proposed|made|created|composed|generated|played|came up with)"
    r"|did you\s+(?:\w+\s+)?(?:say|tell|mention|suggest|recommend|give|provide|list|share|explain|describe|write"
    r"|propose|make|create|compose|generate|play|come up with)"
    r")(?!\w)",
    re.I,
)


def asks_current(text: str) -> bool:
    """Whether ``text`` asks how something stands now ("What is my budget?",
    "How many books do I have?", "... now?"), as opposed to what happened
    ("When did I ...?", "What was ...?", "What has she done?"): a word such
    as ``now`` or ``current``, or else a first tense-bearing auxiliary in the
    present (the present perfect counts as neither).

    Where a fact changed over time, such a question wants its latest value;
    the order factor (:mod:`fusion.factors`) is applied to these queries only.
    """
    if _NOW.search(text):
        return True
    m = _TENSE.search(text.replace("\u2019", "'"))
    return m is not None and m.group(1).lower() in _PRESENT


class QueryPlan(msgspec.Struct, frozen=True):
    """What a recall searches for and which factors it may apply.

    ``text`` is the text the sources search; ``speakers`` the known speakers
    the query names; ``dates`` the inclusive ``(first, last)`` day ranges it
    names.
    """

    text: str
    speakers: tuple[str, ...] = ()
    dates: tuple[tuple[date, date], ...] = ()
    #: The query asks how things stand now (:func:`asks_current`).
    current: bool = False
    #: Known speakers the query only addresses ("Thanks, Melanie!") or
    #: labels as its speaker ("Melanie: ..."): taken out of the searched text
    #: like the others, but not boosted (:func:`addressed`).
    addressed: tuple[str, ...] = ()
    #: Known speakers the query names only as the other party of another
    #: named speaker ("What did Caroline recommend to Melanie?", "What does
    #: Melanie think of Caroline's plan?"): taken out of the searched text,
    #: not boosted (:func:`other_party`).
    others: tuple[str, ...] = ()
    #: Known speakers the first person means (``query.selfSpeakers``), when
    #: the query speaks for itself (:func:`speaks_for_self`) and names no
    #: known speaker: boosted by ``selfBoost``.
    selves: tuple[str, ...] = ()


def speaks_for_self(text: str) -> bool:
    """Whether ``text`` speaks in the first person singular ("what did I
    decide?", "my sister's name") and does not ask what the one it talks to
    said ("what did you recommend to me?"): a question about its own speaker's words."""
    text = text.replace("\u2019", "'")
    return _SELF.search(text) is not None and _YOURS.search(text) is None


def _valid(year: int, month: int, day: int | None = None) -> bool:
    if not 1 <= month <= 12 or not 1000 <= year <= 9999:
        return False
    return day is None or 1 <= day <= calendar.monthrange(year, month)[1]


def date_ranges(text: str) -> tuple[list[tuple[date, date]], list[tuple[int, int]]]:
    """The day ranges named in ``text`` and the character spans naming them.

    ``"13 October 2023"``, ``"October 13, 2023"`` and ``"October 13,2023"`` are one day,
    ``"July 2023"`` the month, ``"2023"`` the year. An impossible date
    (``"31 February 2023"``) gives no range but its span is still reported.
    """
    ranges: list[tuple[date, date]] = []
    spans: list[tuple[int, int]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(a < m.end() and m.start() < b for a, b in spans):
                continue
            g = m.groups()
            if kind == "dmy":
                day, month, year = int(g[0]), _MONTHS[g[1].lower()], int(g[2])
            elif kind == "mdy":
                month, day, year = _MONTHS[g[0].lower()], int(g[1]), int(g[2])
            elif kind == "my":
                day, month, year = 0, _MONTHS[g[0].lower()], int(g[1])
            else:
                day, month, year = 0, 0, int(g[0])
            spans.append((m.start(), m.end()))
            if kind == "y":
                first, last = date(year, 1, 1), date(year, 12, 31)
            elif not _valid(year, month, day or None):
                continue  # named, but no such day: no range, and no reading as a month
            elif day:
                first = last = date(year, month, day)
            else:
                first = date(year, month, 1)
                last = date(year, month, calendar.monthrange(year, month)[1])
            ranges.append((first, last))
    return ranges, sorted(spans)


_COUNTS = {
    **{w: n for n, w in enumerate("one two three four five six seven eight nine ten eleven twelve".split(), 1)},
    "a": 1,
    "an": 1,
    "a couple of": 2,
    "couple of": 2,
}
_UNIT_DAYS = {"day": 1.0, "week": 7.0, "month": 365.25 / 12, "year": 365.25}
_COUNT = r"(\d{1,3}|" + "|".join(sorted((re.escape(w) for w in _COUNTS), key=len, reverse=True)) + r")"
_AGO = re.compile(rf"\b{_COUNT}\s+(day|week|month|year)s?\s+ago\b", re.I)
_YESTERDAY = re.compile(r"\b(the\s+day\s+before\s+)?yesterday\b", re.I)


def relative_ranges(text: str, today: date) -> list[tuple[date, date]]:
    """The day ranges ``text`` names relative to ``today``: ``"yesterday"``,
    ``"the day before yesterday"``, ``"<n> days/weeks/months/years ago"``
    (``n`` in digits, or a word up to twelve, ``"a"``, ``"a couple of"``).

    An offset of ``o`` days is read with a quarter of it either side, rounded,
    and never after ``today``: "yesterday" is that day, "a week ago" the 9th to
    the 5th day before today, "four weeks ago" the 35th to the 21st, "a year
    ago" three months either side. Words with no count ("days ago") name
    nothing.
    """
    offsets: list[float] = []
    for m in _YESTERDAY.finditer(text):
        offsets.append(2.0 if m.group(1) else 1.0)
    for m in _AGO.finditer(text):
        count = m.group(1).lower()
        n = int(count) if count.isdigit() else _COUNTS[" ".join(count.split())]
        offsets.append(n * _UNIT_DAYS[m.group(2).lower()])
    ranges = []
    for offset in offsets:
        days, slack = round(offset), round(offset / 4)
        first = today - timedelta(days=days + slack)
        last = min(today, today - timedelta(days=days - slack))
        ranges.append((first, last))
    return ranges


def _name_pattern(name: str) -> re.Pattern[str]:
    # Whole words, any case, with an optional possessive ("Caroline's").
    return re.compile(rf"(?<!\w){re.escape(name)}(?:'s|’s)?(?!\w)", re.I)


#: Words that address whoever follows them directly: "Thanks Melanie", "Hi Melanie".
#: (With a comma between, "No, Melanie ...", the clause rule of :func:`addressed` decides.)
_GREETINGS = (
    "thanks thank you thx ty hi hey hello hiya howdy yo dear bye goodbye cheers congrats congratulations "
    "sorry welcome morning afternoon evening night"
).split()
_GREETING_AT_END = re.compile(r"(?:^|[\s,])(?:" + "|".join(_GREETINGS) + r")\s+$", re.I)
#: What closes an address: a comma, the end of a sentence, a colon or a dash.
_CLOSES = re.compile(r"\s*(?:$|[,!?.:;)\u2014\u2013]|\s-\s|\n)")
#: A sentence's start, for the words before a name.
_SENTENCE_END = re.compile(r"[.!?\n]")


def addressed(text: str, start: int, end: int, speakers: Iterable[str] = ()) -> bool:
    """Whether the name at ``text[start:end]`` addresses someone (or labels
    who speaks) rather than being what the text is about.

    Addressed: right after a greeting ("Thanks Melanie for ...", "Hi
    Melanie"), or alone in its clause: at the start of a sentence or after
    a comma, and followed by a comma, the end of the sentence, a colon or a
    dash ("Thanks, Melanie!", "Melanie, what do you think?", "What do you
    think, Melanie?", "Melanie: ..."). Not addressed: a possessive
    ("Melanie's dog"), a name inside its clause ("What did Melanie paint?",
    "No, Melanie painted it", "Did you call Melanie?"), and the first of a
    list of names ("Melanie, Caroline and Jon went hiking": a known
    ``speakers`` name, or "and", follows the comma).
    """
    name = text[start:end]
    if name.endswith(("'s", "’s")):
        return False
    before = text[:start]
    clause = _SENTENCE_END.split(before)[-1]
    if _GREETING_AT_END.search(clause):
        return True
    if clause.strip() and not clause.rstrip().endswith(","):
        return False
    after = text[end:]
    if not _CLOSES.match(after):
        return False
    if after.lstrip().startswith(","):
        following = after.lstrip()[1:].lstrip().lower()
        listed = any(following.startswith(s.lower()) for s in speakers if s.strip())
        return not (listed or following.startswith(("and ", "or ", "& ")))
    return True


#: What makes the name after it the other party of someone's act ("recommend
#: to Melanie", "went with her friend Melanie"); "according to Melanie" does not.
_TO_OTHER = re.compile(
    r"(?<!according\s)\b(?:to|with|for)\s+(?:(?:his|her|their|my|your|our)\s+(?:friend|buddy|pal)\s+)?$", re.I
)
_JOINED_AFTER = re.compile(r"\s*(?:and|or|&)\s", re.I)
_JOINED_BEFORE = re.compile(r"(?:\band|\bor|&)\s+$", re.I)


def other_party(text: str, start: int, end: int) -> bool:
    """Whether the name at ``text[start:end]`` names the other party of
    someone's act rather than who acts: right after "to", "with" or "for"
    ("What did Caroline recommend to Melanie?", "... shared with his friend
    Tim"), or possessive ("What does Melanie think about Caroline's
    decision?"). Not when joined to another name ("Tim and John's favourite
    player", "for Nate and Joanna") or after "according to".
    """
    name = text[start:end]
    possessive = name.endswith(("'s", "’s"))
    if _JOINED_AFTER.match(text[end:]) or _JOINED_BEFORE.search(text[:start]):
        return False
    return possessive or _TO_OTHER.search(text[:start]) is not None


def analyze_query(
    text: str,
    speakers: Iterable[str] = (),
    *,
    strip_speakers: bool = True,
    strip_dates: bool = True,
    today: date | None = None,
    self_names: Iterable[str] = (),
) -> QueryPlan:
    """Find the known ``speakers`` and the dates ``text`` names.

    A speaker the text is about goes to ``speakers`` (boosted after fusion);
    one it only addresses or labels as its speaker (:func:`addressed`) to
    ``addressed`` (not boosted), unless the text is also about them; of
    several it is about, one named only as another's other party
    (:func:`other_party`) to ``others`` (not boosted), unless all are. With
    ``strip_*`` both, and the dates, are removed from the searched text,
    unless nothing would be left, in which case the text stays whole. A
    text that is nothing but the name is about them.

    With ``today``, the dates named relative to it (:func:`relative_ranges`)
    join ``dates`` too, but stay in the searched text: a memory often says
    them as well ("I volunteered there last weekend, a week ago").

    A text that speaks for itself (:func:`speaks_for_self`) and is about no
    known speaker means the known speakers among ``self_names``
    (case-insensitive): they go to ``selves``.
    """
    speakers = speakers if isinstance(speakers, (list, tuple, set, frozenset)) else list(speakers)
    named: dict[str, list[tuple[int, int]]] = {}  # each speaker it is about: where
    spoken_to: list[str] = []
    spans: list[tuple[int, int]] = []
    lowered = text.lower()
    # A plain substring test first: a tenant may have thousands of speakers.
    candidates = {s for s in speakers if s.strip() and s.lower() in lowered}
    for name in sorted(candidates, key=lambda s: (-len(s), s)):
        found = [(m.start(), m.end()) for m in _name_pattern(name).finditer(text)]
        found = [f for f in found if not any(a < f[1] and f[0] < b for a, b in spans)]
        if found:
            alone = not any(c.isalnum() for c in text[: found[0][0]] + text[found[0][1] :]) and len(found) == 1
            if alone or not all(addressed(text, a, b, candidates) for a, b in found):
                named[name] = found
            else:
                spoken_to.append(name)
            if strip_speakers:
                spans.extend(found)
    # Of several speakers the query is about, one named only as another's
    # other party is not boosted, unless every one of them is named so.
    others = [n for n, at in named.items() if all(other_party(text, a, b) for a, b in at)]
    if len(others) == len(named):  # one speaker alone, or all named so
        others = []
    selves: tuple[str, ...] = ()
    if self_names and not named and speaks_for_self(text):
        wanted = {n.casefold() for n in self_names}
        selves = tuple(sorted({s for s in speakers if s.casefold() in wanted}))
    ranges, date_spans = date_ranges(text)
    if today is not None:
        ranges.extend(relative_ranges(text, today))
    if strip_dates:
        spans.extend(date_spans)
    searched = text
    for start, end in sorted(spans, reverse=True):
        searched = searched[:start] + " " + searched[end:]
    searched = _SPACES.sub(" ", searched).strip()
    if not any(c.isalnum() for c in searched):
        searched = text
    return QueryPlan(
        text=searched,
        speakers=tuple(sorted(set(named) - set(others))),
        dates=tuple(ranges),
        current=asks_current(text),
        addressed=tuple(sorted(spoken_to)),
        others=tuple(sorted(others)),
        selves=selves,
    )
