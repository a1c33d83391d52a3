"""The outbound guard (shared/web.py) against real local servers: however a loopback or
link-local host is spelled (Unicode digits, full-width dots, decimal, octal, hex, short forms,
IPv6 forms, a name), the server behind it receives nothing; an address named in
OUTBOUND_ALLOWED (with its port) is reached and no other; bodies are streamed whole up to their
limit and said cut past it; a gzip'd sitemap inflates only so far."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import threading
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.retriever.sources import pages
from services.retriever.sources.converter import Converter
from services.retriever.sources.planner import sitemap_pages
from shared.web import NO_PUBLIC_ADDRESS, FetchError, Outbound, RefusedAddress, WebClient


class CountingServer:
    """A server inside the network: counts every request, answers a secret."""

    SECRET = b"INTERNAL-ONLY-0f3c"

    def __init__(self, body: bytes | None = None, content_type: str = "text/html"):
        self.hits = 0
        server_ = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                server_.hits += 1
                data = body if body is not None else self.SECRET_PAGE
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET  # noqa: N815

            SECRET_PAGE = b"<html><body><p>" + self.SECRET + b"</p></body></html>"

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def inside():
    server = CountingServer()
    yield server
    server.close()


CIRCLED = {str(d): c for d, c in zip("0123456789", "⓪①②③④⑤⑥⑦⑧⑨")}
FULL_WIDTH = {str(d): chr(0xFF10 + d) for d in range(10)}
DOTS = (".", "。", "．", "｡")


def loopback_spellings() -> st.SearchStrategy[str]:
    """127.0.0.1 as a URL's host may be written: each digit ASCII, circled or full-width, each
    dot any of the four IDNA dots, or the whole in another notation."""
    digit = lambda d: st.sampled_from([d, CIRCLED[d], FULL_WIDTH[d]])  # noqa: E731
    octets = ["127", "0", "0", "1"]
    spelled = st.tuples(*(st.tuples(*(digit(d) for d in octet)) for octet in octets))
    dots = st.lists(st.sampled_from(DOTS), min_size=3, max_size=3)
    dotted = st.tuples(spelled, dots).map(
        lambda t: "".join("".join(t[0][i]) + (t[1][i] if i < 3 else "") for i in range(4)))
    other = st.sampled_from(["2130706433", "0x7f000001", "0x7f.1", "127.1", "0177.0.0.1", "127.000.000.001",
                             "LOCALHOST", "localhost.", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
                             "[0:0:0:0:0:0:0:1]", "[::127.0.0.1]", "0", "0.0.0.0"])
    return st.one_of(dotted, other)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host=loopback_spellings())
def test_no_spelling_of_loopback_reaches_the_server_behind_it(inside, host):
    async def fetch(client):
        try:
            with pytest.raises((RefusedAddress, FetchError)) as caught:
                await client.get(f"http://{host}:{inside.port}/internal")
            return str(caught.value)
        finally:
            await client.close()

    # Both layers, and the connect-time one alone (a URL check that read the host otherwise).
    for client in (WebClient("Test", timeout_s=3), Unchecked("Test", timeout_s=3)):
        why = asyncio.run(fetch(client))
        assert inside.hits == 0, (host, type(client).__name__, why)
        assert CountingServer.SECRET.decode() not in why


class Unchecked(WebClient):
    """The guard without its look at the URL: only the resolver and the socket factory."""

    def check(self, url: str) -> None:
        pass


def test_unicode_hosts_are_read_as_the_client_reads_them():
    client = WebClient("Test")
    for url, address in (("http://①②⑦.0.0.1:9302/internal", "127.0.0.1 is a loopback"),
                         ("http://127。0。0。1/", "127.0.0.1 is a loopback"),
                         ("http://①⑥⑨.②⑤④.①⑥⑨.②⑤④/latest/meta-data/", "169.254.169.254 is a link-local")):
        with pytest.raises(RefusedAddress, match=address):
            client.check(url)


async def test_a_name_inside_and_a_name_nowhere_are_refused_alike():
    """A tenant learns neither which internal names exist nor their addresses."""
    client = WebClient("Test", timeout_s=3)
    try:
        answers = []
        for host in ("localhost", "no-such-host.invalid"):
            with pytest.raises(RefusedAddress) as caught:
                await client.get(f"http://{host}:9/")
            answers.append(str(caught.value).replace(host, "HOST"))
        assert answers[0] == answers[1] == f"http://HOST:9/: HOST: {NO_PUBLIC_ADDRESS}" and "127.0.0.1" not in answers[0]
    finally:
        await client.close()


async def test_the_metadata_address_and_private_ranges_are_refused_before_any_connection():
    client = WebClient("Test", timeout_s=3)
    try:
        for url, what in (("http://①⑥⑨.②⑤④.①⑥⑨.②⑤④/latest/meta-data/", "link-local"),
                          ("http://１０.０.０.５/", "private"), ("http://100.64.1.1/", "CGNAT"),
                          ("http://[fe80::1]/", "link-local"), ("http://[::ffff:169.254.169.254]/", "link-local"),
                          ("http://user:pw@example.com/", "user name"), ("ftp://example.com/", "only http")):
            with pytest.raises(RefusedAddress, match=what):
                await client.get(url)
    finally:
        await client.close()


async def test_an_allowed_address_is_reached_by_its_port_and_no_other(inside):
    other = CountingServer(b"other")
    client = WebClient("Test", Outbound(allowed=(f"127.0.0.1:{inside.port}",)), timeout_s=3)
    try:
        before = inside.hits
        assert (await client.get(f"http://127.0.0.1:{inside.port}/")).status == 200
        assert inside.hits == before + 1
        with pytest.raises(RefusedAddress, match="loopback"):
            await client.get(f"http://①②⑦.0.0.1:{other.port}/")
        assert other.hits == 0
        inside.hits = before  # the property test counts from nothing
    finally:
        await client.close()
        other.close()


def test_a_wrong_allowed_entry_stops_the_process_at_start(monkeypatch):
    from shared.config import ConfigError

    for wrong in ("10.0.0.0/8,not-an-address", "[::1]x", "127.0.0.1:99999", "127.0.0.1:http"):
        monkeypatch.setenv("OUTBOUND_ALLOWED", wrong)
        with pytest.raises(ConfigError, match="OUTBOUND_ALLOWED"):
            Outbound.from_env()
    monkeypatch.delenv("OUTBOUND_ALLOWED")
    monkeypatch.setenv("CRAWL_ALLOW_PRIVATE_NETWORKS", "1")  # the old name: said, not ignored
    with pytest.raises(ConfigError, match="now OUTBOUND_ALLOW_PRIVATE_NETWORKS"):
        Outbound.from_env()
    monkeypatch.delenv("CRAWL_ALLOW_PRIVATE_NETWORKS")
    monkeypatch.setenv("OUTBOUND_ALLOWED", "10.0.0.0/8, 127.0.0.1:8080 ,[::1]:80")
    outbound = Outbound.from_env()
    assert outbound.why_refused("10.1.2.3", 443) is None and outbound.why_refused("127.0.0.1", 8080) is None
    assert outbound.why_refused("127.0.0.1", 8081) and outbound.why_refused("::1", 80) is None


async def test_a_body_is_read_whole_up_to_its_limit_and_said_cut_past_it():
    page = b"<html><body>" + b"<p>word</p>" * (5_000_000 // 11) + b"</body></html>"
    server = CountingServer(page)
    client = WebClient("Test", Outbound(allow_private=True), timeout_s=10)
    try:
        whole = await client.get(f"http://127.0.0.1:{server.port}/")
        assert len(page) > 4_900_000 and whole.body == page and not whole.truncated
        cut = await client.get(f"http://127.0.0.1:{server.port}/", max_bytes=1_000_000)
        assert len(cut.body) == 1_000_000 and cut.truncated
    finally:
        await client.close()
        server.close()


async def test_a_one_megabyte_sitemap_is_read_whole():
    urls = [f"https://www.example.com/docs/page-{i:05d}" for i in range(20_000)]
    xml = ('<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
           + "".join(f"<url><loc>{u}</loc></url>" for u in urls) + "</urlset>").encode()
    server = CountingServer(xml, "application/xml")
    client = WebClient("Test", Outbound(allow_private=True), timeout_s=10, max_bytes=128_000)
    convert = Converter()
    try:
        assert len(xml) > 1_000_000
        found = await sitemap_pages(client, f"http://127.0.0.1:{server.port}/sitemap.xml", convert)
        assert found == urls
    finally:
        convert.close()
        await client.close()
        server.close()


def test_a_gzipped_sitemap_inflates_only_so_far():
    small = b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>https://a.example/</loc></url></urlset>'
    assert pages.sitemap_entries(gzip.compress(small)) == (["https://a.example/"], [])
    half = len(small) // 2
    assert pages.sitemap_entries(gzip.compress(small[:half]) + gzip.compress(small[half:])) == (
        ["https://a.example/"], [])  # two gzip members, one document
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(deflate.compress(b"\0" * (1024 * 1024)) for _ in range(pages.MAX_SITEMAP_BYTES // (1024 * 1024) + 8))
    bomb += deflate.flush()
    assert len(bomb) < 200_000
    with pytest.raises(ValueError, match="larger than"):
        pages.sitemap_entries(bomb)


async def test_a_key_given_for_one_host_never_follows_a_redirect_to_another():
    """A pull connector's bearer key goes to the host the site named, not to where it redirects."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            seen.append((self.headers.get("Host").split(":")[0], self.headers.get("Authorization")))
            if self.path == "/start":
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{port}/elsewhere")  # the same server, another host
            else:
                self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = WebClient("Test", Outbound(allow_private=True), timeout_s=3)
    try:
        await client.get(f"http://127.0.0.1:{port}/start", headers={"Authorization": "Bearer k"})
    finally:
        await client.close()
        server.shutdown()
    assert seen == [("127.0.0.1", "Bearer k"), ("localhost", None)]
