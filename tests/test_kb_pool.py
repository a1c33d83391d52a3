"""The bounded pool of open knowledge bases (services/retriever/pool.py, knowledge.py): past
its budget the least recently used idle sites are closed and answer again when asked; a
site in use is never closed; racing requests open a site once; a read never makes a site;
Qdrant's local collections are read when used, not when the knowledge base opens; and an
open site's estimated cost is what tracemalloc measures it takes."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

import pytest

from cli.measure.loadtest.retriever import make_corpus
from services.retriever import documents, lightrag_functions, local_qdrant, pool
from services.retriever.knowledge import KnowledgeBase
from shared.embeddings import shared_embedder

SITES = {f"site{n}": f"# Plans\n\n## Price\nThe Orbit plan of site {n} costs ${10 + n} per seat (word{n}).\n"
         for n in range(4)}


async def ask(kb: KnowledgeBase, site: str) -> str:
    found = await kb.query(site, "How much does the Orbit plan cost?", mode="mix", high_level=["price"],
                           low_level=["Orbit"], graph_top_k=10, chunk_top_k=5)
    return " ".join(c["content"] for c in found["chunk"])


@pytest.fixture
async def kb(tmp_path: Path):
    base = KnowledgeBase(tmp_path / "kb", shared_embedder(), open_sites=2).open()
    for site, text in SITES.items():
        (tmp_path / f"{site}.md").write_text(text)
        await base.ingest(site, documents.read(site, tmp_path / f"{site}.md", "plans.md"))
    await base.pool.close_all()
    try:
        yield base
    finally:
        await base.close()


async def test_past_its_budget_the_least_recently_used_site_is_closed_and_answers_again(kb):
    evictions = kb.pool.evictions
    for n in range(3):
        assert f"word{n}" in await ask(kb, f"site{n}")
    assert kb.pool.sites() == ["site1", "site2"] and kb.pool.evictions == evictions + 1
    local = local_qdrant.lazy(kb._client)
    assert not [name for name in local.collections.in_memory() if name.endswith("_site0")]
    assert "site0" not in kb._registries  # its registry left memory with it
    opens = kb.pool.opens
    assert "word0" in await ask(kb, "site0")  # closed, not lost
    assert kb.pool.opens == opens + 1 and kb.pool.sites() == ["site2", "site0"]


async def test_a_site_in_use_is_never_closed(kb):
    await ask(kb, "site0")
    with kb.pool.peek("site0").use():  # a query reading it
        await ask(kb, "site1")
        await ask(kb, "site2")
        await ask(kb, "site3")
        assert "site0" in kb.pool.sites()
    async with kb._lock("site1"):  # an ingest writing it
        await ask(kb, "site1")
        await ask(kb, "site0")
        await ask(kb, "site2")
        assert "site1" in kb.pool.sites()
    assert len(kb.pool) <= 3


async def test_requests_racing_for_a_closed_site_open_it_once(kb):
    opens = kb.pool.opens
    answers = await asyncio.gather(*(ask(kb, "site3") for _ in range(8)))
    assert all("word3" in a for a in answers)
    assert kb.pool.opens == opens + 1 and kb.pool.sites() == ["site3"]


async def test_a_read_never_makes_a_site(kb, tmp_path: Path):
    for _ in range(3):
        assert await ask(kb, "nosuch") == ""
        assert kb.registry("nosuch") == {} and kb.vocabulary("nosuch") == frozenset()
    assert "nosuch" not in kb.pool and "nosuch" not in kb._registries and "nosuch" not in kb._saves
    assert not (tmp_path / "kb" / "nosuch").exists()


async def test_local_collections_are_read_when_used_not_when_the_knowledge_base_opens(kb, tmp_path: Path):
    await kb.close()
    reopened = KnowledgeBase(tmp_path / "kb", shared_embedder()).open()
    try:
        local = local_qdrant.lazy(reopened._client)
        assert len(local.collections) == 3 * len(SITES) and local.collections.in_memory() == []
        assert "word1" in await ask(reopened, "site1")
        # read to open the site, then left once its search index was made
        assert local.collections.in_memory() == []
        await reopened.ingest("site1", documents.read("site1", _write(tmp_path / "new.md"), "new.md"))
        assert "word9" in await ask(reopened, "site1")
        assert not [n for n in local.collections.in_memory() if not n.endswith("_site1")]
    finally:
        await reopened.close()


def _write(path: Path) -> Path:
    path.write_text("# Discounts\n\n## Nonprofits\nNonprofits get 40 percent off the Orbit plan (word9).\n")
    return path


async def test_an_open_sites_estimated_cost_is_what_it_takes(tmp_path: Path):
    """tracemalloc counts what opening a site and its first query leave allocated; the
    estimate (pool.estimate, from the site's files and vectors) is within 20 % of it, and
    closing the site gives it back."""
    for name, docs, sections in (("small", 1, 4), ("large", 5, 20)):
        make_corpus(tmp_path / "corpus" / name, 1, docs, sections)
    kb = KnowledgeBase(tmp_path / "kb", shared_embedder()).open()
    try:
        for name in ("small", "large"):
            folder = tmp_path / "corpus" / name / "load00"
            await kb.ingest_many(name, [documents.read(name, p, p.name) for p in documents.collect([folder])])
        await ask(kb, "small")  # LightRAG's first query in the process makes what every later one shares
        await kb.pool.close_all()
        for name in ("small", "large"):
            gc.collect()
            tracemalloc.start()
            try:
                await ask(kb, name)
                kb.vocabulary(name)
                gc.collect()
                taken = tracemalloc.get_traced_memory()[0]
                estimated = kb.pool.peek(name).cost
                await kb.pool.close_all()
                gc.collect()
                left = tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
            assert 0.8 < taken / estimated < 1.2, (name, taken, estimated)
            # what other tasks of the test process allocate meanwhile is noise of tens of KiB
            assert left < max(0.15 * taken, 128 * 1024), (name, left, taken)
    finally:
        await kb.close()


def test_the_estimate_grows_with_the_files_and_the_vectors(tmp_path: Path):
    (tmp_path / "kv.json").write_bytes(b"x" * 100_000)
    base = pool.estimate(tmp_path, 0, 384)
    assert base == pool.SITE_FIXED_BYTES + 300_000
    assert pool.estimate(tmp_path, 1000, 384) == base + int(pool.BYTES_PER_VECTOR_DIM * 384_000)
    assert pool.estimate(tmp_path / "missing", 0, 384) == pool.SITE_FIXED_BYTES


async def test_a_deferred_snapshot_is_fetched_once_when_first_asked_and_again_after_a_failure(kb, tmp_path: Path):
    """A replica defers a site's newer snapshot (snapshots.Follower) until the site is used:
    racing requests fetch it once; a fetch that fails leaves it deferred and says why."""
    calls = []

    async def failing() -> Path | None:
        calls.append("failing")
        raise OSError("object store unreachable")

    async def nothing_newer() -> Path | None:
        calls.append("ok")
        await asyncio.sleep(0.05)
        return None

    kb.defer("site1", failing)
    with pytest.raises(OSError, match="unreachable"):
        await ask(kb, "site1")
    assert "site1" in kb._deferred  # still to fetch
    kb.defer("site1", nothing_newer)
    answers = await asyncio.gather(*(ask(kb, "site1") for _ in range(5)))
    assert all("word1" in a for a in answers) and calls == ["failing", "ok"]


def test_the_sites_get_a_share_of_what_the_process_does_not_take():
    share = pool.Pool(close=None, busy=None, budget_bytes=1024 << 20).share
    assert share(400 << 20) == int(pool.POOL_SHARE * (624 << 20))
    assert share(2048 << 20) == pool.MIN_POOL_BYTES  # a process past its budget still serves a site


async def test_past_the_high_water_mark_the_sites_share_is_lowered_and_the_oldest_close(monkeypatch):
    """The share rests on an estimate; when the process's resident memory passes 98 % of
    the budget anyway (the allocator's fragmentation after thousands of opens), the share
    is lowered by the excess and the least recently used idle sites close to fit it."""
    mb = 1 << 20
    resident = [400 * mb]
    monkeypatch.setattr(pool, "resident_bytes", lambda: resident[0])
    closed: list[str] = []

    async def close(site, opened):
        closed.append(site)

    sites = pool.Pool(close=close, busy=lambda site: False, budget_bytes=1000 * mb)

    async def open_site(site: str):
        async def opener():
            return pool.Opened(rag=None, directory=Path("."), mtime=0.0, cost=90 * mb)
        return await sites.get(site, opener)

    for n in range(5):
        await open_site(f"s{n}")
    assert sites.limit_bytes == int(pool.POOL_SHARE * 600 * mb) and closed == []  # 450 of 480 MB estimated
    resident[0] = 1000 * mb  # 20 MB past the high-water mark, the estimate notwithstanding
    with sites.peek("s0").use():  # a query reading the oldest: it stays
        await open_site("s5")
    assert sites.limit_bytes == 480 * mb - 20 * mb and closed == ["s1"]
    assert sites.sites() == ["s0", "s2", "s3", "s4", "s5"]
    resident[0] = 900 * mb  # below the mark: the share stays as it was lowered
    await open_site("s6")
    assert sites.limit_bytes == 460 * mb and closed == ["s1", "s0"]


def test_the_lazy_local_store_writes_the_meta_file_qdrant_writes(tmp_path: Path):
    """local_qdrant's `_save` (each collection's configuration serialised once) writes what
    qdrant-client's own does, and qdrant-client reads it back."""
    import json

    from qdrant_client import QdrantClient, models
    from qdrant_client.local.qdrant_local import QdrantLocal

    client = local_qdrant.open_local(str(tmp_path / "q"))
    for n in range(3):
        client.create_collection(f"c{n}", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE))
        client.create_payload_index(f"c{n}", field_name="workspace_id", field_schema=models.KeywordIndexParams(
            type=models.KeywordIndexType.KEYWORD, is_tenant=True))
    client.delete_collection("c1")
    ours = json.loads((tmp_path / "q" / "meta.json").read_text())
    QdrantLocal._save(local_qdrant.lazy(client))  # qdrant-client's own, over the same collections
    theirs = json.loads((tmp_path / "q" / "meta.json").read_text())
    assert ours == theirs and sorted(ours["collections"]) == ["c0", "c2"]
    client.close()
    again = QdrantClient(path=str(tmp_path / "q"))
    assert sorted(c.name for c in again.get_collections().collections) == ["c0", "c2"]
    again.close()


async def test_an_open_site_is_kept_out_of_the_collectors_way_and_a_closed_one_freed_without_it(kb):
    """Open sites are frozen (pool.keep_out_of_collector): the collector's pauses do not grow
    with them. A closed one is taken apart (lightrag_functions.dismantle): reference counting
    frees it, nothing of it is left for the collector (a LightRAG instance closed as it is
    leaves some 700 objects in cycles)."""
    await kb.pool.close_all()
    frozen = gc.get_freeze_count()
    for site in ("site0", "site1"):
        await ask(kb, site)
    assert gc.get_freeze_count() > frozen
    gc.disable()
    try:
        gc.unfreeze()  # what closing leaves in cycles is looked for among every object
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # the cyclic garbage kept in gc.garbage, to be told apart
        await kb.pool.close_all()
        gc.collect()
        # Whatever else the process let go meanwhile (the event loop's, another test's) is
        # not the sites': theirs is LightRAG's and our stores' objects and their closures.
        left = [o for o in gc.garbage if type(o).__module__.startswith(("lightrag", "services.retriever", "networkx"))
                or getattr(o, "__qualname__", "").startswith(lightrag_functions.WRAPPER)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left, f"{len(left)} objects of two closed sites left in cycles: {left[:5]}"
