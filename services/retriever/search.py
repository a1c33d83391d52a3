"""Searching a site's knowledge base for one query, the machinery of the `retrieval` node
(retrieval.py), also run offline by the retrieval eval (evaluation.py).

The search text (the message; for a short follow-up such as "and with Salesforce?", the
visitor's previous message in front; for a message not in English, the English of the
glossary terms it holds appended, shared/glossary.py) → keywords (offline, or the
`classifier` LLM role with RETRIEVAL_KEYWORDS=llm) → LightRAG on the site's own workspace
(chunks by vector search, entities and relationships from the graph, per the mode) → the
reranker (when enabled; the limiter if it fails) or the type-based limiter (when enabled)
or everything → documents numbered 1..N for `[N]` citations. The knowledge base is retried
once; a second failure raises `KnowledgeBaseError`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from services.retriever import extraction, limiter, rerank
from services.retriever.knowledge import KnowledgeBase
from services.retriever.rerank import Reranker, RerankError
from services.retriever.settings import RetrievalSettings, RetrieverSettings
from shared import follow_up, glossary, kb_vectors, language, prompts
from shared import events as ev
from shared.llm import LLMClient, LLMError
from shared.site_config import SiteConfig

log = logging.getLogger(__name__)

KEYWORDS_PROMPT = Path(__file__).parent / "prompts" / "keywords.md"
MIN_QUERY_WORDS = 3  # a query shorter than this without the site's name keeps the name
SNIPPET_CHARS = 240
ATTEMPTS = 2
RETRY_BACKOFF_S = 0.2


class Keywords(msgspec.Struct, kw_only=True):
    high_level: list[str] = []
    low_level: list[str] = []


@dataclass
class Candidate:
    document_type: str
    title: str
    source: str
    content: str
    doc_id: str
    score: float | None = None

    def text(self) -> str:
        return f"{self.title}\n{self.content}"


@dataclass
class Retrieved:
    documents: list[ev.RetrievedDocument]
    keywords: dict[str, list[str]]
    found: dict[str, int]
    selection: str
    fallback: str | None = None
    errors: list[str] = field(default_factory=list)
    unknown_names: list[str] = field(default_factory=list)
    contact_page: str = ""


def search_text(previous: str, message: str) -> str:
    """The message, with the visitor's previous message ("" when none may be used) in front
    when this one leans on it (shared/follow_up.py: "And Xero?", "Which versions does it need?")."""
    message = " ".join(message.split())
    if previous and follow_up.follows_up(message):
        return f"{' '.join(previous.split())} {message}"
    return message


def without_site_name(query: str, name: str) -> str:
    """The query without the site's own name ("Which accounting software does Tidewise
    integrate with?" → "Which accounting software does integrate with?"). Nearly every
    document of a site names the site, so the name ranks nothing, yet it pulls the overview
    pages above the section that answers (measured: the Accounting section was not among
    the 20 documents with it, first without it). A query that is little more than the name
    keeps it."""
    if not name.strip():
        return query
    masked = re.sub(rf"\b{re.escape(name.strip())}(?:['’]s)?\b", " ", query, flags=re.IGNORECASE)
    masked = " ".join(masked.split())
    return masked if len(re.findall(r"\w+", masked)) >= MIN_QUERY_WORDS else query


def candidates(kb: KnowledgeBase, site: str, found: dict[str, list[dict]]) -> dict[str, list[Candidate]]:
    """LightRAG's records → candidates with a title and a source for the browser."""
    out: dict[str, list[Candidate]] = {t: [] for t in limiter.TYPES}
    for kind, items in (("chunk", found["chunk"]), ("entity", found["entity"]),
                        ("relationship", found["relationship"])):
        for item in items:
            record = kb.document(site, item.get("file_path", ""))
            if kind == "chunk":
                head, _, body = item["content"].partition("\n")
                section = f" — {head.split(' — ', 1)[1]}" if " — " in head else ""
                title, content = (record["title"] if record else head) + section, body or head
                if record and body:
                    content = with_section_rest(record, item["content"], content)
            elif kind == "entity":
                title, content = item["entity_name"], item.get("description", "")
            else:
                title, content = f"{item['src_id']} — {item['tgt_id']}", item.get("description", "")
            out[kind].append(Candidate(kind, title, record["source"] if record else "", content,
                                       record["doc_id"] if record else ""))
    return out


def with_section_rest(record: dict, chunk: str, body: str) -> str:
    """A chunk's text with the next chunk of its section, when the section goes on: a
    section longer than the embedding model reads is cut into chunks, and the one a query
    finds often stops where the answer goes on (the sentence introducing a list, the list
    in the next chunk). Searched small, read whole enough to answer."""
    chunks = list(record.get("chunks", {}).values())  # in the document's order
    try:
        at = chunks.index(chunk)
    except ValueError:
        return body
    if at + 1 < len(chunks):
        head, _, rest = chunks[at + 1].partition("\n")
        if head == chunk.partition("\n")[0] and rest:
            return f"{body}\n{rest}"
    return body


def with_page_rest(kb: KnowledgeBase, site: str, kept: list[Candidate], pages: int, limit: int) -> list[Candidate]:
    """`kept` with the first `pages` pages among its chunks read whole: each page's chunks
    that no kept document holds appended to the page's first chunk (at most `limit`
    characters), in the page's order, each under a heading naming its section as its own
    document's title would ("Pricing — Office users": what its sentences are about). A page
    is found by the section nearest the question's words, but what answers it is often
    further on: a price below the plan it belongs to, the exception after the rule."""
    if pages <= 0 or limit <= 0:
        return kept
    out = list(kept)
    held = "\n".join(c.content for c in kept)
    seen: list[str] = []
    for at, c in enumerate(kept):
        if c.document_type != "chunk" or not c.doc_id or c.doc_id in seen:
            continue
        seen.append(c.doc_id)
        if len(seen) > pages:
            break
        record = kb.document(site, c.doc_id)
        rest, size = [], 0
        for chunk in (record or {}).get("chunks", {}).values():  # in the page's order
            head, _, body = chunk.partition("\n")
            body = body.strip()
            if not body or body in held:
                continue
            text = f"## {head}\n{body}" if " — " in head else body  # its section, named as its document would be
            if size + len(text) > limit:
                break
            rest.append(text)
            size += len(text)
        if rest:
            out[at] = Candidate(c.document_type, c.title, c.source, "\n".join([c.content, *rest]), c.doc_id, c.score)
    return out


async def select(settings: RetrievalSettings, rerankers: dict[str, Reranker], query: str,
                 by_type: dict[str, list[Candidate]]) -> tuple[list[Candidate], str, str | None]:
    """(documents kept, how they were chosen, why the reranker was not used if it was
    meant to be)."""
    if not settings.relationships_enabled:
        by_type = {**by_type, "relationship": []}
    fallback = None
    if settings.rerank_enabled:
        reranker = rerankers.get(settings.rerank_provider)
        everything = [c for t in limiter.TYPES for c in by_type[t]]
        if reranker is None:
            fallback = f"reranker {settings.rerank_provider} not configured"
        elif everything:
            try:
                ranked = await reranker.rerank(query, [c.text() for c in everything], settings.rerank_top_k,
                                               settings.rerank_model)
                kept = [everything[i] for i, _ in ranked]
                for (_, score), c in zip(ranked, kept):
                    c.score = score
                return kept, f"rerank:{reranker.provider}", None
            except RerankError as exc:
                fallback = str(exc)
                log.warning("reranker failed; using the limiter", extra={"error": fallback})
        else:
            return [], f"rerank:{settings.rerank_provider}", None
    if settings.limiter_enabled or fallback:
        kept = limiter.limit(settings.mode, settings.rerank_top_k, by_type)
        return [c for t in limiter.TYPES for c in kept[t]], "limiter", fallback
    return [c for t in limiter.TYPES for c in by_type[t]], "all", fallback


def numbered(kept: list[Candidate]) -> list[ev.RetrievedDocument]:
    return [ev.RetrievedDocument(n=i, document_type=c.document_type, title=c.title, source=c.source,
                                 snippet=_snippet(c.content), content=c.content, doc_id=c.doc_id,
                                 rerank_score=None if c.score is None else round(c.score, 4))
            for i, c in enumerate(kept, start=1)]


async def answerable_texts(kb: KnowledgeBase, site: str, name: str,
                           kinds: tuple[str, ...] = limiter.TYPES) -> list[str]:
    """Every sentence and title of the site's knowledge base an extractive answer may embed
    (of the documents of `kinds`: chunk, entity, relationship), the site's `name` masked as
    the answer masks it (shared/kb_vectors.py `texts`): what `concierge ingest` (every
    kind) and a source's sync (its chunks: the sentences answers quote) prepare the vectors
    of."""
    by_type = candidates(kb, site, await kb.everything(site))
    return kb_vectors.texts(numbered([c for kind in kinds for c in by_type.get(kind, [])]), name)


def _snippet(text: str) -> str:
    flat = " ".join(text.replace("**", "").split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[:SNIPPET_CHARS].rsplit(" ", 1)[0] + "…"


@dataclass
class Retriever:
    kb: KnowledgeBase
    base: RetrievalSettings
    rerankers: dict[str, Reranker]
    llm: LLMClient | None = None  # keyword extraction by LLM, when configured

    async def keywords(self, site: str, query: str, config: SiteConfig, record) -> tuple[Keywords, str, str | None]:
        if self.llm is not None:
            system = prompts.compose(KEYWORDS_PROMPT, site, config)
            try:
                found = await self.llm.structured("classifier", [{"role": "system", "content": system},
                                                                 {"role": "user", "content": query}],
                                                  record, Keywords, temperature=0.0)
                if found.high_level or found.low_level:
                    return found, "llm", None
                error = "llm: no keywords"
            except (LLMError, msgspec.MsgspecError) as exc:
                error = f"llm: {exc}"[:300]
        else:
            error = None
        high, low = extraction.query_keywords(query, self.kb.entity_names(site))
        return Keywords(high_level=high, low_level=low), "offline", error

    def unknown_names(self, site: str, message: str, lang: str | None, config: SiteConfig) -> list[str]:
        """The names an English message asks about that no word of the site's knowledge is
        (a plural's singular counts: "IPs" is "IP"); [] in another language, or when the
        site's words cannot all be known."""
        if (lang or language.guess(message)) != "en":
            return []
        vocabulary = self.kb.vocabulary(site)
        if not vocabulary:
            return []
        own = set(language.words(config.name))
        unknown = []
        for name in language.names(message):
            words = language.words(name)
            if words and not own.intersection(words) and not all(
                    any(form in vocabulary for form in _forms(word)) for word in words):
                unknown.append(name)
        return unknown

    async def retrieve(self, site: str, query: str, config: SiteConfig, record, lang: str | None = None,
                       message: str = "") -> Retrieved:
        """`lang`: the query's language, guessed from it when not given; a query in another
        language than English is searched with the English of its glossary terms too (the
        knowledge base and its embedding model are English). `message`: the visitor's own
        words, whose names are checked against the site's (`unknown_names`; default: the
        query)."""
        message = message or query
        await self.kb.ready(site)  # its published snapshot fetched, when this replica had not yet
        settings = self.base.for_site(config)
        query = without_site_name(glossary.expand(query, lang or language.guess(query)), config.name)
        words, extractor, keyword_error = await self.keywords(site, query, config, record)
        errors = [keyword_error] if keyword_error else []
        for attempt in range(1, ATTEMPTS + 1):
            try:
                found = await self.kb.query(site, query, mode=settings.mode, high_level=words.high_level,
                                            low_level=words.low_level, graph_top_k=settings.graph_top_k,
                                            chunk_top_k=settings.chunk_top_k)
                break
            except Exception as exc:  # noqa: BLE001 - storage trouble: retry once, then report it
                errors.append(f"knowledge base: {type(exc).__name__}: {exc}"[:300])
                if attempt == ATTEMPTS:
                    raise KnowledgeBaseError("; ".join(errors)) from exc
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
        by_type = candidates(self.kb, site, found)
        kept, selection, fallback = await select(settings, self.rerankers, query, by_type)
        kept = with_page_rest(self.kb, site, kept, settings.page_rest_pages, settings.page_rest_chars)
        return Retrieved(documents=numbered(kept), unknown_names=self.unknown_names(site, message, lang, config),
                         contact_page="" if config.redirects.support else self.kb.contact_page(site),
                         keywords={"high_level": words.high_level, "low_level": words.low_level,
                                   "extractor": [extractor]},
                         found={t: len(v) for t, v in by_type.items()}, selection=selection, fallback=fallback,
                         errors=errors)


def _forms(word: str) -> tuple[str, ...]:
    """A word as the knowledge may hold it: itself, without a plural's "s", with one."""
    return (word, word[:-1], f"{word}s") if word.endswith("s") and len(word) > 2 else (word, f"{word}s")


class KnowledgeBaseError(Exception):
    pass


def configured(kb: KnowledgeBase, settings: RetrieverSettings) -> Retriever:
    """The retriever as the settings make it, over an open knowledge base."""
    return Retriever(kb=kb, base=settings.retrieval,
                     rerankers=rerank.configured(settings.rerankers, settings.retrieval.rerank_timeout_s),
                     llm=LLMClient(settings.llm).prepare() if settings.keywords == "llm" else None)
