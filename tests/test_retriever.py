"""The retriever's search (search.py) and knowledge base: tenant isolation in storage, the
type-based limiter, reranking and its fallback, ingestion (unchanged / changed / deleted /
unreadable files), the query text. The `retrieval` node itself: tests/test_retrieval.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from services.retriever import documents, limiter
from services.retriever.knowledge import KnowledgeBase
from services.retriever.rerank import CohereReranker, JinaReranker
from services.retriever.search import Candidate, Retriever, search_text, select, without_site_name
from services.retriever.settings import RetrievalSettings
from shared.embeddings import shared_embedder
from shared.site_config import SiteConfig
from tests.servers import RerankServer

# Three sites sell a product of the same name with different facts; each fact carries a
# marker word no other site uses, so any leak is visible in the text.
SITES = {
    "iso_north": ("amber", "$19", "Salesforce", "Frankfurt"),
    "iso_south": ("cobalt", "$49", "HubSpot", "Virginia"),
    "iso_west": ("violet", "$99", "Pipedrive", "Sydney"),
}
QUESTIONS = ["How much does Acme Sync cost?", "Which CRM does Acme Sync integrate with?",
             "Where is Acme Sync data hosted?", "Tell me about the Acme Sync mobile app", "Is there a free trial?"]


def write_site_docs(root: Path, site: str) -> list[Path]:
    marker, price, crm, region = SITES[site]
    folder = root / site
    folder.mkdir(parents=True)
    (folder / "pricing.md").write_text(
        f"# Acme Sync pricing\n\n## Plans\nAcme Sync costs {price} per user per month ({marker} plan). "
        f"The Acme Sync free trial lasts 14 days ({marker}).\n")
    (folder / "integrations.md").write_text(
        f"# Acme Sync integrations\n\n## CRM\nAcme Sync integrates with {crm} ({marker} edition). "
        f"Acme Sync Mobile shows {crm} contacts to field teams ({marker}).\n")
    (folder / "security.md").write_text(
        f"# Acme Sync security\n\n## Hosting\nAcme Sync data is hosted in {region} ({marker} region). "
        f"Acme Sync encrypts data at rest ({marker}).\n")
    return [folder / "pricing.md", folder / "integrations.md", folder / "security.md"]


@pytest.fixture(scope="module")
async def kb(tmp_path_factory):
    root = tmp_path_factory.mktemp("kb")
    base = KnowledgeBase(root / "store", shared_embedder()).open()
    for site in SITES:
        for path in write_site_docs(root / "docs", site):
            assert await base.ingest(site, documents.read(site, path, path.name)) == "added"
    yield base
    await base.close()


def texts(result) -> list[str]:
    return [f"{d.title} {d.content} {d.snippet}" for d in result.documents]


# --- isolation --------------------------------------------------------------------------


async def test_concurrent_queries_never_return_another_sites_documents(kb):
    async def ask(site: str, question: str, mode: str):
        retriever = Retriever(kb=kb, base=RetrievalSettings(mode=mode, limiter_enabled=False), rerankers={})
        return site, await retriever.retrieve(site, question, SiteConfig(), _no_record)

    jobs = [ask(site, q, mode) for site in SITES for q in QUESTIONS for mode in ("mix", "hybrid", "local", "global", "naive")]
    results = await asyncio.gather(*jobs)
    seen_documents = 0
    for site, result in results:
        own_marker = SITES[site][0]
        others = [SITES[s][0] for s in SITES if s != site] + [v for s in SITES if s != site for v in SITES[s][1:]]
        own_ids = set(kb.registry(site))
        for doc in result.documents:
            seen_documents += 1
            text = f"{doc.title} {doc.content}"
            assert not any(word in text for word in others), (site, text)
            assert doc.doc_id in own_ids, (site, doc.doc_id)
        if result.documents:
            assert any(own_marker in t for t in texts(result))
    assert seen_documents > 200  # the queries did find things: the check above had work to do


async def test_every_vector_of_a_site_carries_its_workspace(kb):
    for site in SITES:
        collections = [c.name for c in kb._client.get_collections().collections if c.name.endswith(f"_{site}")]
        assert len(collections) == 3  # chunks, entities, relationships: the site's own
        for name in collections:
            points, _ = kb._client.scroll(name, limit=1000, with_payload=True)
            assert points and {p.payload["workspace_id"] for p in points} == {site}


async def test_a_site_with_no_knowledge_base_gets_nothing(kb):
    retriever = Retriever(kb=kb, base=RetrievalSettings(), rerankers={})
    result = await retriever.retrieve("iso_empty", "How much does Acme Sync cost?", SiteConfig(), _no_record)
    assert result.documents == [] and result.found == {"chunk": 0, "entity": 0, "relationship": 0}


# --- ingestion --------------------------------------------------------------------------


async def test_unchanged_file_adds_nothing_changed_file_replaces_deleted_file_leaves(kb, tmp_path):
    site = "iso_edit"
    path = tmp_path / "plans.md"
    path.write_text("# Plans\n\n## Price\nThe Orbit plan costs $10 per seat (saffron).\n")
    assert await kb.ingest(site, documents.read(site, path, "plans.md")) == "added"
    assert await kb.ingest(site, documents.read(site, path, "plans.md")) == "unchanged"
    path.write_text("# Plans\n\n## Price\nThe Orbit plan costs $12 per seat (indigo).\n")
    assert await kb.ingest(site, documents.read(site, path, "plans.md")) == "replaced"
    retriever = Retriever(kb=kb, base=RetrievalSettings(limiter_enabled=False), rerankers={})
    result = await retriever.retrieve(site, "How much is the Orbit plan?", SiteConfig(), _no_record)
    joined = " ".join(texts(result))
    assert "indigo" in joined and "saffron" not in joined
    assert len(kb.documents(site)) == 1
    assert await kb.delete(site, documents.doc_id_for(site, "plans.md"))
    result = await retriever.retrieve(site, "How much is the Orbit plan?", SiteConfig(), _no_record)
    assert result.documents == []


async def test_an_entity_shared_by_two_documents_survives_the_deletion_of_one(kb, tmp_path):
    site = "iso_shared"
    (tmp_path / "a.md").write_text("# A\n\n## Sync\nZephyr Link connects to Salesforce every hour (topaz).\n")
    (tmp_path / "b.md").write_text("# B\n\n## Mobile\nZephyr Link works offline on phones (jade).\n")
    for name in ("a.md", "b.md"):
        await kb.ingest(site, documents.read(site, tmp_path / name, name))
    await kb.delete(site, documents.doc_id_for(site, "a.md"))
    retriever = Retriever(kb=kb, base=RetrievalSettings(mode="local", limiter_enabled=False), rerankers={})
    result = await retriever.retrieve(site, "What is Zephyr Link?", SiteConfig(), _no_record)
    entities = [d for d in result.documents if d.document_type == "entity" and d.title == "Zephyr Link"]
    assert entities and "jade" in entities[0].content and "topaz" not in entities[0].content
    assert all("topaz" not in t for t in texts(result))


async def test_storage_reads_answer_like_lightrags_own(kb):
    """The knowledge base's storages override a few of LightRAG's reads for speed: the
    graph's batch reads, the key-value store's copies, the vector read without payloads."""
    from lightrag.base import BaseGraphStorage
    from lightrag.kg.json_kv_impl import JsonKVStorage
    from lightrag.kg.qdrant_impl import QdrantVectorDBStorage

    rag = await kb._rag("iso_north")
    chunk_ids = list(rag.text_chunks._data) + ["chunk-missing"]
    assert len(chunk_ids) > 3
    assert await rag.text_chunks.get_by_ids(chunk_ids) == await JsonKVStorage.get_by_ids(rag.text_chunks, chunk_ids)
    copied = (await rag.text_chunks.get_by_ids(chunk_ids[:1]))[0]
    copied["content"] = "changed"
    assert (await rag.text_chunks.get_by_ids(chunk_ids[:1]))[0]["content"] != "changed"
    vectors = await rag.chunks_vdb.get_vectors_by_ids(chunk_ids)
    assert len(vectors) == len(chunk_ids) - 1
    stored = await QdrantVectorDBStorage.get_vectors_by_ids(rag.chunks_vdb, chunk_ids)
    # The same vectors to the float32 rounding Qdrant's local mode adds when it reads a
    # collection again from its file (it normalises a cosine collection's vectors on each read).
    assert vectors.keys() == stored.keys()
    assert all(np.allclose(vectors[i], stored[i], rtol=0, atol=1e-6) for i in vectors)
    # Vector search over the local index: Qdrant's hits, order and scores.
    sample = (await rag.text_chunks.get_by_ids(chunk_ids[:1]))[0]["content"]
    names = " ".join((await rag.chunk_entity_relation_graph.get_all_labels())[:3])
    hits = 0
    for storage in (rag.chunks_vdb, rag.entities_vdb, rag.relationships_vdb):
        for text in (sample, names, "zzz"):
            vector = (await storage.embedding_func([text]))[0]
            ours = await storage.query(text, 8, query_embedding=vector)
            qdrants = storage._client.query_points(collection_name=storage.final_namespace, query=vector, limit=8,
                                                   with_payload=True,
                                                   score_threshold=storage.cosine_better_than_threshold).points
            ours_ranked = [(round(o["distance"], 4), o["id"] if "id" in o else o.get("entity_name")) for o in ours]
            qdrants_ranked = [(round(p.score, 4), p.payload.get("id", p.payload.get("entity_name"))) for p in qdrants]
            assert [score for score, _ in ours_ranked] == [score for score, _ in qdrants_ranked]
            # Equal scores (a chunk's relationships share its vector) come in each store's own
            # order, and the limit may cut their group at different members: the same hits
            # above the last score.
            last = ours_ranked[-1][0] if ours_ranked else None
            assert sorted(h for h in ours_ranked if h[0] != last) == sorted(h for h in qdrants_ranked if h[0] != last)
            hits += len(ours)
    assert hits > 8  # the comparison compared something

    graph = rag.chunk_entity_relation_graph
    assert type(graph).__name__ == "ConciergeGraphStorage"
    nodes = await graph.get_all_labels() + ["No Such Entity"]
    edges = [(e["source"], e["target"]) for e in await graph.get_all_edges()]
    edges += [(t, s) for s, t in edges]  # either direction: the graph is undirected
    assert len(nodes) > 3 and edges  # the site's graph has something to read
    pairs = [{"src": s, "tgt": t} for s, t in edges] + [{"src": "No Such Entity", "tgt": nodes[0]}]
    degree_pairs = edges + [("No Such Entity", nodes[0])]
    for method, arg in (("get_nodes_batch", nodes), ("node_degrees_batch", nodes),
                        ("get_nodes_edges_batch", nodes), ("get_edges_batch", pairs),
                        ("edge_degrees_batch", degree_pairs)):
        assert await getattr(graph, method)(arg) == await getattr(BaseGraphStorage, method)(graph, arg), method


async def test_cli_ingest_reports_unreadable_files_and_ingests_the_rest(tmp_path, monkeypatch, capsys):
    from cli import ingest

    from cli.harness.supervisor import free_port

    monkeypatch.setenv("KB_DIR", str(tmp_path / "kb"))
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{free_port()}")  # no bus: the vectors are not prepared
    good = tmp_path / "docs" / "good.md"
    good.parent.mkdir()
    good.write_text("# Good\n\nThe Nimbus plan includes reporting.\n")
    (tmp_path / "docs" / "broken.pdf").write_bytes(b"not a pdf at all")
    (tmp_path / "docs" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    counts = await ingest.ingest("iso_cli", [tmp_path / "docs", tmp_path / "missing.md"], quiet=True)
    err = capsys.readouterr().err
    assert counts["added"] == 1 and counts["skipped"] == 3 and counts["chunks"] >= 1
    assert counts["vectors"].startswith("not prepared: no NATS server")
    assert "broken.pdf" in err and "latin1.txt" in err and "missing.md" in err
    again = await ingest.ingest("iso_cli", [tmp_path / "docs"], quiet=True)
    assert again["added"] == 0 and again["unchanged"] == 1

    # `docs prune`: once the same files are the site's sources (`make run` uploads the demo's),
    # what the CLI ingested goes; a source's pages stay.
    import argparse

    kb = ingest._open_kb()
    owned = documents.from_markdown("iso_cli", "web-1:https://x.example/b", "B", "https://x.example/b",
                                    "# B\n\nThe Nimbus plan is monthly.", "h1",
                                    {"source": "web-1", "url": "https://x.example/b"})
    assert await kb.ingest("iso_cli", owned) == "added"
    await kb.close()
    assert await ingest._docs(argparse.Namespace(action="prune", site="iso_cli")) == 0
    kb = ingest._open_kb()
    try:
        assert [r["doc_id"] for r in kb.documents("iso_cli")] == [owned.doc_id]
    finally:
        await kb.close()
    assert "1 documents no source owns deleted, 1 kept" in capsys.readouterr().out


def test_documents_read_markdown_html_and_front_matter(tmp_path):
    md = tmp_path / "p.md"
    md.write_text("---\ntitle: Prices\nurl: https://x.example/pricing\n---\n# Ignored\n\n## Plans\nStarter $5.\n")
    doc = documents.read("s", md, "p.md")
    assert (doc.title, doc.source, doc.sections) == ("Prices", "https://x.example/pricing", [("Plans", "Starter $5.")])
    html = tmp_path / "p.html"
    html.write_text("<html><head><title>Help</title><link rel='canonical' href='https://x.example/help'></head>"
                    "<body><nav>menu</nav><h1>Help</h1><h2>Hours</h2><p>9 to 5</p><script>x()</script></body></html>")
    doc = documents.read("s", html, "p.html")
    assert (doc.title, doc.source, doc.sections) == ("Help", "https://x.example/help", [("Hours", "9 to 5")])


# --- limiter and reranking --------------------------------------------------------------


@pytest.mark.parametrize("mode,expected", [
    ("global", {"chunk": 6, "entity": 7, "relationship": 7}),
    ("local", {"chunk": 12, "entity": 4, "relationship": 4}),
    ("hybrid", {"chunk": 6, "entity": 6, "relationship": 8}),
    ("mix", {"chunk": 6, "entity": 6, "relationship": 8}),
    ("naive", {"chunk": 20, "entity": 0, "relationship": 0}),
])
def test_limiter_splits_the_budget_by_mode(mode, expected):
    assert limiter.allocate(mode, 20, {"chunk": 50, "entity": 50, "relationship": 50}) == expected


def test_limiter_gives_unused_places_to_the_other_types():
    take = limiter.allocate("mix", 20, {"chunk": 2, "entity": 50, "relationship": 50})
    assert take["chunk"] == 2 and sum(take.values()) == 20 and take["relationship"] > take["entity"]
    assert limiter.allocate("local", 20, {"chunk": 3, "entity": 4, "relationship": 100}) == \
        {"chunk": 3, "entity": 4, "relationship": 13}
    assert limiter.allocate("mix", 20, {"chunk": 3, "entity": 2, "relationship": 1}) == \
        {"chunk": 3, "entity": 2, "relationship": 1}
    naive = limiter.allocate("naive", 5, {"chunk": 2, "entity": 9, "relationship": 9})
    assert naive["chunk"] == 2 and sum(naive.values()) == 5


def by_type(n=10):
    return {t: [Candidate(t, f"{t} {i}", "src", f"{t} text {i} pricing" if i == 3 else f"{t} text {i}", "d")
                for i in range(n)] for t in limiter.TYPES}


async def test_without_reranker_or_limiter_everything_is_returned():
    kept, selection, fallback = await select(RetrievalSettings(limiter_enabled=False), {}, "q", by_type())
    assert len(kept) == 30 and selection == "all" and fallback is None
    kept, _, _ = await select(RetrievalSettings(limiter_enabled=False, relationships_enabled=False), {}, "q", by_type())
    assert len(kept) == 20 and all(c.document_type != "relationship" for c in kept)


@pytest.fixture
def rerank_server():
    server = RerankServer()
    yield server
    server.close()


@pytest.mark.parametrize("provider", ["jina", "cohere"])
async def test_reranker_scores_all_types_together_and_keeps_top_k(rerank_server, provider):
    reranker = (JinaReranker("k", f"{rerank_server.base_url}/v1/rerank") if provider == "jina"
                else CohereReranker("k", rerank_server.base_url))
    settings = RetrievalSettings(rerank_enabled=True, rerank_provider=provider, rerank_top_k=5)
    kept, selection, fallback = await select(settings, {provider: reranker}, "relationship text pricing", by_type())
    assert selection == f"rerank:{provider}" and fallback is None and len(kept) == 5
    assert kept[0].title == "relationship 3" and kept[0].score == max(c.score for c in kept)
    body = rerank_server.requests[-1]["body"]
    assert len(body["documents"]) == 30 and body["top_n"] == 5 and body["model"] == "rerank-v3.5"


@pytest.mark.parametrize("failure", ["status", "timeout"])
async def test_reranker_failure_falls_back_to_the_limiter_and_says_so(rerank_server, failure):
    if failure == "status":
        rerank_server.fail_with = 503
    else:
        rerank_server.delay_s = 1.0
    reranker = JinaReranker("k", f"{rerank_server.base_url}/v1/rerank", timeout_s=0.3)
    settings = RetrievalSettings(rerank_enabled=True, rerank_provider="jina", rerank_top_k=20, mode="mix")
    kept, selection, fallback = await select(settings, {"jina": reranker}, "q", by_type(50))
    assert selection == "limiter" and fallback and "jina" in fallback
    assert [c.document_type for c in kept].count("relationship") == 8 and len(kept) == 20
    assert all(c.score is None for c in kept)


async def test_reranker_enabled_but_not_configured_uses_the_limiter():
    kept, selection, fallback = await select(RetrievalSettings(rerank_enabled=True, rerank_provider="cohere"), {},
                                             "q", by_type(50))
    assert selection == "limiter" and "not configured" in fallback and len(kept) == 20


class RecordingKnowledgeBase:
    """Records what the retriever asks for; finds nothing."""

    def __init__(self):
        self.asked: list[dict] = []

    async def ready(self, site):
        pass

    def entity_names(self, site):
        return []

    def vocabulary(self, site):
        return None  # its words unknown: no name is reported as never mentioned

    def contact_page(self, site):
        return ""

    async def query(self, site, text, **kw):
        self.asked.append({"text": text, **kw})
        return {"chunk": [], "entity": [], "relationship": []}


@pytest.mark.parametrize("query, lang, searched", [
    ("Y a-t-il une période d'essai ?", None, "Y a-t-il une période d'essai ? trial"),
    ("Welche Zahlungsmethoden gibt es?", "de", "Welche Zahlungsmethoden gibt es? payment methods"),
    ("Is there a trial period?", None, "Is there a trial period?"),
])
async def test_a_message_not_in_english_is_searched_with_its_glossary_terms_in_english(query, lang, searched):
    kb = RecordingKnowledgeBase()
    found = await Retriever(kb=kb, base=RetrievalSettings(), rerankers={}).retrieve("s", query, SiteConfig(),
                                                                                 None, lang)
    assert kb.asked[0]["text"] == searched
    assert " ".join(found.keywords["high_level"]).split()[-1] == searched.split()[-1].strip("?").lower()


# --- the query --------------------------------------------------------------------------


def test_short_follow_ups_are_read_with_the_previous_message():
    assert search_text("Do you integrate with QuickBooks?", "and with Salesforce?") == \
        "Do you integrate with QuickBooks? and with Salesforce?"
    assert search_text("Hi", "What does the Growth plan include for large teams of technicians?") == \
        "What does the Growth plan include for large teams of technicians?"
    assert search_text("", "pricing?") == "pricing?"


def test_the_sites_own_name_is_left_out_of_the_query():
    assert without_site_name("Which accounting software does Tidewise integrate with?", "Tidewise") == \
        "Which accounting software does integrate with?"
    assert without_site_name("What is tidewise's mission statement?", "Tidewise") == "What is mission statement?"
    assert without_site_name("What is Tidewise?", "Tidewise") == "What is Tidewise?"  # little else: kept
    assert without_site_name("Tidewiser pricing plans", "Tidewise") == "Tidewiser pricing plans"  # whole words only
    assert without_site_name("Which plans does Tidewise offer?", "") == "Which plans does Tidewise offer?"


async def _no_record(_call) -> None:
    return None


async def test_with_an_extraction_llm_documents_go_through_lightrags_own_pipeline(tmp_path, llm):
    """RETRIEVAL_EXTRACTION=llm: LightRAG chunks the document and asks the `extraction` role
    for entities and relationships (here the scripted LLM, whose replies hold none, so the
    chunks are what is searched); replace and delete work the same way."""
    from shared.config import LLMRoleConfig
    from shared.llm import LLMClient

    client = LLMClient({"extraction": LLMRoleConfig(role="extraction", base_url=llm.base_url, api_key="k",
                                                    model="scripted", max_retries=0, timeout_s=10)})
    base = KnowledgeBase(tmp_path / "kb", shared_embedder(), extraction_llm=client).open()
    try:
        site = "iso_llm"
        path = tmp_path / "faq.md"
        path.write_text("# FAQ\n\n## Trial\nThe Comet plan has a free trial of 21 days (garnet).\n")
        llm.clear()
        assert await base.ingest(site, documents.read(site, path, "faq.md")) == "added"
        assert any("garnet" in str(r["messages"]) for r in llm.requests())  # the LLM was asked to extract
        assert base.registry(site)[documents.doc_id_for(site, "faq.md")]["chunk_count"] >= 1
        assert await base.ingest(site, documents.read(site, path, "faq.md")) == "unchanged"
        retriever = Retriever(kb=base, base=RetrievalSettings(mode="naive", limiter_enabled=False), rerankers={})
        found = await retriever.retrieve(site, "How long is the Comet free trial?", SiteConfig(), _no_record)
        assert any("garnet" in d.content for d in found.documents)
        path.write_text("# FAQ\n\n## Trial\nThe Comet plan has a free trial of 30 days (amber).\n")
        assert await base.ingest(site, documents.read(site, path, "faq.md")) == "replaced"
        found = await retriever.retrieve(site, "How long is the Comet free trial?", SiteConfig(), _no_record)
        joined = " ".join(d.content for d in found.documents)
        assert "amber" in joined and "garnet" not in joined
        assert await base.delete(site, documents.doc_id_for(site, "faq.md"))
        found = await retriever.retrieve(site, "How long is the Comet free trial?", SiteConfig(), _no_record)
        assert found.documents == []
    finally:
        await base.close()


async def test_a_query_counts_its_tokens_inline_not_on_lightrags_tokenizer_thread(kb, monkeypatch):
    """lightrag_functions.tokenize_inline: LightRAG's hand-over of token counting to a thread
    cost more than the counting (a regex pass); an opened knowledge base's query makes none."""
    import lightrag.utils

    def no_thread():
        raise AssertionError("a query handed token counting to LightRAG's tokenizer thread")

    monkeypatch.setattr(lightrag.utils, "get_tokenizer_executor", no_thread)
    for mode in ("mix", "local", "global"):
        retriever = Retriever(kb=kb, base=RetrievalSettings(mode=mode, limiter_enabled=False), rerankers={})
        result = await retriever.retrieve("iso_north", "How much does Acme Sync cost?", SiteConfig(), _no_record)
        assert any("$19" in text for text in texts(result))


async def test_a_query_returns_what_lightrags_own_counting_and_config_copy_return(kb, monkeypatch):
    """lightrag_functions.untruncated_when_unbounded, cosine_once_per_vector and
    share_query_config: with the budgets out of reach, a query skips LightRAG's rendering
    and counting and its per-query copy of the configuration, and ranks chunks with the
    cheaper cosine, and finds exactly what it found with LightRAG's own functions (put back
    for the second pass)."""
    import types

    import lightrag.utils
    from lightrag import LightRAG

    async def everything() -> list:
        return [await kb.query(site, question, mode=mode, high_level=[], low_level=[question], graph_top_k=20,
                               chunk_top_k=10)
                for site in SITES for question in QUESTIONS for mode in ("mix", "local", "global", "hybrid", "naive")]

    patched = await everything()
    assert any(found["entity"] and found["relationship"] and found["chunk"] for found in patched)
    for name in ("truncate_list_by_token_size", "_truncate_chunks_for_unified_context", "cosine_similarity"):
        monkeypatch.setattr(lightrag.utils, name, getattr(lightrag.utils, name).__wrapped__)
    for site in SITES:
        rag = await kb._rag(site)
        monkeypatch.setattr(rag, "_build_global_config", types.MethodType(LightRAG._build_global_config, rag))
    assert await everything() == patched


async def test_only_queries_share_the_configuration_copy(kb):
    from services.retriever.lightrag_functions import querying

    rag = await kb._rag("iso_north")
    assert rag._build_global_config() is not rag._build_global_config()  # ingestion: a copy each time
    with querying():
        shared = rag._build_global_config()
        assert rag._build_global_config() is shared and shared["tokenizer"] is rag.tokenizer
    assert rag._build_global_config() is not shared


def test_a_budget_within_reach_is_still_counted_and_cut():
    import lightrag.utils
    from lightrag.utils import Tokenizer

    from services.retriever.lightrag_functions import UNBOUNDED_TOKENS, untruncated_when_unbounded
    from services.retriever.word_tokenizer import WordTokenizer

    untruncated_when_unbounded()  # as a knowledge base's `open` does (again: harmless)
    tokenizer = Tokenizer("words", WordTokenizer())
    items = [f"item {i} has five words" for i in range(10)]
    kept = lightrag.utils.truncate_list_by_token_size(items, key=str, separator="\n", max_token_size=12,
                                                      tokenizer=tokenizer)
    assert kept == items[:2]

    def unrendered(item):
        raise AssertionError("an item was rendered to fit a budget out of reach")

    assert lightrag.utils.truncate_list_by_token_size(items, key=unrendered, separator="\n",
                                                      max_token_size=UNBOUNDED_TOKENS, tokenizer=tokenizer) == items
    chunks = [{"content": text, "file_path": f"doc{i}.md"} for i, text in enumerate(items)]
    assert 0 < len(lightrag.utils._truncate_chunks_for_unified_context(chunks, 30, tokenizer)) < len(chunks)
    assert lightrag.utils._truncate_chunks_for_unified_context(chunks, UNBOUNDED_TOKENS - 500, tokenizer) == chunks


def test_the_cosine_swapped_in_is_lightrags_bit_for_bit():
    """lightrag_functions.cosine_once_per_vector: the same similarity, to the last bit, as
    LightRAG's own for the vectors it ranks (a query's array against a stored list) and the
    edge cases it guards (a zero vector, a non-finite one, integers)."""
    import lightrag.utils
    import numpy as np

    from services.retriever.lightrag_functions import cosine_once_per_vector

    cosine_once_per_vector()
    swapped = lightrag.utils.cosine_similarity
    original = swapped.__wrapped__
    assert swapped is not original
    rng = np.random.default_rng(7)
    pairs = [(rng.standard_normal(384).astype(np.float32), rng.standard_normal(384).tolist()) for _ in range(500)]
    pairs += [(rng.standard_normal(384), rng.standard_normal(384).astype(np.float32)) for _ in range(100)]
    strided = np.asfortranarray(rng.standard_normal((50, 384)).astype(np.float32))  # rows not contiguous
    pairs += [(row, rng.standard_normal(384).tolist()) for row in strided]
    pairs += [(np.zeros(384, dtype=np.float32), [1.0] * 384), ([np.inf] + [0.0] * 383, [1.0] * 384),
              ([1, 2, 3], [4, 5, 6]), (np.array([3, 4]), [4.0, 3.0])]
    for v1, v2 in pairs:
        assert swapped(v1, v2) == original(v1, v2)
