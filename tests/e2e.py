"""What the end-to-end modules share (test_e2e_http, test_resilience, test_browser,
test_e2e_briefs): the whole system as processes (nats-server, Redis, the five services, the
scripted LLMs, the webhook receiver); an HTTP client; a configured site per test; the
operator's reads; and headless Chromium for the widget.

A module takes the fixtures by name: `system, http, site = e2e.system, e2e.http, e2e.site`,
a system of its own (`system`, for a module that kills, restarts or reconfigures its
processes, or whose tests read the whole demo site), or the one the worker's modules share
(`system, webhook = e2e.shared_system, e2e.shared_webhook`: started once, as the whole
system's start is most of such a module's time; tests/conftest.py hands those modules to
one worker together, SHARED_SYSTEM).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from cli.harness.supervisor import free_port, make_system
from tests.servers import configure_site

DEADLINE_S = 15
WEBHOOK_SECRET = "e2e-secret"
SLOW_ANSWER = ("Tidewise schedules technicians, tracks their routes and invoices the job from the phone, "
               "so the office sees every visit as it happens and the customer gets one bill.")
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="Chromium not installed (Debian package `chromium`): browser test skipped")


# The variable holding a site's own key for the session provider (Snitcher's stand-in), in the
# shared system's environment; the deployment itself has no key, so a site naming none is not
# looked up there ("no key, no call").
SITE_SNITCHER_KEY_ENV = "ENRICH_KEY_E2E_SNITCHER"
KEYED_SITE = "e2e-snitcher"  # the site that key is bound to (its value: `<site>:<source>:<key>`)


def provider_env(providers) -> dict[str, str]:
    """Snitcher's stand-in as the deployment's session provider, with no deployment key."""
    if providers is None:
        return {}
    from tests.providers import KEYS, SNITCHER_SCRIPT
    return {"ENRICH_SESSION_PROVIDER_URL": f"{providers.url}/snitcher", "ENRICH_SESSION_PROVIDER_FORMAT": "snitcher",
            "ENRICH_SESSION_PROVIDER_ACCOUNT": SNITCHER_SCRIPT,
            SITE_SNITCHER_KEY_ENV: f"{KEYED_SITE}:session_provider:{KEYS[1]}"}


@contextmanager
def running_system(llm, fallback_llm, suggestions_llm, webhook, providers=None) -> Iterator:
    with tempfile.TemporaryDirectory(prefix="concierge-e2e-") as data:
        sys_ = make_system(Path(data), free_port(), free_port(), {
            **provider_env(providers),
            "LLM_BASE_URL": llm.base_url,
            "LLM_FALLBACK_BASE_URL": fallback_llm.base_url,
            "LLM_SUGGESTIONS_BASE_URL": suggestions_llm.base_url,
            # Briefs from the data: the scripted replies queued for a turn are that turn's.
            "BRIEFS_BACKEND": "data",
            "LLM_MAX_RETRIES": "1",
            "LLM_BACKOFF_BASE_S": "0.05",
            "TURN_DEADLINE_S": str(DEADLINE_S),
            "CONSUMER_ACK_WAIT_S": "2",
            "CONSUMER_BACKOFF_S": "0.2,0.5",
            "RATE_LIMIT_PER_IP_PER_MIN": "10000",  # every test request comes from 127.0.0.1
            # Deadlines far beyond a loaded CI machine's cold first turn: these tests check that
            # the answer has its inputs; the degraded path has its own test (test_answer_writer.py).
            "ANSWER_WAIT_S": "5",
            "ANSWER_RETRIEVAL_WAIT_S": "5",
            "LEAD_WEBHOOK_URL": webhook.url,
            "LEAD_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "LEAD_WEBHOOK_BACKOFF_S": "0.05",
            "OUTBOUND_ALLOW_PRIVATE_NETWORKS": "1",  # the knowledge sources' test website is on 127.0.0.1
            "EVAL_RUN_DEBOUNCE_S": "2",  # a site's cases run again 2 s after its config changed
        })
        try:
            # The demo site's knowledge base, as `make run` ingests it (the retriever opens it at start).
            sys_.ingest("demo")
            sys_.start_all()
            yield sys_
        finally:
            sys_.stop()


@pytest.fixture(scope="module")
def system(llm, fallback_llm, suggestions_llm, webhook):
    """A system of the module's own."""
    with running_system(llm, fallback_llm, suggestions_llm, webhook) as sys_:
        yield sys_


@pytest.fixture(scope="module")
def shared_system(e2e_shared_system):
    """The system the worker's SHARED_SYSTEM modules share (tests/conftest.py): a module takes
    it as its `system`, with `shared_webhook` as its `webhook`."""
    return e2e_shared_system


@pytest.fixture(scope="module")
def shared_providers(e2e_shared_providers):
    """The enrichment vendors' stand-ins `shared_system` may call (tests/providers.py)."""
    return e2e_shared_providers


@pytest.fixture(scope="module")
def shared_webhook(e2e_shared_webhook):
    """The lead webhook of `shared_system`: reset it (`webhook.reset()`) before counting."""
    return e2e_shared_webhook


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=DEADLINE_S + 10) as client:
        yield client


@pytest.fixture
async def site(system):
    """A configured site of its own per test (the gateway serves only configured sites)."""
    name = f"t{uuid.uuid4().hex[:10]}"
    await configure_site(system.nats_url, name)
    return name


def ops(system) -> dict:
    """The operator's credentials: the conversation logs and states need them."""
    return {"Authorization": f"Bearer {system.env['ADMIN_TOKEN']}"}


def operator_url(system, site: str, path: str) -> str:
    """`path` under the site's operator prefix."""
    return f"{system.gateway_url}/v1/admin/sites/{site}/{path}"


async def events_of(http, system, site, session) -> list[dict]:
    response = await http.get(operator_url(system, site, f"conversations/{session}/events"), headers=ops(system))
    assert response.status_code == 200, response.text
    return response.json()["events"]


async def ask_in_a_fresh_widget(page, gateway_url: str, message: str) -> None:
    """Open the demo page as a first-time visitor (nothing in localStorage), open the widget
    and send `message`."""
    await page.goto(gateway_url + "/")
    await page.evaluate("localStorage.clear()")
    await page.reload()
    await page.click("[data-testid=cw-launch]")
    await page.fill("[data-testid=cw-input]", message)
    await page.press("[data-testid=cw-input]", "Enter")


async def signed_in_admin(page, base_url: str, key: str) -> None:
    """/admin on `page`, signed in with `key` on its sign-in page (the console's session
    cookie from then on)."""
    await page.goto(base_url + "/admin")
    await page.wait_for_selector("#signIn", state="visible")
    await page.fill("#signInKey", key)
    await page.click("#signInButton")
    await page.wait_for_selector("#signIn", state="hidden")


async def timeline_shown(page, timeout_ms: int = 60000) -> None:
    """Wait for the console's conversation timeline to show its events; if it shows an error
    instead, or nothing in time, an AssertionError saying what the page showed (the URL, which
    views are open, the sign-in, the timeline's text): a loaded machine's slow answer and a
    broken view fail differently."""
    try:
        await page.wait_for_selector("#timeline .event, #timeline .error", timeout=timeout_ms)
    except Exception as exc:  # noqa: BLE001 - said below with what the page shows
        raise AssertionError(f"no timeline after {timeout_ms} ms: {await _console_state(page)}") from exc
    if await page.locator("#timeline .error").count():
        raise AssertionError(f"the timeline shows an error: {await _console_state(page)}")


async def _console_state(page) -> dict:
    return await page.evaluate("""() => ({
        url: location.href,
        views: [...document.querySelectorAll("main")].filter((m) => !m.hidden).map((m) => m.id),
        signIn: !document.getElementById("signIn").hidden,
        which: document.getElementById("which").textContent,
        timeline: document.getElementById("timeline").textContent.slice(0, 300),
        status: (document.getElementById("status") || {}).textContent,
    })""")


async def tab_to(page, selector: str, back: bool = False, limit: int = 60) -> None:
    """Press Tab (Shift+Tab with `back`) until the focus is on `selector`: what a keyboard
    user reaches, or an AssertionError naming what could not be reached."""
    for _ in range(limit):
        if await page.evaluate("s => !!document.activeElement && document.activeElement.matches(s)", selector):
            return
        await page.keyboard.press("Shift+Tab" if back else "Tab")
    raise AssertionError(f"{selector} not reached in {limit} presses of {'Shift+' if back else ''}Tab")


async def type_into(page, selector: str, text: str, back: bool = False) -> None:
    """Tab to a field, select what it holds and type `text` over it."""
    await tab_to(page, selector, back)
    await page.keyboard.press("Control+A")
    await page.keyboard.type(text)


async def open_admin(browser, system, site: str, view: str, key: str | None = None):
    """/admin in a new page, signed in on its sign-in page (ADMIN_TOKEN, or `key`), `site`
    typed in, the view whose header button is `#view` opened."""
    admin = await browser.new_page(viewport={"width": 1400, "height": 900})
    await signed_in_admin(admin, system.gateway_url, key or system.env["ADMIN_TOKEN"])
    if not await admin.eval_on_selector("#site", "e => e.readOnly"):
        await admin.fill("#site", site)
    await admin.click(f"#{view}")
    return admin


async def launch_chromium(pw):
    """Debian's Chromium, headless, without the background calls a closed network refuses."""
    return await pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"])
