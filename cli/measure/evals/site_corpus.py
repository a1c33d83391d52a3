"""The real websites of `concierge eval sites`: public documentation of real B2B products,
written by those companies, not by us, served on 127.0.0.1 as the websites they are.

Each site is a directory of Markdown/MDX pages (cli/measure/evals/realsites/sites.toml says
where each comes from, its licence and its attribution). None of their text is kept in this
repository: a site published on a package registry (npm) is downloaded once into the cache
(`CONCIERGE_CACHE_DIR/realsites/<id>`, its archive checked against the registry's integrity
hash); one kept only in a git repository is read from a copy the operator names
(`--docs DIR`, holding `<id>/`, or `REALSITES_DIR`): a site at hand in neither is reported
as skipped, with how to get it.

`Website` renders every page to HTML as a documentation site would serve it (a header, a
sidebar linking every page, breadcrumbs, the article, a footer) and serves it with a
sitemap, a robots.txt and ETags (304 on If-None-Match), so the product takes it in
through its own crawler, as a site owner's site.

A page's address is its file path without the extension, `index`/`readme` naming the
directory: `billing.md` → `/billing`, `cloud/index.md` → `/cloud`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import io
import os
import posixpath
import re
import tarfile
import threading
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from markdown_it import MarkdownIt

HERE = Path(__file__).parent / "realsites"
MANIFEST = HERE / "sites.toml"
PAGE_SUFFIXES = (".md", ".mdx")
INDEX_NAMES = ("index", "readme")
DOWNLOAD_TIMEOUT_S = 120


@dataclass(frozen=True)
class SiteSource:
    id: str
    name: str  # the product's name, the site's `name`
    licence: str
    attribution: str
    origin: str  # "npm" | "git"
    url: str = ""  # npm: the tarball
    integrity: str = ""  # npm: "sha512-<base64>"
    repo: str = ""  # git: owner/name
    commit: str = ""
    path: str = ""  # the docs' directory inside the archive or repository
    exclude: tuple[str, ...] = ()  # directories (relative to `path`) that are not the site's pages
    questions: Path = field(default_factory=Path)

    def how_to_get(self) -> str:
        if self.origin == "git":
            return (f"a copy of github.com/{self.repo} at {self.commit[:12]}, its {self.path}/ as {self.id}/ "
                    f"under --docs DIR or REALSITES_DIR")
        return f"{self.url} (downloaded into the cache when the registry answers)"


def sources(manifest: Path = MANIFEST) -> list[SiteSource]:
    data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    out = []
    for site_id, entry in data["sites"].items():
        out.append(SiteSource(id=site_id, name=entry["name"], licence=entry["licence"],
                              attribution=entry["attribution"], origin=entry["origin"], url=entry.get("url", ""),
                              integrity=entry.get("integrity", ""), repo=entry.get("repo", ""),
                              commit=entry.get("commit", ""), path=entry.get("path", ""),
                              exclude=tuple(entry.get("exclude", ())),
                              questions=manifest.parent / entry["questions"]))
    return out


def cache_root() -> Path:
    base = os.environ.get("CONCIERGE_CACHE_DIR") or str(Path.home() / ".cache" / "concierge")
    return Path(base) / "realsites"


def _verified(data: bytes, integrity: str) -> bool:
    algorithm, _, expected = integrity.partition("-")
    if algorithm not in ("sha512", "sha256"):
        return False
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode() == expected


def _download(source: SiteSource, into: Path) -> None:
    with urllib.request.urlopen(source.url, timeout=DOWNLOAD_TIMEOUT_S) as response:  # noqa: S310 - a pinned registry URL
        data = response.read()
    if not _verified(data, source.integrity):
        raise ValueError(f"{source.url}: the archive does not match its integrity hash {source.integrity[:20]}…")
    prefix = source.path.strip("/") + "/"
    staging = into.with_name(into.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            if not (member.isfile() and member.name.startswith(prefix) and member.name.endswith(PAGE_SUFFIXES)):
                continue
            relative = Path(member.name[len(prefix):])
            if ".." in relative.parts or relative.is_absolute():
                continue
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.extractfile(member).read())
    staging.rename(into)


def locate(source: SiteSource, docs: Path | None) -> Path | None:
    """The site's pages on this machine, downloading a registry's copy once; None when
    they are not at hand."""
    for base in (docs, Path(os.environ["REALSITES_DIR"]) if os.environ.get("REALSITES_DIR") else None):
        if base is not None and (base / source.id).is_dir():
            return base / source.id
    if source.origin != "npm":
        return None
    cached = cache_root() / f"{source.id}-{hashlib.sha256(source.url.encode()).hexdigest()[:12]}"
    if not cached.is_dir():
        cached.parent.mkdir(parents=True, exist_ok=True)
        try:
            _download(source, cached)
        except OSError:
            return None
    return cached


# --- the pages --------------------------------------------------------------------------

FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)
TITLE_FIELD = re.compile(r"^title:\s*[\"']?(.*?)[\"']?\s*$", re.MULTILINE)
HEADING_1 = re.compile(r"^#\s+(.+)$", re.MULTILINE)
MDX_IMPORT = re.compile(r"^(?:import|export)\s.*$", re.MULTILINE)
HEAD_BLOCK = re.compile(r"<head>.*?</head>", re.DOTALL | re.IGNORECASE)
SCRIPT_BLOCK = re.compile(r"<(script|style)\b.*?</\1>", re.DOTALL | re.IGNORECASE)
# An MDX component's tags (<Tabs>, <Callout type="info">, <Accordion title="…">): dropped,
# what they wrap kept; a title attribute becomes a line of its own, as the page shows it.
COMPONENT_TAG = re.compile(r"</?[A-Z][\w.]*(?:\s[^<>]*?)?/?>")
TITLE_ATTRIBUTE = re.compile(r"<[A-Z][\w.]*\s[^<>]*?title=[\"{]([^\"}]+)[\"}][^<>]*>")
# Docusaurus admonitions (`:::note Title` … `:::`): a box on the page; its title a line of its own.
ADMONITION = re.compile(r"^[ \t]*:::+[ \t]*(?:\w+)?[ \t]*(.*)$", re.MULTILINE)
MDX_EXPRESSION = re.compile(r"^\s*\{/\*.*?\*/\}\s*$", re.MULTILINE)
LOCAL_LINK = re.compile(r'href="(?![a-z]+:|#)([^"#?]+\.mdx?)(#[^"]*)?"')
_markdown = MarkdownIt("commonmark", {"html": True}).enable("table")


@dataclass(frozen=True)
class Page:
    path: str  # the URL path
    file: str  # relative to the site's directory
    title: str
    body: str  # HTML of the article


def url_path_of(url: str) -> str:
    """The page path of a URL the local website served ("http://127.0.0.1:8123/cloud/teams#x"
    → "/cloud/teams")."""
    path = urlsplit(url).path.rstrip("/")
    return path or "/"


def url_path(relative: str) -> str:
    parts = relative.rsplit(".", 1)[0].split("/")
    if parts[-1].lower() in INDEX_NAMES:
        parts = parts[:-1]
    return "/" + "/".join(parts)


def _title(front: str, text: str, relative: str) -> str:
    found = TITLE_FIELD.search(front)
    if found and found.group(1).strip():
        return found.group(1).strip()
    heading = HEADING_1.search(text)
    if heading:
        return heading.group(1).strip()
    return Path(relative).stem.replace("-", " ").replace("_", " ").capitalize()


def render(text: str, relative: str) -> tuple[str, str]:
    """(title, article HTML) of one Markdown/MDX page."""
    front = ""
    matched = FRONT_MATTER.match(text)
    if matched:
        front, text = matched.group(1), text[matched.end():]
    title = _title(front, text, relative)
    text = HEAD_BLOCK.sub("", text)
    text = SCRIPT_BLOCK.sub("", text)
    text = MDX_IMPORT.sub("", text)
    text = MDX_EXPRESSION.sub("", text)
    text = ADMONITION.sub(lambda m: f"\n**{m.group(1).strip()}**\n" if m.group(1).strip() else "\n", text)
    text = TITLE_ATTRIBUTE.sub(lambda m: f"\n\n**{m.group(1)}**\n\n", text)
    text = COMPONENT_TAG.sub("\n", text)
    if not HEADING_1.search(text):
        text = f"# {title}\n\n{text}"
    return title, LOCAL_LINK.sub(lambda m: _linked(m, relative), _markdown.render(text))


def _linked(found: re.Match, relative: str) -> str:
    """A link to another page's file (`billing.md`, `../cloud/teams.mdx#roles`) as its address."""
    target, anchor = found.group(1), found.group(2) or ""
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(relative), target)) if not target.startswith("/") \
        else target.lstrip("/")
    return f'href="{url_path(joined)}{anchor}"'



def pages(root: Path, exclude: tuple[str, ...] = ()) -> list[Page]:
    out = []
    for file in sorted(root.rglob("*")):
        if not (file.is_file() and file.suffix in PAGE_SUFFIXES):
            continue
        relative = file.relative_to(root).as_posix()
        if any(relative == e or relative.startswith(e.rstrip("/") + "/") for e in exclude):
            continue
        if any(part.startswith((".", "_")) or part == "node_modules" for part in Path(relative).parts):
            continue
        title, body = render(file.read_text(encoding="utf-8", errors="replace"), relative)
        out.append(Page(path=url_path(relative), file=relative, title=title, body=body))
    seen: set[str] = set()
    return [p for p in out if not (p.path in seen or seen.add(p.path))]


def _document(page: Page, product: str, sidebar: str) -> str:
    crumbs = " › ".join(html.escape(part.replace("-", " ").capitalize()) for part in page.path.strip("/").split("/")
                        if part)
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(page.title)} | {html.escape(product)} Docs</title>"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"></head><body>"
            f"<header class=\"navbar\"><a href=\"/\">{html.escape(product)} Docs</a> "
            f"<a href=\"/\">Guides</a> <a href=\"/\">Changelog</a> <a href=\"/\">Status</a> "
            f"<input type=\"search\" placeholder=\"Search docs\"></header>"
            f"<div class=\"layout\"><nav class=\"sidebar\" aria-label=\"Docs\">{sidebar}</nav>"
            f"<main><div class=\"breadcrumbs\">Docs › {crumbs}</div><article>{page.body}</article>"
            f"<div class=\"feedback\">Was this page helpful? <button>Yes</button> <button>No</button></div></main></div>"
            f"<footer><p>© {html.escape(product)}. All rights reserved.</p><a href=\"/\">Privacy</a> "
            f"<a href=\"/\">Terms</a> <a href=\"/\">Contact</a></footer></body></html>")


class Website:
    """The site's pages served on 127.0.0.1 (a thread of its own): `/sitemap.xml` lists
    every page, `/robots.txt` allows all and names the sitemap, each page carries an ETag."""

    def __init__(self, product: str, site_pages: list[Page]):
        self.product = product
        self.pages = {p.path: p for p in site_pages}
        sidebar = "<ul>" + "".join(f"<li><a href=\"{html.escape(p.path)}\">{html.escape(p.title)}</a></li>"
                                   for p in site_pages) + "</ul>"
        self.documents = {path: _document(p, product, sidebar).encode() for path, p in self.pages.items()}
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def page_of(self, url: str) -> str:
        """The page path of a URL of this site ('' when it is not one)."""
        return url_path_of(url) if url.startswith(self.url) else ""

    def _sitemap(self) -> bytes:
        urls = "".join(f"<url><loc>{self.url}{html.escape(path)}</loc></url>" for path in self.pages)
        return (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<urlset xmlns=\"http://www.sitemaps.org/schemas/"
                f"sitemap/0.9\">{urls}</urlset>").encode()

    def _app(self):
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            path = request.path.rstrip("/") or "/"
            if path == "/robots.txt":
                return web.Response(text=f"User-agent: *\nAllow: /\nSitemap: {self.url}/sitemap.xml\n")
            if path == "/sitemap.xml":
                return web.Response(body=self._sitemap(), content_type="application/xml")
            body = self.documents.get(path)
            if body is None:
                return web.Response(status=404, text="Not found")
            etag = '"' + hashlib.sha1(body).hexdigest()[:16] + '"'
            if request.headers.get("If-None-Match") == etag:
                return web.Response(status=304, headers={"ETag": etag})
            return web.Response(body=body, content_type="text/html", charset="utf-8", headers={"ETag": etag})

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        return app

    def start(self) -> "Website":
        from aiohttp import web

        started = threading.Event()

        async def serve():
            self._runner = web.AppRunner(self._app())
            await self._runner.setup()
            listening = web.TCPSite(self._runner, "127.0.0.1", 0)
            await listening.start()
            self.port = listening._server.sockets[0].getsockname()[1]
            started.set()

        def run():
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"website-{self.product}", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the local website did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
