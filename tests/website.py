"""A small company website served on 127.0.0.1 for the knowledge-source tests: a sitemap,
robots.txt keeping crawlers out of /private/, 52 documentation pages linked in a chain
from the home page, a page whose text changes between syncs (`changing`), one that
disappears (`vanishing`), a slow one, one listed but missing (404), an image and a download that are not pages.
Pages carry an ETag and answer a matching If-None-Match with 304. `hits` counts the full
(200) answers per path."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import Counter

from aiohttp import web

DOC_PAGES = 52
SLOW_S = 1.0


def doc_path(n: int) -> str:
    return f"/docs/page-{n:02d}"


def doc_fact(n: int) -> str:
    return f"The Model {n} sensor measures {n * 7} readings per minute and costs {n * 10} euros."


class Website:
    def __init__(self):
        self.changing = "The Orbit plan includes 5 dispatchers."
        self.vanishing = True
        self.hits: Counter[str] = Counter()
        self.sitemap_listed = True  # robots.txt names /sitemap.xml, which is served; False: neither
        self.embed = ""  # /embed.html: a page of the site embedding the widget's snippet (not in the sitemap)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pages(self) -> dict[str, str]:
        """Every HTML page by path, as the site serves it now."""
        found = {"/": self._page("Home", "Welcome to Gridline, sensors for field teams.",
                                 [doc_path(1), "/changing", "/slow", "/private/secret"] +
                                 (["/vanishing"] if self.vanishing else []))}
        for n in range(1, DOC_PAGES + 1):
            links = [doc_path(n + 1)] if n < DOC_PAGES else ["/"]
            found[doc_path(n)] = self._page(f"Model {n}", doc_fact(n), links + ["/brochure.png"])
        found["/changing"] = self._page("Plans", self.changing, ["/"])
        found["/slow"] = self._page("Support hours", "Support answers on weekdays from 8 to 18.", ["/"])
        found["/private/secret"] = self._page("Secret", "The private roadmap says nothing public.", ["/"])
        if self.vanishing:
            found["/vanishing"] = self._page("Old offer", "The Legacy bundle costs 999 euros.", ["/"])
        return found

    @staticmethod
    def _page(title: str, text: str, links: list[str]) -> str:
        anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
        return (f"<html><head><title>{title} | Gridline</title></head><body><nav><ul>{anchors}</ul></nav>"
                f"<main><h1>{title}</h1><p>{text}</p><p>{title} is part of the Gridline documentation, "
                f"written for operations managers who plan field work.</p></main>"
                f"<footer>Gridline Inc.</footer></body></html>")

    def sitemap(self) -> str:
        paths = [*self.pages(), "/missing", "/brochure.png", "/download"]
        urls = "".join(f"<url><loc>{self.url}{p}</loc></url>" for p in paths)
        return f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/robots.txt":
            listed = f"Sitemap: {self.url}/sitemap.xml\n" if self.sitemap_listed else ""
            return web.Response(text=f"User-agent: *\nDisallow: /private/\n{listed}")
        if path == "/sitemap.xml" and self.sitemap_listed:
            return web.Response(text=self.sitemap(), content_type="application/xml")
        if path == "/embed.html":
            return web.Response(text=f"<!doctype html><html><body><h1>Gridline</h1>{self.embed}</body></html>",
                                content_type="text/html")
        if path == "/brochure.png":
            return web.Response(body=b"\x89PNG\r\n\x1a\n" + b"0" * 64, content_type="image/png")
        if path == "/download":
            return web.Response(body=b"PK\x03\x04" + b"0" * 64, content_type="application/zip")
        page = self.pages().get(path)
        if page is None:
            return web.Response(status=404, text="not found")
        if path == "/slow":
            await asyncio.sleep(SLOW_S)
        etag = '"' + hashlib.sha256(page.encode()).hexdigest()[:16] + '"'
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        self.hits[path] += 1
        return web.Response(text=page, content_type="text/html", headers={"ETag": etag})

    def __enter__(self) -> "Website":
        started = threading.Event()

        def serve():
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True, name="test-website")
        self._thread.start()
        started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def allowed(self) -> set[str]:
        """The URLs a sync of the sitemap keeps: every HTML page but the private one."""
        return {f"{self.url}{p}" for p in self.pages() if not p.startswith("/private/")}
