"""The knowledge base's batched ingestion (services/retriever/knowledge.py `ingest_many`):
it stores what ingesting the same documents one by one stores, an unchanged batch adds
nothing, a changed document replaces its chunks, a deletion removes what only it named,
and queries run while it writes. Isolation, the limiter, single-document ingestion and
LightRAG's pipeline: tests/test_retriever.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from services.retriever import documents
from services.retriever.knowledge import SEP, KnowledgeBase
from services.retriever.search import Retriever
from services.retriever.settings import RetrievalSettings
from shared.embeddings import shared_embedder
from shared.site_config import SiteConfig

SITE = "batch"
# Salesforce is named by three documents, Zephyr Link by two, Harbor Desk by one; the
# second version of a.md no longer names Salesforce, and b.md is written in between.
FIRST = {
    "a.md": "# Zephyr Link pricing\n\n## Plans\nZephyr Link costs $10 per seat and syncs with Salesforce (topaz).\n\n"
            "## Trial\nThe Zephyr Link trial lasts 14 days and needs no card.\n",
    "b.md": "# Zephyr Link mobile\n\n## Offline\nZephyr Link Mobile works offline and syncs contacts with Salesforce "
            "every hour (jade).\n",
}
BATCH = {
    "c.md": "# Harbor Desk\n\n## Regions\nHarbor Desk data is hosted in Frankfurt, with Salesforce backups (amber).\n",
    "a.md": "# Zephyr Link pricing\n\n## Plans\nZephyr Link costs $12 per seat, billed yearly (indigo).\n\n"
            "## Trial\nThe Zephyr Link trial lasts 14 days and needs no card.\n",
    "d.md": "# Zephyr Link security\n\n## Encryption\nZephyr Link encrypts data at rest with AES-256 (coral).\n",
}
QUESTIONS = ["How much does Zephyr Link cost?", "Does Zephyr Link work with Salesforce?",
             "Where is Harbor Desk data hosted?", "Is Zephyr Link encrypted?"]


def read(folder: Path, texts: dict[str, str]) -> list[documents.SourceDocument]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return [documents.read(SITE, folder / name, name) for name in texts]


async def stored(kb: KnowledgeBase, site: str = SITE) -> dict:
    """Everything the site's stores hold but the vectors (`vectors`), without the write times."""
    found: dict = {}
    for collection in kb._client.get_collections().collections:
        if not collection.name.endswith(f"_{site}"):
            continue
        kind = next(k for k in ("chunks", "entities", "relationships") if k in collection.name)
        points, _ = kb._client.scroll(collection.name, limit=10_000, with_payload=True)
        found[kind] = {p.payload["id"]: {k: v for k, v in p.payload.items() if k != "created_at"} for p in points}
    graph = (await kb._rag(site)).chunk_entity_relation_graph
    found["nodes"] = {n["id"]: {k: v for k, v in n.items() if k != "created_at"} for n in await graph.get_all_nodes()}
    found["edges"] = {tuple(sorted((e["source"], e["target"]))): {k: v for k, v in e.items()
                                                                  if k not in ("created_at", "source", "target")}
                      for e in await graph.get_all_edges()}
    found["registry"] = {doc_id: {k: v for k, v in r.items() if k != "ingested_at"}
                         for doc_id, r in kb.registry(site).items()}
    return found


def vectors(kb: KnowledgeBase, site: str = SITE) -> dict[str, np.ndarray]:
    found = {}
    for collection in kb._client.get_collections().collections:
        if collection.name.endswith(f"_{site}"):
            points, _ = kb._client.scroll(collection.name, limit=10_000, with_payload=True, with_vectors=True)
            found.update({p.payload["id"]: np.asarray(p.vector) for p in points})
    return found


async def hits(kb: KnowledgeBase, site: str = SITE) -> list[list[tuple[str, str]]]:
    answers = []
    for mode in ("mix", "local", "global", "naive"):
        retriever = Retriever(kb=kb, base=RetrievalSettings(mode=mode, limiter_enabled=False), rerankers={})
        for question in QUESTIONS:
            result = await retriever.retrieve(site, question, SiteConfig(), _no_record)
            answers.append([(d.doc_id, d.content) for d in result.documents])
    return answers


@pytest.fixture
async def two(tmp_path):
    """Two empty knowledge bases on one embedder."""
    one = KnowledgeBase(tmp_path / "one", shared_embedder()).open()
    many = KnowledgeBase(tmp_path / "many", shared_embedder()).open()
    yield one, many
    await one.close()
    await many.close()


async def test_a_batch_stores_what_one_by_one_ingestion_stores(two, tmp_path):
    one, many = two
    first, batch = read(tmp_path / "v1", FIRST), read(tmp_path / "v2", BATCH)
    for doc in first:
        assert await one.ingest(SITE, doc) == "added"
    assert await many.ingest_many(SITE, first) == {d.doc_id: "added" for d in first}
    assert await stored(one) == await stored(many)

    outcomes = [await one.ingest(SITE, doc) for doc in batch]
    assert outcomes == ["added", "replaced", "added"]
    assert await many.ingest_many(SITE, batch) == {d.doc_id: o for d, o in zip(batch, outcomes)}
    expected, got = await stored(one), await stored(many)
    assert set(got["chunks"]) == set(expected["chunks"])  # the same chunk ids
    assert got == expected  # and every payload, node, edge and record
    # The same vectors: each text is embedded alone, whatever its batch. Qdrant's local mode
    # normalises a point it adds in float32 and one it updates (the names one-by-one
    # ingestion writes twice) in float64, hence the tolerance.
    one_vectors, many_vectors = vectors(one), vectors(many)
    assert one_vectors.keys() == many_vectors.keys()
    assert all(np.allclose(one_vectors[i], many_vectors[i], rtol=0, atol=1e-6) for i in one_vectors)
    assert await hits(one) == await hits(many)
    salesforce = got["nodes"]["Salesforce"]["file_path"].split(SEP)
    assert salesforce == [documents.doc_id_for(SITE, n) for n in ("b.md", "c.md")]  # registry order: a.md left it


async def test_an_unchanged_batch_adds_nothing(two, tmp_path):
    _, kb = two
    docs = read(tmp_path / "v1", FIRST)
    await kb.ingest_many(SITE, docs)
    before, registry = await stored(kb), dict(kb.registry(SITE))
    embedded = kb.clock.seconds["embed"]
    assert await kb.ingest_many(SITE, read(tmp_path / "again", FIRST)) == {d.doc_id: "unchanged" for d in docs}
    assert await stored(kb) == before and kb.registry(SITE) == registry
    assert kb.clock.seconds["embed"] == embedded  # nothing was even embedded


async def test_a_changed_document_in_a_batch_replaces_its_chunks(two, tmp_path):
    _, kb = two
    await kb.ingest_many(SITE, read(tmp_path / "v1", FIRST))
    a = documents.doc_id_for(SITE, "a.md")
    old_chunks = {i for i, p in (await stored(kb))["chunks"].items() if "topaz" in p["content"]}
    changed = read(tmp_path / "v2", {"a.md": BATCH["a.md"], "b.md": FIRST["b.md"]})
    assert await kb.ingest_many(SITE, changed) == {a: "replaced", documents.doc_id_for(SITE, "b.md"): "unchanged"}
    now = await stored(kb)
    assert old_chunks and not old_chunks & set(now["chunks"])
    contents = [p["content"] for p in now["chunks"].values()]
    assert any("indigo" in c for c in contents) and not any("topaz" in c for c in contents)
    assert all("topaz" not in str(found) for found in await hits(kb))
    assert len(kb.documents(SITE)) == 2


async def test_a_deletion_removes_what_only_its_document_named(two, tmp_path):
    _, kb = two
    await kb.ingest_many(SITE, read(tmp_path / "v1", FIRST) + read(tmp_path / "v2", {"c.md": BATCH["c.md"]}))
    c = documents.doc_id_for(SITE, "c.md")
    before = await stored(kb)
    only_c = {n for n, node in before["nodes"].items() if node["file_path"] == c}
    assert "Harbor Desk" in only_c and "Salesforce" not in only_c
    assert await kb.delete(SITE, c) and not await kb.delete(SITE, c)
    after = await stored(kb)
    assert not only_c & set(after["nodes"])
    assert not any(only_c & set(pair) for pair in after["edges"])
    assert {p["entity_name"] for p in after["entities"].values()} == set(after["nodes"])
    assert {(p["src_id"], p["tgt_id"]) for p in after["relationships"].values()} == set(after["edges"])
    salesforce = after["nodes"]["Salesforce"]
    assert c not in salesforce["file_path"] and "amber" not in salesforce["description"]
    assert not any("amber" in p["content"] for p in after["chunks"].values())


async def test_every_vector_of_a_batch_is_embedded_before_the_insert(two, tmp_path, monkeypatch):
    """The texts knowledge.py prepares are the ones LightRAG's insert embeds: none is left
    for its flush to embed (which would mean LightRAG changed how it makes them)."""
    _, kb = two

    def no_model_call(*_, **__):
        raise AssertionError("LightRAG's flush embedded a text the ingest had not prepared")

    monkeypatch.setattr(kb.embedder, "embed_many", no_model_call)
    monkeypatch.setattr(kb.embedder, "aembed_all", no_model_call)
    await kb.ingest_many(SITE, read(tmp_path / "v1", FIRST) + read(tmp_path / "v2", BATCH))


async def test_queries_run_while_a_batch_is_written_and_a_document_deleted(two, tmp_path):
    _, kb = two
    await kb.ingest_many(SITE, read(tmp_path / "v1", FIRST))
    retriever = Retriever(kb=kb, base=RetrievalSettings(limiter_enabled=False), rerankers={})

    async def ask(question: str):
        return await retriever.retrieve(SITE, question, SiteConfig(), _no_record)

    b = documents.doc_id_for(SITE, "b.md")
    results = await asyncio.gather(kb.ingest_many(SITE, read(tmp_path / "v2", BATCH)), kb.delete(SITE, b),
                                   *[ask(q) for q in QUESTIONS * 3])
    assert results[1] is True and all(r.documents is not None for r in results[2:])
    assert sorted(r["path"] for r in kb.documents(SITE)) == ["a.md", "c.md", "d.md"]
    found = str(await hits(kb))
    assert "indigo" in found and "jade" not in found


async def _no_record(_call) -> None:
    return None


@pytest.mark.parametrize("workers", [1, 2, 3])
async def test_many_texts_get_the_vectors_each_gets_alone_in_their_order(workers):
    """Ingestion embeds with `aembed_many` (the workers share the texts out); a text's
    vector is the one it gets alone, whatever its neighbours, in the order given."""
    embedder = shared_embedder()
    texts = ["Zephyr Link costs $12 per seat.", "", "Harbor Desk data is hosted in Frankfurt, with backups.",
             "trial", "Zephyr Link encrypts data at rest with AES-256 and keeps it for 90 days."]
    vectors = await embedder.aembed_many(texts, workers=workers)
    assert vectors.shape == (len(texts), embedder.dim)
    for text, vector in zip(texts, vectors):
        assert np.array_equal(vector, embedder.embed([text])[0])
    assert (await embedder.aembed_many([])).shape == (0, embedder.dim)
