"""LLM-free goal names: class-based TF-IDF of each cluster's summaries against the other clusters.

What topic-modelling tools (BERTopic's c-TF-IDF) do, sized for names a person reads on a
dashboard:

- **Terms** are unigrams and bigrams of the summaries' words, after removing English stop words
  and conversational filler ("want", "need", "please", "hi", ...), e-mail addresses, links and
  every token holding a digit (numbers, times, ids: "7pm", "A320"). A bigram joins two content
  words that stand side by side, or are separated only by an article or possessive ("book a
  table" gives "book table"); it never spans punctuation, so it stays a phrase someone typed.
  Accents are folded ("café" and "cafe" are one term); words of other scripts are kept as they
  are.
- **Scores** are c-TF-IDF over conversations: ``p[t, c]`` is the share of class ``c``'s
  conversations that use term ``t`` (each conversation counts once, however often it repeats a
  word), and ``W[t, c] = p[t, c] * log(1 + A / sum_c' p[t, c'])`` with ``A`` the mean number of
  terms per conversation. A word every cluster uses ("cambridge" in a city's traffic, "number")
  is damped by the sum over classes; a word one cluster uses often and the others rarely wins.
  A candidate must also be more common in its cluster than in the average other one: with only
  a handful of clusters the damping alone is too weak to keep such a word out.
  :func:`name_clusters` scores every cluster against all the others; :func:`goal_name` (one
  cluster while Algorithm 1 is still merging) scores it against one class made of the rest.
- **The K-distinct rule**: a term is a candidate for a cluster only if at least ``min_df``
  *distinct* summaries of that cluster contain it (identical summaries count once), never fewer
  however small the cluster. One user's name, number or odd word never becomes a name, and
  neither does one user's text pasted into many conversations.
- **Names** (capitalised inside a sentence by most of the summaries that use them: "Cambridge",
  "Dr. Morgan", "Shadyside Inn") are entities, not goals, and never candidates. Capitals mark
  nothing in a sentence that is mostly capitalised (Title Case, SHOUTING).
- **The name** is a phrase: the best bigram when it scores at least ``BIGRAM_RATIO`` of the best
  unigram (a phrase that is nearly as typical reads better than a lone word), else the best
  unigram; then, chosen the same way, the best term sharing no word with it, if it scores at
  least ``SECOND_TERM_RATIO`` of the first. The two are joined with "and", the one more of the
  cluster used first ("restaurant and live music", "account and fraud report"). With no
  candidate at all the name is :data:`NO_NAME`.

Pure functions, deterministic: ties break alphabetically, inputs are never sampled here. Cost is
linear in the characters read, and each summary is read up to :data:`MAX_CHARS_PER_SUMMARY`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

NO_NAME = "miscellaneous"
BIGRAM_RATIO = 0.6
SECOND_TERM_RATIO = 0.5
MAX_CHARS_PER_SUMMARY = 4000
_MIN_WORD_CHARS = 3
_MAX_WORD_CHARS = 25

_STOPWORDS_TEXT = """
    a about above after again against all also am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each few for from further had hadn't has hasn't have haven't having he
    her here hers herself him himself his how i i'd i'll i'm i've if in into is isn't it it's its
    itself just let's me more most much must my myself no nor not now of off on once
    only or other ought our ours ourselves out over own same shall she should shouldn't so
    some such than that that's the their theirs them themselves then there there's these they this
    those through to too under until up upon us very was wasn't we we'd we'll
    we're were weren't what what's when where which while who whom why will with won't would
    wouldn't you you'd you'll you're you've your yours yourself yes yeah yep nope okay ok
    one two three four five six seven eight nine ten also something anything everything nothing
    someone anyone else actually maybe really well way lot lots many thing things able via per
    another around back even ever every next last first second
"""
# What people say to an assistant whatever they want from it: greetings, politeness, the verbs of
# asking. None of it tells one goal from another.
_FILLER_TEXT = """
    want wants wanted wanting need needs needed needing like liked would please pls plz help helps
    helping hi hello hey hiya greetings morning afternoon evening thanks thank thx cheers welcome
    great good fine sure sounds perfect cool awesome alright right nice lovely excellent wonderful
    bye goodbye know think thinking going get getting got give tell make see said say go time day
    look looking find finding searching search interested wondering wonder trying try assist
    assistance question questions ask asking request requesting hoping hope let could kindly
    sorry excuse mind possible today tomorrow now soon currently also maybe probably just
    called named starting
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split()) | frozenset(_FILLER_TEXT.split())
# Words a bigram may skip over ("book a table" -> "book table"): nothing that changes the meaning.
_BRIDGE = frozenset({"a", "an", "the", "my", "our", "your", "some"})

# Entities masked before anything is read: e-mail addresses, links, and every token holding a
# digit (numbers, times, ids, codes: "7pm", "A320", "room12", "city1").
_ENTITY = re.compile(r"\S+@\S+|\b(?:https?://|www\.)\S+|\w*\d\w*", re.IGNORECASE)
# A run of letters, inner apostrophes/hyphens allowed; digits, "_" and punctuation end it.
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019-][^\W\d_]+)*")
# Where a phrase ends: punctuation, brackets, digits (a number is an entity, never a term).
_BREAK = re.compile(r"[.,;:!?()\[\]{}\"<>|/\\\d]+")
# Where a sentence ends: the next word's capital letter says nothing about it being a name.
_SENTENCE = re.compile(r"(?<!\bdr)(?<!\bmr)(?<!\bms)(?<!\bst)(?<!\bmrs)(?<!\bprof)[.!?\n]+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class _Terms:
    """One summary's terms: key (plural-folded words) -> the words as typed, and the keys of
    words written like a name (capitalised inside a sentence)."""

    typed: dict[str, str]
    proper: frozenset[str]


def _fold(word: str) -> str:
    """Lower case with accents removed where the word folds to ASCII ("Café" -> "cafe")."""
    low = word.lower().replace("\u2019", "'")
    plain = "".join(ch for ch in unicodedata.normalize("NFKD", low) if not unicodedata.combining(ch))
    return plain if plain.isascii() else low


def _content(word: str) -> bool:
    return _MIN_WORD_CHARS <= len(word) <= _MAX_WORD_CHARS and word not in STOPWORDS and "'" not in word


def stem(word: str) -> str:
    """The key a word is counted under: plural endings folded ("flights" -> "flight",
    "taxes" -> "tax"); words ending in ss/us/is are left alone. Deliberately crude: "movies" and
    "cities" lose only their "s", a plural that is not folded costs a split count, never a merge
    of two different words."""
    if len(word) <= _MIN_WORD_CHARS or word.endswith(("ss", "us", "is")):
        return word
    if word.endswith(("sses", "shes", "ches", "xes")):  # not "ses": houses, cases
        return word[:-2]
    return word[:-1] if word.endswith("s") else word


def _scan(text: str) -> _Terms:
    """The unigrams and bigrams of one summary (see the module docstring)."""
    typed: dict[str, str] = {}
    proper: set[str] = set()
    for sentence in _SENTENCE.split(_ENTITY.sub(",", text[:MAX_CHARS_PER_SUMMARY])):
        raws = _WORD.findall(sentence)
        # In Title Case Or SHOUTING, capitals mark nothing: only look for names in prose.
        prose = sum(w[:1].isupper() for w in raws) * 2 <= len(raws)
        first = True
        for segment in _BREAK.split(sentence):
            prev: tuple[str, str] | None = None
            for raw in _WORD.findall(segment):
                word = _fold(raw).strip("'-")
                name_like = prose and not first and raw[:1].isupper()
                first = False
                if not _content(word):
                    prev = None if word not in _BRIDGE else prev
                    continue
                key = stem(word)
                typed.setdefault(key, word)
                if name_like:
                    proper.add(key)
                if prev is not None:
                    typed.setdefault(f"{prev[0]} {key}", f"{prev[1]} {word}")
                prev = (key, word)
    return _Terms(typed, frozenset(proper))


def _distinct(texts: Iterable[str]) -> list[str]:
    """Each summary once (whitespace and case ignored), first occurrence kept, order kept."""
    seen: set[str] = set()
    out: list[str] = []
    for t in texts:
        key = " ".join(t[:MAX_CHARS_PER_SUMMARY].lower().split())
        if key and key not in seen:
            seen.add(key)
            out.append(t)
    return out


@dataclass(slots=True)
class _Class:
    """Counts over one class's distinct summaries."""

    size: int = 0
    df: Counter[str] = field(default_factory=Counter)  # key -> summaries using it
    proper: Counter[str] = field(default_factory=Counter)  # key -> summaries writing it like a name
    typed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (key, as typed) -> summaries

    def add(self, t: _Terms) -> None:
        self.size += 1
        self.df.update(t.typed.keys())
        self.proper.update(t.proper)
        self.typed.update(t.typed.items())

    def is_name(self, key: str) -> bool:
        """Mostly written like a name (a place, a person, a venue): not a goal."""
        return any(self.proper[w] * 2 > self.df[w] for w in key.split())

    def shown(self) -> dict[str, str]:
        """The most frequent way of writing each key (ties: alphabetical)."""
        best: dict[str, tuple[int, str]] = {}
        for (key, word), n in self.typed.items():
            old = best.get(key)
            if old is None or (-n, word) < (-old[0], old[1]):
                best[key] = (n, word)
        return {k: w for k, (_, w) in best.items()}


# A candidate: (c-TF-IDF, the term as typed, share of the cluster's summaries using it).
_Scored = tuple[float, str, float]


def _class_scores(groups: Sequence[Sequence[str]], min_df: int) -> list[list[_Scored]]:
    """Per class, its candidate terms, best c-TF-IDF first (ties: alphabetical)."""
    classes: list[_Class] = []
    for texts in groups:
        c = _Class()
        for text in _distinct(texts):
            c.add(_scan(text))
        classes.append(c)
    shares = [{k: n / c.size for k, n in c.df.items()} for c in classes]
    total: dict[str, float] = {}
    for share in shares:
        for k, v in share.items():
            total[k] = total.get(k, 0.0) + v
    filled = [share for share in shares if share]
    # A: terms per conversation, averaged over the classes (BERTopic's "average words per class",
    # on shares so that one large class does not set it alone).
    a = sum(sum(share.values()) for share in filled) / len(filled) if filled else 0.0
    need = max(1, min_df)
    # A candidate must be more common in its cluster than in the average other cluster: with few
    # clusters, c-TF-IDF alone still ranks a word everyone uses ("cambridge") second.
    others = len(filled) - 1
    out: list[list[_Scored]] = []
    for c, share in zip(classes, shares, strict=True):
        shown = c.shown()
        scored = [
            (share[k] * math.log1p(a / total[k]), shown[k], share[k])
            for k, n in c.df.items()
            if n >= need and not c.is_name(k) and (others == 0 or share[k] * others > total[k] - share[k])
        ]
        scored.sort(key=lambda x: (-x[0], x[1]))
        out.append(scored)
    return out


def _pick(scored: Sequence[_Scored]) -> _Scored | None:
    """The best bigram if it scores at least ``BIGRAM_RATIO`` of the best unigram, else that unigram."""
    best_uni = next((x for x in scored if " " not in x[1]), None)
    best_bi = next((x for x in scored if " " in x[1]), None)
    if best_bi is not None and (best_uni is None or best_bi[0] >= BIGRAM_RATIO * best_uni[0]):
        return best_bi
    return best_uni


def _phrase(scored: Sequence[_Scored]) -> str:
    """A readable name from the ranked candidates (see the module docstring)."""
    first = _pick(scored)
    if first is None:
        return NO_NAME
    used = {stem(w) for w in first[1].split()}
    rest = [x for x in scored if x[0] >= SECOND_TERM_RATIO * first[0] and used.isdisjoint(map(stem, x[1].split()))]
    second = _pick(rest)
    if second is None:
        return first[1]
    # The term more of the cluster used reads first: "restaurant and live music".
    head, tail = (second, first) if (-second[2], second[1]) < (-first[2], first[1]) else (first, second)
    return f"{head[1]} and {tail[1]}"


def goal_name(group: Sequence[str], not_in_group: Sequence[str], *, min_df: int) -> str:
    """The name of one cluster (``group``) against the rest (``not_in_group``, one class)."""
    return _phrase(_class_scores([group, not_in_group], min_df)[0])


def name_clusters(groups: Sequence[Sequence[str]], *, min_df: int) -> list[str]:
    """The name of every cluster, each scored against all the others (one class per cluster).

    Clusters that come out with the same name get their next distinguishing term after a colon
    ("directions and details: parking"): a dashboard legend with two equal names is useless.
    """
    scored = _class_scores(groups, min_df)
    names = [_phrase(s) for s in scored]
    counts = Counter(names)
    out = []
    for name, ranked in zip(names, scored, strict=True):
        shown = name
        if counts[name] > 1 and name != NO_NAME:
            used = {stem(w) for w in name.split()}
            extra = _pick([x for x in ranked if used.isdisjoint(map(stem, x[1].split()))])
            if extra is not None:
                shown = f"{name}: {extra[1]}"
        out.append(shown)
    return out
