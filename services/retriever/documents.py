"""Reading knowledge-base files: Markdown, text, HTML and PDF → a `SourceDocument` with a
title, a URL when the file names one, and sections (heading path, text).

Markdown may start with a front-matter block (`---` lines) giving `title:` and `url:`;
HTML gives its `<title>` and `<link rel="canonical">`. A file that cannot be read or
parsed raises `UnreadableDocument` naming it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

SUFFIXES = (".md", ".markdown", ".txt", ".html", ".htm", ".pdf")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


class UnreadableDocument(Exception):
    pass


@dataclass
class SourceDocument:
    doc_id: str
    title: str
    source: str  # URL, or the file's path when it has none
    path: str
    content_hash: str
    sections: list[tuple[str, str]] = field(default_factory=list)  # (heading, text)
    meta: dict[str, str] = field(default_factory=dict)  # kept in its registry record (a synced page's source, URL, validators)


def doc_id_for(site: str, path: str) -> str:
    return "doc-" + hashlib.sha256(f"{site}\0{path}".encode()).hexdigest()[:16]


def collect(paths: list[Path]) -> list[Path]:
    """The files to ingest: each path given, or the supported files under a directory."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES))
        else:
            files.append(path)
    return files


def read(site: str, path: Path, name: str | None = None) -> SourceDocument:
    """`name` is how the document is known (default: the path as given)."""
    name = name or str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UnreadableDocument(f"{path}: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            title, url, sections = _pdf(path)
        elif suffix in (".html", ".htm"):
            title, url, sections = _html(raw.decode("utf-8", errors="replace"))
        elif suffix in (".md", ".markdown", ".txt"):
            title, url, sections = _markdown(raw.decode("utf-8"))
        else:
            raise UnreadableDocument(f"{path}: unsupported file type {suffix or '(none)'} (use {', '.join(SUFFIXES)})")
    except UnicodeDecodeError:
        raise UnreadableDocument(f"{path}: not UTF-8 text") from None
    except UnreadableDocument:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser's failure names the file, the ingest goes on
        raise UnreadableDocument(f"{path}: {type(exc).__name__}: {exc}") from None
    sections = [(h, t.strip()) for h, t in sections if t.strip()]
    if not sections:
        raise UnreadableDocument(f"{path}: no text in it")
    return SourceDocument(doc_id=doc_id_for(site, name), title=title or path.stem.replace("-", " ").title(),
                          source=url or name, path=name, content_hash=hashlib.sha256(raw).hexdigest(),
                          sections=sections)


def from_markdown(site: str, name: str, title: str, source: str, text: str, content_hash: str,
                  meta: dict[str, str] | None = None) -> SourceDocument:
    """A document from Markdown text (a synced page's or file's): known as `name`, cited as
    `source` (its URL; for a file, the URL its front matter declares, as `concierge ingest`
    cites it, else its title)."""
    found_title, declared, sections = _markdown(text)
    if declared.startswith(("http://", "https://")) and not source.startswith(("http://", "https://")):
        source = declared
    sections = [(h, t.strip()) for h, t in sections if t.strip()]
    if not sections:
        raise UnreadableDocument(f"{name}: no text in it")
    return SourceDocument(doc_id=doc_id_for(site, name), title=title or found_title or name, source=source, path=name,
                          content_hash=content_hash, sections=sections, meta=dict(meta or {}))


def markdown_title(text: str) -> str:
    """The title a Markdown file gives itself: its front matter's `title:`, else its first
    `# heading`; "" when neither."""
    return _markdown(text)[0]


def _markdown(text: str) -> tuple[str, str, list[tuple[str, str]]]:
    meta: dict[str, str] = {}
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is not None:
            for line in lines[1:end]:
                key, _, value = line.partition(":")
                meta[key.strip().lower()] = value.strip().strip('"')
            lines = lines[end + 1:]
    title = meta.get("title", "")
    sections: list[tuple[str, str]] = []
    heading, body = "", []
    for line in lines:
        match = HEADING.match(line)
        if match:
            if body:
                sections.append((heading, "\n".join(body)))
            level, text_ = len(match.group(1)), match.group(2).strip()
            if level == 1 and not title:
                title = text_
            heading, body = ("" if level == 1 else text_), []
        else:
            body.append(line)
    if body:
        sections.append((heading, "\n".join(body)))
    return title, meta.get("url", ""), sections


def _html(text: str) -> tuple[str, str, list[tuple[str, str]]]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(text, "html.parser")
    title = soup.title.get_text(strip=True) if soup.title else ""
    canonical = soup.find("link", rel="canonical")
    url = canonical.get("href", "") if canonical else ""
    for tag in soup(["script", "style", "nav", "footer", "header", "noscript", "template"]):
        tag.decompose()
    sections: list[tuple[str, str]] = []
    heading, body = "", []
    for element in (soup.body or soup).find_all(["h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "td", "pre"]):
        words = element.get_text(" ", strip=True)
        if not words:
            continue
        if element.name.startswith("h"):
            if body:
                sections.append((heading, "\n".join(body)))
            if element.name == "h1" and not title:
                title = words
            heading, body = ("" if element.name == "h1" else words), []
        else:
            body.append(("- " if element.name == "li" else "") + words)
    if body:
        sections.append((heading, "\n".join(body)))
    return title, url, sections


def _pdf(path: Path) -> tuple[str, str, list[tuple[str, str]]]:
    from pypdf import PdfReader

    reader = PdfReader(str(path))
    title = (reader.metadata.title if reader.metadata else None) or ""
    sections = [(f"page {i}", page.extract_text() or "") for i, page in enumerate(reader.pages, start=1)]
    return title, "", sections
