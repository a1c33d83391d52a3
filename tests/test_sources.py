"""The pure parts of knowledge sources: definitions checked field by field, a page's scope,
robots.txt and sitemaps, a page's text and links, a run's progress folded from its log,
and the fetcher's refusal of addresses inside the network (shared/sources.py,
services/retriever/sources/)."""

from __future__ import annotations

import asyncio
import gzip

import pytest
from aiohttp import web

from services.retriever.sources import pages
from shared.web import Outbound, RefusedAddress, WebClient, refused
from shared import events as ev
from shared import sources
from shared.state import SyncProgress, apply_sync


def test_a_definition_is_checked_field_by_field():
    with pytest.raises(sources.SourceError) as caught:
        sources.spec_of(sources.SourceInput(url="javascript:alert(1)", every="1x", include=["docs"], max_pages=9999))
    assert {e["field"] for e in caught.value.errors} == {"url", "every", "include[0]", "max_pages"}
    with pytest.raises(sources.SourceError):
        sources.spec_of(sources.SourceInput(url="https://a.example", text="both"))
    with pytest.raises(sources.SourceError):
        sources.spec_of(sources.SourceInput(url="https://user:pw@a.example/"))
    spec = sources.spec_of(sources.SourceInput(url="https://a.example/", every="2d"))
    assert spec.kind == "website" and spec.every_s == 172800
    assert sources.spec_of(sources.SourceInput(url="https://a.example/")).id == spec.id  # one URL, one source
    assert sources.every_seconds("90m") == 5400 and sources.every_seconds(None) == 0
    with pytest.raises(sources.SourceError):
        sources.file_spec("../../etc/passwd", 10)
    assert sources.file_spec("dir/Price List.pdf", 10).name == "Price List.pdf"
    for hidden in ("a\x00.md", "report\u202etxt.pdf", "a\x85b.md", "zero\u200bwidth.md"):  # control, format
        with pytest.raises(sources.SourceError, match="control or format"):
            sources.file_spec(hidden, 10)


def test_scope_keeps_the_site_and_its_paths():
    spec = ev.SourceSpec(id="web-x", kind="website", url="https://www.acme.example/docs/", include=["/docs/*"],
                         exclude=["/docs/internal/*"])
    assert pages.in_scope(spec, "https://acme.example/docs/a")
    assert not pages.in_scope(spec, "https://acme.example/blog/a")
    assert not pages.in_scope(spec, "https://acme.example/docs/internal/x")
    assert not pages.in_scope(spec, "https://evil.example/docs/a")
    assert not pages.in_scope(spec, "https://acme.example/docs/logo.png")
    assert pages.normalized("HTTPS://Acme.example:443/a#top") == "https://acme.example/a"


def test_robots_and_sitemaps():
    rules = pages.robots("User-agent: *\nDisallow: /private/\n")
    assert rules.can_fetch("https://a.example/docs", "Bot") and not rules.can_fetch("https://a.example/private/x", "Bot")
    urlset = (b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
              b"<url><loc>https://a.example/1</loc></url><url><loc> https://a.example/2 </loc></url></urlset>")
    assert pages.sitemap_entries(urlset) == (["https://a.example/1", "https://a.example/2"], [])
    index = b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap><loc>https://a.example/s1.xml</loc></sitemap></sitemapindex>'
    assert pages.sitemap_entries(gzip.compress(index)) == ([], ["https://a.example/s1.xml"])
    with pytest.raises(Exception):
        pages.sitemap_entries(b'<!DOCTYPE x [<!ENTITY a "b">]><urlset>&a;</urlset>')  # no entities (defusedxml)


def test_a_page_gives_its_main_text_title_and_links():
    html = ("<html><head><title>Pricing | Acme</title></head><body><nav><a href='/'>Home</a></nav><main>"
            "<h1>Pricing</h1><p>Acme costs 40 euros per seat per month, billed yearly, for every team.</p>"
            "<a href='../about#team'>About</a><a href='mailto:x@a.example'>mail</a></main>"
            "<footer>Copyright</footer></body></html>")
    title, text, links = pages.html_page(html, "https://a.example/docs/")
    assert title == "Pricing" and "40 euros per seat" in text and "Copyright" not in text
    assert links == ["https://a.example/", "https://a.example/about"]


def test_a_runs_progress_is_folded_in_log_order_up_to_the_limit():
    spec = ev.SourceSpec(id="web-x", kind="website", url="https://a.example/", max_pages=3)
    base = {"site": "s", "session_id": "_src-web-x", "ts": 1.0}
    started = ev.SyncStarted(event_id="1", turn=1, source=spec, pages=[ev.PageTarget(url="https://a.example/")],
                             discover=True, **base)
    progress = apply_sync(SyncProgress(), started)
    assert progress.pages == {"https://a.example/": ""} and not progress.complete
    home = ev.PageFetched(event_id="2", turn=1, url="https://a.example/", outcome="changed",
                          links=["https://a.example/a", "https://a.example/b", "https://a.example/c"], **base)
    progress = apply_sync(progress, home)
    assert list(progress.pages) == ["https://a.example/", "https://a.example/a", "https://a.example/b"]
    assert apply_sync(progress, home) is progress  # a page fetched again counts once
    for i, url in enumerate(["https://a.example/a", "https://a.example/b"]):
        progress = apply_sync(progress, ev.PageFetched(event_id=f"p{i}", turn=1, url=url, outcome="gone", **base))
    assert progress.complete and progress.pending == 0
    other_run = ev.PageFetched(event_id="x", turn=2, url="https://a.example/z", outcome="changed", **base)
    assert apply_sync(progress, other_run) is progress
    ended = apply_sync(progress, ev.SyncCompleted(event_id="e", turn=1, **base))
    assert ended.ended == "completed" and not ended.complete


def test_addresses_inside_the_network_are_refused():
    for address in ("127.0.0.1", "10.0.0.8", "172.16.3.4", "192.168.1.1", "169.254.169.254", "::1", "fd00::1",
                    "::ffff:10.0.0.1", "0.0.0.0", "100.64.0.1"):
        assert refused(address), address
    assert refused("93.184.216.34") is None


async def test_the_fetcher_refuses_loopback_names_and_redirects_into_the_network():
    client = WebClient("Test", timeout_s=3)
    try:
        for url in ("http://127.0.0.1:9/", "http://localhost:9/", "http://[::1]:9/", "file:///etc/passwd"):
            with pytest.raises(RefusedAddress):
                await client.get(url)
    finally:
        await client.close()

    async def redirect(request):
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    app = web.Application()
    app.router.add_get("/", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]

    # The test's own server is allowed by its port: every other address on 127.0.0.1 is not.
    client = WebClient("Test", Outbound(allowed=(f"127.0.0.1:{port}",)), timeout_s=3)
    try:
        with pytest.raises(RefusedAddress, match="169.254.169.254"):
            await client.get(f"http://127.0.0.1:{port}/")
    finally:
        await client.close()
        await runner.cleanup()
    await asyncio.sleep(0)


def test_uploaded_office_files_and_documents_become_markdown():
    import io

    from pptx import Presentation

    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Onboarding"
    slide.placeholders[1].text = "Every customer gets a 30-day onboarding plan."
    data = io.BytesIO()
    deck.save(data)
    title, text = pages.file_text("sales-deck.pptx", data.getvalue())
    assert title == "Sales Deck" and "# Onboarding" in text and "30-day onboarding plan" in text
    # Markdown: the title it gives itself (front matter, else its first heading), else the name's.
    assert pages.file_text("faq.md", b"# FAQ\n\nYes.") == ("FAQ", "# FAQ\n\nYes.")
    assert pages.file_text("faq.md", b"---\ntitle: Questions\n---\nYes.")[0] == "Questions"
    assert pages.file_text("faq.md", b"Yes, plain.") == ("Faq", "Yes, plain.")
    with pytest.raises(pages.UnreadableFile):
        pages.file_text("notes.txt", b"\xff\xfe\x00bad")
    with pytest.raises(pages.UnreadableFile):
        pages.file_text("tool.exe", b"MZ")
