"""Knowledge gaps: the questions a site's knowledge base could not answer, grouped.

A gap question is a turn (shared/insight.py `TurnFacts`) answered "not found", answered
weakly (its citation audit flagged it) or rated down. `gaps` embeds them (the embedding
model the retriever and the extractive answers use), and groups each with the group whose
mean vector is closest, when that is at least `threshold` in cosine, in the order they were
asked; else it starts a group. Each group: how many visitors (conversations) it affected,
how many times it was asked, example questions, the knowledge-base sections retrieval came
closest with, and a suggested page to write (its most central question, and the words its
questions share). Largest first. `report` puts them beside the site's figures.

A curated answer (an operator's answer to a question: a text source whose id starts with
`answer-`, shared/sources.py `curated_spec`) that is close to a group marks it
"answered"; once a later question close to the group is answered citing that source, the
group is "closed" (its `closed_by` names the turn). Otherwise a group is "open".
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from typing import Callable, Iterable, Sequence

import numpy as np

from shared import sources
from shared.bus import Bus
from shared.insight import ConversationFacts, Filters, Projections, TurnFacts, figures, selected

THRESHOLD = 0.6  # cosine between a question and a group's mean: the same question, asked otherwise
EXAMPLES = 5
WORD = re.compile(r"[^\W\d_][\w'-]{2,}", re.UNICODE)
COMMON = set("""the and for are you your does can how what which who when where why with from this that have has
into about our any there their they them will would could should need want please tell know like use using
est les des une pour avec que qui quoi comment dans sur vous votre ist der die das und wie was für ein eine
los las por con que como para una""".split())

Embed = Callable[[list[str]], np.ndarray]


def is_gap(turn: TurnFacts) -> bool:
    return bool(turn.question) and (turn.outcome == "not_found" or turn.rating == "down"
                                    or (turn.weak and turn.outcome == "answered"))


def gaps(records: Iterable[ConversationFacts], embed: Embed, filters: Filters = Filters(),
         curated: Sequence[tuple[str, str]] = (), threshold: float = THRESHOLD) -> list[dict]:
    """The gap groups of `records` in `filters`' range, largest first. `curated`: the site's
    curated answers as (what a citing answer names as its source, question)."""
    chosen = selected(records, filters)
    asked = sorted(((r.session_id, t) for r in chosen for t in r.turns if is_gap(t)), key=lambda p: p[1].ts)
    if not asked:
        return []
    vectors = _unit(embed([t.question for _, t in asked]))
    groups: list[dict] = []
    sums: list[np.ndarray] = []
    for (session, turn), vector in zip(asked, vectors):
        best, score = -1, threshold
        for i, total in enumerate(sums):
            similarity = float(vector @ (total / np.linalg.norm(total)))
            if similarity >= score:
                best, score = i, similarity
        if best < 0:
            groups.append({"members": []})
            sums.append(np.zeros_like(vector))
            best = len(groups) - 1
        groups[best]["members"].append((session, turn, vector))
        sums[best] = sums[best] + vector
    centres = [_unit(total[None, :])[0] for total in sums]
    answers = _curated_matches(centres, curated, embed, threshold)
    closing = _closing_turns(chosen, centres, answers, embed, threshold)
    out = [_describe(group["members"], centre, answers.get(i), closing.get(i))
           for i, (group, centre) in enumerate(zip(groups, centres))]
    return sorted(out, key=lambda g: (-g["size"], -g["questions"], g["first_asked"]))


async def report(bus: Bus, site: str, filters: Filters, embed: Embed) -> dict:
    """A site's figures (shared/insight.py) and knowledge gaps over `filters`, as `concierge
    insight` prints them and the operator API serves them (`embed`: texts -> vectors, run in
    a thread, off the event loop)."""
    records = await Projections(bus).records(site)
    curated = sources.curated_answers(await sources.definitions(bus, site))
    found = await asyncio.to_thread(gaps, records, embed, filters, curated)
    return {"site": site, "since": filters.since, "until": None if filters.until == float("inf") else filters.until,
            "language": filters.language, "route": filters.route, **figures(records, filters), "gaps": found}


def _describe(members: list, centre: np.ndarray, answer: tuple[str, str] | None,
              closed_by: dict | None) -> dict:
    sessions = {session for session, _, _ in members}
    questions = list(dict.fromkeys(turn.question for _, turn, _ in reversed(members)))  # newest first
    central = max(members, key=lambda m: float(m[2] @ centre))[1].question
    closest = Counter((s.title, s.url) for _, turn, _ in members for s in turn.closest)
    words = Counter(w for q in {t.question.lower() for _, t, _ in members} for w in set(WORD.findall(q))
                    if w not in COMMON)
    first = min(members, key=lambda m: m[1].ts)
    reasons = Counter("rated down" if t.rating == "down" else ("weak" if t.outcome == "answered" else "not found")
                      for _, t, _ in members)
    status = "closed" if answer and closed_by else ("answered" if answer else "open")
    return {
        "id": "gap-" + hashlib.blake2b(f"{first[0]}|{first[1].turn}".encode(), digest_size=6).hexdigest(),
        "size": len(sessions),
        "questions": len(members),
        "examples": questions[:EXAMPLES],
        "reasons": dict(reasons.most_common()),
        "closest": [{"title": title, "url": url} for (title, url), _ in closest.most_common(3)],
        "suggested_page": {"title": central, "about": [w for w, _ in words.most_common(6)]},
        "sessions": sorted(sessions),
        "first_asked": first[1].ts,
        "last_asked": max(t.ts for _, t, _ in members),
        "status": status,
        "curated": {"source": answer[0], "question": answer[1]} if answer else None,
        "closed_by": closed_by,
    }


def _curated_matches(centres: list[np.ndarray], curated: Sequence[tuple[str, str]], embed: Embed,
                     threshold: float) -> dict[int, tuple[str, str]]:
    """Each group's curated answer: the closest curated question at least `threshold` away."""
    if not curated or not centres:
        return {}
    similarity = _unit(embed([question for _, question in curated])) @ np.stack(centres).T
    out = {}
    for i in range(len(centres)):
        j = int(np.argmax(similarity[:, i]))
        if similarity[j, i] >= threshold:
            out[i] = curated[j]
    return out


def _closing_turns(records: list[ConversationFacts], centres: list[np.ndarray], answers: dict[int, tuple[str, str]],
                   embed: Embed, threshold: float) -> dict[int, dict]:
    """Each answered group's first turn close to it that was answered citing its curated answer."""
    names = {name for name, _ in answers.values()}
    cited = sorted(((r.session_id, t) for r in records for t in r.turns
                    if t.outcome == "answered" and any(s.url in names for s in t.cited)), key=lambda p: p[1].ts)
    if not cited:
        return {}
    similarity = _unit(embed([t.question for _, t in cited])) @ np.stack(centres).T
    out: dict[int, dict] = {}
    for row, (session, turn) in enumerate(cited):
        i = int(np.argmax(similarity[row]))
        if similarity[row, i] >= threshold and i in answers and i not in out \
                and any(s.url == answers[i][0] for s in turn.cited):
            out[i] = {"session_id": session, "turn": turn.turn, "question": turn.question, "ts": turn.ts}
    return out


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)

