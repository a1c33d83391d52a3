"""kb_vectors: the vectors of a site's knowledge-base sentences, prepared by `concierge
ingest` and shared on the bus, so an extractive answer embeds only its question: what the
ingest stores covers what real retrievals hand an answer; a second replica reads what the
first embedded; no server, no wait."""

from __future__ import annotations

import asyncio

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from cli import ingest
from cli.harness.supervisor import free_port
from services.responder import extractive
from services.retriever import documents, retrieval
from services.retriever.knowledge import KnowledgeBase
from services.retriever.search import Retriever
from services.retriever.settings import RetrievalSettings
from shared import kb_vectors, subjects
from shared.embeddings import shared_embedder
from shared.metrics import kb_vectors as looked_up
from shared.site_config import parse
from tests.helpers import decide, turn, unique

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ["Do you integrate with QuickBooks?", "Is my data stored in the EU?", "How long does onboarding take?",
             "Does the mobile app work offline?", "What does the Pro plan cost?", "Who founded Tidewise?"]


class CountingEmbedder:
    """Vectors that say which text they are for; counts the texts it embedded."""
    version, dim = "counting-1", 4

    def __init__(self):
        self.embedded: list[str] = []

    async def aembed_all(self, texts):
        self.embedded += texts
        return np.array([[len(t), sum(map(ord, t)) % 97, 1.0, 0.0] for t in texts], dtype=np.float32)


def count(source: str) -> float:
    return looked_up.labels(source)._value.get()


@pytest.fixture(scope="module")
async def demo(tmp_path_factory):
    """The demo knowledge base in a store of its own, under a site of its own."""
    site = unique("kbv")
    base = KnowledgeBase(tmp_path_factory.mktemp("kb"), shared_embedder()).open()
    root = ROOT / "knowledge" / "demo"
    for path in documents.collect([root]):
        await base.ingest(site, documents.read(site, path, str(path.relative_to(root.parent))))
    yield base, site
    await base.close()


async def test_the_ingest_stores_every_sentence_a_retrieval_hands_an_answer(demo, bus, nats_url, tmp_path,
                                                                          monkeypatch):
    kb, site = demo
    sites = tmp_path / "sites"
    sites.mkdir()
    shutil.copy(ROOT / "sites" / "demo.toml", sites / f"{site}.toml")
    name = parse(sites / f"{site}.toml").name
    monkeypatch.setenv("NATS_URL", nats_url)
    monkeypatch.setenv("SITES_DIR", str(sites))
    prepared = await ingest._prepare_vectors(kb, site)
    assert prepared["stored"] == prepared["texts"] > 100
    again = await ingest._prepare_vectors(kb, site)
    assert again == {"texts": prepared["texts"], "stored": 0}  # a second ingest embeds nothing (it rewrites them)

    node = retrieval.make_node(Retriever(kb=kb, base=RetrievalSettings(), rerankers={}))
    kv = bus.kv[subjects.KB_VECTORS_BUCKET]
    version = kb.embedder.version
    for question in QUESTIONS:
        (done,) = (await decide(node, turn(site, "s1", 1, question))).events
        assert done.documents, question
        wanted = kb_vectors.texts(done.documents[:10], name)  # what answer_writer embeds besides the question
        missing = [t for t in wanted if await kb_vectors._get(kv, kb_vectors.key(site, version, t), 384) is None]
        assert missing == [], question
    # The stored vectors are the model's for the text (int8 weights with dynamic activation
    # ranges: a vector depends a little on the batch it was made in, as in any answer).
    text = wanted[-1]
    stored = await kb_vectors._get(kv, kb_vectors.key(site, version, text), 384)
    assert float(stored @ kb.embedder.embed([text])[0]) > 0.97


async def test_texts_are_those_an_extractive_answer_embeds_besides_its_question():
    from shared import events as ev

    docs = [ev.RetrievedDocument(n=1, document_type="chunk", title="Acme — Pricing", source="p.md", snippet="",
                                 content="Acme costs $19 a user. It includes support. Acme runs in Frankfurt."),
            ev.RetrievedDocument(n=2, document_type="entity", title="Frankfurt", source="p.md", snippet="",
                                 content="Frankfurt (location): Acme runs in Frankfurt.")]
    asked = extractive.Question(text="How much is it?", name="Acme")
    embedded, _, _ = extractive.texts_to_embed(asked, extractive.candidates(docs))
    prepared = kb_vectors.texts(docs, "Acme")
    assert set(embedded[1:]) <= set(prepared)
    # The entity's sentence is the chunk's: an answer given only the entity embeds its title.
    alone, _, _ = extractive.texts_to_embed(asked, extractive.candidates(docs[1:]))
    assert set(alone[1:]) <= set(prepared) and "Frankfurt" in prepared
    assert "How much is it?" not in kb_vectors.texts(docs, "Acme")  # never the visitor's words


async def test_a_second_replica_reads_what_the_first_embedded(bus):
    site, kv = unique("kbv"), bus.kv[subjects.KB_VECTORS_BUCKET]
    texts = ["Invoices sync every hour.", "Data stays in Frankfurt.", "Invoices sync every hour."]
    first, second = CountingEmbedder(), CountingEmbedder()
    before = {s: count(s) for s in ("memory", "bucket", "embedded")}
    writer = kb_vectors.KnowledgeVectors(first)
    a = await writer.vectors(kv, site, texts)
    await writer.flush()  # stored in the background, off the answer's path
    assert first.embedded == ["Invoices sync every hour.", "Data stays in Frankfurt."]
    replica = kb_vectors.KnowledgeVectors(second)
    b = await replica.vectors(kv, site, texts)
    assert second.embedded == [] and np.array_equal(a, b) and b.shape == (3, 4)
    await replica.vectors(kv, site, texts[:1])  # now in its memory
    assert second.embedded == []
    assert count("embedded") - before["embedded"] == 2
    assert count("bucket") - before["bucket"] == 2
    assert count("memory") - before["memory"] == 1
    # Another site's same sentence is another key: nothing is read across sites.
    other = CountingEmbedder()
    await kb_vectors.KnowledgeVectors(other).vectors(kv, unique("kbv"), texts[:1])
    assert other.embedded == texts[:1]


async def test_no_bucket_means_embedding_in_the_process():
    embedder = CountingEmbedder()
    vectors = await kb_vectors.KnowledgeVectors(embedder).vectors(None, "s", ["One sentence here."])
    assert vectors.shape == (1, 4) and embedder.embedded == ["One sentence here."]


async def test_an_ingest_with_no_server_says_so_at_once(monkeypatch):
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{free_port()}")
    started = time.monotonic()
    outcome = await ingest._prepare_vectors(None, "demo")
    assert outcome.startswith("not prepared: no NATS server") and time.monotonic() - started < 3


async def test_a_bucket_that_does_not_answer_costs_an_embedding_not_the_answer():
    import nats.errors

    class Unreachable:
        async def get(self, key):
            raise nats.errors.TimeoutError

        async def put(self, key, value):
            raise nats.errors.TimeoutError

    embedder = CountingEmbedder()
    knowledge = kb_vectors.KnowledgeVectors(embedder)
    vectors = await knowledge.vectors(Unreachable(), "s", ["One sentence here."])
    assert vectors.shape == (1, 4) and embedder.embedded == ["One sentence here."]
    await knowledge.flush()  # the failed store is logged, not raised


async def test_what_other_calls_remember_meanwhile_cannot_lose_a_calls_vectors():
    embedder = CountingEmbedder()
    knowledge = kb_vectors.KnowledgeVectors(embedder, memory=1)
    vectors = await knowledge.vectors(None, "s", ["The first sentence.", "The second sentence."])
    assert vectors.shape == (2, 4) and vectors[0][0] == len("The first sentence.")


async def test_a_failure_while_preparing_leaves_the_ingest_as_it_was(demo, nats_url, monkeypatch):
    kb, site = demo

    async def refused(*_):
        raise PermissionError("Permissions Violation for Publish to $KV.kb_vectors")

    monkeypatch.setenv("NATS_URL", nats_url)
    monkeypatch.setattr(kb_vectors, "warm", refused)
    assert await ingest._prepare_vectors(kb, site) == \
        "not prepared: PermissionError: Permissions Violation for Publish to $KV.kb_vectors"


async def test_a_changed_time_to_live_reaches_the_existing_bucket(bus):
    from shared.bus import _ensure_bucket

    name = unique("ttl")
    await _ensure_bucket(bus.js, name, 60.0, 1)
    await _ensure_bucket(bus.js, name, 120.0, 1)
    assert (await bus.js.stream_info(f"KV_{name}")).config.max_age == 120.0
    await bus.js.delete_stream(f"KV_{name}")


async def test_a_caller_cancelled_mid_embedding_leaves_the_texts_embedded_for_the_others():
    """Two retrievals ask for the same question's vector; the first is cancelled (its turn's
    route went elsewhere) while the model runs: the second still gets the vector, at once,
    rather than waiting for a future nobody will ever resolve."""
    import threading

    from shared.embeddings import Embedder

    release = threading.Event()

    class Slow(Embedder):
        def embed_many(self, texts):
            release.wait(5)
            return np.ones((len(texts), 4), dtype=np.float32)

    embedder = Slow()
    first = asyncio.ensure_future(embedder.aembed_all(["What does it cost?"]))
    await asyncio.sleep(0.05)  # the model call is under way
    second = asyncio.ensure_future(embedder.aembed_all(["What does it cost?"]))
    await asyncio.sleep(0.05)
    first.cancel()
    release.set()
    vectors = await asyncio.wait_for(second, 5)
    assert vectors.shape == (1, 4) and first.cancelled()
    assert (await asyncio.wait_for(embedder.aembed_all(["What does it cost?"]), 1)).shape == (1, 4)  # cached
