"""Sites as data (shared/site_store.py, routes/sites.py, cli/site_data.py): a site made,
changed and deleted through the operator API and the CLI, checked as a file is (every
field's problem named), versioned in the bucket, audited in the site's log without secrets,
seen by every reader within the TTL; the files imported only when they change; the widget's
settings served to visitors and nothing else. Against real NATS (and Redis for the gateway)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib

import msgspec
import pytest

from cli.site_data import assignments
from shared import events as ev
from shared import subjects
from shared.site_config import SiteConfig, SiteConfigError, SiteConfigs, parse, validate
from shared.site_store import SiteConfigSync, SiteNotFound, SiteStore, as_data, exported, merged
from shared.toml_text import dumps
from tests import test_briefs_api
from tests.e2e import launch_chromium, needs_chromium, signed_in_admin
from tests.helpers import unique, wait_for
from tests.servers import ROOT, configure_site
from tests.test_briefs_api import ADMIN, ORIGIN, bearer, key_of

api = test_briefs_api.api  # the fixture: the gateway in process, a site and another one, each with its key
SECRET = "SECRET-INSTRUCTIONS-do-not-show"


# --- the checks, the export and the edits, without a server ---------------------------------

def test_every_problem_is_named_by_its_field():
    data = {"name": "Acme", "allowed_origins": ["https://ok.example", "https://bad.example/path"],
            "cta": {"url": "javascript:alert(1)"},
            "widget": {"primary_color": "blue", "position": "top", "avatar_url": "http://logo.example/a.png",
                       "starter_questions": ["ok?"] * 6 + ["one too many?"], "greeting": "x" * 501,
                       "launcher_text": " "}}
    with pytest.raises(SiteConfigError) as info:
        validate(data)
    fields = {e.field for e in info.value.errors}
    assert fields == {"allowed_origins[1]", "cta.url", "widget.primary_color", "widget.position", "widget.avatar_url",
                      "widget.starter_questions", "widget.greeting", "widget.launcher_text"}
    assert all(e.message for e in info.value.errors)


@pytest.mark.parametrize("data,field", [
    ({"widget": {"show_sources": "yes"}}, "widget.show_sources"),
    ({"widget": {"colour": "#fff"}}, "widget.colour"),
    ({"colour": "#fff"}, "colour"),
    ({"booking": {"fields": [{"label": "no name"}]}}, "booking.fields[0].name"),
    ({"widget": {"starter_questions": ["fine", "y" * 121]}}, "widget.starter_questions[1]"),
])
def test_a_type_error_names_its_field(data, field):
    with pytest.raises(SiteConfigError) as info:
        validate(data)
    assert [e.field for e in info.value.errors] == [field]


def test_the_export_reads_back_as_the_same_config():
    demo = parse(ROOT / "sites" / "demo.toml")
    odd = validate({**as_data(demo), "name": 'Quotes " and \\ back\\slashes é',
                    "instructions": 'Line one.\n"""three quotes"""\n\ttab \x01 control\n',
                    "widget": {"primary_color": "#0a7", "starter_questions": ["What's new?", "Pricing?"],
                               "show_sources": False, "position": "left"},
                    "retrieval": {"chunk_top_k": 4}, "booking": {"fields": []}})
    for config in (demo, odd, SiteConfig()):
        text = dumps(exported(config))
        assert validate(tomllib.loads(text)) == msgspec.structs.replace(config, version="")
    assert dumps(exported(SiteConfig())) == "\n"  # nothing chosen, nothing written


def test_a_patch_merges_tables_replaces_lists_and_null_resets():
    base = as_data(validate({"name": "Acme", "languages": ["en", "fr"], "widget": {"title": "Hi"}}))
    after = validate(merged(base, {"languages": ["de"], "widget": {"greeting": "Hello"}, "name": None}))
    assert after.languages == ["de"] and after.widget.title == "Hi" and after.widget.greeting == "Hello"
    assert after.name == ""


def test_cli_assignments_are_dotted_keys_with_toml_values():
    assert assignments(["widget.primary_color=#0a7", "cta.first_turn=3", "name=Acme Corp", 'languages=["en", "fr"]',
                        "widget.show_sources=false", "widget.greeting="]) == {
        "widget": {"primary_color": "#0a7", "show_sources": False, "greeting": ""}, "cta": {"first_turn": 3},
        "name": "Acme Corp", "languages": ["en", "fr"]}


# --- the store ---------------------------------------------------------------------------------

async def site_log(bus, site) -> list[ev.SiteChanged]:
    return [r.event for r in await bus.read(subjects.conv(site, ev.SITE_SESSION, "site_changed"))]


async def test_a_site_is_made_changed_and_deleted_with_versions_and_an_audit_without_secrets(bus):
    site, store = unique("made"), SiteStore(bus)
    digest = hashlib.sha256(b"a key").hexdigest()
    created = await store.put(site, {"name": "Acme", "instructions": SECRET, "operator_key_sha256": [digest]},
                              "admin", must_create=True)
    changed = await store.patch(site, {"widget": {"primary_color": "#0a7"}, "instructions": SECRET + "!"}, "cli:ada")
    again = await store.patch(site, {"widget": {"primary_color": "#0a7"}}, "cli:ada")
    assert again.event is None and again.config == changed.config  # the same content: no version, no event
    with pytest.raises(SiteConfigError):
        await store.patch(site, {"cta": {"url": "ftp://x"}}, "cli:ada")
    assert (await store.read(site)) == changed.config  # a refused change leaves the site as it was
    deleted = await store.delete(site, "admin")
    assert await store.read(site) is None
    with pytest.raises(SiteNotFound):
        await store.patch(site, {"name": "Gone"}, "admin")

    log = await site_log(bus, site)
    assert [(e.change, e.actor) for e in log] == [("created", "admin"), ("updated", "cli:ada"), ("deleted", "admin")]
    assert log[1].fields_changed == ["instructions", "widget.primary_color"]
    assert (log[1].previous_version, log[1].version) == (created.config.version, changed.config.version)
    assert log[2].previous_version == changed.config.version == deleted.event.previous_version
    assert all(e.session_id == ev.SITE_SESSION and e.turn == 0 for e in log)
    text = json.dumps([ev.to_builtins(e) for e in log])
    assert SECRET not in text and digest not in text  # field names only, never values

    versions = await store.versions(site)
    assert [v["deleted"] for v in versions] == [True, False, False]
    assert [v["version"] for v in versions[1:]] == [changed.config.version, created.config.version]
    assert versions[1]["change"]["actor"] == "cli:ada" and versions[1]["config"]["widget"]["primary_color"] == "#0a7"


async def test_two_writers_at_once_both_keep_their_change(bus):
    site, store = unique("race"), SiteStore(bus)
    await store.put(site, {"name": "Acme"}, "admin")
    await asyncio.gather(*(store.patch(site, {"widget": {key: value}}, "admin") for key, value in
                           (("title", "Hello"), ("greeting", "Welcome"), ("launcher_text", "Ask"),
                            ("primary_color", "#123456"))))
    widget = (await store.read(site)).widget
    assert (widget.title, widget.greeting, widget.launcher_text, widget.primary_color) == \
        ("Hello", "Welcome", "Ask", "#123456")
    assert len(await site_log(bus, site)) == 5


async def test_every_reader_sees_a_change_within_its_ttl(bus, nats_url):
    """Two readers (two replicas' SiteConfigs) with a copy cached: both serve the change once
    their copy is older than the TTL (plus the read that refreshes it)."""
    from shared.bus import connect
    from shared.config import BusConfig

    site, ttl = unique("ttl"), 0.5
    await SiteStore(bus).put(site, {"name": "Before"}, "admin")
    other = await connect(BusConfig(url=nats_url), name="test-second-replica")
    try:
        readers = [SiteConfigs(bus, ttl_s=ttl), SiteConfigs(other, ttl_s=ttl)]
        assert [(await r.get(site)).name for r in readers] == ["Before", "Before"]
        changed_at = time.monotonic()
        await SiteStore(other).patch(site, {"name": "After"}, "admin")
        for reader in readers:
            await wait_for(lambda r=reader: _named(r, site, "After"), 5, "the change read")
        assert time.monotonic() - changed_at < ttl + 1.0
    finally:
        await other.close()


async def _named(reader: SiteConfigs, site: str, name: str) -> bool:
    return (await reader.get(site)).name == name


async def test_a_file_is_imported_again_only_when_it_changes(bus, tmp_path):
    """A site edited through the API keeps its edit when the router starts again; a changed
    file wins over it; a removed file leaves a site edited since."""
    site, store = unique("file"), SiteStore(bus)
    path = tmp_path / f"{site}.toml"
    path.write_text('name = "From the file"\n')
    assert (await SiteConfigSync(bus, tmp_path).sync_once())[site] == "loaded"
    await store.patch(site, {"name": "From the API"}, "admin")

    restarted = SiteConfigSync(bus, tmp_path)  # a new router: every file read again
    assert (await restarted.sync_once())[site] == "unchanged"
    assert (await store.read(site)).name == "From the API"

    path.write_text('name = "The file, changed"\n')
    os.utime(path, ns=(1, 1))
    assert (await restarted.sync_once())[site] == "loaded"
    assert (await store.read(site)).name == "The file, changed"
    assert [e.actor for e in await site_log(bus, site)] == [f"file:{path}", "admin", f"file:{path}"]

    await store.patch(site, {"name": "Edited once more"}, "admin")
    path.unlink()
    assert (await restarted.sync_once())[site].startswith("kept")
    assert (await store.read(site)).name == "Edited once more"
    assert site in await _registered(bus)

    await store.delete(site, "admin")
    assert site not in await _registered(bus)


async def _registered(bus) -> list[str]:
    from shared.site_config import REGISTRY_KEY

    entry = await (await bus.js.key_value(subjects.SITE_CONFIG_BUCKET)).get(REGISTRY_KEY)
    return json.loads(entry.value)


# --- the operator API --------------------------------------------------------------------------

async def test_the_api_makes_changes_and_deletes_a_site_with_every_field_named(api, bus):
    client, _ = api
    site = unique("api")
    url, admin = f"/v1/admin/sites/{site}", bearer(ADMIN)
    assert (await client.get(url, headers=admin)).status_code == 404
    made = await client.put(url, headers=admin, json={"name": "Acme", "allowed_origins": [ORIGIN],
                                                      "widget": {"title": "Acme help"}})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["config"]["widget"]["title"] == "Acme help" and body["version"]
    assert body["snippet"] == f'<script src="{client.base_url}/widget.js" data-site="{site}"></script>'
    assert (await client.put(url, headers=admin, json={"name": "Acme"})).status_code == 200  # replaced

    refused = await client.patch(url, headers=admin, json={"cta": {"url": "javascript:alert(1)"},
                                                           "widget": {"primary_color": "red", "position": "up"}})
    assert refused.status_code == 422
    errors = refused.json()["errors"]
    assert {e["field"] for e in errors} == {"cta.url", "widget.primary_color", "widget.position"}
    assert refused.json()["detail"] == errors
    typed = await client.patch(url, headers=admin, json={"widget": {"starter_questions": "not a list"}})
    assert typed.status_code == 422 and typed.json()["errors"][0]["field"] == "widget.starter_questions"
    assert (await client.patch(url, headers=admin, content=b"[1]")).status_code == 422

    patched = await client.patch(url, headers=admin, json={"widget": {"primary_color": "#0a7", "greeting": "Hi!"}})
    assert patched.status_code == 200 and patched.json()["config"]["widget"]["greeting"] == "Hi!"
    versions = (await client.get(f"{url}/versions", headers=admin)).json()["versions"]
    assert [v["change"]["change"] for v in versions] == ["updated", "updated", "created"]
    assert versions[0]["change"]["fields_changed"] == ["widget.greeting", "widget.primary_color"]

    assert (await client.delete(url, headers=admin)).json() == {"site": site, "deleted": patched.json()["version"]}
    assert (await client.get(url, headers=admin)).status_code == 404
    assert (await client.delete(url, headers=admin)).status_code == 404
    log = await site_log(bus, site)
    assert [e.change for e in log] == ["created", "updated", "updated", "deleted"]
    assert {e.actor for e in log} == {"admin"}


async def test_a_site_key_reads_and_changes_only_its_own_site(api, site, bus):
    client, other = api
    own = bearer(key_of(site))
    assert (await client.get(f"/v1/admin/sites/{site}", headers=own)).status_code == 200
    changed = await client.patch(f"/v1/admin/sites/{site}", headers=own, json={"widget": {"title": "Ours"}})
    assert changed.status_code == 200
    [event] = await site_log(bus, site)
    assert event.actor == f"key:{site}:{hashlib.sha256(key_of(site).encode()).hexdigest()[:12]}"
    for method, path in (("GET", other), ("PATCH", other), ("PUT", other), ("DELETE", other),
                         ("PUT", unique("new")), ("POST", f"{other}/keys"), ("GET", f"{other}/versions")):
        answer = await client.request(method, f"/v1/admin/sites/{path}", headers=own, json={"name": "Mine now"})
        assert answer.status_code == 404, (method, path)  # another site: as if it did not exist
    assert (await client.delete(f"/v1/admin/sites/{site}", headers=own)).status_code == 403
    assert (await client.get(f"/v1/admin/sites/{other}", headers=bearer(ADMIN))).json()["config"]["name"] == ""

    made = await client.post(f"/v1/admin/sites/{site}/keys", headers=own)
    assert made.status_code == 201
    key = made.json()["key"]
    assert key.startswith(f"ck_{site}_") and made.json()["sha256"] == hashlib.sha256(key.encode()).hexdigest()
    shown = (await client.get(f"/v1/admin/sites/{site}", headers=own)).json()
    assert made.json()["sha256"] in shown["config"]["operator_key_sha256"] and key not in json.dumps(shown)
    # At once on the gateway that made it (its copy of the config dropped), not a TTL later.
    assert await _answers(client, f"/v1/admin/sites/{site}", key)
    assert key not in json.dumps([ev.to_builtins(e) for e in await site_log(bus, site)])


async def _served(client, site, origin) -> bool:
    answer = await client.get(f"/v1/sites/{site}/widget", headers={"Origin": origin})
    return answer.status_code == 200 and answer.headers.get("access-control-allow-origin") == origin


async def _answers(client, url, key) -> bool:
    return (await client.get(url, headers=bearer(key))).status_code == 200


async def test_the_widget_gets_its_settings_and_nothing_private(api, bus):
    client, _ = api
    site = unique("look")
    await SiteStore(bus).put(site, {
        "name": "Acme", "instructions": SECRET, "allowed_origins": [ORIGIN], "languages": ["en", "fr"],
        "operator_key_sha256": [hashlib.sha256(b"k").hexdigest()], "lead": {"webhook_secret_env": "ACME_SECRET"},
        "widget": {"primary_color": "#0a7", "greeting": "Bonjour!", "starter_questions": ["Pricing?"],
                   "show_sources": False, "avatar_url": "https://acme.example/logo.png", "position": "left"}},
        "admin")
    answer = await client.get(f"/v1/sites/{site}/widget", headers={"Origin": ORIGIN})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN
    assert answer.headers["cache-control"] == "public, max-age=5"
    body = answer.json()
    assert set(body) == {"site", "languages", "widget"} and body["languages"] == ["en", "fr"]
    assert body["widget"]["greeting"] == "Bonjour!" and body["widget"]["show_sources"] is False
    assert body["widget"]["position"] == "left" and body["widget"]["avatar_url"] == "https://acme.example/logo.png"
    for private in (SECRET, "ACME_SECRET", hashlib.sha256(b"k").hexdigest(), "operator_key", "instructions"):
        assert private not in answer.text
    # A site that sets no greeting still greets (issue 53: never an empty panel), in its first language.
    quiet = unique("quiet")
    await SiteStore(bus).put(quiet, {"name": "Gridline", "languages": ["fr-CA", "en"], "allowed_origins": [ORIGIN]},
                             "admin")
    greeted = (await client.get(f"/v1/sites/{quiet}/widget", headers={"Origin": ORIGIN})).json()["widget"]
    assert greeted["greeting"] == "Bonjour ! Posez-moi vos questions sur Gridline."
    assert (await client.get(f"/v1/sites/{unique('nosuch')}/widget")).status_code == 404
    assert (await client.get("/v1/sites/%0A%C3%B6%3D/widget")).status_code == 422  # not a site id: never a key
    assert (await client.get(f"/v1/sites/{site}/widget", headers={"Origin": "https://evil.example"})).status_code == 403


# --- the CLI -----------------------------------------------------------------------------------

def sites_cli(nats_url, *args):
    return subprocess.run([sys.executable, "-m", "cli", "sites", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "NATS_URL": nats_url}, timeout=60)


async def test_the_install_check_finds_the_snippet_on_the_sites_page_and_names_each_problem(
        nats_url, redis_url, site, monkeypatch):
    """"Check installation": the page is fetched through the outbound guard (its address let
    through here, as a deployment would with OUTBOUND_ALLOWED), and the answer says whether it
    embeds this site's widget on an origin the site allows, each problem in words."""
    import httpx

    from shared.web import Outbound
    from tests.test_turn_end import running_gateway
    from tests.website import Website

    with Website() as website:
        await configure_site(nats_url, site, allowed_origins=[website.url])
        other = unique("other")
        await configure_site(nats_url, other, allowed_origins=["https://elsewhere.example"])
        outbound = Outbound(allowed=(f"127.0.0.1:{website.port}",))
        async with running_gateway(nats_url, redis_url, monkeypatch, admin_token=ADMIN, outbound=outbound) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=bearer(ADMIN)) as client:
                async def check(for_site, page=f"{website.url}/embed.html"):
                    return await client.post(f"/v1/admin/sites/{for_site}/install-check", json={"url": page})

                snippet = (await client.get(f"/v1/admin/sites/{site}")).json()["snippet"]
                answer = (await check(site)).json()
                assert not answer["ok"] and not answer["installed"], answer
                assert answer["problems"] == ["the page has no widget script: paste the snippet before </body>"]
                website.embed = snippet
                answer = (await check(site)).json()
                assert answer["ok"] and answer["installed"] and answer["origin_allowed"], answer
                assert answer["status"] == 200 and answer["origin"] == website.url and answer["problems"] == []
                answer = (await check(other)).json()  # the page embeds another site's widget
                assert not answer["ok"] and answer["widget_site"] == site, answer
                assert answer["problems"][0] == f"the widget on the page is for site {site!r}, not {other!r}"
                assert "is not among the site's allowed origins" in answer["problems"][1]
                answer = (await check(site, f"{website.url}/missing")).json()
                assert answer["problems"] == ["the page answered HTTP 404"], answer
                port = website.port
                refused = (await check(site, f"http://127.0.0.1:{port + 1}/")).json()  # not let through
                assert refused["problems"][0].startswith("refused: "), refused
                bad = await check(site, "javascript:alert(1)")
                assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "url", bad.text
                assert (await check(unique("nosite"))).status_code == 404
                assert (await client.post(f"/v1/admin/sites/{site}/install-check", content=b"{",
                                          headers={"Content-Type": "application/json"})).status_code == 422
                # A few a minute per site: the deployment is no fetcher of other people's pages.
                # (21 more: however a minute's boundary splits them, one window has too many.)
                answers = [(await check(site)).status_code for _ in range(21)]
                assert answers.count(429) >= 1 and answers[0] == 200, answers
                assert (await check(other)).status_code == 200  # another site counts apart


async def test_the_cli_adds_sets_shows_exports_and_deletes(nats_url, bus, tmp_path):
    site = unique("cli")
    added = sites_cli(nats_url, "add", "--site", site, "--name", "Acme", "--origin", "https://acme.example")
    assert added.returncode == 0 and f"created site {site}" in added.stdout, added.stderr
    assert sites_cli(nats_url, "add", "--site", site, "--name", "Twice").returncode == 1

    changed = sites_cli(nats_url, "set", "--site", site, "widget.primary_color=#0a7", "cta.first_turn=3",
                        'widget.starter_questions=["Pricing?", "Integrations?"]', "widget.title=Acme help desk")
    assert changed.returncode == 0, changed.stderr
    assert "cta.first_turn, widget.primary_color, widget.starter_questions, widget.title" in changed.stdout
    refused = sites_cli(nats_url, "set", "--site", site, "widget.primary_color=teal", "cta.url=ftp://x")
    assert refused.returncode == 1
    assert "widget.primary_color: must be a hex colour" in refused.stderr and "cta.url:" in refused.stderr
    patch = tmp_path / "patch.toml"
    patch.write_text('[widget]\ngreeting = "Hello there"\n')
    assert sites_cli(nats_url, "set", "--site", site, "--file", str(patch)).returncode == 0

    stored = await SiteStore(bus).read(site)
    shown = sites_cli(nats_url, "show", "--site", site)
    assert shown.returncode == 0 and validate(tomllib.loads(shown.stdout)) == msgspec.structs.replace(stored, version="")
    exported_text = sites_cli(nats_url, "export", "--site", site).stdout
    (tmp_path / f"{site}.toml").write_text(exported_text)
    assert msgspec.structs.replace(parse(tmp_path / f"{site}.toml"), version="") == \
        msgspec.structs.replace(stored, version="")
    assert "[widget]" in exported_text and "operator_key_sha256" not in exported_text  # defaults left out

    versions = sites_cli(nats_url, "show", "--site", site, "--versions")
    assert versions.returncode == 0 and len(versions.stdout.splitlines()) == 3 and "by cli:" in versions.stdout
    assert sites_cli(nats_url, "delete", "--site", site).returncode == 0
    assert sites_cli(nats_url, "show", "--site", site).returncode == 1
    assert [e.change for e in await site_log(bus, site)] == ["created", "updated", "updated", "deleted"]


# --- the operator UI's Site view and the widget, in headless Chromium ---------------------------

@needs_chromium
async def test_the_site_view_makes_a_site_whose_widget_takes_its_look(api):
    """/admin: a new site's form, a field's error shown beside it, the preview following the
    edits, the snippet; then a page of the site embedding the snippet shows the saved look."""
    from playwright.async_api import async_playwright

    client, _ = api
    base, site = str(client.base_url), unique("ui")
    shop_page = _page_server(lambda: f"<!doctype html><html><body><h1>Acme</h1>{snippet}</body></html>")
    page_origin, snippet = f"http://127.0.0.1:{shop_page.server_port}", ""
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await signed_in_admin(page, base, ADMIN)
            await page.fill("#site", site)
            await page.click("#siteSettings")
            await page.wait_for_selector("#siteState:has-text('No site')")
            await page.fill("#site-name", "Acme")
            await page.fill("#site-allowed_origins", page_origin)
            await page.fill("#site-widget-primary_color", "teal")
            await page.fill("#site-widget-greeting", "Bonjour! Ask me anything.")
            await page.fill("#site-widget-starter_questions", "What does it cost?\nDo you integrate with Xero?")
            await page.click("#siteSave")
            error = page.locator(".field[data-field='widget.primary_color'] .field-error")
            await error.wait_for()
            assert "hex colour" in await error.text_content()
            assert (await client.get(f"/v1/admin/sites/{site}", headers=bearer(ADMIN))).status_code == 404

            await page.fill("#site-widget-primary_color", "#0a7755")
            preview = page.frame_locator("#sitePreview")
            launcher = preview.locator("[data-testid=cw-launch]")
            await page.wait_for_function("""() => {
                const b = document.querySelector('#sitePreview').contentDocument.querySelector('[data-testid=cw-launch]');
                return b && getComputedStyle(b).backgroundColor === 'rgb(10, 119, 85)';
            }""", timeout=10000)
            assert await preview.locator("[data-testid=cw-greeting]").text_content() == "Bonjour! Ask me anything."
            assert await launcher.count() == 1
            await page.click("#siteSave")
            await page.wait_for_selector("#status:has-text('site created')")
            snippet = await page.text_content("#siteSnippet")
            assert snippet == f'<script src="{base}/widget.js" data-site="{site}"></script>'
            assert (await client.get(f"/v1/admin/sites/{site}", headers=bearer(ADMIN))).json()["config"]["widget"][
                "primary_color"] == "#0a7755"

            # The gateway's copy of the site is refreshed within SITE_CONFIG_TTL_S of its creation.
            await wait_for(lambda: _served(client, site, page_origin), 10, "the new site served to its pages")
            shop = await browser.new_page()
            await shop.goto(f"{page_origin}/")
            launch = shop.locator("[data-testid=cw-launch]")
            await shop.wait_for_function(
                "() => { const b = document.querySelector('[data-testid=cw-launch]');"
                " return b && getComputedStyle(b).backgroundColor === 'rgb(10, 119, 85)'; }", timeout=10000)
            await launch.click()
            assert await shop.locator("[data-testid=cw-greeting]").text_content() == "Bonjour! Ask me anything."
            assert await shop.locator("[data-testid=cw-starters] button").all_text_contents() == \
                ["What does it cost?", "Do you integrate with Xero?"]
        finally:
            await browser.close()
            shop_page.shutdown()


def _page_server(body):
    """A page of the site on an origin of its own (loopback: Chromium lets no public page load
    a script from a private address), its HTML `body()` when asked."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            data = body().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_sites_log_is_no_turn_a_replay_compares():
    """`concierge replay verify` reruns every log of a site, its `_site` log too: no input,
    nothing rerun, and no divergence."""
    from cli.replay.diff import diff

    change = ev.SiteChanged(event_id=ev.new_id(), site="s", session_id=ev.SITE_SESSION, turn=0, ts=1.0,
                            change="created", version="v1", actor="admin")
    assert diff([change], []) == []


@needs_chromium
async def test_the_console_signs_in_with_a_key_once_and_keeps_no_secret_in_the_page(api):
    """/admin opens on its sign-in page; a wrong key is refused there; a site key signs in
    once (the operator's name shown, the site fixed to theirs, another site's view 404) and
    nothing the page can read holds the key or the session; sign-out comes back to the
    sign-in page, and a reload stays there."""
    from playwright.async_api import async_playwright

    client, other = api
    base = str(client.base_url)
    site = unique("signin")
    assert (await client.put(f"/v1/admin/sites/{site}", headers=bearer(ADMIN), json={
        "name": "Signin Co", "allowed_origins": [ORIGIN]})).status_code in (200, 201)
    key = (await client.post(f"/v1/admin/sites/{site}/keys", headers=bearer(ADMIN))).json()["key"]
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{base}/admin")
            await page.wait_for_selector("#signIn", state="visible")
            await page.fill("#signInKey", "ck_nobody_notakey")
            await page.click("#signInButton")
            await page.wait_for_selector("#signInError:has-text('not one of this deployment')")
            await page.fill("#signInKey", key)
            await page.press("#signInKey", "Enter")
            await page.wait_for_selector("#signIn", state="hidden")
            assert await page.text_content("#who") == f"{site} key ({site})"
            assert await page.input_value("#site") == site and await page.eval_on_selector("#site", "e => e.readOnly")
            await page.click("#siteSettings")
            await page.wait_for_selector(f"#siteWhich:has-text('{site}')")
            # The sidebar marks the view and the address names it: a reload comes back to it.
            assert page.url.endswith(f"#/sites/{site}/settings")
            assert await page.get_attribute("#siteSettings", "aria-current") == "page"
            await page.reload()
            await page.wait_for_selector(f"#siteWhich:has-text('{site}')")
            assert await page.is_hidden("#signIn") and await page.is_hidden("#conversationsView")
            kept = await page.evaluate("() => JSON.stringify({...sessionStorage}) + JSON.stringify({...localStorage})"
                                       " + document.cookie")
            assert key not in kept and "concierge_console" not in kept, kept  # HttpOnly: not for scripts
            # Another site, typed past the read-only box by a script: its API answers 404.
            answer = await page.evaluate(f"""async () => (await fetch("/v1/admin/sites/{other}",
                                             {{headers: {{"X-Concierge-Console": "1"}}}})).status""")
            assert answer == 404
            await page.click("#signOut")
            await page.wait_for_selector("#signIn", state="visible")
            await page.reload()
            await page.wait_for_selector("#signIn", state="visible")
            assert await page.text_content("#who") == ""
        finally:
            await browser.close()
