"""Turning a fetched page or an uploaded file into text (pages.py) in worker processes, so a
hostile file costs its own site a failed page and nobody else anything; and, for the same
reason, what a site's robots.txt and sitemaps say (parsing them, checking URLs against up to
500 KiB of rules: seconds of CPU for a hostile site).

The converters (trafilatura, markitdown, pypdf) are CPU-bound and trust their input: run on
the retriever's event loop, one 388 KB DOCX that inflates to 114 MB of XML, or a small PDF
that reuses one compressed stream on every page, stops retrieval for every site and the work
queue's heartbeats with it. Here each conversion runs in a pool of worker processes (pebble,
spawned: nothing of the service's threads or models is inherited) that are:

- bounded in time (CONVERT_TIMEOUT_S: past it the worker is killed and the page fails with why),
- bounded in memory (CONVERT_MEMORY_MB: the worker's address space; past it MemoryError or
  death, the page fails),
- bounded in what they are given: an HTML body over CONVERT_MAX_HTML_BYTES, a DOCX/PPTX whose
  entries inflate past CONVERT_MAX_UNZIPPED_BYTES (or that holds too many entries) is refused
  before any converter sees it; a text longer than MAX_TEXT_CHARS is cut,
- niced, so the answers the same machine serves come first,
- recycled after MAX_TASKS conversions (a converter's leaks end with its process).

A failure is a `ConversionFailed` naming the file and the limit: the page fetcher records it
as the page's `failed` outcome, once; the work item is not redelivered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import io
import multiprocessing
import os
import posixpath
import resource
import zipfile

import pebble

from services.retriever.sources import pages as pg
from shared import events as ev
from services.retriever.settings import ConvertLimits

MAX_TASKS = 100  # conversions per worker process before it is replaced
MAX_ZIP_ENTRIES = 10_000
MAX_TEXT_CHARS = 2_000_000  # a page's text kept at most (a knowledge base is not a book store)


class ConversionFailed(Exception):
    """The page or file was not converted; the message says which limit or error."""


def _worker_started(memory_bytes: int) -> None:
    """A converter process's start: below the service in CPU priority, first in line for the
    kernel's OOM killer (a bomb that passes every other check kills this process, not the
    retriever), its address space bounded."""
    os.nice(10)
    with contextlib.suppress(OSError):
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _unzipped_size(name: str, data: bytes, limit: int) -> None:
    """Refuse an Office file whose entries would inflate past `limit` bytes (sizes as its
    central directory declares them; zipfile also stops an entry at its declared size)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise pg.UnreadableFile(f"{name}: not a valid Office file ({type(exc).__name__})") from None
    if len(entries) > MAX_ZIP_ENTRIES:
        raise pg.UnreadableFile(f"{name}: holds {len(entries)} entries (at most {MAX_ZIP_ENTRIES})")
    total = sum(entry.file_size for entry in entries)
    if total > limit:
        raise pg.UnreadableFile(f"{name}: inflates to {total} bytes (at most {limit}: CONVERT_MAX_UNZIPPED_BYTES)")


def _cut(text: str) -> str:
    return text[:MAX_TEXT_CHARS]


def _html_within(what: str, size: int, unit: str, limits: ConvertLimits) -> None:
    """Refuse HTML past CONVERT_MAX_HTML_BYTES before trafilatura reads it (`size` in `unit`:
    an upload's bytes, a fetched page's decoded characters)."""
    if size > limits.max_html_bytes:
        raise pg.UnreadableFile(f"{what}: {size} {unit} of HTML (at most {limits.max_html_bytes}: "
                                "CONVERT_MAX_HTML_BYTES)")


def file_text(name: str, data: bytes, limits: ConvertLimits) -> tuple[str, str]:
    """In a worker: pages.file_text within the limits on what it is given."""
    suffix = posixpath.splitext(name.lower())[1]
    if suffix in (".docx", ".pptx"):
        _unzipped_size(name, data, limits.max_unzipped_bytes)
    elif suffix in (".html", ".htm"):
        _html_within(name, len(data), "bytes", limits)
    title, text = pg.file_text(name, data)
    return title, _cut(text)


@functools.lru_cache(maxsize=8)
def _rules(robots: str):
    """A run's robots.txt, parsed once in this worker for all its pages (up to 500 KiB of rules
    take a quarter of a second to parse, and each URL's check milliseconds)."""
    return pg.robots(robots)


def robots_rule(robots: str, agent: str, url: str, limits: ConvertLimits) -> tuple[bool, float | None]:
    """In a worker: whether robots.txt lets `agent` fetch `url`, and its Crawl-delay."""
    rules = _rules(robots)
    delay = rules.crawl_delay(agent)
    return rules.can_fetch(url, agent), None if delay is None else float(delay)


def allowed(spec: ev.SourceSpec, robots: str, agent: str, urls: list[str], limit: int,
            limits: ConvertLimits) -> list[str]:
    """In a worker: the first `limit` of `urls` in the source's scope that robots.txt allows."""
    rules, found = _rules(robots), []
    for url in urls:
        if len(found) >= limit:
            break
        if pg.in_scope(spec, url) and rules.can_fetch(url, agent):
            found.append(url)
    return found


def html_page(html: str, url: str, spec: ev.SourceSpec, robots: str, agent: str,
              limits: ConvertLimits) -> tuple[str, str, list[str]]:
    """In a worker: pages.html_page of a fetched page within the limits, its links those of
    the source's scope robots.txt allows."""
    _html_within(url, len(html), "characters", limits)
    title, text, links = pg.html_page(html, url)
    return title, _cut(text), allowed(spec, robots, agent, links, pg.MAX_SITEMAP_URLS, limits)


def sitemap(body: bytes, budget: int, limits: ConvertLimits) -> tuple[list[str], list[str]]:
    """In a worker: a sitemap's (page URLs, nested sitemaps), normalized, at most `budget` pages."""
    listed, nested = pg.sitemap_entries(body)
    return [pg.normalized(u) for u in listed[:budget]], nested[:pg.MAX_SITEMAPS]


class Converter:
    """The pool of converter processes of one retriever (started at the first conversion)."""

    def __init__(self, limits: ConvertLimits | None = None):
        self.limits = limits or ConvertLimits()
        self._pool: pebble.ProcessPool | None = None

    def _open(self) -> pebble.ProcessPool:
        if self._pool is None or not self._pool.active:
            self.close()  # a pool that stopped (a worker that could not start): its processes ended
            self._pool = pebble.ProcessPool(max_workers=self.limits.workers, max_tasks=MAX_TASKS,
                                            initializer=_worker_started,
                                            initargs=(self.limits.memory_mb * 1024 * 1024,),
                                            context=multiprocessing.get_context("spawn"))
        return self._pool

    async def _run(self, what: str, function, *args):
        future = self._open().schedule(function, args=(*args, self.limits), timeout=self.limits.timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except concurrent.futures.TimeoutError:
            raise ConversionFailed(f"{what}: not converted within {self.limits.timeout_s:g} s "
                                   "(CONVERT_TIMEOUT_S)") from None
        except MemoryError:
            raise ConversionFailed(f"{what}: needs more than {self.limits.memory_mb} MiB to convert "
                                   "(CONVERT_MEMORY_MB)") from None
        except pebble.ProcessExpired as exc:
            raise ConversionFailed(f"{what}: the converter process died (exit {exc.exitcode}): "
                                   "too big or malformed") from None
        except pg.UnreadableFile as exc:
            raise ConversionFailed(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a converter's own failure names the file; the run goes on
            raise ConversionFailed(f"{what}: {type(exc).__name__}: {str(exc)[:300]}") from None

    async def file_text(self, name: str, data: bytes) -> tuple[str, str]:
        """(title, text as Markdown) of an uploaded file."""
        return await self._run(name, file_text, name, data)

    async def html_page(self, html: str, url: str, spec: ev.SourceSpec, robots: str,
                        agent: str) -> tuple[str, str, list[str]]:
        """(title, main content as Markdown, the links in scope robots.txt allows) of a page."""
        return await self._run(url, html_page, html, url, spec, robots, agent)

    async def robots_rule(self, robots: str, agent: str, url: str) -> tuple[bool, float | None]:
        """(whether robots.txt allows `url`, its Crawl-delay)."""
        return await self._run(f"{url}: robots.txt", robots_rule, robots, agent, url)

    async def allowed(self, spec: ev.SourceSpec, robots: str, agent: str, urls: list[str],
                      limit: int) -> list[str]:
        """The first `limit` of `urls` in the source's scope that robots.txt allows."""
        return await self._run(f"{spec.url}: the pages to fetch", allowed, spec, robots, agent, urls, limit)

    async def sitemap(self, url: str, body: bytes, budget: int) -> tuple[list[str], list[str]]:
        """A sitemap's (page URLs, at most `budget`, nested sitemaps); ConversionFailed: not one."""
        return await self._run(f"{url}: not a sitemap", sitemap, body, budget)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=5)
            self._pool = None

