"""extractive: an answer made of the retrieved sources' own sentences, for when the answer
role has no LLM (`ANSWER_BACKEND=extractive`). A B2B site's assistant must not invent
facts; a sentence copied from the knowledge base, cited, cannot.

Pure: the question, its follow-up context, the turn's documents and their sentences'
vectors in; the chosen sentences out. answer_writer does the I/O (embedding, streaming).

1. Candidates: every retrieved document cut into sentences, Markdown headings dropped and
   list / emphasis / link markup removed, a very short sentence ("Yes.") joined to the
   next; a sentence found in several documents is kept once, cited to a chunk first
   (entity and relationship descriptions repeat chunk sentences).
2. Relevance: MiniLM cosine similarity to the question; for a short, elliptical question
   ("And Xero?") blended with the similarity to the previous visitor message and this one.
   A question not in English is compared with the English of its glossary terms appended
   (shared/glossary.py): the sentences are English, and so is the sentence model.
3. Nothing at or above `threshold`: no sentence (the caller says it found nothing).
4. Otherwise up to `max_sentences` by maximal marginal relevance among those within
   `margin` of the best, near-duplicates (similarity ≥ `duplicate`) never both.
5. Order: by source, the sources in the order of their best sentence, each source's
   sentences in their original order.

`reply` writes the answer: each sentence followed by its `[n]`, then the endings the
applied skills ask for, from localized templates (data/extractive.toml); with no sentence,
a plain "not found" and the site's contact (its CTA, its support page), never a guess.
"""

from __future__ import annotations

import math
import re
import tomllib
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from shared import citations, glossary, language
from shared import events as ev
from shared.follow_up import elliptical, follows_up
# The knowledge base's sentences, cut as shared/kb_vectors.py cuts them to embed them ahead.
from shared.kb_sentences import CACHED_TEXTS, WORD, Candidate, _key, candidates, masked, sentences, units  # noqa: F401
from shared.site_config import SiteConfig

NUMBER = re.compile(r"\d+(?:[.,:]\d+)*%?")
STEM = 6  # letters two words share at the start to count as one stem ("integrez" / "integrate")

TEMPLATES = tomllib.loads((Path(__file__).parent / "data" / "extractive.toml").read_text(encoding="utf-8"))

# Where a message asking several things splits: after a question mark, or at "and" / "also"
# (en, fr, de, es) before a question word.
PART_SPLIT = re.compile(
    r"(?<=\?)\s+|[,;]?\s+(?:and|also|plus|et|und|sowie|y|además)\s+(?=(?:what|how|is|are|do|does|can|could|will|"
    r"would|where|which|who|when|why|should|que|quel|quelle|quels|comment|est-ce|peut|peut-on|combien|was|wie|"
    r"welche|welcher|ist|sind|kann|können|gibt|wo|wann|qué|cómo|cuál|puedo|hay|dónde)\b)", re.IGNORECASE)
MIN_PART_WORDS = 3
MAX_ITEMS = 8  # a list said with its introducing sentence: its first items
MAX_ANSWER_CHARS = 900


@dataclass(frozen=True)
class Picked:
    text: str
    n: int
    position: int
    score: float  # relevance to the question



@dataclass(frozen=True)
class Question:
    """What the visitor asked: this message, the previous one when this one follows it up,
    the site's own name (every sentence of its knowledge base says it: it tells them apart
    from nothing, so it is left out of the comparison) and the visitor's language."""
    text: str
    previous: str = ""
    name: str = ""
    lang: str = "en"

    @property
    def compared(self) -> str:
        """The message as sentences are compared with it: with the English of its glossary
        terms when it is in another language."""
        return glossary.expand(self.text, self.lang)

    @property
    def context(self) -> str:
        if not (self.previous and follows_up(self.text)):
            return ""
        return f"{glossary.expand(self.previous, self.lang)} {self.compared}"

    @property
    def parts(self) -> list[str]:
        """The questions a message asks, when it asks several ("Do we lose access, and what
        happens to our data?"): each as it is compared; [] for one question."""
        pieces = [p.strip(" ,;") for p in PART_SPLIT.split(self.text) if p and p.strip(" ,;")]
        pieces = [p for p in pieces if len(WORD.findall(p)) >= MIN_PART_WORDS]
        return [glossary.expand(p, self.lang) for p in pieces] if len(pieces) >= 2 else []


def _fold(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))


@lru_cache(maxsize=CACHED_TEXTS)
def terms(text: str, name: str = "") -> frozenset[str]:
    """The text's content words, lowercased, accents removed: no function word of any
    supported language, no site name, no single letter; numbers kept."""
    masked_text = masked(text, name)
    out = {_fold(w) for w in language.words(masked_text) if w not in language.ALL_FUNCTION_WORDS and len(w) > 1}
    out |= set(NUMBER.findall(masked_text))
    return frozenset(w for w in out if "-" not in w)


@lru_cache(maxsize=CACHED_TEXTS * 8)
def same_word(a: str, b: str) -> bool:
    """The same word or a close form of it, in one language or across them: a plural or a
    conjugation ("plan" / "plans"), a shared stem ("integrez" / "integrate",
    "synchronisation" / "synchronised", "technicien" / "technician")."""
    if a == b:
        return True
    if a.isdigit() or b.isdigit():
        return False
    short, long_ = sorted((a, b), key=len)
    if len(short) >= 4 and long_.startswith(short) and len(long_) - len(short) <= 3:
        return True
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return common >= STEM and common >= 0.6 * len(short)


def lexical(question: Question, pool: list[Candidate]) -> np.ndarray:
    """Per candidate, the share of the question's content words (weighted by how rare they
    are among the candidates) that the sentence or its section title holds. Works where the
    English-only sentence model does not: product names, numbers and cognates read the same
    in a French or German question. A follow-up's previous message counts too (half, unless
    the follow-up is elliptical)."""
    asked = {w: 1.0 for w in terms(question.compared, question.name)}
    if question.context:
        weight = 1.0 if elliptical(question.text) else 0.5  # "And the price?" is mostly its previous message
        for w in terms(glossary.expand(question.previous, question.lang), question.name):
            asked.setdefault(w, weight)
    if not asked or not pool:
        return np.zeros(len(pool))
    held = [terms(f"{c.title} {c.text}", question.name) for c in pool]
    matches = {w: [any(same_word(w, h) for h in words) for words in held] for w in asked}
    weight = {w: asked[w] * math.log((len(pool) + 1) / (sum(found) + 0.5)) for w, found in matches.items()}
    total = sum(weight.values())
    if total <= 0:
        return np.zeros(len(pool))
    return np.array([sum(weight[w] for w in asked if matches[w][i]) / total for i in range(len(pool))])


def rank_prior(pool: list[Candidate]) -> np.ndarray:
    """1 for the first source the retriever ranked, less for each one after: the retriever
    read the question with its keywords (in any language) and the whole section."""
    order = {n: r for r, n in enumerate(sorted({c.n for c in pool}))}
    return np.array([1.0 / (1.0 + order[c.n]) for c in pool])


def choose(question_vec: np.ndarray, vectors: np.ndarray, title_vectors: np.ndarray, pool: list[Candidate], *,
           context_vec: np.ndarray | None = None, lexical_scores: np.ndarray | None = None,
           prior: np.ndarray | None = None, part_vecs: list[np.ndarray] = (),
           part_lexical: list[np.ndarray] = (), max_sentences: int = 5, threshold: float = 0.35,
           evidence_threshold: float = 0.45, margin: float = 0.2, duplicate: float = 0.9, diversity: float = 0.3,
           title_weight: float = 0.3, lexical_weight: float = 0.5, prior_weight: float = 0.1,
           other_source_margin: float = 0.25, neighbour_margin: float = 0.45,
           section_margin: float = 0.45) -> list[Picked]:
    """The sentences that answer the question, in reading order; [] when nothing answers it.

    A sentence can answer when its similarity reaches `threshold`, or when it shares words
    with the question and its relevance (similarity + `lexical_weight` × the lexical score
    + `prior_weight` × the rank prior) reaches `evidence_threshold`: with no word in
    common, the rank prior alone never makes an answer. `vectors` are the sentences',
    `title_vectors` their sources' titles' (one row per candidate): a sentence is relevant
    as itself and by what its section is about. Unit rows: a dot product is the cosine.

    The answer is built around the best sentence (the anchor): for a question of several
    parts (`part_vecs`, `part_lexical`), the best sentence for each part too;
    then sentences of the anchor's source within `margin` of it, and of other sources only
    within `other_source_margin` (near-equal evidence, not padding), at most
    `max_sentences` by maximal marginal relevance, near-duplicates (similarity ≥
    `duplicate`) never both. A sentence introducing a list brings the list's first
    items, a list's item the sentence introducing it. Last, each chosen sentence brings the
    sentences just before and after it in its source, when within `neighbour_margin` of
    the best: what a fact leans on or goes on with ("Recipient Authentication allows…",
    then "Recipient Authentication is an Enterprise feature."); and, while the answer has
    room, the anchor's section's other sentences within `section_margin` of the best that
    share a word with the question: a short FAQ answer's condition a few sentences on ("The
    discount applies to Business plans on annual billing only.")."""
    if not pool:
        return []
    lexical_scores = np.zeros(len(pool)) if lexical_scores is None else lexical_scores
    prior = np.zeros(len(pool)) if prior is None else prior

    def similarity(rows: np.ndarray, asked: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        sim = rows @ asked
        if context is not None:
            sim = np.maximum(sim, 0.6 * sim + 0.4 * (rows @ context))
        return sim

    def scored(asked: np.ndarray, lexical_part: np.ndarray, context: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        semantic = ((1 - title_weight) * similarity(vectors, asked, context)
                    + title_weight * similarity(title_vectors, asked, context))
        relevance = semantic + lexical_weight * lexical_part + prior_weight * prior
        return relevance, (semantic >= threshold) | ((lexical_part > 0) & (relevance >= evidence_threshold))

    relevance, answers = scored(question_vec, lexical_scores, context_vec)
    if not answers.any():
        return []
    anchor = max(np.flatnonzero(answers), key=lambda i: relevance[i])
    best = float(relevance[anchor])
    at = {(c.n, c.position): i for i, c in enumerate(pool)}  # a source's neighbouring sentences
    chosen: list[int] = []
    said = [0]  # characters

    def duplicated(i: int) -> bool:
        return any(float(vectors[i] @ vectors[j]) >= duplicate or _key(pool[i].text) in _key(pool[j].text)
                   or _key(pool[j].text) in _key(pool[i].text) for j in chosen)

    def add(i: int) -> None:
        if i in chosen or duplicated(i) or said[0] + len(pool[i].text) > MAX_ANSWER_CHARS:
            return
        if pool[i].role == "item":
            intro = _intro_of(i, pool, at)
            if intro is not None and intro not in chosen:
                return add(intro)
        items = _items_of(i, pool, at) if pool[i].role == "intro" else []
        if pool[i].role == "intro" and not items:
            return  # its list is in a part of the page not retrieved: said alone, it says nothing
        chosen.append(i)
        said[0] += len(pool[i].text)
        if items:
            for j in items[:MAX_ITEMS]:
                if j not in chosen and said[0] + len(pool[j].text) <= MAX_ANSWER_CHARS:
                    chosen.append(j)
                    said[0] += len(pool[j].text)

    add(anchor)
    for part_vec, lexical_part in zip(part_vecs, part_lexical):
        part_relevance, part_answers = scored(part_vec, lexical_part, None)
        if part_answers.any():
            add(max(np.flatnonzero(part_answers), key=lambda i: part_relevance[i]))
    anchor_source = pool[anchor].n
    eligible = [i for i in np.flatnonzero(answers) if i not in chosen and (
        relevance[i] >= best - (margin if pool[i].n == anchor_source else other_source_margin))]
    while eligible and sum(1 for i in chosen if pool[i].role != "item") < max_sentences:
        def mmr(i: int) -> float:
            overlap = max((float(vectors[i] @ vectors[j]) for j in chosen), default=0.0)
            return (1 - diversity) * float(relevance[i]) - diversity * overlap

        pick = max(eligible, key=mmr)
        eligible.remove(pick)
        add(pick)
    for i in [i for i in chosen if pool[i].role != "item"]:
        for j in (at.get((pool[i].n, pool[i].position - 1)), at.get((pool[i].n, pool[i].position + 1))):
            if j is not None and j not in chosen and relevance[j] >= best - neighbour_margin:
                add(j)
    section = (pool[anchor].n, pool[anchor].title)
    for i in sorted((i for i, c in enumerate(pool) if (c.n, c.title) == section), key=lambda i: pool[i].position):
        if relevance[i] >= best - section_margin and lexical_scores[i] > 0:  # it says something asked
            add(i)
    source_rank: dict[int, int] = {}
    for i in chosen:
        source_rank.setdefault(pool[i].n, len(source_rank))
    chosen.sort(key=lambda i: (source_rank[pool[i].n], pool[i].position))
    return [Picked(text=pool[i].text, n=pool[i].n, position=pool[i].position, score=round(float(relevance[i]), 4))
            for i in chosen]


def _items_of(intro: int, pool: list[Candidate], at: dict[tuple[int, int], int]) -> list[int]:
    """The candidates of the list `intro` introduces, in order (`at`: each candidate's index
    by its source and place)."""
    out, position = [], pool[intro].position + 1
    while (found := at.get((pool[intro].n, position))) is not None and pool[found].role == "item":
        out.append(found)
        position += 1
    return out


def _intro_of(item: int, pool: list[Candidate], at: dict[tuple[int, int], int]) -> int | None:
    """The candidate introducing the list `item` belongs to, if the list has one."""
    position = pool[item].position - 1
    while (found := at.get((pool[item].n, position))) is not None:
        if pool[found].role == "intro":
            return found
        if pool[found].role != "item":
            return None
        position -= 1
    return None


def texts_to_embed(question: Question, pool: list[Candidate]) -> tuple[list[str], bool, list[str]]:
    """What `choose` needs embedded, in order, the site's name masked: the question, the
    follow-up context (when the question follows up a previous message), the distinct
    titles, the sentences. Returns (texts, with_context, titles)."""
    context = question.context
    titles = list(dict.fromkeys(c.title for c in pool))
    texts = [question.compared, *([context] if context else []), *question.parts, *titles, *(c.text for c in pool)]
    return [masked(t, question.name) or t for t in texts], bool(context), titles


def asked_rows(question: Question) -> int:
    """How many of `texts_to_embed`'s texts come first as the visitor's (the question, the
    follow-up context when there is one, each part of a question of several); the rest are
    the knowledge base's."""
    return (2 if question.context else 1) + len(question.parts)


def choose_from(vectors: np.ndarray, question: Question, titles: list[str], pool: list[Candidate],
                **params) -> list[Picked]:
    """`choose` over the rows of `texts_to_embed`'s texts, embedded."""
    with_context = bool(question.context)
    parts = question.parts
    first_part = 2 if with_context else 1
    start = asked_rows(question)
    title_row = {t: start + i for i, t in enumerate(titles)}
    sentences_at = start + len(titles)
    part_lexical = [lexical(Question(text=part, name=question.name), pool) for part in parts]
    return choose(vectors[0], vectors[sentences_at:], vectors[[title_row[c.title] for c in pool]], pool,
                  context_vec=vectors[1] if with_context else None, lexical_scores=lexical(question, pool),
                  prior=rank_prior(pool), part_vecs=[vectors[first_part + k] for k in range(len(parts))],
                  part_lexical=part_lexical, **params)


def compose(question: str, documents: list[ev.RetrievedDocument], embed: Callable[[list[str]], np.ndarray], *,
            previous: str = "", name: str = "", lang: str = "en", **params) -> list[Picked]:
    """The whole selection with a synchronous `embed` (tests, offline tools)."""
    pool = candidates(documents)
    if not pool:
        return []
    asked = Question(text=question, previous=previous, name=name, lang=lang)
    texts, _, titles = texts_to_embed(asked, pool)
    return choose_from(embed(texts), asked, titles, pool, **params)


def cite(sentence: str, n: int) -> str:
    """The sentence with its `[n]` before the final punctuation: "… both directions [1]."."""
    sentence = citations.without_citations(sentence).rstrip()
    if sentence and sentence[-1] in ".!?":
        return f"{sentence[:-1]} [{n}]{sentence[-1]}"
    return f"{sentence} [{n}]."


def _templates(lang: str) -> dict[str, str]:
    return {**TEMPLATES["en"], **TEMPLATES.get(lang, {})}


def not_found(config: SiteConfig, site: str, lang: str, cta: tuple[str, str] | None = None,
              contacts: list[str] = ()) -> str:
    """Nothing relevant was retrieved: say so, and where to ask instead: `contacts`, the
    site's contact for what the visitor needs the team for (its support page for a support
    request), else the call to action (`cta`: the visitor's segment's (label, url), else the
    site's) and the support page."""
    t = _templates(lang)
    name = config.name or site
    lines = [t["not_found"].format(site_name=name)]
    if contacts:
        return " ".join([*lines, *contacts])
    label, cta_url = cta if cta and cta[1] else (config.cta.label, config.cta.url or config.cta.booking_url)
    if cta_url:
        lines.append(t["contact_cta"].format(label=label, url=cta_url))
    if config.redirects.support:
        lines.append(t["contact_support"].format(url=config.redirects.support))
    if len(lines) == 1:
        lines.append(t["contact_none"].format(site_name=name))
    return " ".join(lines)


def endings(skills: list[str], question: str | None, lang: str, resource_url: str = "") -> list[str]:
    """What the applied skills add after the answer, in their order. `suggest_follow_up`
    adds nothing here: the widget shows the suggested questions."""
    t = _templates(lang)
    out = []
    for skill in skills:
        if skill == "ask_qualifying_question" and question:
            out.append(t[skill].format(question=question.rstrip(" ?") + "?"))
        elif skill == "share_resource" and resource_url.startswith(("http://", "https://")):
            out.append(t[skill].format(url=resource_url))
        elif skill in ("propose_demo", "collect_email"):
            out.append(t[skill])
    return out


def reply(picked: list[Picked], documents: list[ev.RetrievedDocument], *, skills: list[str], question: str | None,
          lang: str, config: SiteConfig, site: str, audience: list[str] = (),
          cta: tuple[str, str] | None = None, contacts: list[str] = ()) -> str:
    """The answer's text: the sentences, each cited, then the site's words for the visitor's
    audience (`audience`: its example and offer, shared/segments.py), then the skills'
    endings; or the "not found" reply, with the visitor's call to action (`cta`), and a
    qualifying question still asked when one is due (`contacts`: where the site points a
    visitor who needs its team, named instead when nothing was found)."""
    if not picked:
        rest = endings([s for s in skills if s == "ask_qualifying_question"], question, lang)
        return "\n\n".join([not_found(config, site, lang, cta, contacts), *rest])
    urls = {d.n: d.source for d in documents}
    answer = " ".join(cite(p.text, p.n) for p in picked)
    return "\n\n".join([answer, *([" ".join(audience)] if audience else []),
                         *endings(skills, question, lang, urls.get(picked[0].n, ""))])
