"""The knowledge base: one LightRAG workspace per site, vectors in Qdrant.

Isolation is a property of the storage, not of the query code: every site is its own
LightRAG workspace, so its knowledge graph and key-value stores are files under
`<KB_DIR>/<site>/`, and every vector it writes to Qdrant carries `workspace_id=<site>`;
LightRAG's Qdrant storage filters every search on it. A query is made through the site's
own LightRAG instance and cannot name another workspace.

Qdrant: the server at `QDRANT_URL` when set; otherwise qdrant-client's embedded local mode,
files under `<KB_DIR>/qdrant` (one process at a time: stop the retriever to ingest, or use
a server). LightRAG's Qdrant storage only knows how to make a client from a URL, so
lightrag_storage.py registers one under another name that is given the client; LightRAG
is handed its tokenizer (word_tokenizer.py) and its embedding and LLM functions
(lightrag_functions.py).

Documents are added with `ainsert_custom_kg` (chunks, entities and relationships made
offline by extraction.py), or, with an LLM for the `extraction` role
(RETRIEVAL_EXTRACTION=llm), through LightRAG's own `ainsert` (its chunking and LLM
extraction; removed with `adelete_by_doc_id`). `<KB_DIR>/<site>/documents.json` records what each document
added, so re-ingesting an unchanged file does nothing and a changed or deleted file takes
its chunks, and the entities and relationships no other document of the site names, with
it; names that other documents share are written again from those documents.
`ingest_many` does it for many documents at once, with one embedding pass and one insert;
`ingest` is a batch of one. A site's writers (ingest, delete, load) take its lock; queries
take none and read the stores as the last flush left them.

A site can also be served from another directory: a snapshot of its files published by
ingestion and unpacked by this replica (snapshots.py). `load` opens it beside the one in
use and swaps them; queries already running finish on the old one, which is closed and
its directory removed after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import time
import weakref
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from services.retriever import extraction, lightrag_functions, local_qdrant
from services.retriever.documents import SourceDocument
from services.retriever.lightrag_functions import (UNBOUNDED_TOKENS, cosine_once_per_vector, embedding_function,
                                                    llm_function, no_llm, querying, quiet_lightrag, share_query_config,
                                                    tokenize_inline, unqueued_embedding, untruncated_when_unbounded)
from services.retriever.pool import Opened, Pool, estimate
from services.retriever.settings import KnowledgeBaseSettings
from services.retriever.stage_clock import StageClock
from services.retriever.word_tokenizer import WordTokenizer
from shared import language, subjects
from shared.embeddings import Embedder, model_dir
from shared.llm import LLMClient

SEP = "<SEP>"  # LightRAG's separator between the sources of a merged graph field
MAX_DESCRIPTION_CHARS = 600


@dataclass(frozen=True)
class _Derived:
    saves: int  # the registry's change it was made from
    vocabulary: frozenset[str] | None
    contact_page: str


def _vocabulary(registry: dict[str, dict]) -> frozenset[str] | None:
    words: set[str] = set()
    for record in registry.values():
        if record.get("extraction") == "llm":
            return None
        texts = [record.get("title", ""), *record.get("chunks", {}).values(), *record.get("entities", {})]
        words.update(language.words(" ".join(texts)))
    return frozenset(words)


def _contact_page(registry: dict[str, dict]) -> str:
    found: list[tuple[int, str]] = []
    for record in registry.values():
        source = record.get("source", "")
        if not source.startswith(("http://", "https://")):
            continue
        last = source.split("?")[0].split("#")[0].rstrip("/").rsplit("/", 1)[-1].lower()
        rank = next((i for i, names in enumerate(CONTACT_PAGES) if last in names), None)
        if rank is None and record.get("title", "").lower().startswith(("contact", "kontakt")):
            rank = 0
        if rank is not None:
            found.append((rank, source))
    return min(found)[1] if found else ""


# Sites whose vocabulary (`vocabulary`) is kept made (about 1 MB for a site of 180 pages, 7,000
# words); another is made again when asked.
VOCABULARIES = 64
# Registries (documents.json) kept in memory besides the open sites' own.
REGISTRIES = 64
# A contact page's address ends in one of these (best first): see `contact_page`.
CONTACT_PAGES = (frozenset({"contact", "contact-us", "contactus", "contacts", "get-in-touch", "kontakt", "contacto",
                            "nous-contacter", "contatti"}),
                 frozenset({"support", "help", "help-center", "helpdesk", "customer-support", "hilfe", "aide"}))
LLM_CHUNK_WORDS = 160  # ≈ 210 MiniLM tokens: under the 256 the embedding model reads
LLM_CHUNK_OVERLAP_WORDS = 20


class UnknownSite(Exception):
    pass


class KnowledgeBaseLocked(Exception):
    """The embedded Qdrant store is open in another process."""


class KnowledgeBase:
    def __init__(self, root: Path, embedder: Embedder, qdrant_url: str = "", qdrant_api_key: str = "",
                 extraction_llm: LLMClient | None = None, client=None, cosine_threshold: float = 0.2,
                 memory_budget_mb: int = 1024, open_sites: int = 0):
        """`client`: an open Qdrant client to use (and leave open) instead of making one,
        as if it were a server: shared collections, every point tagged with its site.
        `memory_budget_mb`: what this process may take in memory; the sites it holds open
        get a share of what it does not take when the first one opens (pool.py), and
        `open_sites`, when above 0, bounds their number too."""
        self.root = root
        # With an LLM for the `extraction` role, documents go through LightRAG's own
        # pipeline (its chunking, its LLM entity and relationship extraction); otherwise
        # through the offline extractor and `ainsert_custom_kg`.
        self.extraction_llm = extraction_llm
        self.embedder = embedder
        self.qdrant_url = qdrant_url
        self.qdrant_api_key = qdrant_api_key
        self.cosine_threshold = cosine_threshold
        self.memory_budget_mb = memory_budget_mb
        self._pool = Pool(self._close_site, self._writing, memory_budget_mb << 20, open_sites)
        self._places: dict[str, Path] = {}  # sites served from a directory other than root/<site>
        self._deferred: dict[str, Callable[[], Awaitable[Path | None]]] = {}  # newer snapshots not fetched yet
        # a site's writers' lock, while anyone holds or waits for it
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # site → its documents.json: the open sites', and REGISTRIES more asked last
        self._registries: OrderedDict[str, dict] = OrderedDict()
        # site → what its registry gives (`_derived`), for the VOCABULARIES sites asked last only
        self._derived: OrderedDict[str, _Derived] = OrderedDict()
        self._saves: dict[str, int] = {}  # site → its registry's changes: a change makes `_derived` again
        self._client = client
        self._own_client = client is None
        self._server = bool(qdrant_url) or client is not None
        self._key = f"kb-{id(self)}"
        self.clock = StageClock()  # where ingestion's time went (`concierge loadtest ingest`)
        self._prepared: dict[str, Any] = {}  # text -> vector, embedded before an insert (`_write`)
        self._tokenizer = None
        self._model_tokenizer = None

    @classmethod
    def configured(cls, settings: KnowledgeBaseSettings, embedder: Embedder) -> "KnowledgeBase":
        return cls(Path(settings.kb_dir).resolve(), embedder, settings.qdrant_url, settings.qdrant_api_key,
                   LLMClient(settings.llm) if settings.extraction == "llm" else None,
                   cosine_threshold=settings.cosine_threshold, memory_budget_mb=settings.memory_budget_mb,
                   open_sites=settings.open_sites)

    # --- lifecycle ------------------------------------------------------------------

    def open(self) -> "KnowledgeBase":
        from qdrant_client import QdrantClient

        from services.retriever import lightrag_storage

        quiet_lightrag()
        tokenize_inline()
        untruncated_when_unbounded()
        cosine_once_per_vector()
        lightrag_storage.register()
        self.root.mkdir(parents=True, exist_ok=True)
        if self._client is not None:
            pass
        elif self.qdrant_url:
            self._client = QdrantClient(url=self.qdrant_url, api_key=self.qdrant_api_key or None)
        else:
            try:
                self._client = local_qdrant.open_local(str(self.root / "qdrant"))
            except RuntimeError as exc:  # qdrant-client: "Storage folder ... is already accessed by another instance"
                raise KnowledgeBaseLocked(
                    f"the knowledge base {self.root / 'qdrant'} is open in another process (a running retriever?): "
                    "stop it first, or set QDRANT_URL to a Qdrant server") from exc
        lightrag_storage.CLIENTS[self._key] = self._client
        self.embedder.load()
        from tokenizers import Tokenizer

        self._model_tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        self._model_tokenizer.no_truncation()
        self._model_tokenizer.no_padding()
        self._tokenizer = WordTokenizer()
        return self

    @property
    def pool(self) -> Pool:
        return self._pool

    async def close(self) -> None:
        from services.retriever import lightrag_storage

        await self._pool.close_all()
        if self._client is not None:
            lightrag_storage.CLIENTS.pop(self._key, None)
            if self._own_client:
                self._client.close()
            self._client = None

    def count_tokens(self, text: str) -> int:
        """In the embedding model's own tokens (chunks must fit what it reads)."""
        return len(self._model_tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    # --- one LightRAG per site ------------------------------------------------------

    def _site_dir(self, site: str) -> Path:
        if not subjects.TOKEN_RE.match(site):
            raise UnknownSite(f"invalid site id {site!r}: letters, digits, '-' and '_' only")
        return self._places.get(site, self.root / site)

    def site_directory(self, site: str) -> Path:
        """The directory the site is served from (its own under KB_DIR, or a loaded snapshot's)."""
        return self._site_dir(site)

    def _registry_path(self, site: str) -> Path:
        return self._site_dir(site) / "documents.json"

    def registry(self, site: str) -> dict[str, dict]:
        """The site's documents.json ({} for a site with none, which is not kept: a read
        never makes a site)."""
        registry = self._registries.get(site)
        if registry is None:
            path = self._registry_path(site)
            if not path.exists():
                return {}
            registry = self._registries[site] = json.loads(path.read_text())
            self._saves[site] = self._saves.get(site, 0) + 1  # another registry: its vocabulary is made again
            closed = [s for s in self._registries if s not in self._pool and not self._writing(s)]
            for old in closed[:max(0, len(closed) - REGISTRIES)]:  # bounded whatever the number of sites
                self._forget(old)
        self._registries.move_to_end(site)
        return registry

    def _forget(self, site: str) -> None:
        """Drop what is kept in memory of a site's registry (read again when asked)."""
        self._registries.pop(site, None)
        self._derived.pop(site, None)
        self._saves.pop(site, None)

    def contact_page(self, site: str) -> str:
        """The address of the site's contact page among its synced pages (its path's last
        part "contact", "contact-us", "kontakt"…, else "support" or "help"; or a title
        opening with "Contact"), '' when it has none: where a reply points a visitor the
        knowledge cannot help when the site's config names no support page."""
        return self._derived_of(site).contact_page

    def vocabulary(self, site: str) -> frozenset[str] | None:
        """Every word of the site's knowledge (its chunks, titles and entity names),
        lowercased; None when some document's text is not in the registry (chunked by
        LightRAG, LLM extraction) and the words cannot all be known."""
        return self._derived_of(site).vocabulary

    def _derived_of(self, site: str) -> "_Derived":
        """What the site's registry gives every turn its retrieval answers, made once per
        change of the registry (not on each turn), kept for the VOCABULARIES sites asked last."""
        registry = self.registry(site)
        saves = self._saves.get(site, 0)
        cached = self._derived.get(site)
        if not registry:
            return _Derived(saves=saves, vocabulary=frozenset(), contact_page="")
        if cached is None or cached.saves != saves:
            cached = _Derived(saves=saves, vocabulary=_vocabulary(registry), contact_page=_contact_page(registry))
            self._derived[site] = cached
        self._derived.move_to_end(site)
        while len(self._derived) > VOCABULARIES:  # bounded whatever the number of sites
            self._derived.popitem(last=False)
        return cached

    def _save_registry(self, site: str, registry: dict) -> None:
        self._registries[site] = registry
        self._saves[site] = self._saves.get(site, 0) + 1
        path = self._registry_path(site)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(registry, ensure_ascii=False))
        tmp.replace(path)
        if (opened := self._pool.peek(site)) is not None:
            opened.mtime = path.stat().st_mtime
            opened.cost = self._cost(site, opened.directory)

    def _lock(self, site: str) -> asyncio.Lock:
        """The site's writers' lock (ingest, delete, a snapshot's load)."""
        lock = self._locks.get(site)
        if lock is None:
            lock = self._locks[site] = asyncio.Lock()
        return lock

    def _writing(self, site: str) -> bool:
        lock = self._locks.get(site)
        return lock is not None and lock.locked()

    def _cost(self, site: str, directory: Path) -> int:
        vectors = 0
        if not self._server:  # local mode: its vectors are indexed in this process (lightrag_storage.LocalIndex)
            registry = self.registry(site)
            vectors = sum(len(r["chunks"]) + r.get("chunk_count", 0) for r in registry.values())
            vectors += len({n for r in registry.values() for n in r["entities"]})
            vectors += len({k for r in registry.values() for k in r["relations"]})
        return estimate(directory, vectors, self.embedder.dim)

    async def _rag(self, site: str, create: bool = False):
        """The site's LightRAG, or None when the site has no knowledge base."""
        opened = await self._opened(site, create)
        return opened.rag if opened else None

    async def _opened(self, site: str, create: bool = False) -> Opened | None:
        """The site's open LightRAG (opened in the pool when it is not), or None when the
        site has no knowledge base and `create` is not asked. Reopened when another process
        (an ingest against a Qdrant server) changed the site's documents."""
        if not create:  # a writer (create) fetched it before taking the site's lock
            await self.ready(site)
        path = self._registry_path(site)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            if not create:
                return None
            mtime = 0.0
        opened = self._pool.peek(site)
        if opened is not None and mtime > opened.mtime and not create:
            self._pool.pop(site)
            self._forget(site)
            await self._retire(site, opened)
        return await self._pool.get(site, lambda: self._open_site(site, self._site_dir(site), mtime))

    async def _open_site(self, site: str, directory: Path, mtime: float) -> Opened:
        rag = self._new_rag(site, directory)
        await rag.initialize_storages()
        lightrag_functions.steady_flags(rag)
        return Opened(rag, directory, mtime, cost=self._cost(site, directory))

    async def _close_site(self, site: str, opened: Opened) -> None:
        """The pool lets the site go: its LightRAG closed, its registry and vectors out of memory."""
        self._forget(site)
        await self._finalize(opened)

    async def load(self, site: str, directory: Path) -> None:
        """Serve `site` from `directory` (a snapshot's files) from now on. A site held open
        has its new LightRAG opened beside the one in use, then swapped in; queries already
        running finish on the old one, which is closed once they are done. One not open is
        opened from `directory` when next asked. The directory it was served from before is
        removed when it was a loaded snapshot too."""
        async with self._lock(site):
            self._deferred.pop(site, None)
            old, previous = await self._swap(site, directory)
        await self._let_go(site, old, previous)

    async def _swap(self, site: str, directory: Path) -> tuple[Opened | None, Path | None]:
        """`load`'s part under the site's lock: (the LightRAG replaced, the directory served before)."""
        registry_path = directory / "documents.json"
        registry = json.loads(registry_path.read_text()) if registry_path.exists() else {}
        await self._pool.settled(site)
        previous = self._places.get(site)
        self._places[site] = directory
        self._forget(site)
        if registry:
            self._registries[site] = registry
            self._saves[site] = 1
        if site in self._pool:
            new = await self._open_site(site, directory, registry_path.stat().st_mtime if registry else 0.0)
            return self._pool.put(site, new), previous
        return None, previous

    async def _let_go(self, site: str, old: Opened | None, previous: Path | None) -> None:
        if old is not None:
            await self._retire(site, old)
        elif previous is not None:
            self._remove_snapshot(site, previous)

    def defer(self, site: str, fetch: Callable[[], Awaitable[Path | None]]) -> None:
        """The site has a newer snapshot than the one this replica serves it from: `fetch`
        gets it (its unpacked directory, or None when there is nothing newer after all) when
        the site is next used (`ready`), not now: a replica starting beside thousands of
        sites downloads none of them before it answers."""
        self._deferred[site] = fetch

    def is_open(self, site: str) -> bool:
        return site in self._pool

    async def ready(self, site: str) -> None:
        """Fetch and load the site's deferred snapshot, if it has one (once, however many ask;
        when the fetch fails it stays deferred and the error is raised)."""
        if site not in self._deferred:
            return
        async with self._lock(site):
            fetch = self._deferred.pop(site, None)
            if fetch is None:  # fetched by whoever held the lock before
                return
            try:
                directory = await fetch()
            except BaseException:
                self._deferred.setdefault(site, fetch)
                raise
            if directory is None:
                return
            old, previous = await self._swap(site, directory)
        await self._let_go(site, old, previous)

    async def unload(self, site: str) -> None:
        """Stop serving `site` (its snapshot was withdrawn): it has no knowledge base from now on."""
        async with self._lock(site):
            self._deferred.pop(site, None)
            await self._pool.settled(site)
            old = self._pool.pop(site)
            previous = self._places.pop(site, None)
            self._forget(site)
        if old is not None:
            await self._retire(site, old)
        elif previous is not None:
            self._remove_snapshot(site, previous)

    async def _retire(self, site: str, old: Opened) -> None:
        await old.idle.wait()
        await self._finalize(old)
        self._remove_snapshot(site, old.directory)

    def _remove_snapshot(self, site: str, directory: Path) -> None:
        """Remove a loaded snapshot's directory the site is no longer served from (never a
        site's own under KB_DIR)."""
        if directory.parent != self.root and directory != self._places.get(site):
            shutil.rmtree(directory, ignore_errors=True)

    async def _finalize(self, opened: Opened) -> None:
        """Close a LightRAG: its stores flushed, LightRAG's in-memory tables of its workspace
        dropped, its Qdrant collections out of memory (local mode: read again when used)."""
        from services.retriever import lightrag_storage

        await opened.rag.finalize_storages()
        lightrag_storage.forget(opened.directory.name)
        self._release_vectors(opened.rag)
        lightrag_functions.dismantle(opened.rag)

    def _release_vectors(self, rag) -> None:
        """Local mode: the site's Qdrant collections out of memory (read again when next
        used: a query reads them once to make its search index)."""
        if (local := local_qdrant.lazy(self._client)) is not None:
            local.release(v.final_namespace for v in (rag.chunks_vdb, rag.entities_vdb, rag.relationships_vdb))

    def _new_rag(self, site: str, directory: Path):
        from lightrag import LightRAG
        from lightrag.utils import EmbeddingFunc, Tokenizer

        from services.retriever import lightrag_storage

        directory.mkdir(parents=True, exist_ok=True)
        embed = embedding_function(self.embedder, self.clock, self._prepared)
        rag = LightRAG(
            working_dir=str(directory.parent),
            workspace=directory.name,
            embedding_func=EmbeddingFunc(embedding_dim=self.embedder.dim, func=embed,
                                         model_name=re.sub(r"[^a-z0-9]+", "_", self.embedder.name.lower())),
            llm_model_func=llm_function(self.extraction_llm) if self.extraction_llm else no_llm,
            chunk_token_size=LLM_CHUNK_WORDS,  # LightRAG's chunking (LLM mode) counts words here
            chunk_overlap_token_size=LLM_CHUNK_OVERLAP_WORDS,
            tokenizer=Tokenizer("words", self._tokenizer),
            vector_storage=lightrag_storage.VECTOR_STORAGE,
            graph_storage=lightrag_storage.GRAPH_STORAGE,
            kv_storage=lightrag_storage.KV_STORAGE,
            doc_status_storage="JsonDocStatusStorage",
            vector_db_storage_cls_kwargs={"cosine_better_than_threshold": self.cosine_threshold, "site": site,
                                          "client_key": self._key, "collection_per_site": not self._server},
            enable_llm_cache=False,
        )
        share_query_config(rag)  # one copy of its configuration for all its queries (`querying`)
        unqueued_embedding(rag, embed)  # no worker tasks per instance left behind when it closes
        return rag

    # --- reading ----------------------------------------------------------------------

    async def query(self, site: str, text: str, *, mode: str, high_level: list[str], low_level: list[str],
                    graph_top_k: int, chunk_top_k: int) -> dict[str, list[dict]]:
        """{"chunk": [...], "entity": [...], "relationship": [...]}, each best first, from
        this site's workspace only."""
        from lightrag import QueryParam

        empty: dict[str, list[dict]] = {"chunk": [], "entity": [], "relationship": []}
        opened = await self._opened(site)
        if opened is None:
            return empty
        # LightRAG trims its context to token budgets meant for an LLM prompt, bisecting with
        # the tokenizer over the whole rendered context (costly on a large graph). Here the
        # reranker or the limiter chooses what is kept, and the answer's prompt has its own
        # cap, so the budgets are set out of reach, and with such budgets
        # nothing is rendered or counted to fit them (lightrag_functions.untruncated_when_unbounded).
        param = QueryParam(mode=mode, top_k=graph_top_k, chunk_top_k=chunk_top_k, hl_keywords=high_level,
                           ll_keywords=low_level, enable_rerank=False, max_entity_tokens=UNBOUNDED_TOKENS,
                           max_relation_tokens=UNBOUNDED_TOKENS, max_total_tokens=UNBOUNDED_TOKENS)
        with opened.use() as rag, querying():
            result = await rag.aquery_data(text, param)
        data = result.get("data") or {}
        return {"chunk": data.get("chunks", []), "entity": data.get("entities", []),
                "relationship": data.get("relationships", [])}

    async def everything(self, site: str) -> dict[str, list[dict]]:
        """Every chunk, entity and relationship of the site, in the shape `query` returns
        them: what a query could ever hand an answer (`concierge ingest` prepares their
        sentences' vectors from it, shared/kb_vectors.py)."""
        found: dict[str, list[dict]] = {"chunk": [], "entity": [], "relationship": []}
        opened = await self._opened(site)
        if opened is None:
            return found
        registry = self.registry(site)
        with opened.use() as rag:
            for doc_id, record in registry.items():
                found["chunk"] += [{"content": content, "file_path": doc_id} for content in record["chunks"].values()]
                if record.get("extraction") == "llm":  # chunked by LightRAG: its chunks, by its status record
                    status = await rag.doc_status.get_by_id(doc_id) or {}
                    chunks = await rag.text_chunks.get_by_ids(list(status.get("chunks_list") or []))
                    found["chunk"] += [{"content": c["content"], "file_path": doc_id} for c in chunks if c]
            graph = rag.chunk_entity_relation_graph
            for node in await graph.get_all_nodes():
                found["entity"].append({"entity_name": node.get("entity_id") or node["id"],
                                        "description": node.get("description", ""),
                                        "file_path": node.get("file_path", "")})
            for edge in await graph.get_all_edges():
                source, target = sorted((edge["source"], edge["target"]))  # as a query returns a pair
                found["relationship"].append({"src_id": source, "tgt_id": target,
                                              "description": edge.get("description", ""),
                                              "file_path": edge.get("file_path", "")})
        return found

    def document(self, site: str, file_path: str) -> dict | None:
        """The registry record of a document, from a LightRAG `file_path` (the doc id; a
        merged graph field names several)."""
        registry = self.registry(site)
        for doc_id in (file_path or "").split(SEP):
            if doc_id in registry:
                return registry[doc_id]
        return None

    def entity_names(self, site: str) -> list[str]:
        names: dict[str, None] = {}
        for record in self.registry(site).values():
            names.update(dict.fromkeys(record["entities"]))
        return list(names)

    def documents(self, site: str) -> list[dict]:
        return sorted(self.registry(site).values(), key=lambda r: r["path"])

    # --- writing ----------------------------------------------------------------------

    async def ingest(self, site: str, doc: SourceDocument) -> str:
        """"added", "replaced" or "unchanged"."""
        return (await self.ingest_many(site, [doc]))[doc.doc_id]

    async def ingest_many(self, site: str, docs: list[SourceDocument]) -> dict[str, str]:
        """Each document's outcome by doc id: "added", "replaced" or "unchanged" (a doc id
        given twice counts with its last version). The stores end as ingesting the documents
        one by one in order leaves them, but each piece of work is done once for all of them:
        the changed documents are extracted together off the event loop, every text to embed
        is embedded in one pass, their earlier versions are taken out, and one LightRAG insert
        writes their chunks and every entity and relationship they name (each once, however
        many of them name it), with one flush of the stores; documents.json is written once.
        The store runs on the event loop (qdrant-client's local mode is synchronous), ~6 ms
        a chunk: a caller serving queries meanwhile hands over batches of a size it can wait.

        If it fails, the registry is read again from documents.json, which still names the
        earlier versions, so ingesting the same documents again redoes them; a failure
        before the stores are written (the extraction, the embedding) leaves them untouched."""
        await self.ready(site)
        async with self._lock(site):
            registry = self.registry(site)
            method = "llm" if self.extraction_llm else extraction.VERSION
            outcomes: dict[str, str] = {}
            changed: list[SourceDocument] = []
            for doc in {d.doc_id: d for d in docs}.values():
                old = registry.get(doc.doc_id)
                if old is not None and old["content_hash"] == doc.content_hash and old.get("extraction") == method:
                    outcomes[doc.doc_id] = "unchanged"
                else:
                    outcomes[doc.doc_id] = "added" if old is None else "replaced"
                    changed.append(doc)
            if self.extraction_llm:
                for doc in changed:
                    await self._ingest_with_llm(site, doc, registry)
                return outcomes
            if not changed:
                return outcomes
            with self.clock("extract"):
                records = await asyncio.get_running_loop().run_in_executor(None, self._records, changed)
            rag = await self._rag(site, create=True)
            try:
                first = _first_naming(registry, records)
                olds = [registry.pop(doc_id) for doc_id in records if doc_id in registry]
                registry.update(records)
                names, relations = _still_named(registry, olds)
                for record in records.values():
                    names.update(record["entities"])
                    relations.update(record["relations"])
                await self._write(rag, registry, olds, names, relations, list(records), first)
            except BaseException:
                self._forget(site)
                raise
            with self.clock("registry"):
                self._save_registry(site, registry)
            return outcomes

    async def delete(self, site: str, doc_id: str) -> bool:
        await self.ready(site)
        async with self._lock(site):
            registry = self.registry(site)
            if doc_id not in registry:
                return False
            rag = await self._rag(site, create=True)
            try:
                olds = [registry.pop(doc_id)]
                await self._write(rag, registry, olds, *_still_named(registry, olds))
            except BaseException:
                self._forget(site)
                raise
            self._save_registry(site, registry)
            return True

    def _records(self, docs: list[SourceDocument]) -> dict[str, dict]:
        """Each document's registry record: its chunks, and the entities and relationships
        extracted from them under LightRAG's normalised names."""
        from lightrag.utils import normalize_entity_name

        records = {}
        for doc in docs:
            chunks = extraction.chunk(doc, self.count_tokens)
            found = extraction.extract(doc, chunks)
            entities = {}
            for name, data in found.entities.items():
                key = normalize_entity_name(name)
                if key and key not in entities:
                    entities[key] = data
            relations = {}
            for (a, b), data in found.relations.items():
                a, b = normalize_entity_name(a), normalize_entity_name(b)
                if a in entities and b in entities and a != b:
                    relations[f"{min(a, b)}{SEP}{max(a, b)}"] = data
            records[doc.doc_id] = {
                "doc_id": doc.doc_id, "title": doc.title, "source": doc.source, "path": doc.path,
                "content_hash": doc.content_hash, "extraction": extraction.VERSION, "ingested_at": time.time(),
                **({"meta": doc.meta} if doc.meta else {}),
                "chunks": {c.alias: c.content for c in chunks}, "entities": entities, "relations": relations}
        return records

    async def _ingest_with_llm(self, site: str, doc: SourceDocument, registry: dict) -> None:
        """LightRAG's own pipeline: its chunking and its LLM entity/relationship extraction."""
        rag = await self._rag(site, create=True)
        if doc.doc_id in registry:
            olds = [registry.pop(doc.doc_id)]
            await self._write(rag, registry, olds, *_still_named(registry, olds))
        text = "\n\n".join([f"# {doc.title}"] + [f"## {h}\n{t}" if h else t for h, t in doc.sections])
        await rag.ainsert(text, ids=[doc.doc_id], file_paths=[doc.doc_id])
        status = await rag.doc_status.get_by_id(doc.doc_id) or {}
        if str(status.get("status", "")).lower().endswith("failed"):
            raise RuntimeError(f"{doc.path}: LightRAG could not process it: {status.get('error_msg', status)}")
        registry[doc.doc_id] = {"doc_id": doc.doc_id, "title": doc.title, "source": doc.source, "path": doc.path,
                                "content_hash": doc.content_hash, "extraction": "llm", "ingested_at": time.time(),
                                "chunk_count": int(status.get("chunks_count") or 0),
                                "chunks": {}, "entities": {}, "relations": {}, **({"meta": doc.meta} if doc.meta else {})}
        self._save_registry(site, registry)

    async def _write(self, rag, registry: dict, olds: list[dict], names: set[str], relations: set[str],
                     docs: list[str] | None = None, first: dict[tuple[str, str], str] | None = None) -> None:
        """Take `olds` (records already out of `registry`) out of the stores (`_take_out`),
        then write the chunks of `docs`, and the given entities and relationships with the
        descriptions of every document naming them (`first[kind, key]`'s first when given,
        the others in registry order), each anchored to one chunk of its first document (that chunk is
        written again too; same content, same id), in one LightRAG insert, which flushes
        every store (with nothing to insert, the stores are flushed). LightRAG records a
        chunk's alias (`<doc id>#<n>`) as its `full_doc_id`.

        Every text the insert will embed is embedded first, all in one pass
        (`Embedder.aembed_many`), before any store is touched; LightRAG's flush then finds
        each vector prepared (lightrag_functions.embedding_function) instead of embedding
        its three stores' texts in small calls of its own.

        A relationship's text is not run through the model: its vector is its anchor chunk's.
        Offline, a relationship is two names in a sentence of that chunk, described by such
        sentences; embedding each was 3 in 4 of the texts an ingest embedded (6.6 a chunk on
        the load test's corpus, 3.5 on the demo's) for no better retrieval: with the chunk's
        vector the retrieval eval is the same in every mode but global, which is better
        (hit@5 0.897 -> 0.914, MRR 0.842 -> 0.853). The vector depends only on what is written
        with it, so a batch stores what one-by-one ingestion does (the midpoint of the two
        entities' vectors did not: an entity's description grows as documents name it)."""
        first = first or {}
        chunks: dict[str, dict] = {}
        for doc_id in docs or ():
            for alias, content in registry[doc_id]["chunks"].items():
                chunks[alias] = {"content": content, "source_id": alias, "file_path": doc_id}
        holders: dict[tuple[str, str], list[dict]] = defaultdict(list)  # in registry order
        for record in registry.values():
            for name in names.intersection(record["entities"]):
                holders["entities", name].append(record)
            for key in relations.intersection(record["relations"]):
                holders["relations", key].append(record)
        for key, records in holders.items():
            records.sort(key=lambda r: r["doc_id"] != first.get(key))

        def anchor(record: dict, alias: str) -> str:
            chunks.setdefault(alias, {"content": record["chunks"][alias], "source_id": alias,
                                      "file_path": record["doc_id"]})
            return alias

        entities, edges = [], []
        for name in sorted(names):
            naming = holders.get(("entities", name))
            if not naming:
                continue
            head = naming[0]["entities"][name]
            entities.append({"entity_name": name, "entity_type": head["type"],
                             "description": _merged(d["entities"][name]["description"] for d in naming),
                             "source_id": anchor(naming[0], head["chunk"]),
                             "file_path": SEP.join(d["doc_id"] for d in naming)})
        for key in sorted(relations):
            naming = holders.get(("relations", key))
            if not naming:
                continue
            a, _, b = key.partition(SEP)
            head = naming[0]["relations"][key]
            edges.append({"src_id": a, "tgt_id": b, "keywords": head["keywords"],
                          "description": _merged(d["relations"][key]["description"] for d in naming),
                          "source_id": anchor(naming[0], head["chunk"]),
                          "file_path": SEP.join(d["doc_id"] for d in naming)})
        chunk_texts, entity_texts, edge_texts = _embedded_texts(chunks.values(), entities, edges)
        texts = list(dict.fromkeys(chunk_texts + entity_texts))
        with self.clock("embed"):
            vectors = await self.embedder.aembed_many(texts)
        self._prepared.update(zip(texts, vectors))
        found_in = dict(zip(chunks, chunk_texts))
        self._prepared.update((text, self._prepared[found_in[edge["source_id"]]]) for edge, text in zip(edges, edge_texts))
        texts += edge_texts
        try:
            with self.clock("store"):
                await self._take_out(rag, registry, olds)
                if chunks or entities or edges:
                    await rag.ainsert_custom_kg({"chunks": list(chunks.values()), "entities": entities,
                                                 "relationships": edges})
                else:
                    await _flush(rag)
            self._release_vectors(rag)  # written: a site synced and not yet asked holds none in memory
        finally:
            for text in texts:
                self._prepared.pop(text, None)

    async def _take_out(self, rag, registry: dict, olds: list[dict]) -> None:
        """Take documents' records (`olds`, already out of `registry`) out of the stores,
        whichever way they were ingested: their chunks, and the entities and relationships
        no document in `registry` names. Offline records' removals wait in the stores'
        buffers for the flush that follows."""
        from lightrag.utils import compute_mdhash_id, make_relation_vdb_ids, sanitize_text_for_encoding

        for old in olds:
            if old.get("extraction") == "llm":
                await rag.adelete_by_doc_id(old["doc_id"])
        olds = [old for old in olds if old.get("extraction") != "llm"]
        if not olds:
            return
        chunk_ids = [compute_mdhash_id(sanitize_text_for_encoding(c), prefix="chunk-")
                     for old in olds for c in old["chunks"].values()]
        await rag.chunks_vdb.delete(chunk_ids)
        await rag.text_chunks.delete(chunk_ids)
        # A name no document holds leaves no relationship any document holds either (a
        # document's relationships join its own names): these are all there is to remove.
        held_names = {n for r in registry.values() for n in r["entities"]}
        held_relations = {k for r in registry.values() for k in r["relations"]}
        gone_relations = {k for old in olds for k in old["relations"]} - held_relations
        pairs = [tuple(key.split(SEP)) for key in sorted(gone_relations)]
        await rag.relationships_vdb.delete([i for a, b in pairs for i in make_relation_vdb_ids(a, b)])
        await rag.chunk_entity_relation_graph.remove_edges(pairs)
        gone = sorted({n for old in olds for n in old["entities"]} - held_names)
        await rag.entities_vdb.delete([compute_mdhash_id(name, prefix="ent-") for name in gone])
        await rag.chunk_entity_relation_graph.remove_nodes(gone)


def _first_naming(registry: dict, records: dict[str, dict]) -> dict[tuple[str, str], str | None]:
    """Whose description goes first for each entity name and relationship (`(kind, key)`)
    a batch writes, as ingesting `records` one by one into `registry` (as it is before the
    batch) would leave it: each is written last by the last document whose ingestion wrote
    it, which goes first if it names it (None otherwise: a replaced document no longer
    naming what others still name has it written again from those, in registry order)."""
    kinds = ("entities", "relations")
    held = Counter((kind, key) for r in registry.values() for kind in kinds for key in r[kind])
    first: dict[tuple[str, str], str | None] = {}
    for doc_id, record in records.items():
        if doc_id in registry:
            old = [(kind, key) for kind in kinds for key in registry[doc_id][kind]]
            held.subtract(old)
            first.update((named, None) for named in old if held[named] > 0)
        new = [(kind, key) for kind in kinds for key in record[kind]]
        held.update(new)
        first.update(dict.fromkeys(new, doc_id))
    return first


def _still_named(registry: dict, olds: list[dict]) -> tuple[set[str], set[str]]:
    """The entity names and relationships of `olds` that documents in `registry` still
    name: to be written again from those."""
    held_names = {n for r in registry.values() for n in r["entities"]}
    held_relations = {k for r in registry.values() for k in r["relations"]}
    return ({n for old in olds for n in old["entities"]} & held_names,
            {k for old in olds for k in old["relations"]} & held_relations)


def _embedded_texts(chunks, entities: list[dict], edges: list[dict]) -> tuple[list[str], list[str], list[str]]:
    """The texts `ainsert_custom_kg` gives its three vector stores to embed (chunks',
    entities', relationships'), as it makes them (pinned: lightrag-hku 1.5.7; names and pairs come normalised and sorted, and with
    no embedding token limit nothing is cut). A text made differently is not found
    prepared and is embedded by the flush instead: slower, never wrong; a test checks
    that none is (tests/test_retriever.py)."""
    from lightrag.utils import sanitize_text_for_encoding

    return ([sanitize_text_for_encoding(c["content"]) for c in chunks],
            [f"{e['entity_name']}\n{e['description']}" for e in entities],
            [f"{r['keywords']}\t{r['src_id']}\n{r['tgt_id']}\n{r['description']}" for r in edges])



async def _flush(rag) -> None:
    """Persist what the stores hold buffered (LightRAG's inserts do it themselves)."""
    await asyncio.gather(*(storage.index_done_callback() for storage in (
        rag.chunks_vdb, rag.text_chunks, rag.entities_vdb, rag.relationships_vdb, rag.chunk_entity_relation_graph)))


def _merged(descriptions) -> str:
    """A name's descriptions from every document naming it, up to MAX_DESCRIPTION_CHARS.
    (LightRAG summarises long descriptions with an LLM; offline they are cut instead, so a
    name that every document mentions does not drag a page of text into every query.)"""
    out, size = [], 0
    for text in dict.fromkeys(descriptions):
        if size + len(text) > MAX_DESCRIPTION_CHARS and out:
            break
        out.append(text)
        size += len(text) + 1
    return "\n".join(out)[:MAX_DESCRIPTION_CHARS]
