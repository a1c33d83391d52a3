"""The widget in headless Chromium (Debian's, through playwright-core) on the demo page,
with the whole system running as processes (tests/e2e.py): a streamed answer with its
sources and follow-ups, markdown rendered and HTML never, an answer resumed after a reload
or a dropped connection, a message sent again after a try that failed in transit, a handoff to
an operator and back; and a site owner onboarding in /admin (a site, its website synced, its
widget embedded); an operator reading the Insight view and answering a knowledge gap from it;
an operator answering a visitor who asked for a person from the Inbox view; an account manager
ranking accounts, writing their reports and editing one from the Accounts view."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import re
import uuid

from tests import e2e
from tests.e2e import (SLOW_ANSWER, ask_in_a_fresh_widget, events_of, launch_chromium, needs_chromium, open_admin,
                       operator_url, ops, signed_in_admin, tab_to, timeline_shown, type_into)
from tests.helpers import wait_for
from tests.servers import ROOT

system, http = e2e.system, e2e.http  # the fixtures (tests/e2e.py)


@needs_chromium
async def test_browser_asks_sees_streamed_answer_sources_and_follow_up(system, llm, suggestions_llm):
    """The demo page in headless Chromium: ask, see the streamed answer with its sources and
    follow-ups, click a follow-up, get a second answer; a screenshot is kept in artifacts/."""
    from playwright.async_api import async_playwright

    llm.clear(), suggestions_llm.clear()
    llm.fail_next({"reply": "Tidewise connects to QuickBooks Online and Xero [1], and to Salesforce and HubSpot [2].",
                   "inter_token_ms": 30},
                  {"reply": "Yes: Tidewise Mobile works offline and syncs when back online [1]."})
    suggestions_llm.fail_next({"reply": json.dumps({"suggestions": ["Does the mobile app work offline?",
                                                                    "How much does the Growth plan cost?"]})},
                              {"reply": json.dumps({"suggestions": ["Is there a free trial?"]})})
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            await page.goto(system.gateway_url + "/")
            await page.click("[data-testid=cw-launch]")
            # The demo site greets in its own words, with its starter questions (issue 53).
            greeting = page.locator("[data-testid=cw-greeting]")
            await greeting.wait_for(timeout=10000)
            assert (await greeting.text_content()).startswith("Hi! I'm Tidewise's assistant.")
            assert await page.locator("[data-testid=cw-starters] button").all_text_contents() == [
                "How much does Tidewise cost?", "Does the mobile app work offline?",
                "Which accounting tools do you integrate with?"]
            await page.fill("[data-testid=cw-input]", "What integrations do you offer?")
            bot = page.locator("[data-testid=cw-bot]").first
            # Every text the answer bubble showed, as it changed.
            await page.evaluate("""() => {
                window.seen = [];
                new MutationObserver(() => {
                    const b = document.querySelector('[data-testid=cw-bot]');
                    if (b && window.seen[window.seen.length - 1] !== b.textContent) window.seen.push(b.textContent);
                }).observe(document.querySelector('[data-testid=cw-log]'), {childList: true, subtree: true, characterData: true});
            }""")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_selector("[data-testid=cw-follow-ups] button", timeout=30000)
            # Streamed: the bubble showed part of the answer before the whole of it.
            seen = await page.evaluate("window.seen")
            assert any("QuickBooks" in t and "HubSpot" not in t for t in seen), seen
            assert "HubSpot" in await bot.text_content()
            cite = bot.locator("a.cw-cite").first
            assert (await cite.text_content()) == "[1]" and (await cite.get_attribute("href")).startswith("https://")
            sources = await page.locator("[data-testid=cw-sources] a").all_text_contents()
            assert sources and any("Integrations" in s for s in sources)
            await page.locator("[data-testid=cw-follow-ups] button", has_text="offline").click()
            await page.wait_for_function(
                "() => document.querySelectorAll('[data-testid=cw-bot]').length === 2 &&"
                " document.querySelectorAll('[data-testid=cw-bot]')[1].textContent.includes('works offline')",
                timeout=30000)
            await page.screenshot(path=str(artifacts / "browser-chat.png"))
            # A reload resumes the conversation from the session id and token kept in the browser
            # (read back from the visitor endpoint), and the next question continues it.
            await page.reload()
            await page.wait_for_function("() => document.querySelectorAll('.cw-msg').length >= 4", timeout=30000)
            await page.fill("[data-testid=cw-input]", "And the price?")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_function(
                "() => [...document.querySelectorAll('[data-testid=cw-bot]')].some("
                "b => b.textContent.includes('I have 4 earlier messages'))", timeout=30000)
        finally:
            await browser.close()


@needs_chromium
async def test_browser_renders_the_answers_markdown_and_never_its_html(system, llm, suggestions_llm):
    """A list, bold, an https link and a citation become elements, while the answer streams
    and after; a javascript: link stays text and an <img> tag from the model stays text."""
    from playwright.async_api import async_playwright

    llm.clear(), suggestions_llm.clear()
    llm.fail_next({"reply": "Two things:\n- **Scheduling**: drag and drop [1]\n"
                            "- see [pricing](https://tidewise.example/pricing)\n\n"
                            "Also [run me](javascript:alert(1)) and [this](javascript:void) "
                            "<img src=x onerror=alert(1)>", "inter_token_ms": 20})
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), asyncio.ensure_future(d.dismiss())))
            await ask_in_a_fresh_widget(page, system.gateway_url, "How does scheduling work?")
            bot = page.locator("[data-testid=cw-bot]").last
            # While streaming, the list is already a list.
            await page.wait_for_selector("[data-testid=cw-bot] ul > li > strong", timeout=30000)
            await page.wait_for_function(
                "() => [...document.querySelectorAll('[data-testid=cw-bot]')].pop().textContent.includes('onerror')",
                timeout=30000)
            assert await bot.locator("ul > li").count() == 2
            assert await bot.locator("ul > li > strong").first.text_content() == "Scheduling"
            link = bot.locator("a", has_text="pricing")
            assert await link.get_attribute("href") == "https://tidewise.example/pricing"
            assert await bot.locator("a.cw-cite").first.text_content() == "[1]"
            hrefs = await bot.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
            assert all(h.startswith("https://") for h in hrefs), hrefs
            assert await bot.locator("a", has_text="run me").count() == 0
            assert await bot.locator("a", has_text="this").count() == 0
            assert await page.locator("[data-testid=cw-log] img").count() == 0
            assert "<img src=x onerror=alert(1)>" in await bot.text_content()
            assert dialogs == []
        finally:
            await browser.close()


@needs_chromium
async def test_browser_links_a_citation_only_to_an_http_source(system):
    """A source's URL is the site's data (a text source's title, a PDF's /Title): a
    `javascript:` one cites as plain text, never as a link; an https one links. The turn's
    stream is the server's frames, served by the browser's own route (no model involved)."""
    from playwright.async_api import async_playwright

    sources = [{"n": 1, "url": "javascript:alert(document.domain)//", "title": "javascript:alert(1)//",
                "document_type": "chunk"},
               {"n": 2, "url": "https://tidewise.example/guide", "title": "Guide", "document_type": "chunk"}]
    frames = [{"type": "start", "session_id": "s-cite", "turn": 1, "session_token": "t"},
              {"type": "sources", "sources": sources},
              {"type": "token", "content": "Read this [1] and that [2]."},
              {"type": "complete", "session_id": "s-cite", "turn": 1, "session_token": "t",
               "metadata": {"route": "ANSWER", "sources": sources}}]
    stream = "".join(f"id: 1:{i}\ndata: {json.dumps(f)}\n\n" for i, f in enumerate(frames))
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), asyncio.ensure_future(d.dismiss())))
            await page.route("**/v1/chat", lambda route: route.fulfill(
                status=200, headers={"Content-Type": "text/event-stream"}, body=stream))
            await ask_in_a_fresh_widget(page, system.gateway_url, "Where is the guide?")
            bot = page.locator("[data-testid=cw-bot]").last
            await page.wait_for_selector("[data-testid=cw-bot] .cw-cite >> nth=1", timeout=30000)
            cites = await bot.locator(".cw-cite").evaluate_all(
                "cs => cs.map(c => [c.tagName, c.getAttribute('href'), c.textContent])")
            assert cites == [["SPAN", None, "[1]"], ["A", "https://tidewise.example/guide", "[2]"]], cites
            hrefs = await page.locator("[data-testid=cw-log] a").evaluate_all("as => as.map(a => a.href)")
            assert not [h for h in hrefs if not h.startswith("https://")], hrefs
            assert dialogs == []
        finally:
            await browser.close()


@needs_chromium
async def test_browser_resumes_the_answer_after_a_reload_and_a_dropped_connection(system, llm, suggestions_llm):
    """Reload the page in the middle of a long answer and read the rest of it, once; then lose
    the network mid-answer and still read one whole answer."""
    from playwright.async_api import async_playwright

    llm.clear(), suggestions_llm.clear()
    llm.fail_next({"reply": SLOW_ANSWER, "inter_token_ms": 120}, {"reply": SLOW_ANSWER, "inter_token_ms": 120})
    last_bot = "[...document.querySelectorAll('[data-testid=cw-bot]')].pop()"
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            context = await browser.new_context()
            page = await context.new_page()
            resumed = []
            page.on("request", lambda r: resumed.append(r.url) if "/stream" in r.url else None)
            await ask_in_a_fresh_widget(page, system.gateway_url, "What does Tidewise do?")
            await page.wait_for_function(f"() => {last_bot}?.textContent.includes('routes')", timeout=30000)
            streaming = json.loads(await page.evaluate("localStorage.getItem('concierge:demo:stream')"))
            assert streaming["turn"] == 1 and streaming["last"].startswith("1:"), streaming
            await page.reload()
            await page.wait_for_function(f"() => {last_bot}?.textContent.includes('one bill.')", timeout=30000)
            assert await page.locator("[data-testid=cw-bot]").count() == 1
            assert await page.locator("[data-testid=cw-bot]").last.text_content() == SLOW_ANSWER
            assert await page.locator(".cw-user").all_text_contents() == ["What does Tidewise do?"]
            # Cleared on `complete`, which follows the last token.
            await page.wait_for_function("() => localStorage.getItem('concierge:demo:stream') === null", timeout=10000)

            # The network drops the next answer's stream after a few chunks (the page's fetch
            # sees a network error, as when Wi-Fi goes): the widget resumes after its last frame.
            await page.evaluate("""() => {
                const real = window.fetch;
                window.fetch = (url, init) => real(url, init).then(resp => {
                    if (!String(url).endsWith('/v1/chat')) return resp;
                    const reader = resp.body.getReader();
                    let chunks = 0;
                    const body = new ReadableStream({pull(c) {
                        return reader.read().then(({done, value}) => {
                            if (done) return c.close();
                            if (++chunks > 8) { reader.cancel(); return c.error(new TypeError('network error')); }
                            c.enqueue(value);
                        });
                    }});
                    return new Response(body, {status: resp.status, headers: resp.headers});
                });
            }""")
            await page.fill("[data-testid=cw-input]", "Tell me again")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_function(
                "() => document.querySelectorAll('[data-testid=cw-bot]').length === 2 &&"
                f" {last_bot}.textContent.includes('one bill.')", timeout=30000)
            assert await page.locator("[data-testid=cw-bot]").last.text_content() == SLOW_ANSWER
            assert await page.locator(".cw-error").count() == 0
            assert [u.rsplit("/turns/", 1)[1] for u in resumed] == ["1/stream", "2/stream"], resumed
        finally:
            await browser.close()


@needs_chromium
async def test_browser_sends_a_message_again_when_its_try_fails_before_the_turn_streams(system, llm, suggestions_llm,
                                                                                        http):
    """A try whose connection drops before any frame (the gateway stored the turn, then died)
    is sent again with the same client_message_id: the visitor reads that turn's answer, and
    the log has one turn for the message. A try that never reached the gateway is sent again
    and answered. No error shown either time."""
    from playwright.async_api import async_playwright

    llm.clear(), suggestions_llm.clear()
    bots = "document.querySelectorAll('[data-testid=cw-bot]')"
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page()
            sent = []
            page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/v1/chat") else None)
            await ask_in_a_fresh_widget(page, system.gateway_url, "Hello there")
            await page.wait_for_function(f"() => {bots}.length === 1 && !!localStorage.getItem('concierge:demo:token')"
                                         " && !document.querySelector('[data-testid=cw-input]').disabled"
                                         " && !document.querySelector('.cw-form button').disabled", timeout=30000)
            # The next try: 'cut' lets the request through, then its stream fails before any
            # frame; 'lost' fails it before it leaves the page.
            await page.evaluate("""() => {
                const real = window.fetch;
                window.fetch = (url, init) => {
                    const mode = window.__fail;
                    if (!String(url).endsWith('/v1/chat') || !mode) return real(url, init);
                    window.__fail = null;
                    if (mode === 'lost') return Promise.reject(new TypeError('network error'));
                    return real(url, init).then(resp => {
                        resp.body.cancel();
                        const body = new ReadableStream({start(c) { c.error(new TypeError('network error')); }});
                        return new Response(body, {status: resp.status, headers: resp.headers});
                    });
                };
            }""")
            for mode, message, count in (("cut", "Do you integrate with Xero?", 2), ("lost", "And with Sage?", 3)):
                await page.evaluate(f"window.__fail = '{mode}'")
                await page.fill("[data-testid=cw-input]", message)
                await page.press("[data-testid=cw-input]", "Enter")
                await page.wait_for_function(
                    f"() => {bots}.length === {count} && [...{bots}].pop().textContent.includes('You said: {message}')"
                    " && !document.querySelector('.cw-form button').disabled", timeout=30000)
            assert await page.locator(".cw-error").count() == 0
            session = await page.evaluate("localStorage.getItem('concierge:demo:session')")
        finally:
            await browser.close()
    cut = [b for b in sent if b["message"] == "Do you integrate with Xero?"]
    assert len(cut) == 2 and cut[0]["client_message_id"] == cut[1]["client_message_id"], cut
    assert len({b["client_message_id"] for b in sent}) == 3
    requested = [e["event"] for e in await events_of(http, system, "demo", session) if e["type"] == "turn_requested"]
    assert [(e["turn"], e["message"]) for e in requested] == [
        (1, "Hello there"), (2, "Do you integrate with Xero?"), (3, "And with Sage?")]


@needs_chromium
async def test_browser_votes_down_on_an_answer_and_says_why(system, llm, suggestions_llm, http):
    """Thumbs down under an answer, a reason typed and sent: the buttons say which vote is
    pressed, and the conversation's log has the turn's latest FeedbackGiven with the reason.
    After a reload the answer has its buttons again, the stored vote pressed."""
    from playwright.async_api import async_playwright

    llm.clear(), suggestions_llm.clear()
    reason = "It did not name the accounting tools."
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            await ask_in_a_fresh_widget(page, system.gateway_url, "What integrations do you offer?")
            up, down = page.locator("[data-testid=cw-vote-up]"), page.locator("[data-testid=cw-vote-down]")
            await down.wait_for(timeout=30000)
            assert (await up.get_attribute("aria-label"), await down.get_attribute("aria-label")) == (
                "Helpful", "Not helpful")
            assert await down.get_attribute("aria-pressed") == "false"
            await down.click()
            await page.fill("[data-testid=cw-reason]", reason)
            (ROOT / "artifacts").mkdir(exist_ok=True)
            await page.screenshot(path=str(ROOT / "artifacts" / "browser-vote.png"))
            await page.click("[data-testid=cw-reason-send]")
            await page.wait_for_selector("[data-testid=cw-reason]", state="detached", timeout=10000)
            assert (await down.get_attribute("aria-pressed"), await up.get_attribute("aria-pressed")) == (
                "true", "false")
            assert await page.text_content("[data-testid=cw-vote-status]") == "Thanks for your feedback."
            session = await page.evaluate("localStorage.getItem('concierge:demo:session')")
            await page.reload()
            await page.wait_for_selector("[data-testid=cw-vote-down]", timeout=30000)
            assert await page.locator("[data-testid=cw-vote]").count() == 1
            assert await page.locator("[data-testid=cw-vote-down]").get_attribute("aria-pressed") == "true"
            assert await page.locator("[data-testid=cw-vote-up]").get_attribute("aria-pressed") == "false"

            # Counted in /admin: Insight's "rated down" lists the conversation, with the reason's turn.
            admin = await open_admin(browser, system, "demo", "insight")
            down_figure = admin.locator("#insightFigures [data-figure=feedback_down]")
            await down_figure.wait_for(timeout=120000)
            row = admin.locator(f"#insightConversations .row[data-session='{session}']")
            for _ in range(20):  # the projector stores the vote as it is delivered: reload until it is in
                await admin.click("#insight")
                try:  # the figure is a disabled button while it counts none
                    await admin.wait_for_selector("#insightFigures [data-figure=feedback_down]:not([disabled])",
                                                  timeout=1500)
                    await down_figure.click()
                    await row.wait_for(timeout=1500)
                    break
                except Exception:  # noqa: BLE001 - not projected yet
                    continue
            assert int(await down_figure.locator(".value").text_content()) >= 1
            assert "What integrations do you offer?" in await row.text_content()
            assert admin.url.endswith("#/sites/demo/insight")
            assert await admin.get_attribute("#insight", "aria-current") == "page"

            # A deep link to the conversation survives a reload (the session cookie signed in).
            # Opening it never rewrites the address to the view's without the conversation, not
            # even for a moment: a reload in that moment would lose it (seen in CI).
            await admin.evaluate("""() => { window.addresses = [];
                const replace = history.replaceState.bind(history);
                history.replaceState = (state, title, url) => { window.addresses.push(String(url)); replace(state, title, url); };
            }""")
            await admin.goto(f"{system.gateway_url}/admin#/sites/demo/conversations/{session}")
            await admin.wait_for_function("document.querySelector('#which').textContent.length > 0")
            assert all(a.endswith(f"/conversations/{session}") for a in await admin.evaluate("window.addresses"))
            await admin.reload()
            await timeline_shown(admin)
            assert await admin.text_content("#which") == session
            assert not await admin.locator("#conversationsView").is_hidden()
            assert await admin.get_attribute("#load", "aria-current") == "page"
        finally:
            await browser.close()
    votes = [e["event"] for e in await events_of(http, system, "demo", session) if e["type"] == "feedback_given"]
    # The thumbs-down is stored as it is clicked, then again with its reason: the latest counts.
    assert [(v["turn"], v["rating"], v["reason"]) for v in votes] == [(1, "down", ""), (1, "down", reason)]


@needs_chromium
async def widget_page(browser, system, site: str, message: str, before: str = ""):
    """A page embedding the site's widget (on the gateway's own origin: a site's origins need
    not list it; `before`: the page's own script ahead of it), whose visitor opened it and sent
    `message`."""
    page_url = f"{system.gateway_url}/page-{site}.html"
    html = (f'<!doctype html><html><body><script>{before}</script>'
            f'<script src="/widget.js" data-site="{site}"></script></body></html>')
    page = await browser.new_page(viewport={"width": 1200, "height": 800})
    await page.route(page_url, lambda route: route.fulfill(content_type="text/html", body=html))
    await page.goto(page_url)
    await page.click("[data-testid=cw-launch]")
    await page.fill("[data-testid=cw-input]", message)
    await page.press("[data-testid=cw-input]", "Enter")
    return page


async def asked_for_a_person(browser, system, site: str):
    return await widget_page(browser, system, site, "Can I talk to a person?")


async def test_the_widget_sends_what_the_site_knows_of_the_visitor_and_the_enricher_uses_it(system, http):
    """Issue 43's first step: the site's page sets `window.ConciergeIdentity`; each message
    carries what is valid of it (an invalid e-mail hash and an unknown key are left out, so the
    message still goes), the page without its query string; the reveal names the company."""
    from playwright.async_api import async_playwright

    from tests.servers import configure_site

    site = f"id{uuid.uuid4().hex[:8]}"
    await configure_site(system.nats_url, site, name="Acme")
    digest = hashlib.sha256(b"ada@initech.example").hexdigest()
    identity = ("window.ConciergeIdentity = function () { return {reveal: {company: 'Initech', domain: "
                "'initech.example', nested: {no: 1}}, person_id: 'crm-0042', email_hash: '" + digest + "', "
                "password: 'never sent'}; };")
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await widget_page(browser, system, site, "What does it cost?", before=identity)
            await page.locator("[data-testid=cw-bot]").first.wait_for(timeout=30000)
            await page.wait_for_function("() => !document.querySelector('.cw-form button').disabled", timeout=30000)
            session = await page.evaluate(f"localStorage.getItem('concierge:{site}:session')")
            await page.evaluate("window.ConciergeIdentity = () => ({email_hash: 'not a hash'})")
            await page.fill("[data-testid=cw-input]", "And for 40 people?")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_function("() => document.querySelectorAll('[data-testid=cw-bot]').length === 2",
                                         timeout=30000)
        finally:
            await browser.close()

    async def enriched():
        events = await events_of(http, system, site, session)
        done = [e["event"] for e in events if e["type"] == "enrichment_completed" and e["event"]["turn"] == 1]
        return (events, done) if done else None

    events, done = await wait_for(enriched, timeout=20, what="turn 1 enriched")
    visitors = [e["event"]["visitor"] for e in events if e["type"] == "turn_requested"]
    assert visitors[0] == {"reveal": {"company": "Initech", "domain": "initech.example"}, "person_id": "crm-0042",
                           "email_hash": digest, "page_url": f"{system.gateway_url}/page-{site}.html"}
    assert visitors[1] == {"page_url": f"{system.gateway_url}/page-{site}.html"}  # the bad hash left out
    assert done[0]["profile"]["company_name"] == "Initech"


async def test_browser_handoff_an_operator_answers_then_the_assistant_again(system, llm, suggestions_llm, http):
    """Issue 42 in the widget: on a site that takes handoffs, asking for a person shows the
    waiting message and a status line; the operator's arrival and message come over the live
    channel (a bubble with their name, no votes); a message written while held shows no answer;
    after a reload the operator's message is still there and the channel listens again; handed
    back, the AI answers."""
    from playwright.async_api import async_playwright

    from shared.site_config import Handoff
    from tests.servers import configure_site

    site = f"h{uuid.uuid4().hex[:10]}"
    await configure_site(system.nats_url, site, name="Acme", handoff=Handoff(enabled=True))
    llm.clear(), suggestions_llm.clear()
    status = "[data-testid=cw-handoff-status]"
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await asked_for_a_person(browser, system, site)
            await page.wait_for_function("() => [...document.querySelectorAll('[data-testid=cw-bot]')].some("
                                         "b => b.textContent.includes('connecting you with the Acme team'))",
                                         timeout=30000)
            await page.wait_for_function(f"() => document.querySelector('{status}').textContent === "
                                         "'Connecting you with the team…'", timeout=10000)
            assert await page.get_attribute(status, "aria-live") == "polite"
            session = await page.evaluate(f"localStorage.getItem('concierge:{site}:session')")

            handoff = operator_url(system, site, f"handoffs/{session}")
            claimed = await http.post(f"{handoff}/claim", json={"operator": "Grace"}, headers=ops(system))
            assert claimed.status_code == 201, claimed.text
            await page.locator("[data-testid=cw-handoff-event]", has_text="Grace joined the conversation").wait_for(
                timeout=15000)
            sent = await http.post(f"{handoff}/messages", json={"operator": "Grace", "text": "Hi, Grace from sales: "
                                                                "40 technicians is our Pro plan."}, headers=ops(system))
            assert sent.status_code in (200, 201), sent.text
            operator = page.locator("[data-testid=cw-operator]")
            await operator.wait_for(timeout=15000)
            assert "Grace" in await operator.locator(".cw-operator-name").text_content()
            assert "Pro plan" in await operator.text_content()
            assert await page.locator("[data-testid=cw-vote]").count() == 0

            # Written while held: the turn ends with no answer, and no empty bubble is left.
            await page.fill("[data-testid=cw-input]", "Great, and for 60?")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_function("() => document.querySelectorAll('.cw-user').length === 2 && "
                                         "!document.querySelector('.cw-form button').disabled", timeout=30000)
            assert await page.locator("[data-testid=cw-bot]").count() == 1
            (ROOT / "artifacts").mkdir(exist_ok=True)
            await page.screenshot(path=str(ROOT / "artifacts" / "browser-handoff.png"))

            # Reloaded: the operator's message in its place, the channel listening again.
            await page.reload()
            await operator.wait_for(timeout=30000)
            assert await operator.count() == 1 and "Pro plan" in await operator.text_content()
            texts = await page.locator(".cw-log > *").all_text_contents()
            assert [t for t in texts if "Pro plan" in t or "for 60" in t] == [await operator.text_content(),
                                                                            "Great, and for 60?"]  # in order
            await page.wait_for_function(f"() => document.querySelector('{status}').textContent === "
                                         "'Grace joined the conversation'", timeout=10000)
            assert await page.locator("[data-testid=cw-bot]").count() == 1

            # Handed back: said in the log, and the AI answers the next question.
            released = await http.post(f"{handoff}/release", json={"operator": "Grace"}, headers=ops(system))
            assert released.status_code == 200, released.text
            await page.locator("[data-testid=cw-handoff-event]",
                               has_text="The conversation is back with the assistant").wait_for(timeout=15000)
            assert await page.locator("[data-testid=cw-handoff-event]", has_text="Grace left").count() == 1
            await page.fill("[data-testid=cw-input]", "What does the Pro plan include?")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_function("() => [...document.querySelectorAll('[data-testid=cw-bot]')].some("
                                         "b => b.textContent.includes('You said:'))", timeout=30000)
            await page.locator("[data-testid=cw-vote]").wait_for(timeout=30000)  # an answer's votes, once it ends
            assert await operator.count() == 1
        finally:
            await browser.close()


@needs_chromium
async def test_a_site_owner_onboards_from_the_operator_ui(system, llm, suggestions_llm, http):
    """Issue 53's guided path, in Chromium: "Add a site" takes a name and the website's home
    page, makes the site, reads the website (its sitemap found through robots.txt) with its
    progress and its failed pages shown, lets the owner try the assistant inside the console
    (it greets, and answers from the pages, citing them), gives the snippet and checks that a
    page of the website embeds it. Then Settings gives the widget the site's look, a page of
    the website embedding the snippet shows it and answers; the page changes, "Sync now"
    brings the new fact."""
    from playwright.async_api import async_playwright

    from tests.website import Website

    llm.clear(), suggestions_llm.clear()
    llm.fail_next({"reply": "The Model 17 sensor costs 170 euros [1]."},
                  {"reply": "The Model 17 sensor costs 170 euros [1]."}, {"reply": "It includes 12 dispatchers [1]."})
    suggestions_llm.fail_next({"reply": json.dumps({"suggestions": ["What does Model 18 cost?"]})},
                              {"reply": json.dumps({"suggestions": ["What does Model 18 cost?"]})},
                              {"reply": json.dumps({"suggestions": ["Is there a trial?"]})})
    site = f"onboard{uuid.uuid4().hex[:6]}"
    with Website() as website:
        async with async_playwright() as pw:
            browser = await launch_chromium(pw)
            try:
                admin = await open_admin(browser, system, site, "addSite")
                await admin.fill("#onboardName", "Gridline")
                assert await admin.input_value("#onboardSite") == "gridline"  # made from the name
                await admin.fill("#onboardSite", site)
                await admin.fill("#onboardUrl", "gridline.example")
                await admin.click("#onboardStart")
                await admin.wait_for_selector(".field[data-field=url].invalid")  # no scheme: said beside the field
                await admin.fill("#onboardUrl", f"{website.url}/")
                await admin.click("#onboardStart")
                await admin.wait_for_selector("#onboardCounts:has-text('Done:')", timeout=90000)
                counts = await admin.text_content("#onboardCounts")
                assert f"{len(website.allowed())} kept" in counts and f"sitemap {website.url}/sitemap.xml" in counts, counts
                assert "/missing: " in await admin.text_content("#onboardProblems")  # the sitemap's 404, and why
                assert await admin.get_attribute("#stepTry", "aria-current") == "step"
                assert admin.url.endswith(f"#/sites/{site}/new")

                preview = admin.frame_locator("#onboardPreview")
                greeting = preview.locator("[data-testid=cw-greeting]")
                await greeting.wait_for(timeout=15000)
                assert "Gridline" in await greeting.text_content()  # no greeting set: the default names the site
                await preview.locator("[data-testid=cw-input]").fill("How much does the Model 17 sensor cost?")
                await preview.locator("[data-testid=cw-input]").press("Enter")
                await preview.locator("[data-testid=cw-sources] a").first.wait_for(timeout=30000)
                assert "170 euros" in await preview.locator("[data-testid=cw-bot]").first.text_content()

                snippet = await admin.text_content("#onboardSnippet")
                await admin.click("#onboardCheck")  # the home page has no snippet yet
                await admin.wait_for_selector("#onboardChecked.error:has-text('no widget script')")
                website.embed = snippet
                await admin.fill("#onboardCheckUrl", f"{website.url}/embed.html")
                await admin.click("#onboardCheck")
                await admin.wait_for_selector("#onboardChecked.good:has-text('Installed')")
                from tests import axe
                assert not await axe.violations(admin), "the guided path's last step"
                (ROOT / "artifacts").mkdir(exist_ok=True)
                await admin.screenshot(path=str(ROOT / "artifacts" / "console-add-a-site.png"), full_page=True)

                await admin.click("#siteSettings")
                await admin.wait_for_selector(f"#siteWhich:has-text('{site}')")
                await admin.fill("#site-widget-primary_color", "#0a7755")
                await admin.fill("#site-widget-greeting", "Hello from Gridline!")
                await admin.click("#siteSave")
                await admin.wait_for_selector("#status:has-text('saved')")

                page = await browser.new_page()
                await page.goto(f"{website.url}/embed.html")
                await page.wait_for_function(
                    "() => { const b = document.querySelector('[data-testid=cw-launch]');"
                    " return b && getComputedStyle(b).backgroundColor === 'rgb(10, 119, 85)'; }", timeout=15000)
                await page.click("[data-testid=cw-launch]")
                assert await page.locator("[data-testid=cw-greeting]").text_content() == "Hello from Gridline!"
                await page.fill("[data-testid=cw-input]", "How much does the Model 17 sensor cost?")
                await page.press("[data-testid=cw-input]", "Enter")
                await page.wait_for_selector("[data-testid=cw-sources] a", timeout=30000)
                links = await page.locator("[data-testid=cw-sources] a").evaluate_all("as => as.map(a => a.href)")
                assert f"{website.url}/docs/page-17" in links, links
                assert "170 euros" in await page.locator("[data-testid=cw-bot]").first.text_content()

                # The website changes; "Sync now" brings the new text into the answers' sources.
                website.changing = "The Orbit plan includes 12 dispatchers."
                await admin.click("#knowledge")
                await admin.click("#sources .source button.sync")
                await admin.wait_for_selector("#sources .source .counts:has-text('1 updated')", timeout=90000)
                await page.fill("[data-testid=cw-input]", "How many dispatchers does the Orbit plan include?")
                await page.press("[data-testid=cw-input]", "Enter")
                await page.wait_for_function(
                    "() => document.querySelectorAll('[data-testid=cw-bot]').length === 2", timeout=30000)
            finally:
                await browser.close()
    conversations = (await http.get(f"{system.gateway_url}/v1/admin/sites/{site}/conversations",
                                    headers=ops(system))).json()["conversations"]
    tried, conversation = sorted(conversations, key=lambda c: c["turns"])  # the console's try, the page's two

    async def second_retrieval():  # the second bubble shows as the turn starts, before its retrieval is logged
        events = await events_of(http, system, site, conversation["session_id"])
        done = [e for e in events if e["type"] == "retrieval_completed"]
        return done[1]["event"]["documents"] if len(done) >= 2 else None

    retrieved = await wait_for(second_retrieval, timeout=30, what="the second question's retrieval")
    assert any("12 dispatchers" in d["content"] and d["source"] == f"{website.url}/changing" for d in retrieved), retrieved


@needs_chromium
async def test_an_operator_reads_insight_and_answers_a_gap(system, llm, suggestions_llm, http):
    """Issue 41's Insight view: two conversations on the demo site through the gateway, one
    answered from its knowledge base and one it cannot answer, projected as their turns end
    by the enricher's insight_projector. /admin's Insight shows the counts the API gives, the
    conversations behind "not found" (one opens its timeline), charts, the gap with its
    example question; an answer written from the gap (its question prefilled; an empty answer
    refused beside its field) becomes a source of the site; the export downloads."""
    from playwright.async_api import async_playwright

    from cli.harness.sse import Conversation

    llm.clear(), suggestions_llm.clear()
    klingon = "Do you offer a Klingon translation service?"
    llm.fail_next({"reply": "Tidewise connects to QuickBooks Online and Xero [1]."})
    answered = await Conversation(http, system.gateway_url, "demo").say("What integrations do you offer?")
    missing = await Conversation(http, system.gateway_url, "demo").say(klingon)  # the scripted reply cites nothing
    answered_id, missing_id = answered.final["session_id"], missing.final["session_id"]

    async def behind(**query) -> set[str]:
        listed = await http.get(operator_url(system, "demo", "insight/conversations"), params=query, headers=ops(system))
        return {c["session_id"] for c in listed.json()["conversations"]}

    async def both_projected() -> bool:
        return answered_id in await behind(turn_outcome="answered") and missing_id in await behind(turn_outcome="not_found")

    # No rebuild: the live projector stores each record as its turn ends.
    await wait_for(both_projected, timeout=30, what="both conversations projected")
    figures = (await http.get(operator_url(system, "demo", "insight"), headers=ops(system), timeout=120)).json()
    assert figures["conversations"] >= 2 and figures["not_found"] >= 1, figures

    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            admin = await open_admin(browser, system, "demo", "insight")
            gap = admin.locator("#insightGaps .gap", has_text=klingon)
            await gap.wait_for(timeout=120000)  # the gaps embed their questions (the first call loads the model)
            figure = "#insightFigures [data-figure={}] .value"
            assert await admin.text_content(figure.format("conversations")) == str(figures["conversations"])
            assert await admin.text_content(figure.format("not_found")) == str(figures["not_found"])
            assert await admin.locator("#insightCharts svg[role=img]").count() == 4
            assert await admin.locator("#insightCharts rect").count() >= 1
            assert klingon in await gap.locator(".examples").all_text_contents()
            assert await gap.locator("h3 .tag").text_content() == "open"

            # Between dates: yesterday alone has none of them; from yesterday on, both.
            yesterday = (datetime.date.today() - datetime.timedelta(days=1)).isoformat()
            await admin.select_option("#insightRange", "dates")
            await admin.fill("#insightTo", yesterday)
            await admin.fill("#insightFrom", yesterday)
            await admin.wait_for_selector(f"{figure.format('conversations')}:text-is('0')")
            await admin.fill("#insightTo", "")
            await admin.wait_for_selector(f"{figure.format('conversations')}:text-is('{figures['conversations']}')")

            # The conversations behind "not found"; one opens in the timeline.
            await admin.click("#insightFigures [data-figure=not_found]")
            row = admin.locator(f"#insightConversations .row[data-session='{missing_id}']")
            await row.wait_for()
            assert klingon in await row.text_content()
            assert await admin.locator(f"#insightConversations .row[data-session='{answered_id}']").count() == 0
            await row.locator("button", has_text="Open conversation").click()
            await admin.wait_for_selector(f"#which:has-text('{missing_id}')")
            await timeline_shown(admin)
            assert await admin.is_hidden("#insightView")

            # Back to Insight: the export, fetched with the token, saved from a Blob.
            await admin.click("#insight")
            await gap.wait_for(timeout=120000)
            async with admin.expect_download() as downloading:
                await admin.click("#exportConversations")
            download = await downloading.value
            assert download.suggested_filename == "demo-conversations.csv"
            with open(await download.path(), encoding="utf-8") as exported:
                text = exported.read()
            assert text.startswith("session_id,") and missing_id in text and answered_id in text

            # A curated answer from the gap: its question prefilled; an empty answer is refused
            # beside its field; then added, and the gap shows as answered.
            await gap.locator("button.write").click()
            assert await admin.input_value("#answerQuestion") == klingon
            await admin.click("#answerSave")
            await admin.wait_for_selector("#answerTextError:not(:empty)")
            await admin.fill("#answerText", "No: Tidewise is in English, French and German only.")
            await admin.click("#answerSave")
            notice = admin.locator("#insightView .notice", has_text="being added to the knowledge base")
            await notice.wait_for(timeout=30000)
            confirmed = await notice.text_content()
            await admin.wait_for_selector(f"#insightGaps .gap:has-text('{klingon}') h3 .tag:text-is('answered')",
                                          timeout=30000)
            (ROOT / "artifacts").mkdir(exist_ok=True)
            await admin.screenshot(path=str(ROOT / "artifacts" / "browser-insight.png"))
            # The same form from a listed conversation, its question prefilled.
            await row.locator("button.write").click()
            assert await admin.input_value("#answerQuestion") == klingon
            await admin.click("#answerCancel")
            # A filter reloads the figures and the list shown: no BOOKING turn in either.
            await admin.select_option("#insightRoute", "BOOKING")
            await admin.wait_for_selector("#insightConversations > .muted:text-is('0 conversations')")
            assert await admin.text_content("#behindWhich") == "not found"
            assert await admin.text_content(figure.format("conversations")) == "0"
        finally:
            await browser.close()
    sources = (await http.get(operator_url(system, "demo", "sources"), headers=ops(system))).json()["sources"]
    curated = [s["id"] for s in sources if s["id"].startswith("answer-")]
    assert len(curated) == 1 and curated[0] in confirmed, (sources, confirmed)


@needs_chromium
async def test_browser_handoff_nobody_joins_so_the_widget_offers_the_email_follow_up(system, llm, http):
    """Issue 42, "never left waiting silently", in the widget: nobody joins within the site's
    maximum wait, so the waiting status goes and the site's offer to leave an e-mail address
    arrives on the live channel as a message; it is still there after a reload, and the
    address the visitor leaves is thanked for."""
    from playwright.async_api import async_playwright

    from shared.site_config import Handoff
    from tests.servers import configure_site

    site = f"n{uuid.uuid4().hex[:10]}"
    await configure_site(system.nats_url, site, name="Acme", handoff=Handoff(enabled=True, max_wait_s=2))
    status = "[data-testid=cw-handoff-status]"
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await asked_for_a_person(browser, system, site)
            notice = page.locator("[data-testid=cw-notice]")
            await notice.wait_for(timeout=30000)
            assert "e-mail address" in await notice.text_content()
            await page.wait_for_function(f"() => document.querySelector('{status}').textContent === ''", timeout=5000)
            await page.reload()
            await notice.wait_for(timeout=30000)
            assert await notice.count() == 1
            await page.fill("[data-testid=cw-input]", "ada@example.com")
            await page.press("[data-testid=cw-input]", "Enter")
            await page.wait_for_function("() => [...document.querySelectorAll('[data-testid=cw-bot]')].some("
                                         "b => b.textContent.includes('write to you at ada@example.com'))",
                                         timeout=30000)
        finally:
            await browser.close()


async def test_an_operator_answers_a_handoff_from_the_inbox(system, llm, http):
    """Issue 42's inbox in /admin, used with the keyboard only up to the hand-back (issue 53):
    signed in, the site typed and the Inbox opened with Tab and Enter; a visitor asks for a
    person on a site that takes handoffs; the Inbox lists the conversation as waiting with
    its transcript; a claim without a name is refused beside the name field; claimed as Grace,
    the visitor's next message shows at once (the site's feed); another operator's claim is a
    409 naming her (through the API and in the view); her reply is stored as hers; handed back
    to the AI, the visitor's next question is answered by the AI; the timeline opens from the
    view."""
    from playwright.async_api import async_playwright

    from cli.harness.sse import Conversation
    from shared.site_config import Handoff
    from tests.servers import configure_site

    site = f"inbox{uuid.uuid4().hex[:6]}"
    await configure_site(system.nats_url, site, name="Acme", handoff=Handoff(enabled=True))
    llm.clear()
    visitor = Conversation(http, system.gateway_url, site)
    asked = await visitor.say("Can I talk to a person?")
    assert asked.final["metadata"]["route"] == "HANDOFF", asked.final
    session = visitor.session_id
    handoff = operator_url(system, site, f"handoffs/{session}")
    reply = "Hi, Grace from Acme here: how many technicians do you have?"
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            admin = await browser.new_page(viewport={"width": 1400, "height": 900})
            await admin.goto(system.gateway_url + "/admin")
            await admin.wait_for_selector("#signIn", state="visible")
            await admin.keyboard.type(system.env["ADMIN_TOKEN"])  # the sign-in's key field has the focus
            await admin.keyboard.press("Enter")
            await admin.wait_for_selector("#signIn", state="hidden")
            await type_into(admin, "#site", site)
            await tab_to(admin, "#inbox", back=True)
            await admin.keyboard.press("Enter")
            row = admin.locator(f"#inboxList .row[data-session='{session}']")
            await row.wait_for(timeout=15000)
            # The sidebar's Inbox says how many wait for an operator.
            await admin.wait_for_selector("#inboxBadge:text-is('1')", timeout=10000)
            assert await admin.get_attribute("#inbox", "aria-label") == "Inbox, 1 waiting"
            assert await row.locator(".tag").first.text_content() == "waiting"
            await tab_to(admin, f"#inboxList .row[data-session='{session}']")
            await admin.keyboard.press("Enter")
            await admin.wait_for_selector("#handoffTranscript .msg.user:has-text('Can I talk to a person?')")
            assert await row.get_attribute("aria-pressed") == "true"

            await tab_to(admin, "#handoffClaim")  # no name yet
            await admin.keyboard.press("Enter")
            await admin.wait_for_selector("#inboxOperatorError:not(:empty)")
            await type_into(admin, "#inboxOperator", "Grace", back=True)
            await tab_to(admin, "#handoffClaim")
            await admin.keyboard.press("Enter")
            await row.locator(".tag:text-is('held')").wait_for()
            assert "Grace" in await row.text_content()
            # The visitor writes while held: the feed brings it, well before the 30 s fallback poll.
            await visitor.say("Are you there?")
            await admin.wait_for_selector("#handoffTranscript .msg.user:has-text('Are you there?')", timeout=5000)
            taken = await http.post(f"{handoff}/claim", json={"operator": "Linus"}, headers=ops(system))
            assert taken.status_code == 409 and taken.json()["holder"] == "Grace", taken.text
            await type_into(admin, "#inboxOperator", "Linus")
            await tab_to(admin, "#handoffClaim")
            await admin.keyboard.press("Enter")
            await admin.wait_for_selector("#handoffErrors:has-text('Grace holds this conversation')")

            await type_into(admin, "#inboxOperator", "Grace", back=True)
            await tab_to(admin, "#handoffSend")  # an empty reply: refused beside its field
            await admin.keyboard.press("Enter")
            await admin.wait_for_selector("#handoffTextError:not(:empty)")
            await type_into(admin, "#handoffText", reply, back=True)
            await tab_to(admin, "#handoffSend")
            await admin.keyboard.press("Enter")
            await admin.wait_for_selector(f"#handoffTranscript .msg.operator:has-text('{reply}')")
            assert "Grace (operator)" in await admin.text_content("#handoffTranscript .msg.operator")
            written = [e["event"] for e in await events_of(http, system, site, session) if e["type"] == "operator_message"]
            assert [(m["operator"], m["text"]) for m in written] == [("Grace", reply)]

            await tab_to(admin, "#handoffRelease", back=True)
            await admin.keyboard.press("Enter")
            await row.wait_for(state="detached")
            await admin.wait_for_selector("#inboxList .muted:has-text('Nobody is waiting')")
            back = await visitor.say("What does the Pro plan include?")
            assert back.final["metadata"]["route"] == "ANSWER", back.final

            await admin.click("#handoffTimeline")
            await admin.wait_for_selector(f"#which:has-text('{session}')")
            await timeline_shown(admin)
            assert await admin.is_hidden("#inboxView")
            # From the timeline Grace steps in again, unasked: the conversation is hers.
            await admin.click("#join")
            await admin.wait_for_selector("#handoffClaim:text-is('Join')")
            await admin.click("#handoffClaim")
            await row.locator(".tag:text-is('held')").wait_for()
            requested = [e["event"] for e in await events_of(http, system, site, session)
                         if e["type"] == "handoff_requested"]
            assert [(r["reason"], r["producer"]) for r in requested] == [("visitor_asked", "handoff_handler"),
                                                                         ("operator", "gateway")]
        finally:
            await browser.close()


REPORT_SECTIONS = ["Executive Summary", "Situation", "Complication", "Resolution", "Key Metrics", "Evidence", "Risks",
                   "Next Steps", "Key Questions"]


@needs_chromium
async def test_an_account_manager_ranks_accounts_writes_reports_and_edits_one_from_the_accounts_view(system, http):
    """Issue 44's "done when", in /admin's Accounts view on the data-only backend
    (BRIEFS_BACKEND=data: the rules rank, the figures write, the rule editor edits): six
    accounts of the demo portfolio imported with its deals; "Find opportunities" ranks every
    one with a reason and checks the best three; "Generate reports" writes theirs, each with
    the nine sections, a data-only metadata line and a sales script, and the table shows each
    one's last report; the Risks section edited by hand is marked so, asking "make the
    executive summary shorter" makes a third version that keeps it, and two versions of the
    history show what changed; in "Paste your data" a JSON account is refused naming its
    field, then read, and its report shown. The waits: a double click asks for one search;
    another operator's search written first is shown instead of a timeout, and a report of
    theirs written after the view's does not hide the view's; a site switched mid-wait is
    asked nothing of it."""
    from playwright.async_api import async_playwright

    from shared import account_reports
    from shared import events as ev
    from tests.servers import configure_site

    site = f"acct{uuid.uuid4().hex[:6]}"
    await configure_site(system.nats_url, site, name="Tidewise")
    demo = json.loads((ROOT / "sites" / "demo.accounts.json").read_text(encoding="utf-8"))
    portfolio = demo["accounts"][:6]
    imported = await http.post(operator_url(system, site, "accounts/import"), headers=ops(system),
                               json={"accounts": portfolio, "deals": demo["deals"]})
    assert imported.status_code == 200, imported.text
    names = {a["id"]: a["name"] for a in portfolio}
    hand = "The renewal owner changed in March: **confirm the budget** with the new COO before proposing seats."
    row = "#accountRows tr[data-account='{}']"
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            admin = await open_admin(browser, system, site, "accounts")
            rows = admin.locator("#accountRows [data-testid=account-row]")
            await rows.nth(5).wait_for()
            assert await rows.count() == 6
            assert await admin.locator("[data-testid=last-report]:text-is('—')").count() == 6

            # Find opportunities (none checked: every account), double-clicked: one search, the
            # button waiting with it. Another operator's search of every account is written after
            # it before the view reads it (the view's reads held): only the newest is kept, so the
            # view shows that newer one and stops waiting.
            released = asyncio.Event()

            async def held(route):
                if route.request.method == "GET":
                    await released.wait()
                await route.continue_()

            async def newest_search(request_id):
                answer = await http.get(operator_url(system, site, "accounts/opportunities"), headers=ops(system))
                return answer.status_code == 200 and answer.json()["request_id"] == request_id

            searches = []
            admin.on("request", lambda r: searches.append(r.url) if r.method == "POST" and r.url.endswith(
                "/accounts/opportunities") else None)
            await admin.route("**/accounts/opportunities", held)
            async with admin.expect_response(lambda r: r.request.method == "POST") as answered:
                await admin.dblclick("#accountsFind")
            ours = (await (await answered.value).json())["request_id"]
            await wait_for(lambda: newest_search(ours), timeout=60, what="the view's search written")
            theirs = (await http.post(operator_url(system, site, "accounts/opportunities"), headers=ops(system),
                                      json={})).json()["request_id"]
            await wait_for(lambda: newest_search(theirs), timeout=60, what="the other operator's search written")
            released.set()
            items = admin.locator("#opportunities [data-testid=opportunity]")
            await items.nth(5).wait_for(timeout=15000)
            await admin.locator("[data-testid=opportunities-newer]").wait_for()
            assert len(searches) == 1, searches
            await admin.unroute("**/accounts/opportunities", held)
            assert not await admin.is_disabled("#accountsFind")
            ranked = (await http.get(operator_url(system, site, "accounts/opportunities"), headers=ops(system))).json()
            assert [await i.get_attribute("data-account") for i in await items.all()] == \
                [i["account_id"] for i in ranked["items"]]
            for item in await items.all():
                assert (await item.locator("[data-testid=opportunity-reason]").text_content()).strip()
                assert await item.locator("[data-testid=proposition]").text_content() in ev.PROPOSITIONS
            selected = ranked["selected"]
            assert len(selected) == 3, ranked
            assert "pre-selected: 3 best candidates" in await admin.text_content("[data-testid=opportunities-selected]")
            checked = await admin.locator("#accountRows tr:has([data-testid=account-check]:checked)").evaluate_all(
                "rows => rows.map(r => r.dataset.account)")
            assert sorted(checked) == sorted(selected)

            # Generate their reports: each one's progress, then its last report in the table. One
            # account's report asked for again (another operator) is written after the view's before
            # the view reads it: the view finds its own in the account's list all the same.
            async def newest_report(account_id, request_id):
                answer = await http.get(operator_url(system, site, f"accounts/{account_id}/reports/latest"),
                                        headers=ops(system))
                return answer.status_code == 200 and answer.json()["event"]["request_id"] == request_id

            report_reads = re.compile(r"/accounts/[^/]+/reports(/latest)?$")  # a list, or the latest
            released.clear()
            await admin.route(report_reads, held)
            async with admin.expect_response(lambda r: r.request.method == "POST") as answered:
                await admin.click("#accountsGenerate")
            ours = (await (await answered.value).json())["request_id"]
            for account_id in selected:
                await wait_for(lambda account_id=account_id: newest_report(account_id, ours), timeout=120,
                               what="the view's report written")
            again = await http.post(operator_url(system, site, "accounts/reports"), headers=ops(system),
                                    json={"accounts": selected[:1]})
            await wait_for(lambda: newest_report(selected[0], again.json()["request_id"]), timeout=120,
                           what="the other operator's report written")
            released.set()
            for account_id in selected:
                progress = admin.locator(f"#reportProgress [data-testid=report-progress][data-account='{account_id}']")
                await progress.locator(".tag:text-is('done')").wait_for(timeout=15000)
                assert await admin.locator(f"{row.format(account_id)} [data-testid=last-report] [data-testid=proposition]"
                                           ).count() == 1
            await admin.unroute(report_reads, held)
            unreported = next(a for a in names if a not in selected)
            assert await admin.text_content(f"{row.format(unreported)} [data-testid=last-report]") == "—"

            # Each report: its nine sections, a data-only metadata line, a sales script, one version.
            sections = admin.locator("#reportSections [data-testid=report-section]")
            for account_id in selected:
                await admin.click(f"{row.format(account_id)} [data-testid=account-name]")
                assert await admin.text_content("#reportWhich") == names[account_id]
                await sections.nth(8).wait_for(timeout=15000)
                assert [await s.get_attribute("data-section") for s in await sections.all()] == REPORT_SECTIONS
                assert await admin.locator("#reportMeta [data-testid=data-only]").count() == 1
                assert await admin.locator("#reportSections [data-section='Key Metrics'] table td").count() >= 4
                assert len((await admin.text_content("#salesScript")).strip()) > 100
                await admin.wait_for_selector("#reportHistory [data-testid=report-version]")
                assert await admin.locator("#reportHistory [data-testid=report-version]").count() == 1

            # One of them: the Risks section edited by hand, then a change asked for elsewhere.
            focus = selected[0]
            await admin.click(f"{row.format(focus)} [data-testid=account-name]")
            risks = admin.locator("#reportSections [data-section='Risks']")
            summary = admin.locator("#reportSections [data-section='Executive Summary'] [data-testid=section-text]")
            await risks.wait_for(timeout=15000)
            summary_before = await summary.text_content()
            await risks.locator("[data-testid=section-edit]").click()
            await risks.locator("[data-testid=section-textarea]").fill(hand)
            await risks.locator("[data-testid=section-save]").click()
            await risks.locator("[data-testid=hand-edited]").wait_for(timeout=60000)
            assert await risks.locator("[data-testid=section-text] strong").text_content() == "confirm the budget"
            await admin.wait_for_selector("#reportHistory [data-version='2']")

            assert await admin.get_attribute("#reportInstruction", "maxlength") == str(
                account_reports.MAX_INSTRUCTION_CHARS)
            await admin.fill("#reportInstruction", "make the executive summary shorter")
            await admin.click("#reportAskSend")
            asked = admin.locator("#reportHistory [data-testid=report-version][data-version='3']")
            await asked.wait_for(timeout=60000)
            assert "make the executive summary shorter” (the rule editor)" in await asked.text_content()
            assert "Executive Summary" in await asked.text_content()
            assert "confirm the budget" in await risks.locator("[data-testid=section-text]").text_content()
            assert await risks.locator("[data-testid=hand-edited]").count() == 1
            assert len(await summary.text_content()) < len(summary_before)
            assert await admin.locator("#reportHistory [data-testid=report-version]").count() == 3

            # Versions 1 and 3 side by side: the two sections changed, before and after.
            await admin.check("#reportHistory [data-version='1'] input")
            await admin.check("#reportHistory [data-version='3'] input")
            diff = admin.locator("#reportDiff [data-testid=diff-section]")
            await diff.first.wait_for()
            assert sorted(await diff.evaluate_all("boxes => boxes.map(b => b.dataset.section)")) == \
                ["Executive Summary", "Risks"]
            assert "confirm the budget" in await admin.text_content("#reportDiff [data-section='Risks'] .diff-new")

            # Paste your data: free text with no figure and a JSON account with a wrong one are
            # refused naming the field; then the JSON account is read and reported on.
            refused = admin.locator("#pasteErrors [data-testid=paste-error]")
            await admin.check("#pasteText")
            await admin.fill("#pasteBody", "Hi Sam, can we talk about Acme next week?")
            await admin.click("#pasteSend")
            await admin.wait_for_selector("#pasteErrors [data-testid=paste-error][data-field=figures]")
            await admin.check("#pasteJson")
            pasted = {k: v for k, v in demo["accounts"][7].items() if k != "id"}
            await admin.fill("#pasteBody", json.dumps({**pasted, "arr": "a lot"}))
            await admin.click("#pasteSend")
            await admin.wait_for_selector("#pasteErrors [data-testid=paste-error][data-field=arr]")
            assert await refused.count() == 1, await refused.all_text_contents()
            await admin.fill("#pasteBody", json.dumps(pasted))
            await admin.click("#pasteSend")
            await admin.wait_for_selector(f"[data-testid=pasted-account]:has-text('{pasted['name']}')")
            assert await admin.locator("#pasteErrors li").count() == 0
            report = admin.locator("#pasteReport [data-testid=pasted-report]")
            await report.wait_for(timeout=120000)
            assert [await s.get_attribute("data-section") for s in await report.locator(
                "[data-testid=report-section]").all()] == REPORT_SECTIONS
            assert await report.locator("[data-testid=data-only]").count() == 1
            assert await report.locator("[data-testid=section-edit]").count() == 0
            (ROOT / "artifacts").mkdir(exist_ok=True)
            await risks.scroll_into_view_if_needed()
            await report.scroll_into_view_if_needed()
            await admin.evaluate("window.scrollTo(0, 0)")
            await admin.screenshot(path=str(ROOT / "artifacts" / "browser-accounts.png"))

            # The site switched while a search is asked for: its wait ends quietly, and nothing of
            # it is asked of the other site (its polls would 404, then time out blaming the enricher).
            switched, elsewhere = asyncio.Event(), []

            async def held_post(route):
                if route.request.method == "POST":
                    await switched.wait()
                await route.continue_()

            admin.on("request", lambda r: elsewhere.append(r.url) if f"/sites/{site}x/accounts/opportunities" in r.url
                     else None)
            await admin.route("**/accounts/opportunities", held_post)
            async with admin.expect_response(lambda r: r.request.method == "POST") as answered:
                await admin.click("#accountsFind")
                await admin.fill("#site", f"{site}x")
                await admin.dispatch_event("#site", "change")
                switched.set()
            assert (await answered.value).status == 202
            await admin.wait_for_function("!document.getElementById('accountsFind').disabled", timeout=5000)
            await asyncio.sleep(1.5)  # a poll a second after the search was queued would have gone by now
            assert elsewhere == [] and await admin.text_content("#accountsErrors") == ""
        finally:
            await browser.close()
    # What the view did is what the API holds: the hand edit is the operator's, kept by the asked change.
    request_id = (await http.get(operator_url(system, site, f"accounts/{focus}/reports/latest"),
                                 headers=ops(system))).json()["report"]["request_id"]
    versions = (await http.get(operator_url(system, site, f"accounts/{focus}/reports/{request_id}/versions"),
                               headers=ops(system))).json()["versions"]
    assert [(v["how"], v["sections"]) for v in versions[1:]] == [("hand", ["Risks"]), ("asked", ["Executive Summary"])]
    assert versions[2]["hand_edited"] == ["Risks"]


@needs_chromium
async def test_every_console_view_has_no_serious_accessibility_violation(system):
    """axe-core (tests/axe.py; WCAG 2.1 A and AA) on the sign-in page and on every view the
    sidebar opens, for the demo site: no serious or critical violation. The views' screenshots
    go to artifacts/ (docs/operations.md shows them)."""
    from playwright.async_api import async_playwright

    from tests import axe

    found: dict[str, list[str]] = {}
    (ROOT / "artifacts").mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            # The check sees what it should: a button without a name is critical to axe.
            control = await browser.new_page()
            await control.set_content("<!doctype html><html lang='en'><title>t</title><main><button></button></main>")
            assert any(v.startswith("button-name (critical)") for v in await axe.violations(control))
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(system.gateway_url + "/admin")
            await page.wait_for_selector("#signIn", state="visible")
            found["sign-in"] = await axe.violations(page)
            await page.screenshot(path=str(ROOT / "artifacts" / "console-sign-in.png"))
            admin = await browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []  # what the console's modules throw, anywhere
            admin.on("pageerror", lambda error: errors.append(str(error)))
            await signed_in_admin(admin, system.gateway_url, system.env["ADMIN_TOKEN"])
            await admin.fill("#site", "demo")
            for view in ("inbox", "load", "insight", "knowledge", "accounts", "leads", "tests", "siteSettings", "addSite"):
                await admin.click(f"#{view}")
                await admin.wait_for_timeout(1500)  # the view loads what it shows (its live feeds never idle)
                found[view] = await axe.violations(admin)
                await admin.screenshot(path=str(ROOT / "artifacts" / f"console-{view}.png"))
        finally:
            await browser.close()
    assert not any(found.values()), found
    assert not errors, errors
