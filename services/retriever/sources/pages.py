"""What a source's pages are: which URLs are in its scope, what robots.txt allows, the
pages a sitemap lists, and the text of a page or file (pure functions over fetched bytes).

- Scope: the start URL's scheme and host (www. or not), paths matching one of `include`
  (none given: all) and none of `exclude` (fnmatch patterns on the path, e.g. `/blog/*`),
  no fragments; a URL is normalized (fragment dropped, default port dropped) before any
  comparison, so a page is one page however it was linked.
- robots.txt: Protego (BSD-3), the rules for our User-Agent.
- Sitemaps: `<urlset>` and `<sitemapindex>` (gzipped or not), parsed with defusedxml, up to
  MAX_SITEMAP_BYTES (raw and inflated); the planner has them parsed in the converter's
  processes (converter.py), as the robots.txt checks.
- HTML: trafilatura (Apache-2.0) takes the main content as Markdown (headings kept, menus,
  footers and cookie banners left out) and the title; the links come from lxml.
- Files: PDF, HTML, Markdown and text as `concierge ingest` reads them (documents.py);
  DOCX and PPTX through markitdown (MIT).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import posixpath
import zlib
from urllib.parse import urljoin, urlsplit, urlunsplit

from shared import events as ev
from shared import sources

HTML_TYPES = ("text/html", "application/xhtml+xml")
# Links to these are not pages: never queued.
ASSET_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp", ".ico", ".css", ".js", ".zip", ".gz", ".mp4",
                  ".mp3", ".woff", ".woff2", ".ttf", ".xml", ".json", ".rss", ".atom")
MAX_SITEMAPS = 50
# A sitemap read up to this, raw or inflated (the protocol allows 50 MB, but 50,000 URLs fit in
# a fifth of that); a run's sitemaps list at most MAX_SITEMAP_URLS pages (the protocol's limit
# for one), and a page at most that many links.
MAX_SITEMAP_BYTES = 10 * 1024 * 1024
MAX_SITEMAP_URLS = 50_000
MAX_ROBOTS_BYTES = 500 * 1024  # robots.txt read this far, the rest ignored (as Google does)


def normalized(url: str) -> str:
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    port = parts.port
    netloc = host if port is None or (parts.scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"
    path = parts.path or "/"
    return urlunsplit((parts.scheme.lower(), netloc, path, parts.query, ""))


def _site_host(host: str) -> str:
    return host[4:] if host.startswith("www.") else host


def in_scope(source: ev.SourceSpec, url: str) -> bool:
    """Whether `url` is one of the source's pages by its address (robots.txt aside)."""
    start, parts = urlsplit(source.url), urlsplit(url)
    if parts.scheme not in ("http", "https") or _site_host(parts.hostname or "") != _site_host(start.hostname or ""):
        return False
    if (start.port or None) != (parts.port or None) and not (start.port is None and parts.port in (80, 443)):
        return False
    path = parts.path or "/"
    if posixpath.splitext(path)[1].lower() in ASSET_SUFFIXES:
        return False
    if source.include and not any(fnmatch.fnmatchcase(path, p) for p in source.include):
        return False
    return not any(fnmatch.fnmatchcase(path, p) for p in source.exclude)


def robots(text: str):
    from protego import Protego

    return Protego.parse(text or "")


def robots_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/robots.txt", "", ""))


def is_home(url: str) -> bool:
    """A site's home page: no path beyond "/", no query."""
    parts = urlsplit(url)
    return parts.path in ("", "/") and not parts.query


def is_sitemap(url: str, content_type: str = "") -> bool:
    path = urlsplit(url).path.lower()
    return path.endswith((".xml", ".xml.gz")) or content_type in ("application/xml", "text/xml")


def sitemap_entries(body: bytes) -> tuple[list[str], list[str]]:
    """(page URLs, nested sitemap URLs) a sitemap lists. A gzipped one is inflated up to
    MAX_SITEMAP_BYTES, no further (ValueError: a bigger one, or a bomb)."""
    from defusedxml import ElementTree

    if body[:2] == b"\x1f\x8b":
        out, rest = b"", body
        while rest[:2] == b"\x1f\x8b":  # each gzip member in turn (a file may hold several)
            room = MAX_SITEMAP_BYTES - len(out)  # never 0 here: to zlib, a max_length of 0 is no limit
            inflate = zlib.decompressobj(wbits=31)
            out += inflate.decompress(rest, room)
            if inflate.unconsumed_tail:
                raise ValueError(f"larger than {MAX_SITEMAP_BYTES} bytes uncompressed")
            if not inflate.eof:
                raise ValueError("a gzip stream cut short")
            rest = inflate.unused_data
            if rest[:2] == b"\x1f\x8b" and len(out) >= MAX_SITEMAP_BYTES:
                raise ValueError(f"larger than {MAX_SITEMAP_BYTES} bytes uncompressed")
        body = out
    root = ElementTree.fromstring(body)
    tag = root.tag.rsplit("}", 1)[-1]
    locs = [el.text.strip() for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "loc" and el.text]
    return ([], locs) if tag == "sitemapindex" else (locs, [])


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def html_page(html: str, url: str) -> tuple[str, str, list[str]]:
    """(title, main content as Markdown, links as absolute normalized URLs) of a page."""
    import lxml.html
    import trafilatura

    doc = trafilatura.bare_extraction(html, url=url, output_format="python", with_metadata=True,
                                      include_links=False, include_formatting=True, favor_recall=True)
    text = (trafilatura.extract(html, url=url, output_format="markdown", include_formatting=True,
                                include_links=False, favor_recall=True) or "") if doc is not None else ""
    title = (getattr(doc, "title", "") or "") if doc is not None else ""
    links: list[str] = []
    try:
        tree = lxml.html.fromstring(html)
        base = tree.xpath("//base/@href")
        base_url = urljoin(url, base[0]) if base else url
        for href in tree.xpath("//a/@href"):
            href = href.strip()
            if href and not href.startswith(("mailto:", "tel:", "javascript:", "#")):
                links.append(normalized(urljoin(base_url, href)))
        if not title:
            found = tree.xpath("//title/text()")
            title = found[0].strip() if found else ""
    except Exception:  # noqa: BLE001 - a page lxml cannot parse has no links to follow; its text stands
        pass
    return title.strip(), text.strip(), list(dict.fromkeys(links))


class UnreadableFile(Exception):
    pass


def file_text(name: str, data: bytes) -> tuple[str, str]:
    """(title, text as Markdown) of an uploaded file."""
    suffix = posixpath.splitext(name.lower())[1]
    if suffix not in sources.UPLOAD_SUFFIXES:
        raise UnreadableFile(f"{name}: unsupported file type {suffix or '(none)'} (use {', '.join(sources.UPLOAD_SUFFIXES)})")
    stem = posixpath.splitext(posixpath.basename(name))[0].replace("-", " ").replace("_", " ").strip().title()
    if suffix in (".docx", ".pptx"):
        from markitdown import MarkItDown, StreamInfo

        try:
            result = MarkItDown(enable_plugins=False).convert_stream(io.BytesIO(data),
                                                                     stream_info=StreamInfo(extension=suffix))
        except Exception as exc:  # noqa: BLE001 - the converter's failure names the file
            raise UnreadableFile(f"{name}: {type(exc).__name__}: {exc}") from None
        return (result.title or stem), result.markdown.strip()
    if suffix in (".html", ".htm"):
        title, text, _ = html_page(data.decode("utf-8", errors="replace"), "file:///" + name)
        return title or stem, text
    if suffix == ".pdf":
        from pypdf import PdfReader

        try:
            reader = PdfReader(io.BytesIO(data))
            pages = [page.extract_text() or "" for page in reader.pages]
        except Exception as exc:  # noqa: BLE001
            raise UnreadableFile(f"{name}: {type(exc).__name__}: {exc}") from None
        title = (reader.metadata.title if reader.metadata else None) or stem
        return title, "\n\n".join(f"## page {i}\n\n{t}" for i, t in enumerate(pages, 1) if t.strip())
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFile(f"{name}: not UTF-8 text") from None
    if suffix in (".md", ".markdown"):  # the title it gives itself, as `concierge ingest` reads it
        from services.retriever.documents import markdown_title

        return markdown_title(text) or stem, text
    return stem, text
