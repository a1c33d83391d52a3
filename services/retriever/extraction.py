"""Offline knowledge extraction, for when no LLM is configured: chunks, entities and
relationships from a document, and the keywords of a query, with rules instead of a model.

- Chunks: each section's paragraphs packed up to `max_tokens` (the embedding model reads
  256), prefixed with the document title and section heading so every chunk carries its
  context.
- Entities: section headings (topics), bold terms, and capitalised names (products,
  integrations, standards: "Salesforce", "SOC 2", "Tidewise Mobile"); each described by
  the sentences of the document that mention it.
- Relationships: two entities named in the same sentence, described by that sentence; a
  section's topic and the entities of its text.
- Query keywords: low-level = the site's entity names and capitalised names found in the
  query; high-level = the query's content words.

The result feeds LightRAG's `ainsert_custom_kg` (see knowledge.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from services.retriever.documents import SourceDocument

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n+")
BOLD = re.compile(r"\*\*([^*\n]{2,60})\*\*")
NAME = re.compile(r"\b([A-Z][A-Za-z0-9&+.'-]*(?:[ -](?:[A-Z0-9][A-Za-z0-9&+.'-]*|of|for|&)){0,3})")
WORD = re.compile(r"[^\W_][\w'-]*", re.UNICODE)
# Capitalised only because they start a sentence or are everyday words, not names.
COMMON = set("""a an the this that these those it its we our you your they their he she i my me us
yes no not all any each every some more most many much few one two three four five six seven eight nine ten
what which who whom whose when where why how can could will would should may might must do does did is are
was were be been being have has had if then than so but or and for with without from into onto on in at by
to of as per via about also only just very here there new every today now use using used get see
monday tuesday wednesday thursday friday saturday sunday january february march april june july august
september october november december q a faq note tip example step page pages section overview introduction
hello hi thanks please le la les un une des et ou de du en pour avec el los las y por con der die das und
mit für ein eine il lo gli di che o e com para os as um uma het een van voor met""".split())
STOP = COMMON | set("""tell know want need like give show explain much many offer offers offered does do
provide provides support supports work works able there any kind kinds whats what's i'm im can't cannot
between difference about available include includes including""".split())
VERSION = 4  # bump when the rules change: documents ingested by older rules are extracted again
# (3: a relationship's vector is its anchor chunk's, knowledge._write; a site keeps one kind;
# 4: a sentence's opening word with only numbers and small words after it is no name)
MAX_ENTITIES = 80
MAX_RELATIONS = 160
MAX_DESCRIPTION_SENTENCES = 3


@dataclass
class Chunk:
    alias: str  # the chunk's name inside its document (source_id in a custom KG)
    content: str


@dataclass
class Extraction:
    chunks: list[Chunk] = field(default_factory=list)
    entities: dict[str, dict] = field(default_factory=dict)  # name -> {type, description, chunk}
    relations: dict[tuple[str, str], dict] = field(default_factory=dict)  # (a, b) sorted -> {description, keywords, chunk}


def chunk(doc: SourceDocument, count_tokens: Callable[[str], int], max_tokens: int = 200) -> list[Chunk]:
    chunks: list[Chunk] = []
    for heading, text in doc.sections:
        prefix = f"{doc.title} — {heading}\n" if heading else f"{doc.title}\n"
        budget = max_tokens - count_tokens(prefix)
        parts: list[str] = []
        for paragraph in _paragraphs(text, count_tokens, budget):
            if parts and count_tokens("\n".join(parts + [paragraph])) > budget:
                chunks.append(Chunk(f"{doc.doc_id}#{len(chunks)}", prefix + "\n".join(parts)))
                parts = []
            parts.append(paragraph)
        if parts:
            chunks.append(Chunk(f"{doc.doc_id}#{len(chunks)}", prefix + "\n".join(parts)))
    return chunks


def _paragraphs(text: str, count_tokens: Callable[[str], int], budget: int) -> list[str]:
    """Paragraphs, with any paragraph longer than the budget cut at sentence ends."""
    out: list[str] = []
    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if not paragraph:
            continue
        if count_tokens(paragraph) <= budget:
            out.append(paragraph)
            continue
        piece = ""
        for sentence in SENTENCE.split(paragraph):
            candidate = f"{piece} {sentence}".strip()
            if piece and count_tokens(candidate) > budget:
                out.append(piece)
                candidate = sentence
            piece = candidate
        if piece:
            out.append(piece)
    return out


def names_in(text: str, known: set[str] | None = None) -> list[str]:
    """Capitalised names and bold terms, in order of appearance, without everyday words.
    A capitalised word that opens the text, alone or with only numbers and small words
    after it ("Teams of 50"), is a name only if it is in `known` (names seen elsewhere),
    since any word is capitalised there ("Office users are free")."""
    found: list[str] = []
    for match in BOLD.finditer(text):
        found.append(match.group(1).strip())
    plain = BOLD.sub(lambda m: m.group(1), text)
    for match in NAME.finditer(plain):
        words = match.group(1).strip(" .'-").split()
        while words and words[0].lower() in COMMON:
            words = words[1:]
        while words and words[-1].lower() in COMMON:
            words = words[:-1]
        if not words or (len(words) == 1 and len(words[0]) < 2):
            continue
        opening = not plain[:match.start()].strip(" -*#>\"'(")
        # At the opening, only the first word may be capitalised for the opening's sake:
        # with no other capitalised word ("Teams of 50 people use it"), the phrase is a
        # name only if the document uses it (or its first word) as one elsewhere.
        alone = len(words) == 1 or not any(w[0].isupper() for w in words[1:])
        if alone and opening and known is not None and words[0] not in known and " ".join(words) not in known:
            continue
        found.append(" ".join(words))
    seen: set[str] = set()
    return [n for n in found if not (n.lower() in seen or seen.add(n.lower()))]


def extract(doc: SourceDocument, chunks: list[Chunk]) -> Extraction:
    result = Extraction(chunks=chunks)
    mentions: dict[str, list[str]] = {}
    first_chunk: dict[str, str] = {}
    kinds: dict[str, str] = {}
    # Names the document uses mid-sentence or in several words: a sentence-opening word
    # counts as a name only if it is one of these.
    known = {n for c in chunks for sentence in SENTENCE.split(c.content.partition("\n")[2])
             for n in names_in(sentence, known=set())}
    for c in chunks:
        head, _, body = c.content.partition("\n")
        topic = head.split(" — ", 1)[1].strip() if " — " in head else ""
        if topic and len(topic.split()) <= 6:
            kinds.setdefault(topic, "topic")
            first_chunk.setdefault(topic, c.alias)
            mentions.setdefault(topic, []).append(body.strip().split("\n")[0][:300])
        for sentence in (s.strip(" -*") for s in SENTENCE.split(body)):
            if len(sentence) < 3:
                continue
            names = names_in(sentence, known)[:6]
            for name in names:
                kinds.setdefault(name, "term")
                first_chunk.setdefault(name, c.alias)
                mentions.setdefault(name, []).append(sentence[:300])
            pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if a.lower() != b.lower()]
            if topic:
                pairs += [(topic, n) for n in names if n.lower() != topic.lower()]
            for a, b in pairs:
                key = tuple(sorted((a, b)))
                rel = result.relations.setdefault(key, {"sentences": [], "keywords": topic or doc.title, "chunk": c.alias})
                if len(rel["sentences"]) < MAX_DESCRIPTION_SENTENCES and sentence not in rel["sentences"]:
                    rel["sentences"].append(sentence[:300])
    ranked = sorted(mentions, key=lambda n: (-len(mentions[n]), n))[:MAX_ENTITIES]
    for name in ranked:
        sentences = list(dict.fromkeys(mentions[name]))[:MAX_DESCRIPTION_SENTENCES]
        result.entities[name] = {"type": kinds[name], "description": f"{name} ({doc.title}): " + " ".join(sentences),
                                 "chunk": first_chunk[name]}
    kept = {k: v for k, v in result.relations.items() if k[0] in result.entities and k[1] in result.entities}
    best = sorted(kept, key=lambda k: -len(kept[k]["sentences"]))[:MAX_RELATIONS]
    result.relations = {k: {"description": " ".join(kept[k]["sentences"]), "keywords": kept[k]["keywords"],
                            "chunk": kept[k]["chunk"]} for k in best}
    return result


def query_keywords(query: str, entity_names: list[str]) -> tuple[list[str], list[str]]:
    """(high-level, low-level) keywords of a query, without an LLM."""
    padded = f" {' '.join(m.group(0) for m in WORD.finditer(query.lower()))} "
    low = [n for n in entity_names if len(n) > 2 and f" {' '.join(WORD.findall(n.lower()))} " in padded]
    low += [n for n in names_in(query) if n.lower() not in STOP and n not in low]
    content = [w for w in (m.group(0).lower() for m in WORD.finditer(query)) if w not in STOP and len(w) > 1]
    high = [" ".join(content)] if content else []
    if not low:
        low = content[:6]
    return high, low[:8]
