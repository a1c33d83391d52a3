"""qdrant-client's local mode with collections read when first used and released when a
site leaves the knowledge base's pool (knowledge.py).

qdrant-client's `QdrantLocal` reads every collection's points into memory when it opens,
and keeps an SQLite connection open per collection: in local mode each site has its own
three collections (lightrag_storage.py), so a retriever holding thousands of sites would
hold every site's vectors and payloads, and three file descriptors a site, from its start,
whatever its memory budget. Here a collection is a `_Closed` entry (its configuration and
text indexes, what `QdrantLocal` writes into meta.json) until something asks for it, then
read from its SQLite file as qdrant-client reads it; `release` closes it again. Local mode
writes every point to SQLite as it is upserted or deleted, so releasing a collection loses
nothing. Pinned: qdrant-client 1.20.0's `QdrantLocal` (its `collections` dict, `_load`,
meta.json's layout); a version without them fails here, when the knowledge base opens.
"""

from __future__ import annotations

import json
import os
from typing import Any

from qdrant_client import QdrantClient
from qdrant_client.http import models as rest_models
from qdrant_client.local.local_collection import LocalCollection
from qdrant_client.local.qdrant_local import META_INFO_FILENAME, QdrantLocal


class _Closed:
    """A collection not in memory: what meta.json needs of it, and where it is read from."""

    def __init__(self, config: rest_models.CreateCollection, text_indexes: dict | None = None):
        self.config = config
        self.text_indexes = text_indexes or {}

    def close(self) -> None:
        pass


class _Collections(dict):
    """name → LocalCollection, read from its files on first access (`__getitem__`, which
    every `QdrantLocal` operation on one collection goes through)."""

    def __init__(self, local: "LazyQdrantLocal"):
        super().__init__()
        self._local = local

    def __getitem__(self, name: str):
        collection = super().__getitem__(name)
        if isinstance(collection, _Closed):
            opened = LocalCollection(collection.config, self._local._collection_path(name),
                                     force_disable_check_same_thread=self._local.force_disable_check_same_thread)
            opened.text_indexes = collection.text_indexes
            commit_without_sync(opened)
            super().__setitem__(name, opened)
            collection = opened
        return collection

    def release(self, name: str) -> bool:
        """Close a collection read into memory (it is read again when next used); False
        when it was not in memory."""
        collection = super().get(name)
        if collection is None or isinstance(collection, _Closed):
            return False
        collection.close()
        super().__setitem__(name, _Closed(collection.config, collection.text_indexes))
        return True

    def in_memory(self) -> list[str]:
        return [name for name, c in super().items() if not isinstance(c, _Closed)]


class LazyQdrantLocal(QdrantLocal):
    collections: _Collections

    def _load(self) -> None:
        """QdrantLocal's `_load` with each collection left `_Closed`: meta.json read (made
        when missing), then the folder's lock taken as QdrantLocal takes it."""
        import portalocker

        self.collections = _Collections(self)
        self._configs: dict[str, tuple[Any, str]] = {}  # name → (its config, that config's JSON)
        if not self.persistent:
            return
        meta_path = os.path.join(self.location, META_INFO_FILENAME)
        if not os.path.exists(meta_path):
            os.makedirs(self.location, exist_ok=True)
            with open(meta_path, "w") as f:
                f.write(json.dumps({"collections": {}, "aliases": {}}))
        else:
            with open(meta_path) as f:
                meta = json.load(f)
            indexes = meta.get("text_indexes", {})
            for name, config_json in meta["collections"].items():
                config_json.pop("init_from", None)
                text_indexes = {field: rest_models.TextIndexParams(**params)
                                for field, params in indexes.get(name, {}).items()}
                dict.__setitem__(self.collections, name,
                                 _Closed(rest_models.CreateCollection(**config_json), text_indexes))
            self.aliases = meta["aliases"]
        lock_path = os.path.join(self.location, ".lock")
        if not os.path.exists(lock_path):
            with open(lock_path, "w") as f:
                f.write("tmp lock file")
        self._flock_file = open(lock_path, "r+")
        try:
            portalocker.lock(self._flock_file, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
        except portalocker.exceptions.LockException:
            raise RuntimeError(f"Storage folder {self.location} is already accessed by another instance of "
                               "Qdrant client. If you require concurrent access, use Qdrant server instead.")

    def _save(self, aliases: dict[str, str] | None = None) -> None:
        """QdrantLocal's `_save` (meta.json: every collection's configuration, the aliases,
        the text indexes) with each configuration's JSON made once, not on every save:
        qdrant-client writes the whole file after each collection made and each payload index
        (six times for a new site), and making every configuration's dict again each time
        was what a new site cost past a thousand sites. The file is the same."""
        if not self.persistent:
            return
        if self.closed:
            raise RuntimeError("QdrantLocal instance is closed. Please create a new instance.")
        from qdrant_client._pydantic_compat import to_dict

        parts, indexes = [], {}
        for name, collection in dict.items(self.collections):
            cached = self._configs.get(name)
            if cached is None or cached[0] is not collection.config:
                cached = self._configs[name] = (collection.config, json.dumps(to_dict(collection.config)))
            parts.append(f"{json.dumps(name)}: {cached[1]}")
            if collection.text_indexes:
                indexes[name] = {field: to_dict(params, exclude_none=True)
                                 for field, params in collection.text_indexes.items()}
        for gone in set(self._configs) - set(self.collections):
            del self._configs[gone]
        meta = (f'{{"collections": {{{", ".join(parts)}}}, '
                f'"aliases": {json.dumps(self.aliases if aliases is None else aliases)}, '
                f'"text_indexes": {json.dumps(indexes)}}}')
        meta_path = os.path.join(self.location, META_INFO_FILENAME)
        tmp_path = f"{meta_path}.tmp"  # replaced whole, as QdrantLocal does
        with open(tmp_path, "w") as f:
            f.write(meta)
        os.replace(tmp_path, meta_path)

    def release(self, names) -> int:
        """Close these collections if they are in memory; how many were."""
        return sum(self.collections.release(name) for name in names)


def commit_without_sync(collection: LocalCollection) -> None:
    """SQLite in write-ahead-log mode with `synchronous=NORMAL` on the collection's
    connection (lightrag_storage.commit_without_sync says why): every collection this
    module reads, and each one qdrant-client's local mode makes or reads."""
    if collection.storage is not None:
        collection.storage.storage.execute("PRAGMA journal_mode=WAL")
        collection.storage.storage.execute("PRAGMA synchronous=NORMAL")


def open_local(path: str) -> QdrantClient:
    """A QdrantClient in local mode on `path` whose collections are read when first used."""
    client = QdrantClient(location=":memory:")
    client._client.close()
    client._client = LazyQdrantLocal(location=path)
    return client


def lazy(client: Any) -> LazyQdrantLocal | None:
    """The client's lazy local store, None for a server or qdrant-client's own local mode."""
    local = getattr(client, "_client", None)
    return local if isinstance(local, LazyQdrantLocal) else None
