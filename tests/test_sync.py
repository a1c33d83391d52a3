"""Knowledge sources synced end to end on a real nats-server (a server of its own: the work
queue allows one consumer per subject filter) and a real knowledge base, against a website
served on 127.0.0.1 (tests/website.py): the first sync keeps exactly the allowed pages, the
second re-extracts only the changed page and removes the one gone, a fetcher that dies
mid-run loses and duplicates nothing, and what is stored is cited by the pages' URLs."""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import msgspec
import pytest

from services.retriever import search
from services.retriever.knowledge import KnowledgeBase
from services.retriever.sources import collector, fetcher, planner
from services.retriever.sources.converter import Converter
from shared.web import Outbound, WebClient
from shared import events as ev
from shared import kb_vectors, sources, subjects
from shared.embeddings import shared_embedder
from tests.helpers import fast, start, wait_for
from tests.website import Website, doc_fact, doc_path

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
async def kb(tmp_path_factory):
    base = KnowledgeBase(tmp_path_factory.mktemp("kb"), shared_embedder()).open()
    yield base
    await base.close()


@pytest.fixture
def website():
    with Website() as site:
        yield site


CLIENTS: list[WebClient] = []


def web_client() -> WebClient:
    client = WebClient("ConciergeTest/1.0", Outbound(allow_private=True), timeout_s=5.0)
    CLIENTS.append(client)
    return client


CONVERTER = Converter()  # one pool of converter processes for the module's nodes, as a retriever has


async def run_nodes(bus, kb, fetchers: int = 1, fetch_config=None):
    staging, web = sources.Staging(bus), web_client()
    runners = [await start(bus, planner.make_node(web, kb, CONVERTER)), await start(bus, collector.make_node(kb, staging))]
    for _ in range(fetchers):
        runners.append(await start(bus, fetcher.make_node(web, staging, converter=CONVERTER),
                                   fetch_config or fast(concurrency=8)))
    return runners


async def stop(runners):
    for runner in runners:
        await runner.stop()
    while CLIENTS:
        await CLIENTS.pop().close()


@pytest.fixture
async def syncing(work_bus, kb):
    """The sync's three nodes running on the work queue's server (what tests add sources to)."""
    runners = await run_nodes(work_bus, kb)
    yield work_bus
    await stop(runners)


async def added(bus, site, **given) -> ev.SourceSpec:
    """A source defined as an operator does, its first run requested."""
    spec = sources.spec_of(sources.SourceInput(**given))
    await sources.define(bus, site, spec, "test")
    await sources.request_sync(bus, site, spec.id, "added")
    return spec


async def ended(bus, site, source, run) -> ev.Envelope | None:
    session = sources.session_of(source)
    for kind in ("sync_completed", "sync_failed"):
        last = await bus.last(subjects.conv(site, session, kind))
        if last is not None and last.turn == run:
            return last
    return None


async def synced(bus, site, source, run, timeout=90.0) -> ev.Envelope:
    await wait_for(lambda: ended(bus, site, source, run), timeout=timeout, what=f"run {run} ended")
    return await ended(bus, site, source, run)


async def pages_of(bus, site, source, run) -> list[ev.PageFetched]:
    records = await bus.read(subjects.conv(site, sources.session_of(source), "page_fetched"))
    return [r.event for r in records if r.event.turn == run]


async def kept_urls(kb, site, source) -> set[str]:
    return set(await planner.known_pages(kb, site, source))


async def test_a_website_is_synced_and_kept_current(syncing, kb, website, site):
    bus = syncing
    spec = sources.spec_of(sources.SourceInput(url=f"{website.url}/sitemap.xml"))
    await sources.define(bus, site, spec, "test")
    first, new = await sources.request_sync(bus, site, spec.id, "added")
    assert new and first.turn == 1
    done = await synced(bus, site, spec.id, 1)
    assert isinstance(done, ev.SyncCompleted), done
    outcomes = {p.url: p.outcome for p in await pages_of(bus, site, spec.id, 1)}
    base = website.url
    assert f"{base}/private/secret" not in outcomes  # robots.txt: never planned
    assert outcomes[f"{base}/missing"] == "gone" and outcomes[f"{base}/download"] == "skipped"
    assert f"{base}/brochure.png" not in outcomes  # an image's address: never planned
    assert await kept_urls(kb, site, spec.id) == website.allowed()
    assert len(website.allowed()) >= 50 and done.added == len(website.allowed()) and done.chunks > 0
    assert website.hits["/private/secret"] == 0

    # The site changes: a page's text, a page gone. Only the changed one is extracted again.
    website.changing = "The Orbit plan includes 12 dispatchers."
    website.vanishing = False
    before = collections.Counter(website.hits)
    second, new = await sources.request_sync(bus, site, spec.id, "operator")
    assert new and second.turn == 2
    done = await synced(bus, site, spec.id, 2)
    assert isinstance(done, ev.SyncCompleted), done
    outcomes = {p.url: p.outcome for p in await pages_of(bus, site, spec.id, 2)}
    assert [u for u, o in outcomes.items() if o == "changed"] == [f"{base}/changing"]
    assert done.replaced == 1 and done.added == 0 and done.removed == 1
    assert f"{base}/vanishing" not in await kept_urls(kb, site, spec.id)
    refetched = {p for p in website.hits if website.hits[p] > before[p]}
    assert refetched == {"/changing", "/"}, refetched  # the rest answered 304
    registry = kb.registry(site)
    changing = next(r for r in registry.values() if r.get("meta", {}).get("url") == f"{base}/changing")
    assert "12 dispatchers" in " ".join(changing["chunks"].values())

    # The chunks' sentences extractive answers quote have their vectors in the bucket, the changed
    # page's new one too: a first answer embeds only its question.
    kv, version = bus.kv[subjects.KB_VECTORS_BUCKET], kb.embedder.version
    texts = await search.answerable_texts(kb, site, site, kinds=("chunk",))  # no site config: the site id masked
    assert any("12 dispatchers" in t for t in texts)
    missing = [t for t in texts if await kb_vectors._get(kv, kb_vectors.key(site, version, t), kb.embedder.dim) is None]
    assert len(texts) > 100 and missing == []

    # What the knowledge base finds is cited by the page's URL.
    found = await kb.query(site, "How much does the Model 17 sensor cost?", mode="mix", high_level=[],
                           low_level=["Model 17 sensor"], graph_top_k=5, chunk_top_k=5)
    cited = [kb.document(site, c["file_path"])["source"] for c in found["chunk"]]
    assert cited and cited[0] == f"{base}{doc_path(17)}", cited
    assert doc_fact(17) in found["chunk"][0]["content"]


async def test_a_fetcher_killed_mid_run_loses_and_duplicates_nothing(work_bus, kb, website, site):
    bus = work_bus
    first = await run_nodes(bus, kb, fetchers=0)
    staging = sources.Staging(bus)
    started = asyncio.Event()

    class Stuck(WebClient):
        async def get(self, url, headers=None, max_bytes=None):
            if url.endswith("/slow"):
                started.set()
                await asyncio.sleep(3600)  # dies here, holding the page
            return await super().get(url, headers, max_bytes)

    stuck = Stuck("ConciergeTest/1.0", Outbound(allow_private=True), timeout_s=5.0)
    CLIENTS.append(stuck)
    node = fetcher.make_node(stuck, staging)
    doomed = await start(bus, node, fast(concurrency=4, ack_wait_s=2.0))
    try:
        spec = await added(bus, site, url=f"{website.url}/sitemap.xml", include=["/", "/slow", "/docs/page-0*"])
        await asyncio.wait_for(started.wait(), 30)
        # Killed: no ack, no nak for what it holds; its pages come back after the ack wait.
        doomed._stopping = True
        doomed._loop_task.cancel()
        for task in list(doomed._tasks):
            task.cancel()
        await bus.nc.flush()
        survivor = await start(bus, dataclasses.replace(node, handle=fetcher.make_node(web_client(), staging).handle),
                               fast(concurrency=8))
        first.append(survivor)
        done = await synced(bus, site, spec.id, 1)
        assert isinstance(done, ev.SyncCompleted), done
        pages = await pages_of(bus, site, spec.id, 1)
        urls = [p.url for p in pages]
        assert len(urls) == len(set(urls)), "a page stored twice"
        assert f"{website.url}/slow" in urls
        planned = (await bus.last(subjects.conv(site, sources.session_of(spec.id), "sync_started"))).pages
        assert set(urls) == {p.url for p in planned}
        assert (await bus.js.stream_info(subjects.BRIEFS_STREAM)).state.messages == 0
    finally:
        await stop(first)


async def test_a_run_whose_end_is_retried_counts_what_the_run_did(work_bus, kb, website, site):
    """The run's end fails after its first batch of pages is stored (the store gone for a
    moment; a redelivery after a lost heartbeat is the same): the retry finds those pages
    stored already, and the run still says it added every page. A later run whose end is
    retried after its one changed page was stored says that page was replaced."""
    bus = work_bus
    calls, fail_at = [], {2}

    class FailingOnce:  # the knowledge base, the listed writes failing once each
        def __getattr__(self, name):
            return getattr(kb, name)

        async def ingest_many(self, site_id, docs):
            calls.append(len(docs))
            result = await kb.ingest_many(site_id, docs)
            if len(calls) in fail_at:
                raise ConnectionError("the store went away after the write")
            return result

    runners = await run_nodes(bus, FailingOnce())
    try:
        spec = await added(bus, site, url=f"{website.url}/sitemap.xml")
        done = await synced(bus, site, spec.id, 1)
        assert isinstance(done, ev.SyncCompleted), done
        assert len(calls) > 2 and calls[0] == collector.INGEST_BATCH  # the second write failed, then all again
        assert (done.added, done.replaced, done.unchanged) == (len(website.allowed()), 0, 0), done

        website.changing = "The Orbit plan includes 12 dispatchers."
        fail_at.add(len(calls) + 1)  # the next run's first write
        again, _ = await sources.request_sync(bus, site, spec.id, "manual")
        done = await synced(bus, site, spec.id, again.turn)
        assert isinstance(done, ev.SyncCompleted), done
        assert calls[-2:] == [1, 1]  # the changed page written, the end retried
        assert (done.added, done.replaced) == (0, 1) and done.unchanged == len(website.allowed()) - 1, done
    finally:
        await stop(runners)


async def test_a_start_page_is_crawled_by_its_links_up_to_the_limit(syncing, website, site):
    bus = syncing
    website.sitemap_listed = False  # no sitemap to find: the links alone
    spec = await added(bus, site, url=f"{website.url}/", max_pages=10, exclude=["/slow"])
    done = await synced(bus, site, spec.id, 1)
    assert isinstance(done, ev.SyncCompleted), done
    urls = [p.url for p in await pages_of(bus, site, spec.id, 1)]
    assert len(urls) == 10 and len(set(urls)) == 10
    assert f"{website.url}/private/secret" not in urls and f"{website.url}/slow" not in urls
    assert f"{website.url}{doc_path(1)}" in urls
    started = await bus.last(subjects.conv(site, sources.session_of(spec.id), "sync_started"))
    assert started.sitemap == "" and [p.url for p in started.pages] == [f"{website.url}/"]


async def test_a_home_page_brings_its_sites_sitemap_named_by_robots_txt(syncing, website, site):
    """What a new site owner gives is their home page: the run starts from the sitemap
    robots.txt names as well, so every listed page is known at once (not 53 links deep), and
    the operator sees which sitemap it was."""
    bus = syncing
    spec = await added(bus, site, url=f"{website.url}/")
    started = await wait_for(lambda: bus.last(subjects.conv(site, sources.session_of(spec.id), "sync_started")))
    assert started.sitemap == f"{website.url}/sitemap.xml" and started.discover
    planned = {p.url for p in started.pages}
    assert f"{website.url}{doc_path(52)}" in planned and f"{website.url}/missing" in planned
    assert f"{website.url}/private/secret" not in planned  # robots.txt still rules
    done = await synced(bus, site, spec.id, 1)
    assert isinstance(done, ev.SyncCompleted) and done.added == len(website.allowed()), done
    view = await sources.status(bus, site, spec)
    assert view["sitemap"] == f"{website.url}/sitemap.xml" and view["state"] == "completed"


async def test_a_site_that_cannot_be_reached_ends_its_run_in_sync_failed(syncing, site):
    bus = syncing
    spec = await added(bus, site, url="http://127.0.0.1:9/sitemap.xml")
    done = await synced(bus, site, spec.id, 1)
    assert isinstance(done, ev.SyncFailed) and "127.0.0.1:9" in done.reason


async def test_text_and_file_sources_are_synced(syncing, kb, site, tmp_path):
    bus = syncing
    text = sources.spec_of(sources.SourceInput(title="Returns policy",
                                               text="# Returns\n\nHardware can be returned within 45 days."))
    await sources.define(bus, site, text, "test")
    await sources.request_sync(bus, site, text.id, "added")
    files = {"warranty.md": b"# Warranty\n\nEvery Gridline sensor has a 3 year warranty.\n",
             # Front matter, as `concierge ingest` reads it (the demo's files have it): the
             # title it gives and the URL answers cite.
             "sla.md": b"---\ntitle: Service levels\nurl: https://gridline.example/sla\n---\n# SLA\n\n"
                       b"Support answers within 4 hours.\n"}
    uploaded = []
    for name, data in files.items():
        spec = sources.file_spec(name, len(data))
        spec = msgspec.structs.replace(spec, upload=sources.upload_key(site, spec.id, spec.name))
        await sources.Staging(bus).upload(spec.upload, data)
        await sources.define(bus, site, spec, "test")
        await sources.request_sync(bus, site, spec.id, "added")
        uploaded.append(spec.id)
    for source in (text.id, *uploaded):
        done = await synced(bus, site, source, 1)
        assert isinstance(done, ev.SyncCompleted) and done.added == 1, done
    cited = {r["title"]: r["source"] for r in kb.registry(site).values()}
    assert cited == {"Returns policy": "Returns policy", "Warranty": "Warranty",
                     "Service levels": "https://gridline.example/sla"}, cited
    # Removing a source takes its pages out of the knowledge base.
    await sources.remove(bus, site, text.id, "test")
    await wait_for(lambda: _gone(kb, site, text.id), timeout=20, what="the removed source's pages gone")


async def _gone(kb, site, source):
    return not await planner.known_pages(kb, site, source)


async def test_a_scheduled_source_is_synced_again_when_due(bus, site):
    """The schedule (scheduler.py): a source whose last run was requested `every` ago, and
    has ended, is asked for its next run, once however many replicas look."""
    from services.retriever.sources.scheduler import Scheduler

    spec = sources.spec_of(sources.SourceInput(url="https://docs.example/", every="1h"))
    manual = sources.spec_of(sources.SourceInput(url="https://other.example/"))
    for s in (spec, manual):
        await sources.define(bus, site, s, "test")
        session = sources.session_of(s.id)
        base = {"site": site, "session_id": session, "turn": 1}
        await bus.publish(ev.SyncRequested(event_id=ev.new_id(), ts=ev.now() - 7200, **base))
        await bus.publish(ev.SyncCompleted(event_id=ev.new_id(), ts=ev.now() - 7100, **base))
    replicas = [Scheduler(bus), Scheduler(bus)]
    assert sum([await r.tick() for r in replicas]) == 1
    requested = await bus.last(subjects.conv(site, sources.session_of(spec.id), "sync_requested"))
    assert requested.turn == 2 and requested.reason == "schedule"
    assert (await bus.last(subjects.conv(site, sources.session_of(manual.id), "sync_requested"))).turn == 1
    assert await replicas[0].tick() == 0  # run 2 is under way
