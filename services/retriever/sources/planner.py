"""sync_planner: on `SyncRequested`, the run's plan.

A website: its robots.txt (none, or unreadable: everything allowed), then the pages of its
sitemap (the source's URL is a sitemap: the pages it and its nested sitemaps list) or its
start page, with links followed (`discover`). A start page that is the site's home page (what
a new site owner gives) also brings the site's own sitemap's pages: the first on its origin
that robots.txt names (`Sitemap:`), else `/sitemap.xml`; none, or one that cannot be read,
and the links alone find the pages. Only pages in the source's scope and allowed
by robots.txt, at most the source's page limit. A file or a text snippet: one page. Each
page carries what the knowledge base holds of it (ETag, Last-Modified, text hash) so an
unchanged page costs a conditional request. → `SyncStarted` and one `PageFetchRequested`
work item per page.

A run whose source is gone, or whose start cannot be read (the sitemap, the start page's
site unreachable or refused), ends here: `SyncFailed`, the knowledge base untouched.
"""

from __future__ import annotations

import logging

from protego import Protego

from services.retriever.sources import pages as pg
from services.retriever.sources.converter import ConversionFailed, Converter
from shared.web import FetchError, RefusedAddress, WebClient, origin
from shared import events as ev
from shared import sources
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "sync_planner"
TARGET_FIELDS = ("etag", "last_modified", "content_hash")  # what a conditional fetch of a known page carries


async def known_pages(kb, site: str, source: str) -> dict[str, dict]:
    """What the knowledge base holds of the source's pages: url → {etag, last_modified,
    content_hash, doc_id, since} (the site's published snapshot fetched first, when it was
    not); `since`: the run that first stored the page ("" if stored before runs said so)."""
    await kb.ready(site)
    found = {}
    for doc_id, record in kb.registry(site).items():
        meta = record.get("meta") or {}
        if meta.get("source") == source:
            found[meta.get("url", record.get("source", ""))] = {
                "doc_id": doc_id, "etag": meta.get("etag", ""), "last_modified": meta.get("last_modified", ""),
                "content_hash": record.get("content_hash", ""), "since": meta.get("since", "")}
    return found


async def sitemap_pages(web: WebClient, url: str, convert: Converter) -> list[str]:
    """The pages a sitemap (and the sitemaps it names, at most pg.MAX_SITEMAPS) lists, at most
    pg.MAX_SITEMAP_URLS, each sitemap parsed in the converter's processes."""
    found: list[str] = []
    queue, seen = [url], set()
    while queue and len(seen) < pg.MAX_SITEMAPS and len(found) < pg.MAX_SITEMAP_URLS:
        current = queue.pop(0)
        if current in seen:
            continue
        seen.add(current)
        response = await web.get(current, max_bytes=pg.MAX_SITEMAP_BYTES)
        if response.status != 200:
            raise FetchError(f"{current}: HTTP {response.status}")
        if response.truncated:
            raise FetchError(f"{current}: larger than {pg.MAX_SITEMAP_BYTES} bytes")
        try:
            listed, nested = await convert.sitemap(current, response.body, pg.MAX_SITEMAP_URLS - len(found))
        except ConversionFailed as exc:  # not XML, past its size, ...: said in the run's failure
            raise FetchError(str(exc)) from None
        found.extend(listed)
        queue.extend(nested)
    return list(dict.fromkeys(found))


async def site_sitemap(web: WebClient, home: str, robots_text: str, convert: Converter) -> tuple[str, list[str]]:
    """The home page's site's sitemap and its pages: the first robots.txt names on the home
    page's origin (one elsewhere is another site's), else `/sitemap.xml`; ("", []) when
    none lists a page (missing, unreadable, not a sitemap: the links are followed anyway)."""
    home_origin = origin(home)
    named = [url for url in Protego.parse(robots_text).sitemaps if origin(url) == home_origin] if robots_text else []
    for url in named or [f"{home_origin}/sitemap.xml"]:
        try:
            if listed := await sitemap_pages(web, url, convert):
                return url, listed
        except (FetchError, ConversionFailed) as exc:
            log.info("no sitemap read", extra={"url": url, "error": str(exc)[:200]})
    return "", []


def make_node(web: WebClient, kb, converter: Converter | None = None) -> Node:
    convert = converter or Converter()

    async def plan(event: ev.SyncRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        added, removed = inputs.latest["source_added"], inputs.latest["source_removed"]
        if added is None or (removed is not None and removed.ts >= added.ts):
            return [ctx.follow(ev.SyncFailed, reason="the source was removed" if added else "no such source",
                               node=NAME)]
        spec = added.source
        known = await known_pages(kb, event.site, spec.id)
        robots_text, discover, sitemap = "", False, ""
        if spec.kind == "website":
            try:
                robots_text = await _robots(web, spec.url)
                if pg.is_sitemap(spec.url):
                    urls = await sitemap_pages(web, spec.url, convert)
                else:
                    urls, discover = [pg.normalized(spec.url)], True
                    if pg.is_home(spec.url):
                        sitemap, listed = await site_sitemap(web, spec.url, robots_text, convert)
                        urls = list(dict.fromkeys(urls + listed))
                urls = await convert.allowed(spec, robots_text, web.user_agent, urls, spec.max_pages)
            except (FetchError, RefusedAddress, ConversionFailed) as exc:
                return [ctx.follow(ev.SyncFailed, reason=str(exc), node=NAME)]
        else:
            urls = [sources.page_url(spec)]
        targets = [ev.PageTarget(url=u, **{k: v for k, v in known.get(u, {}).items() if k in TARGET_FIELDS})
                   for u in urls]
        started = ctx.follow(ev.SyncStarted, source=spec, pages=targets, discover=discover, robots=robots_text[:20000],
                             user_agent=web.user_agent, sitemap=sitemap)
        work = [fetch_item(ctx, event, target) for target in targets]
        log.info("sync planned", extra={"site_id": event.site, "source": spec.id, "run": event.turn,
                                        "pages": len(targets), "discover": discover})
        return [started, *work]

    return Node(NAME, consumes=("sync_requested",), handle=plan,
                needs=Needs(latest=("source_added", "source_removed")),
                failure=sync_failed)


def fetch_item(ctx: Context, event: ev.Envelope, target: ev.PageTarget) -> ev.PageFetchRequested:
    """The work item fetching `target` in `event`'s run: one id per run and page whichever
    node queues it (the planner, or the collector for a link), so JetStream keeps one."""
    item = ctx.follow(ev.PageFetchRequested, key=f"page-{target.url}", page=target)
    item.event_id = ev.derived_id(f"{event.site}/{event.session_id}/{event.turn}", "page", target.url)
    return item


async def _robots(web: WebClient, url: str) -> str:
    """robots.txt's text; "" when the site has none (4xx). A site that cannot be reached at
    all fails the run (FetchError): nothing would be fetched."""
    response = await web.get(pg.robots_url(url), max_bytes=pg.MAX_ROBOTS_BYTES)
    if response.status >= 500:
        raise FetchError(f"{pg.robots_url(url)}: HTTP {response.status}")
    return response.text() if response.status == 200 else ""


def sync_failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.Envelope:
    """A sync node's last attempt failing ends the run: `SyncFailed`."""
    return ev.follow(event, ev.SyncFailed, node, key="failed", reason=reason[:2000], node=node, attempts=attempts,
                     failed_event_id=event.event_id)
