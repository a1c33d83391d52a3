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
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.retriever import extraction
from services.retriever.documents import SourceDocument
from services.retriever.lightrag_functions import (UNBOUNDED_TOKENS, cosine_once_per_vector, embedding_function,
                                                    llm_function, no_llm, querying, quiet_lightrag, share_query_config,
                                                    tokenize_inline, untruncated_when_unbounded)
from services.retriever.settings import KnowledgeBaseSettings
from services.retriever.stage_clock import StageClock
from services.retriever.word_tokenizer import WordTokenizer
from shared import subjects
from shared.embeddings import Embedder, model_dir
from shared.llm import LLMClient

SEP = "<SEP>"  # LightRAG's separator between the sources of a merged graph field
MAX_DESCRIPTION_CHARS = 600
LLM_CHUNK_WORDS = 160  # ≈ 210 MiniLM tokens: under the 256 the embedding model reads
LLM_CHUNK_OVERLAP_WORDS = 20


class UnknownSite(Exception):
    pass


class KnowledgeBaseLocked(Exception):
    """The embedded Qdrant store is open in another process."""


@dataclass
class _Open:
    """A site's open LightRAG, the directory it reads, and the queries using it."""
    rag: Any
    directory: Path
    mtime: float
    users: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self):
        self.idle.set()

    @contextlib.contextmanager
    def use(self):
        self.users += 1
        self.idle.clear()
        try:
            yield self.rag
        finally:
            self.users -= 1
            if self.users == 0:
                self.idle.set()


class KnowledgeBase:
    def __init__(self, root: Path, embedder: Embedder, qdrant_url: str = "", qdrant_api_key: str = "",
                 extraction_llm: LLMClient | None = None, client=None, cosine_threshold: float = 0.2):
        """`client`: an open Qdrant client to use (and leave open) instead of making one,
        as if it were a server: shared collections, every point tagged with its site."""
        self.root = root
        # With an LLM for the `extraction` role, documents go through LightRAG's own
        # pipeline (its chunking, its LLM entity and relationship extraction); otherwise
        # through the offline extractor and `ainsert_custom_kg`.
        self.extraction_llm = extraction_llm
        self.embedder = embedder
        self.qdrant_url = qdrant_url
        self.qdrant_api_key = qdrant_api_key
        self.cosine_threshold = cosine_threshold
        self._open: dict[str, _Open] = {}
        self._places: dict[str, Path] = {}  # sites served from a directory other than root/<site>
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._registries: dict[str, dict] = {}
        self._client = client
        self._own_client = client is None
        self._server = bool(qdrant_url) or client is not None
        self._key = f"kb-{id(self)}"
        self.clock = StageClock()  # where ingestion's time went (`concierge loadtest ingest`)
        self._tokenizer = None
        self._model_tokenizer = None

    @classmethod
    def configured(cls, settings: KnowledgeBaseSettings, embedder: Embedder) -> "KnowledgeBase":
        return cls(Path(settings.kb_dir).resolve(), embedder, settings.qdrant_url, settings.qdrant_api_key,
                   LLMClient(settings.llm) if settings.extraction == "llm" else None,
                   cosine_threshold=settings.cosine_threshold)

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
                self._client = QdrantClient(path=str(self.root / "qdrant"))
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

    async def close(self) -> None:
        from services.retriever import lightrag_storage

        for site in list(self._open):
            await _finalize(self._open.pop(site))
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
        if site not in self._registries:
            path = self._registry_path(site)
            self._registries[site] = json.loads(path.read_text()) if path.exists() else {}
        return self._registries[site]

    def _save_registry(self, site: str) -> None:
        path = self._registry_path(site)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._registries[site], ensure_ascii=False))
        tmp.replace(path)
        if site in self._open:
            self._open[site].mtime = path.stat().st_mtime

    async def _rag(self, site: str, create: bool = False):
        """The site's LightRAG, or None when the site has no knowledge base."""
        opened = await self._opened(site, create)
        return opened.rag if opened else None

    async def _opened(self, site: str, create: bool = False) -> _Open | None:
        """The site's open LightRAG, or None when the site has no knowledge base. Reopened when
        another process (an ingest against a Qdrant server) changed the site's documents."""
        path = self._registry_path(site)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            if not create:
                return None
            mtime = 0.0
        opened = self._open.get(site)
        if opened is not None and mtime > opened.mtime and not create:
            self._registries.pop(site, None)
            await self._retire(self._open.pop(site))
            opened = None
        if opened is None:
            directory = self._site_dir(site)
            rag = self._new_rag(site, directory)
            await rag.initialize_storages()
            opened = self._open[site] = _Open(rag, directory, mtime)
        return opened

    async def load(self, site: str, directory: Path) -> None:
        """Serve `site` from `directory` (a snapshot's files) from now on. Its LightRAG is
        opened beside the one in use, then swapped in; queries already running finish on
        the old one, which is closed once they are done, and its directory removed when it
        was a loaded snapshot too."""
        registry_path = directory / "documents.json"
        registry = json.loads(registry_path.read_text()) if registry_path.exists() else {}
        rag = self._new_rag(site, directory)
        await rag.initialize_storages()
        async with self._locks[site]:
            old = self._open.get(site)
            self._places[site] = directory
            self._registries[site] = registry
            self._open[site] = _Open(rag, directory, registry_path.stat().st_mtime if registry else 0.0)
        if old is not None:
            await self._retire(old)

    async def unload(self, site: str) -> None:
        """Stop serving `site` (its snapshot was withdrawn): it has no knowledge base from now on."""
        async with self._locks[site]:
            old = self._open.pop(site, None)
            self._places.pop(site, None)
            self._registries.pop(site, None)
        if old is not None:
            await self._retire(old)

    async def _retire(self, old: _Open) -> None:
        await old.idle.wait()
        await _finalize(old)
        if old.directory.parent != self.root:  # a loaded snapshot's directory, not a site's own
            shutil.rmtree(old.directory, ignore_errors=True)

    def _new_rag(self, site: str, directory: Path):
        from lightrag import LightRAG
        from lightrag.utils import EmbeddingFunc, Tokenizer

        from services.retriever import lightrag_storage

        directory.mkdir(parents=True, exist_ok=True)
        rag = LightRAG(
            working_dir=str(directory.parent),
            workspace=directory.name,
            embedding_func=EmbeddingFunc(embedding_dim=self.embedder.dim, func=embedding_function(self.embedder, self.clock),
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
        sentences' vectors from it, services/responder/kb_vectors.py)."""
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
        async with self._locks[site]:
            registry = self.registry(site)
            old = registry.get(doc.doc_id)
            method = "llm" if self.extraction_llm else extraction.VERSION
            if old is not None and old["content_hash"] == doc.content_hash and old.get("extraction") == method:
                return "unchanged"
            if self.extraction_llm:
                return await self._ingest_with_llm(site, doc, registry, old)
            loop = asyncio.get_running_loop()
            with self.clock("extract"):
                chunks = await loop.run_in_executor(None, extraction.chunk, doc, self.count_tokens)
                found = extraction.extract(doc, chunks)
            rag = await self._rag(site, create=True)
            from lightrag.utils import normalize_entity_name

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
            record = {"doc_id": doc.doc_id, "title": doc.title, "source": doc.source, "path": doc.path,
                      "content_hash": doc.content_hash, "extraction": extraction.VERSION, "ingested_at": time.time(),
                      **({"meta": doc.meta} if doc.meta else {}),
                      "chunks": {c.alias: c.content for c in chunks}, "entities": entities, "relations": relations}
            with self.clock("write"):
                affected = await self._take_out(rag, registry, doc.doc_id) if old is not None else (set(), set())
                registry[doc.doc_id] = record
                await self._write(rag, registry, set(entities) | affected[0], set(relations) | affected[1],
                                  own_doc=doc.doc_id)
            with self.clock("registry"):
                self._save_registry(site)
            return "replaced" if old is not None else "added"

    async def delete(self, site: str, doc_id: str) -> bool:
        async with self._locks[site]:
            registry = self.registry(site)
            if doc_id not in registry:
                return False
            rag = await self._rag(site, create=True)
            names, relations = await self._take_out(rag, registry, doc_id)
            await self._write(rag, registry, names, relations, own_doc=None)
            self._save_registry(site)
            return True

    async def _ingest_with_llm(self, site: str, doc: SourceDocument, registry: dict, old: dict | None) -> str:
        """LightRAG's own pipeline: its chunking and its LLM entity/relationship extraction."""
        rag = await self._rag(site, create=True)
        if old is not None:
            names, relations = await self._take_out(rag, registry, doc.doc_id)
            await self._write(rag, registry, names, relations, own_doc=None)
        text = "\n\n".join([f"# {doc.title}"] + [f"## {h}\n{t}" if h else t for h, t in doc.sections])
        await rag.ainsert(text, ids=[doc.doc_id], file_paths=[doc.doc_id])
        status = await rag.doc_status.get_by_id(doc.doc_id) or {}
        if str(status.get("status", "")).lower().endswith("failed"):
            raise RuntimeError(f"{doc.path}: LightRAG could not process it: {status.get('error_msg', status)}")
        registry[doc.doc_id] = {"doc_id": doc.doc_id, "title": doc.title, "source": doc.source, "path": doc.path,
                                "content_hash": doc.content_hash, "extraction": "llm", "ingested_at": time.time(),
                                "chunk_count": int(status.get("chunks_count") or 0),
                                "chunks": {}, "entities": {}, "relations": {}, **({"meta": doc.meta} if doc.meta else {})}
        self._save_registry(site)
        return "replaced" if old is not None else "added"

    async def _take_out(self, rag, registry: dict, doc_id: str) -> tuple[set[str], set[str]]:
        """Remove a document, whichever way it was ingested."""
        if registry[doc_id].get("extraction") == "llm":
            registry.pop(doc_id)
            await rag.adelete_by_doc_id(doc_id)
            return set(), set()
        return await self._remove(rag, registry, doc_id)

    async def _remove(self, rag, registry: dict, doc_id: str) -> tuple[set[str], set[str]]:
        """Take a document out; returns the entity names and relationships that other
        documents still hold (to be written again from them)."""
        from lightrag.utils import compute_mdhash_id, sanitize_text_for_encoding

        old = registry.pop(doc_id)
        chunk_ids = [compute_mdhash_id(sanitize_text_for_encoding(c), prefix="chunk-") for c in old["chunks"].values()]
        await rag.chunks_vdb.delete(chunk_ids)
        await rag.text_chunks.delete(chunk_ids)
        await rag.chunks_vdb.index_done_callback()
        await rag.text_chunks.index_done_callback()
        held_names = {n for r in registry.values() for n in r["entities"]}
        held_relations = {k for r in registry.values() for k in r["relations"]}
        for key in old["relations"]:
            if key not in held_relations:
                a, _, b = key.partition(SEP)
                await rag.adelete_by_relation(a, b)
        for name in old["entities"]:
            if name not in held_names:
                await rag.adelete_by_entity(name)
        return set(old["entities"]) & held_names, set(old["relations"]) & held_relations

    async def _write(self, rag, registry: dict, names: set[str], relations: set[str], own_doc: str | None) -> None:
        """Write `own_doc`'s chunks, and the given entities and relationships with the
        descriptions of every document naming them, each anchored to one chunk of a
        document that holds it (that chunk is written again too; same content, same id)."""
        chunks: dict[str, dict] = {}
        if own_doc is not None:
            for alias, content in registry[own_doc]["chunks"].items():
                chunks[alias] = {"content": content, "source_id": alias, "file_path": own_doc}

        def holders(kind: str, key: str) -> list[dict]:
            docs = [r for r in registry.values() if key in r[kind]]
            docs.sort(key=lambda r: r["doc_id"] != own_doc)  # the document being written anchors first
            return docs

        def anchor(record: dict, alias: str) -> str:
            chunks.setdefault(alias, {"content": record["chunks"][alias], "source_id": alias,
                                      "file_path": record["doc_id"]})
            return alias

        entities, edges = [], []
        for name in sorted(names):
            docs = holders("entities", name)
            if not docs:
                continue
            first = docs[0]["entities"][name]
            entities.append({"entity_name": name, "entity_type": first["type"],
                             "description": _merged(d["entities"][name]["description"] for d in docs),
                             "source_id": anchor(docs[0], first["chunk"]),
                             "file_path": SEP.join(d["doc_id"] for d in docs)})
        for key in sorted(relations):
            docs = holders("relations", key)
            if not docs:
                continue
            a, _, b = key.partition(SEP)
            first = docs[0]["relations"][key]
            edges.append({"src_id": a, "tgt_id": b, "keywords": first["keywords"],
                          "description": _merged(d["relations"][key]["description"] for d in docs),
                          "source_id": anchor(docs[0], first["chunk"]),
                          "file_path": SEP.join(d["doc_id"] for d in docs)})
        if chunks or entities or edges:
            await rag.ainsert_custom_kg({"chunks": list(chunks.values()), "entities": entities,
                                         "relationships": edges}, full_doc_id=own_doc)


async def _finalize(opened: _Open) -> None:
    from services.retriever import lightrag_storage

    await opened.rag.finalize_storages()
    lightrag_storage.forget(opened.directory.name)


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
