"""LightRAG's storages as the knowledge base uses them (knowledge.py): Qdrant with the
knowledge base's own client, the NetworkX graph and the JSON key-value store with faster
reads. LightRAG finds a storage by name, so `register()` adds these three to its table;
it names this module, and LightRAG imports the class from it.

Importing this module imports LightRAG (slow): knowledge.py does so when a knowledge
base is opened, not when it is imported.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from lightrag.kg import STORAGE_IMPLEMENTATIONS, STORAGES
from lightrag.kg.json_kv_impl import JsonKVStorage
from lightrag.kg.networkx_impl import NetworkXStorage
from lightrag.kg.qdrant_impl import ID_FIELD, QdrantVectorDBStorage
from qdrant_client.local.local_collection import DEFAULT_VECTOR_NAME

from services.retriever import local_qdrant

# The Qdrant client of each open knowledge base, by the key in its LightRAG config (LightRAG
# deep-copies its config, so the client itself cannot travel in it).
CLIENTS: dict[str, Any] = {}


class ConciergeQdrantStorage(QdrantVectorDBStorage):
    """LightRAG's Qdrant storage with the knowledge base's client (server or local).

    The vectors' workspace is always the site (the `site` the knowledge base passes), even
    when LightRAG's workspace, which names the graph and key-value files, is a loaded
    snapshot's directory (snapshots.py); LightRAG would let QDRANT_WORKSPACE put every
    site in one workspace, which would undo the isolation. In local mode each site
    also gets its own collections: qdrant-client's local mode evaluates payload
    filters point by point in Python over the whole collection, so one shared
    collection would make every site's search as slow as all sites' data."""

    def __post_init__(self):
        super().__post_init__()
        kwargs = self.global_config["vector_db_storage_cls_kwargs"]
        self.effective_workspace = kwargs["site"]
        self._per_site = bool(kwargs.get("collection_per_site"))
        self._index: LocalIndex | None = None
        if self._per_site:
            self.final_namespace = f"{self.final_namespace}_{self.effective_workspace}"

    async def query(self, query: str, top_k: int, query_embedding: list[float] = None) -> list[dict[str, Any]]:
        if not self._per_site:
            return await super().query(query, top_k, query_embedding)
        if query_embedding is None:
            query_embedding = (await self.embedding_func([query], context="query"))[0]
        if self._buffered():
            # The collection holds this site's points only: no payload filter to evaluate.
            points = self._client.query_points(collection_name=self.final_namespace, query=query_embedding,
                                               limit=top_k, with_payload=True,
                                               score_threshold=self.cosine_better_than_threshold).points
            return [{**p.payload, "distance": p.score, "created_at": p.payload.get("created_at")} for p in points]
        return self._local_index().search(np.asarray(query_embedding, dtype=np.float32), top_k,
                                  self.cosine_better_than_threshold)

    def _buffered(self) -> bool:
        """Writes LightRAG holds back until its next flush (upsert, delete, delete_entity):
        until then reads go to the store with them, as LightRAG's own do."""
        return bool(self._pending_vector_docs or self._pending_vector_deletes)

    def _build_upsert_batches(self, points, max_payload_bytes: int, max_points_per_batch: int):
        """Local mode: batches by point count only. LightRAG sizes each point as JSON to keep
        a request under a server's payload limit; the embedded store takes no request, and
        that sizing (a JSON dump of every point) costs more than the write itself."""
        if not self._per_site:
            return super()._build_upsert_batches(points, max_payload_bytes, max_points_per_batch)
        size = max_points_per_batch if max_points_per_batch > 0 else len(points) or 1
        return [(points[start:start + size], 0) for start in range(0, len(points), size)]

    # What writes the store itself forgets the index (this process is the embedded store's
    # only writer): the flush of the buffered writes, and the two that write directly.

    async def _flush_pending_vector_ops(self):
        self._index = None
        return await super()._flush_pending_vector_ops()

    async def delete_entity_relation(self, entity_name):
        self._index = None
        return await super().delete_entity_relation(entity_name)

    async def drop(self):
        self._index = None
        return await super().drop()

    async def get_vectors_by_ids(self, ids: list[str]) -> dict[str, list[float]]:
        if not self._per_site or self._buffered():
            return await super().get_vectors_by_ids(ids)
        # Nothing buffered (the query path): the vectors from the search index's read of the
        # collection. qdrant-client's local mode answers `retrieve` through a pydantic model
        # per point, and LightRAG reads a few dozen chunks' vectors per mix query.
        return self._local_index().vectors_by_id(ids)

    def _local_index(self) -> "LocalIndex":
        """The collection's search index, read at the first query after a write; the
        collection itself then leaves memory (local_qdrant.py: read again for the next write)."""
        if self._index is None:
            self._index = LocalIndex.read(self._client, self.final_namespace)
            if (local := local_qdrant.lazy(self._client)) is not None:
                local.release([self.final_namespace])
        return self._index

    async def initialize(self):
        if self._client is None:
            self._client = CLIENTS[self.global_config["vector_db_storage_cls_kwargs"]["client_key"]]
        if self._per_site and local_qdrant.lazy(self._client) is not None \
                and self._client.collection_exists(self.final_namespace):
            # The site's own collection, made by an earlier open: nothing to create, migrate or
            # count (LightRAG's set-up reads every point and filters them in Python), and
            # nothing read until a query makes its index (a cold site's first answer waits
            # for that alone). What LightRAG's `initialize` sets besides:
            from lightrag.kg.shared_storage import get_namespace_lock

            self._initialized = True
            self._flush_lock = get_namespace_lock(namespace=self.final_namespace, workspace=self.effective_workspace)
            return
        await super().initialize()
        commit_without_sync(self._client, self.final_namespace)

    async def finalize(self):
        # Flush, but leave the shared client open: the knowledge base closes it.
        await self._flush_pending_vector_ops()


def commit_without_sync(client, collection: str) -> None:
    """qdrant-client's local mode keeps a collection's points in SQLite and commits each
    point it writes or deletes on its own: in SQLite's default journal mode that is a
    disk sync per point (13 ms each on the development machine: 2,000 points in 23 s,
    1.6 s of it CPU). In write-ahead-log mode with `synchronous=NORMAL` a commit is an
    append, synced at checkpoints (the same 2,000 points: 0.3 s): a crash of the process
    loses nothing, a power cut may lose the last commits but leaves the file whole, and
    the knowledge base's other files (documents.json, LightRAG's) are not synced either.
    A server (QDRANT_URL) is left alone. Pinned: qdrant-client 1.20.0's `QdrantLocal`
    keeps each collection's SQLite connection at `collections[name].storage.storage`; a
    version without it fails here, when the knowledge base opens."""
    from qdrant_client.local.qdrant_local import QdrantLocal

    local = getattr(client, "_client", None)
    if not isinstance(local, QdrantLocal):
        return
    local_qdrant.commit_without_sync(local.collections[collection])


class LocalIndex:
    """One local-mode collection's vectors as a matrix, searched with one product.

    qdrant-client's local mode answers `query_points` through pydantic models and a deep
    copy of each hit's payload (three to four queries per mix search); the same cosine
    ranking over a matrix read once takes a fraction of that. Read at the first query after
    any write; same hits, same order (ties by insertion order), same scores as Qdrant
    (cosine over unit vectors)."""

    def __init__(self, payloads: list[dict], matrix: np.ndarray, stored: np.ndarray | None = None):
        self.payloads, self.matrix = payloads, matrix
        self._stored = stored  # the vectors as stored (float32, as Qdrant's local mode keeps them)
        self._rows: dict[str, int] | None = None

    @classmethod
    def read(cls, client, collection: str) -> "LocalIndex":
        if (local := local_qdrant.lazy(client)) is not None:
            return cls.of_collection(local.collections[collection])
        payloads, vectors, offset = [], [], None
        while True:
            points, offset = client.scroll(collection_name=collection, limit=1024, offset=offset,
                                           with_payload=True, with_vectors=True)
            for point in points:
                payloads.append(point.payload or {})
                vectors.append(point.vector)
            if offset is None:
                break
        if not vectors:
            return cls([], np.zeros((0, 0), dtype=np.float32))
        matrix = np.asarray(vectors, dtype=np.float32)
        return cls(payloads, matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12), matrix)

    @classmethod
    def of_collection(cls, collection) -> "LocalIndex":
        """From a local collection's own arrays (what `scroll` would copy point by point into
        pydantic records): its live points in the order it holds them. The collection is
        released after (local_qdrant.py), so its payloads are the index's alone."""
        live = ~collection.deleted[:len(collection.payload)]
        rows = np.flatnonzero(live)
        if not len(rows):
            return cls([], np.zeros((0, 0), dtype=np.float32))
        stored = np.asarray(collection.vectors[DEFAULT_VECTOR_NAME][rows], dtype=np.float32)
        payloads = [collection.payload[i] or {} for i in rows]
        return cls(payloads, stored / np.maximum(np.linalg.norm(stored, axis=1, keepdims=True), 1e-12), stored)

    def vectors_by_id(self, ids: list[str]) -> dict[str, list[float]]:
        """The stored vectors of the points whose payload `id` is in `ids` (LightRAG's ids;
        unknown ones left out), each the caller's own list, as Qdrant's `retrieve` gives."""
        if self._rows is None:
            self._rows = {p[ID_FIELD]: i for i, p in enumerate(self.payloads) if ID_FIELD in p}
        return {i: self._stored[row].tolist() for i in ids if (row := self._rows.get(i)) is not None}

    def search(self, query: np.ndarray, top_k: int, threshold: float | None) -> list[dict[str, Any]]:
        if not self.payloads or top_k <= 0:
            return []
        scores = self.matrix @ (query / max(float(np.linalg.norm(query)), 1e-12))
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [{**self.payloads[i], "distance": float(scores[i]), "created_at": self.payloads[i].get("created_at")}
                for i in order if threshold is None or scores[i] >= threshold]


class ConciergeGraphStorage(NetworkXStorage):
    """LightRAG's NetworkX graph with batch reads done in one pass.

    LightRAG's base class answers `get_edges_batch` and its siblings one item at a
    time, each through `_get_graph()` and its namespace lock; a mix query on a few
    hundred entities makes ~1,700 such calls. Each batch here takes the graph once and
    reads it synchronously (no await in between, so no commit can interleave), with the
    same answers as the one-by-one defaults."""

    async def get_nodes_batch(self, node_ids: list[str]) -> dict[str, dict]:
        graph = await self._get_graph()
        return {n: dict(graph.nodes[n]) for n in node_ids if graph.has_node(n)}

    async def node_degrees_batch(self, node_ids: list[str]) -> dict[str, int]:
        graph = await self._get_graph()
        return {n: graph.degree(n) if graph.has_node(n) else 0 for n in node_ids}

    async def edge_degrees_batch(self, edge_pairs: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        graph = await self._get_graph()

        def degree(n: str) -> int:
            return graph.degree(n) if graph.has_node(n) else 0
        return {(s, t): degree(s) + degree(t) for s, t in edge_pairs}

    async def get_edges_batch(self, pairs: list[dict[str, str]]) -> dict[tuple[str, str], dict]:
        graph = await self._get_graph()
        found = {}
        for pair in pairs:
            edge = graph.edges.get((pair["src"], pair["tgt"]))
            if edge is not None:
                found[(pair["src"], pair["tgt"])] = dict(edge)
        return found

    async def get_nodes_edges_batch(self, node_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
        graph = await self._get_graph()
        return {n: list(graph.edges(n)) if graph.has_node(n) else [] for n in node_ids}

class ConciergeKVStorage(JsonKVStorage):
    """LightRAG's JSON key-value store, copying what it returns as JSON data.

    `get_by_ids` deep-copies every record so callers cannot change the stored one, with
    `copy.deepcopy`'s memo and dispatch for each of a mix query's few hundred chunk
    records. Records are JSON (dicts, lists, strings, numbers), so copying the dicts and
    lists gives the same protection at less cost."""

    async def get_by_ids(self, ids: list[str]) -> list[dict[str, Any] | None]:
        async with self._storage_lock:
            results: list[dict[str, Any] | None] = []
            for id_ in ids:
                data = self._data.get(id_, None)
                if data:
                    record = json_copy(data)
                    record.setdefault("create_time", 0)
                    record.setdefault("update_time", 0)
                    record["_id"] = id_
                    results.append(record)
                else:
                    results.append(None)
            return results


VECTOR_STORAGE = ConciergeQdrantStorage.__name__
GRAPH_STORAGE = ConciergeGraphStorage.__name__
KV_STORAGE = ConciergeKVStorage.__name__


def register() -> None:
    """Make the three storages known to LightRAG by name (once per process is enough; again is harmless)."""
    for cls, kind in ((ConciergeQdrantStorage, "VECTOR_STORAGE"), (ConciergeGraphStorage, "GRAPH_STORAGE"),
                      (ConciergeKVStorage, "KV_STORAGE")):
        STORAGES[cls.__name__] = __name__
        implementations = STORAGE_IMPLEMENTATIONS[kind]["implementations"]
        if cls.__name__ not in implementations:
            implementations.append(cls.__name__)


def forget(workspace: str) -> None:
    """Drop what LightRAG keeps in memory for a workspace after its storages are finalized.

    LightRAG's key-value and document-status data, update flags and pipeline status live in
    process-wide dictionaries keyed `<workspace>:<namespace>`, and a storage opened on a
    workspace already known there binds to that data instead of reading its files. So a
    workspace reopened after its files changed (another process's ingest, a new snapshot)
    would serve the old data, and every swapped-out snapshot would stay in memory."""
    from lightrag.kg import shared_storage

    prefix = f"{workspace}:"
    for table in (shared_storage._shared_dicts, shared_storage._init_flags, shared_storage._update_flags,
                  shared_storage._namespace_data_cache):
        if table is not None:
            for key in [k for k in table.keys() if k.startswith(prefix)]:
                table.pop(key, None)


def json_copy(value: Any) -> Any:
    """A copy of JSON data (dicts, lists, and values that are never changed in place)."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value
