"""page_fetcher: one page of a run, from the BRIEFS work queue (each page to one replica;
a replica that dies mid-page leaves it to another after the ack wait).

A web page: robots.txt as the run read it (its Crawl-delay waited before the request, at
most MAX_CRAWL_DELAY_S: a site sees at most CRAWL_CONCURRENCY requests per delay), then a
conditional GET (the ETag and
Last-Modified the knowledge base holds); 304 → `unchanged`; 404/410 → `gone`; another
error status, a timeout or a refused address → `failed` (what the knowledge base holds of
it stays); not HTML → `skipped`. Its main content is extracted (pages.py, in the converter's
worker processes: converter.py; a page or file past its limits → `failed`, saying which); the same text as
before (its hash) → `unchanged`; otherwise the text is staged (shared/sources.py `Staging`)
and the page is `changed`. The links found in scope and allowed go with it (the collector
follows them when the run discovers). A file or text snippet is read from its upload or its
definition the same way. → `PageFetched`.

A page whose handling fails every attempt is `failed` too (its failure event): the run
still ends.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from services.retriever.sources import pages as pg
from services.retriever.sources.converter import ConversionFailed, Converter
from shared.web import FetchError, RefusedAddress, WebClient
from shared import events as ev
from shared import sources, subjects
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "page_fetcher"
MAX_CRAWL_DELAY_S = 10.0  # a robots.txt Crawl-delay is waited before each page, up to this


def make_node(web: WebClient, staging: sources.Staging, max_in_flight: int | None = None,
              converter: Converter | None = None) -> Node:
    convert = converter or Converter()

    async def fetch(item: ev.PageFetchRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        started = inputs.latest["sync_started"]
        if started is None or started.turn != item.turn:
            return []  # a run that was superseded: the newer run fetches its own pages
        spec, target = started.source, item.page

        def fetched(outcome: str, **fields) -> ev.PageFetched:
            return ctx.follow(ev.PageFetched, url=target.url, outcome=outcome, **fields)

        if spec.kind == "website":
            agent = started.user_agent or web.user_agent
            try:
                allowed, delay = await convert.robots_rule(started.robots, agent, target.url)
            except ConversionFailed as exc:
                return [fetched("failed", reason=str(exc)[:500])]
            if not allowed:
                return [fetched("skipped", reason="disallowed by robots.txt")]
            if delay:
                await asyncio.sleep(min(delay, MAX_CRAWL_DELAY_S))
            headers = {}
            if target.etag:
                headers["If-None-Match"] = target.etag
            if target.last_modified:
                headers["If-Modified-Since"] = target.last_modified
            try:
                response = await web.get(target.url, headers)
            except (FetchError, RefusedAddress) as exc:
                return [fetched("failed", reason=str(exc)[:500])]
            validators = {"etag": response.headers.get("etag", ""),
                          "last_modified": response.headers.get("last-modified", ""), "status": response.status}
            if response.status == 304:
                return [fetched("unchanged", content_hash=target.content_hash, etag=target.etag,
                                last_modified=target.last_modified, status=304)]
            if response.status in (404, 410):
                return [fetched("gone", status=response.status, reason=f"HTTP {response.status}")]
            if response.status != 200:
                return [fetched("failed", status=response.status, reason=f"HTTP {response.status}")]
            final = pg.normalized(response.url)
            if final != target.url and not pg.in_scope(spec, final):
                return [fetched("skipped", status=200, reason=f"redirected out of scope to {final}")]
            if response.content_type not in pg.HTML_TYPES:
                return [fetched("skipped", status=200, reason=f"not a page ({response.content_type or 'no type'})")]
            try:
                title, text, links = await convert.html_page(response.text(), final, spec, started.robots, agent)
            except ConversionFailed as exc:
                return [fetched("failed", status=200, reason=str(exc)[:500])]
            links = [u for u in links if u != target.url]
        else:
            validators, links = {}, []
            if spec.kind == "text":
                title, text = spec.title, spec.text
            else:
                data = await staging.uploaded(spec.upload)
                if data is None:
                    return [fetched("failed", reason="the uploaded file is no longer stored")]
                try:
                    title, text = await convert.file_text(spec.name, data)
                except ConversionFailed as exc:
                    return [fetched("failed", reason=str(exc)[:500])]
        if not text.strip():
            return [fetched("skipped", reason="no text in it", links=links, **validators)]
        digest = pg.text_hash(text)
        if digest == target.content_hash:
            return [fetched("unchanged", content_hash=digest, title=title, chars=len(text), links=links, **validators)]
        key = sources.staged_key(item.site, spec.id, item.turn, target.url)
        await staging.stage(key, msgspec.json.encode(sources.StagedPage(
            url=target.url, title=title[:300], text=text, content_hash=digest, etag=validators.get("etag", ""),
            last_modified=validators.get("last_modified", ""))))
        return [fetched("changed", content_hash=digest, title=title[:300], chars=len(text), staged=key, links=links,
                        **validators)]

    return Node(NAME, consumes=("page_fetch_requested",), handle=fetch, needs=Needs(latest=("sync_started",)),
                stream=subjects.BRIEFS_STREAM, max_in_flight=max_in_flight, failure=page_failed)


def page_failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.Envelope:
    """A page whose every attempt failed is a failed page of its run (the run still ends)."""
    url = event.page.url if isinstance(event, ev.PageFetchRequested) else ""
    return ev.follow(event, ev.PageFetched, node, url=url, outcome="failed", reason=reason[:500])
