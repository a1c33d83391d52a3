"""A hostile tenant on the real system (five services, real NATS and Redis, keyless as
`make run`): it holds only a site key for a site of its own (`evil`, made with ADMIN_TOKEN)
and replays every attack of issue 56 (docs/security.md, "A hostile tenant"):

- hosts spelled to slip past the address guard (Unicode digits, full-width dots) as a
  knowledge source, a robots.txt redirect, an accounts pull URL and a webhook URL: the server
  inside receives nothing and nothing of it is stored;
- another tenant's webhook secret (or ADMIN_TOKEN) named as its own: nothing sent, and the
  same message whatever the variable is;
- a DOCX that inflates to 120 MB, a PDF reusing one stream on every page, HTML past its
  limit: each page fails once saying why, and the demo site's answers keep their sources;
- loopback ports as webhook targets (NATS, Redis): refused, nothing readable of them;
- a site config past the bus's message size, an upload named with a NUL byte: 4xx;
- accounts past the site's cap: 422; listings a page at a time.

What a hostile tenant could already not do stays refused in tests/test_hostile.py."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import statistics
import tempfile
import time
import uuid
import zipfile
import zlib
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from cli.harness.sse import Conversation
from cli.harness.supervisor import free_port, make_system
from cli.measure import machine
from shared import webhook_secret
from tests.helpers import wait_for
from tests.test_outbound_guard import CountingServer

ADMIN = "hostile-tenant-admin-token-0123456789"
DEMO = "demo"
EVIL = f"evil{uuid.uuid4().hex[:6]}"
DEMO_SECRET = webhook_secret.new()
EVIL_SECRET = webhook_secret.new()
CONVERT_TIMEOUT_S = 4
CONFIG_TTL_S = 0  # every service reads a site's config at each use: a change applies at once


class PublicSite(CountingServer):
    """What the tenant serves at an address the deployment lets through (OUTBOUND_ALLOWED): a
    robots.txt that redirects inside, and a webhook receiver."""

    def __init__(self, inside_port: int):
        import http.server
        import threading

        self.hits, self.hooks = 0, []
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                site.hits += 1
                if self.path == "/robots.txt":
                    self.send_response(302)
                    # Raw UTF-8 in the header, as a hostile server may send it.
                    self._headers_buffer.append(f"Location: http://①②⑦.0.0.1:{inside_port}/internal\r\n".encode())
                    self.end_headers()
                    return
                body = b"<html><body><h1>Evil corp</h1><p>Our public page.</p></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                site.hooks.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class HeavySite(CountingServer):
    """A tenant's website built to cost the crawler: 480 KiB of wildcard robots.txt rules (a
    quarter of a second to parse, milliseconds a URL to check) and a gzipped sitemap of 60,000
    pages."""

    def __init__(self):
        import http.server  # here: the module's `http` is the client fixture

        super().__init__(b"")
        robots = ("User-agent: *\n" + "".join(f"Disallow: /*a{i}*b*c$\n" for i in range(20_000))).encode()[:480 * 1024]
        gz = gzip.compress(('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
            f"<url><loc>http://127.0.0.1:{self.port}/p/{i}</loc></url>" for i in range(60_000)) + "</urlset>").encode())

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body, kind = (robots, "text/plain") if self.path == "/robots.txt" else (gz, "application/gzip")
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server.RequestHandlerClass = Handler


@pytest.fixture(scope="module")
def heavy():
    server = HeavySite()
    yield server
    server.close()


@pytest.fixture(scope="module")
def inside():
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def public(inside):
    server = PublicSite(inside.port)
    yield server
    server.close()


@pytest.fixture(scope="module")
def system(public, heavy):
    with tempfile.TemporaryDirectory(prefix="concierge-hostile-tenant-") as data:
        sys_ = make_system(Path(data), free_port(), free_port(), {
            "ADMIN_TOKEN": ADMIN,
            "SESSION_TOKEN_SECRET": "hostile-tenant-session-secret-0123456789",
            "RATE_LIMIT_PER_IP_PER_MIN": "100000",
            "RATE_LIMIT_PER_SITE_PER_MIN": "100000",
            # The tenant's "public" server is on 127.0.0.1 too: that port is let through, no other.
            "OUTBOUND_ALLOWED": f"127.0.0.1:{public.port},127.0.0.1:{heavy.port}",
            "CONVERT_TIMEOUT_S": str(CONVERT_TIMEOUT_S),
            # The demo tenant's own webhook secret, and one for the hostile tenant.
            "DEMO_WEBHOOK_SECRET": webhook_secret.bound(DEMO, DEMO_SECRET),
            "EVIL_WEBHOOK_SECRET": webhook_secret.bound(EVIL, EVIL_SECRET),
            "LEAD_WEBHOOK_BACKOFF_S": "0.05",
            "SITE_CONFIG_TTL_S": str(CONFIG_TTL_S),
        })
        try:
            sys_.ingest(DEMO)
            sys_.start_all()
            yield sys_
        finally:
            sys_.stop()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def evil_key(system):
    """The hostile tenant's site and its key, made as an operator would."""

    async def make() -> str:
        async with httpx.AsyncClient(base_url=system.gateway_url, timeout=30) as client:
            made = await client.put(f"/v1/admin/sites/{EVIL}", headers=bearer(ADMIN), json={"name": "Evil"})
            assert made.status_code == 201, made.text
            key = await client.post(f"/v1/admin/sites/{EVIL}/keys", headers=bearer(ADMIN))
            assert key.status_code == 201, key.text
            return key.json()["key"]

    return asyncio.run(make())


def admin(system, path: str) -> str:
    return f"{system.gateway_url}/v1/admin/sites/{EVIL}/{path}".rstrip("/")


async def patch(http, system, key, change: dict) -> None:
    """The hostile tenant changes its site."""
    patched = await http.patch(admin(system, ""), headers=bearer(key), json=change)
    assert patched.status_code == 200, patched.text


async def source_events(http, system, key, source: str) -> list[dict]:
    response = await http.get(admin(system, f"conversations/_src-{source}/events"), headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.json()["events"]


async def run_outcome(http, system, key, source: str, timeout: float = 60) -> dict:
    """The source's first run's end (SyncCompleted or SyncFailed) and every event of it."""

    async def ended():
        events = await source_events(http, system, key, source)
        return events if any(e["type"] in ("sync_completed", "sync_failed") for e in events) else None

    return await wait_for(ended, timeout=timeout, what=f"the run of {source}")


async def add_source(http, system, key, url: str) -> str:
    added = await http.post(admin(system, "sources"), headers=bearer(key), json={"url": url})
    assert added.status_code == 202, added.text
    return added.json()["source"]


async def test_unicode_hosts_reach_nothing_inside_and_nothing_of_it_is_stored(system, evil_key, inside, public, http):
    for host in (f"①②⑦.0.0.1:{inside.port}", f"127。0。0。1:{inside.port}", f"１２７.０.０.１:{inside.port}",
                 "①⑥⑨.②⑤④.①⑥⑨.②⑤④"):
        source = await add_source(http, system, evil_key, f"http://{host}/internal")
        events = await run_outcome(http, system, evil_key, source)
        (failed,) = [e["event"] for e in events if e["type"] == "sync_failed"]
        assert "loopback" in failed["reason"] or "link-local" in failed["reason"], failed
    # A public site whose robots.txt redirects inside: refused at that hop, nothing of it kept.
    source = await add_source(http, system, evil_key, f"{public.url}/")
    events = await run_outcome(http, system, evil_key, source)
    assert public.hits >= 1
    (failed,) = [e["event"] for e in events if e["type"] == "sync_failed"]
    assert "loopback" in failed["reason"], failed
    # The accounts pull connector, the same guard in the gateway.
    await patch(http, system, evil_key, {"accounts": {"pull_url": f"http://①②⑦.0.0.1:{inside.port}/internal"}})
    pulled = await http.post(admin(system, "accounts/pull"), headers=bearer(evil_key))
    assert pulled.status_code == 502 and "loopback" in pulled.json()["detail"], pulled.text
    assert inside.hits == 0
    every = json.dumps([await source_events(http, system, evil_key, s["id"])
                        for s in (await http.get(admin(system, "sources"), headers=bearer(evil_key))).json()["sources"]],
                       ensure_ascii=False)
    assert CountingServer.SECRET.decode() not in every and CountingServer.SECRET.decode() not in pulled.text


async def handoff_webhook(http, system, site: str) -> dict:
    """A visitor of `site` asks for a person; the handoff's webhook outcome."""
    visitor = Conversation(http, system.gateway_url, site)
    asked = await visitor.say("Can I talk to a person, please?")
    assert asked.final["type"] == "complete" and asked.final["metadata"]["route"] == "HANDOFF", asked.events

    async def recorded():
        response = await http.get(f"{system.gateway_url}/v1/admin/sites/{site}/conversations/{visitor.session_id}"
                                  "/events", headers=bearer(ADMIN))
        found = [e["event"] for e in response.json()["events"] if e["type"] == "webhook_recorded"]
        return found[0] if found else None

    return await wait_for(recorded, timeout=30, what="the handoff webhook's outcome")


async def test_a_site_cannot_sign_with_another_tenants_secret_nor_probe_the_environment(system, evil_key, public,
                                                                                        http):
    errors = []
    for variable in ("DEMO_WEBHOOK_SECRET", "ADMIN_TOKEN", "NOT_SET_ANYWHERE"):
        await patch(http, system, evil_key, {"handoff": {"enabled": True, "webhook_url": f"{public.url}/hook"},
                                             "lead": {"webhook_secret_env": variable}})
        outcome = await handoff_webhook(http, system, EVIL)
        assert not outcome["ok"] and outcome["status"] is None, outcome
        errors.append(outcome["error"])
    assert public.hooks == []
    assert len(set(errors)) == 1 and f"no webhook secret for site {EVIL}" in errors[0]  # no oracle
    # Its own variable, bound to it: sent, and signed with its own secret only.
    await patch(http, system, evil_key, {"lead": {"webhook_secret_env": "EVIL_WEBHOOK_SECRET"}})
    assert (await handoff_webhook(http, system, EVIL))["ok"]
    (delivered,) = public.hooks
    assert Webhook(EVIL_SECRET).verify(delivered["body"], delivered["headers"])["site"] == EVIL
    with pytest.raises(Exception):
        Webhook(DEMO_SECRET).verify(delivered["body"], delivered["headers"])


async def test_webhooks_to_loopback_ports_are_refused_and_say_nothing_of_them(system, evil_key, inside, http):
    for target in (f"http://127.0.0.1:{system.nats_port}/", f"http://127.0.0.1:{system.redis_port}/",
                   f"http://①②⑦.0.0.1:{inside.port}/hook", "http://[::1]:9000/metrics"):
        await patch(http, system, evil_key, {"handoff": {"enabled": True, "webhook_url": target},
                                             "lead": {"webhook_secret_env": None}})
        outcome = await handoff_webhook(http, system, EVIL)
        assert not outcome["ok"] and outcome["status"] is None and outcome["attempts"] == 1, outcome
        assert outcome["error"].startswith("refused: ") and "loopback" in outcome["error"], outcome
    assert inside.hits == 0


def docx_bomb() -> bytes:
    """A 120 KB DOCX whose document.xml inflates to 120 MB."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/'
                                                'package/2006/content-types"/>')
        archive.writestr("word/document.xml", "<w:document><w:body><w:p><w:r><w:t>" + "a" * 120_000_000
                         + "</w:t></w:r></w:p></w:body></w:document>")
    return out.getvalue()


def pdf_bomb(pages: int = 40, operations: int = 120_000) -> bytes:
    """A small PDF whose every page shows one compressed content stream of many operations
    (each page's text extraction takes seconds)."""
    content = zlib.compress(b"BT /F1 12 Tf 10 10 Td (x) Tj ET\n" * operations, 9)
    objects = {1: b"<</Type/Catalog/Pages 2 0 R>>",
               2: b"<</Type/Pages/Kids[" + b" ".join(b"%d 0 R" % (10 + i) for i in range(pages))
                  + b"]/Count %d>>" % pages,
               3: b"<</Length %d/Filter/FlateDecode>>\nstream\n" % len(content) + content + b"\nendstream",
               4: b"<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>"}
    for i in range(pages):
        objects[10 + i] = (b"<</Type/Page/Parent 2 0 R/MediaBox[0 0 612 792]/Contents 3 0 R"
                           b"/Resources<</Font<</F1 4 0 R>>>>>>")
    out, offsets = bytearray(b"%PDF-1.4\n"), {}
    for number, body in objects.items():
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref, size = len(out), max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for number in range(1, size):
        out += (b"%010d 00000 n \n" % offsets[number]) if number in offsets else b"0000000000 65535 f \n"
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


DEMO_QUESTIONS = ("How much does the Pro plan cost?", "Do you integrate with Salesforce?",
                  "What is your refund policy?", "How long is the warranty?", "Is there a free trial?")


async def demo_answer(http, system, i: int) -> tuple[float, int]:
    """(seconds, sources cited) of one demo question."""
    result = await Conversation(http, system.gateway_url, DEMO).say(DEMO_QUESTIONS[i % len(DEMO_QUESTIONS)])
    assert result.final and result.final["type"] == "complete", result.events
    return result.total_s, len(result.final["metadata"].get("sources") or [])


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


async def test_a_bomb_upload_fails_once_with_why_and_the_other_sites_keep_answering(system, evil_key, heavy, http):
    before = [await demo_answer(http, system, i) for i in range(10)]
    uploads = {"report.docx": docx_bomb(), "brochure.pdf": pdf_bomb(), "page.html": b"<p>x</p>" * 800_000}
    ids = {}
    for name, data in uploads.items():
        up = await http.post(admin(system, "uploads"), params={"name": name}, headers=bearer(evil_key), content=data)
        assert up.status_code == 202, up.text
        ids[name] = up.json()["source"]
    # And a website whose robots.txt and sitemap cost more to read than a conversion may take.
    ids["website"] = await add_source(http, system, evil_key, f"http://127.0.0.1:{heavy.port}/sitemap.xml.gz")
    started, during, converting = time.monotonic(), [], True

    async def ask_meanwhile():  # the demo site's visitors, all the while the files convert
        while converting:
            during.append(await demo_answer(http, system, len(during)))

    asking = asyncio.create_task(ask_meanwhile())
    outcomes = {}
    try:
        for name, source in ids.items():
            events = await run_outcome(http, system, evil_key, source, timeout=120)
            if name == "website":
                (failed,) = [e["event"] for e in events if e["type"] == "sync_failed"]
                outcomes[name] = failed["reason"]
                continue
            (page,) = [e["event"] for e in events if e["type"] == "page_fetched"]  # once: not redelivered
            assert page["outcome"] == "failed", page
            outcomes[name] = page["reason"]
    finally:
        converting = False
        await asking
    assert "inflates to" in outcomes["report.docx"]
    assert f"not converted within {CONVERT_TIMEOUT_S} s" in outcomes["brochure.pdf"]
    assert "bytes of HTML" in outcomes["page.html"]
    assert f"the pages to fetch: not converted within {CONVERT_TIMEOUT_S} s" in outcomes["website"]
    # Every demo answer asked while the files converted was made from its sources, as before.
    assert len(during) >= 10 and all(sources > 0 for _, sources in before + during), (before, during)
    print(json.dumps({"demo_answers_during_bombs": len(during),
                      "demo_answer_p99_s_before": round(p99([s for s, _ in before]), 3),
                      "demo_answer_p99_s_during_bombs": round(p99([s for s, _ in during]), 3),
                      "bombs_failed_after_s": round(time.monotonic() - started, 1),
                      "machine_gauge_ms": machine.gauge_ms()}))


async def test_oversized_configs_and_control_characters_are_4xx(system, evil_key, http):
    from shared.site_store import MAX_CONFIG_BYTES

    for i in range(2):  # a patch that fits the request's limit, and one that grows the config past its own
        big = await http.patch(admin(system, ""), headers=bearer(evil_key),
                               json={"instructions": "x" * (MAX_CONFIG_BYTES // 2 + 10_000) * (i + 1)})
        assert big.status_code == (200 if i == 0 else 422), big.status_code
    assert f"at most {MAX_CONFIG_BYTES}" in big.json()["detail"][0]["message"]
    await patch(http, system, evil_key, {"instructions": ""})
    nul = await http.post(admin(system, "uploads"), params={"name": "a\x00.md"}, headers=bearer(evil_key),
                          content=b"# x")
    assert nul.status_code == 422 and nul.json()["detail"][0]["field"] == "name", nul.text


async def test_accounts_past_the_sites_cap_are_refused_and_listed_a_page_at_a_time(system, evil_key, http):
    from shared import accounts

    def batch(start: int, count: int) -> dict:
        return {"accounts": [{"name": f"Customer {n:05d}", "domain": f"c{n}.example", "arr": 1000 + n}
                             for n in range(start, start + count)]}

    for start in range(0, accounts.MAX_SITE_RECORDS, accounts.MAX_ACCOUNTS):
        imported = await http.post(admin(system, "accounts/import"), headers=bearer(evil_key),
                                   json=batch(start, accounts.MAX_ACCOUNTS))
        assert imported.status_code == 200, imported.text
    over = await http.post(admin(system, "accounts/import"), headers=bearer(evil_key),
                           json=batch(accounts.MAX_SITE_RECORDS, 1))
    assert over.status_code == 422 and str(accounts.MAX_SITE_RECORDS) in over.text, over.text
    again = await http.post(admin(system, "accounts/import"), headers=bearer(evil_key), json=batch(0, 10))
    assert again.status_code == 200  # what it holds may still change
    page = (await http.get(admin(system, "accounts"), params={"limit": 50, "offset": 100},
                           headers=bearer(evil_key))).json()
    assert len(page["accounts"]) == 50 and page["total"] == accounts.MAX_SITE_RECORDS and page["next_offset"] == 150
    assert page["accounts"][0]["name"] == "Customer 00100"
    assert (await http.get(admin(system, "accounts"), params={"limit": 100_000},
                           headers=bearer(evil_key))).status_code == 422


