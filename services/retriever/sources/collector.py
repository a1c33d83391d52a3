"""sync_collector: a run's pages coming in, and its end.

On each `PageFetched` of a run that discovers, the links the run's progress queued for it
(shared/state.py `SyncProgress`: in log order, up to the page limit) go out as work items
(one id per run and page: a link found on many pages is fetched once). When the progress
says every queued page has its outcome (on whichever event completes it), the knowledge
base changes, once, under the site's lock:

- `changed` pages are ingested from their staged text (replacing what the page had), in
  batches (INGEST_BATCH);
- `unchanged` and `failed` pages keep what the knowledge base holds;
- the source's pages this run did not keep are removed: `gone` and `skipped` ones, and
  those no longer listed or linked (after a discovering run in which some page failed,
  only the `gone` and `skipped`: a page behind a failed one was not reached, not removed);
- a run in which every page failed changes nothing: `SyncFailed`.

A removed source (`SourceRemoved`) has its pages removed, then `SourceForgotten`.

→ `SyncCompleted` with the counts (stored before the staged texts are deleted: an end
redelivered after a crash finds them again and does the same).

Then, when the run changed the knowledge base, the vectors of its chunks' sentences and
titles, what extractive answers quote (shared/kb_vectors.py), are embedded and stored in the
`kb_vectors` bucket, those already there left alone: a site's first answers would otherwise
embed them on the turn's path, before their first token. Only the chunks' (`concierge
ingest` prepares the graph's entity and relationship descriptions too): those repeat the
chunks' sentences under names of their own, and preparing them would more than double what
a sync embeds; an answer embeds the few names it is given. A cache: if it fails, the answers
embed what they miss.
"""

from __future__ import annotations

import logging
import time

from services.retriever import documents, search
from services.retriever.sources.planner import fetch_item, known_pages, sync_failed
from shared import events as ev
from shared import kb_vectors, sources
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "sync_collector"
KEPT = ("changed", "unchanged", "failed")
MAX_FAILURES_LISTED = 20
# Pages ingested together: one extraction, embedding and store write for all of them
# (knowledge.py `ingest_many`), small enough that queries served meanwhile barely wait for
# the store's writes, which run on the event loop.
INGEST_BATCH = 16


def make_node(kb, staging: sources.Staging, published=None) -> Node:
    """`published(site)`: called after the knowledge base changed (KB_SNAPSHOTS=bus: a new
    snapshot for the other replicas); None when nothing else needs telling."""

    async def collect(event: ev.Envelope, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        if isinstance(event, ev.SourceRemoved):
            return [ctx.follow(ev.SourceForgotten, documents=await forget(event))]
        progress = inputs.state.sync
        out: list[ev.Envelope] = []
        if isinstance(event, ev.PageFetched) and progress.discover and progress.run == event.turn:
            out = [fetch_item(ctx, event, ev.PageTarget(url=url)) for url in event.links
                   if progress.pages.get(url) == ""]
        if progress.run != event.turn or not progress.complete:
            return out
        return await finish(event, progress, ctx, inputs.config, inputs.kb_vectors)

    async def finish(event: ev.Envelope, progress, ctx: Context, config, kv) -> list[ev.Envelope]:
        """The run is complete: no page pending, no link left to queue."""
        started = time.monotonic()
        site, source = event.site, sources.source_of(event.session_id)
        run_id = ev.derived_id(f"{site}/{event.session_id}/{progress.run}", "run", "end")
        outcomes = list(progress.pages.values())
        failures = [url for url, o in progress.pages.items() if o == "failed"]
        if outcomes and len(failures) == len(outcomes):
            return [ctx.follow(ev.SyncFailed, cause_id=run_id, node=NAME,
                               reason=f"every page failed ({len(outcomes)}); the knowledge base is unchanged")]
        known = await known_pages(kb, site, source)
        counts = {"added": 0, "replaced": 0, "unchanged": 0}
        chunks = 0
        staged_keys = []
        run = str(progress.run)  # each page's `run` and `since` in its meta: see `ingest`
        batch: list[documents.SourceDocument] = []
        for url, outcome in progress.pages.items():
            if outcome != "changed":
                continue
            key = sources.staged_key(site, source, progress.run, url)
            page = await staging.staged(key)
            if page is None:  # applied by an earlier attempt whose end was stored: nothing left to do
                continue
            staged_keys.append(key)
            cited = url if url.startswith(("http://", "https://")) else page.title
            since = known[url].get("since", "") if url in known else run
            try:
                batch.append(documents.from_markdown(
                    site, f"{source}:{url}", page.title, cited, page.text, page.content_hash,
                    {"source": source, "url": url, "etag": page.etag, "last_modified": page.last_modified,
                     "run": run, "since": since}))
            except documents.UnreadableDocument:
                continue
            if len(batch) >= INGEST_BATCH:
                chunks += await ingest(site, batch, counts, run)
                batch = []
        if batch:
            chunks += await ingest(site, batch, counts, run)
        keep = {url for url, o in progress.pages.items() if o in KEPT}
        if progress.discover and failures:
            keep |= {url for url in known if url not in progress.pages}
        removed = 0
        for url, info in known.items():
            if url not in keep and await kb.delete(site, info["doc_id"]):
                removed += 1
        changed = bool(counts["added"] or counts["replaced"] or removed)
        if published is not None and changed:
            await published(site)
        completed = ctx.follow(
            ev.SyncCompleted, cause_id=run_id, pages=len(outcomes), added=counts["added"], replaced=counts["replaced"],
            unchanged=sum(1 for o in outcomes if o == "unchanged") + counts["unchanged"], removed=removed,
            failed=len(failures), skipped=sum(1 for o in outcomes if o in ("skipped", "gone")), chunks=chunks,
            seconds=round(time.monotonic() - started, 3),
            failed_pages=failures[:MAX_FAILURES_LISTED])
        await ctx.emit(completed)
        for key in staged_keys:
            await staging.unstage(key)
        log.info("sync completed", extra={"site_id": site, "source": source, "run": progress.run,
                                          "pages": len(outcomes), "removed": removed})
        if changed and kv is not None:
            await prepare_vectors(site, config.name or site, kv)
        return []  # stored already, before the staged texts went

    async def prepare_vectors(site: str, name: str, kv) -> None:
        """The site's answerable texts' vectors in the `kb_vectors` bucket (those missing)."""
        started = time.monotonic()
        try:
            texts = await search.answerable_texts(kb, site, name, kinds=("chunk",))
            done = await kb_vectors.warm(kv, kb.embedder, site, texts, refresh=False)
        except Exception as exc:  # noqa: BLE001 - a cache: the answers embed what they miss
            log.warning("knowledge vectors not prepared", extra={"site_id": site, "error": repr(exc)})
            return
        log.info("knowledge vectors prepared", extra={"site_id": site, **done,
                                                       "seconds": round(time.monotonic() - started, 3)})

    async def ingest(site: str, batch: list, counts: dict[str, int], run: str) -> int:
        """One batch of pages into the knowledge base; the chunks it added. A page this run
        already wrote (an earlier attempt of its end, redelivered after a crash or a lost
        heartbeat, or one running beside it) is found unchanged but counts as what that
        attempt did: added when the run is the first to hold it (`since`), else replaced, so
        the run's counts do not depend on how many attempts it took."""
        outcomes = await kb.ingest_many(site, batch)
        chunks = 0
        for doc_id, result in outcomes.items():
            record = kb.registry(site)[doc_id]
            meta = record.get("meta") or {}
            if result == "unchanged" and meta.get("run") == run:
                result = "added" if meta.get("since") == run else "replaced"
            counts[result] += 1
            if result != "unchanged":
                chunks += record.get("chunk_count", len(record.get("chunks", {})))
        return chunks

    async def forget(event: ev.SourceRemoved) -> int:
        """A removed source's pages leave the knowledge base (and its upload the store); how
        many documents left."""
        source = sources.source_of(event.session_id)
        known = await known_pages(kb, event.site, source)
        removed = [info["doc_id"] for info in known.values() if await kb.delete(event.site, info["doc_id"])]
        if removed and published is not None:
            await published(event.site)
        for url in known:
            if url.startswith("upload://"):
                await staging.remove_upload(sources.upload_key(event.site, source, url.rsplit("/", 1)[-1]))
        log.info("source removed", extra={"site_id": event.site, "source": source, "documents": len(removed)})
        return len(removed)

    return Node(NAME, consumes=("sync_started", "page_fetched", "source_removed"), handle=collect,
                needs=Needs(state=True, config=True, kb_vectors=True),
                failure=sync_failed)
