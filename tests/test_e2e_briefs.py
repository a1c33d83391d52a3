"""A sales user's path, with the whole system running as processes (tests/e2e.py): a lead
captured in the widget (headless Chromium) gets a brief and a call script, which
`concierge briefs show` prints, and `concierge briefs triage` ranks it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from tests import e2e
from tests.e2e import ask_in_a_fresh_widget, launch_chromium, needs_chromium
from tests.servers import ROOT

system = e2e.shared_system  # the fixture (tests/e2e.py): the system test_e2e_http takes too


@needs_chromium
async def test_a_lead_captured_in_the_widget_gets_a_brief_the_sales_team_reads_and_ranks(system, llm, suggestions_llm):
    """The sales user's path: a visitor books a demo in the widget; `concierge briefs show`
    prints the lead's brief with every section and a call script (briefs from the data in
    this system), the company the booking form collected after the e-mail included, and
    `concierge briefs triage` ranks the site's open leads with reasons."""
    from playwright.async_api import async_playwright

    from services.enricher.briefs.document import REQUIRED_SECTIONS

    llm.clear(), suggestions_llm.clear()
    async with async_playwright() as pw:
        browser = await launch_chromium(pw)
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            await ask_in_a_fresh_widget(page, system.gateway_url, "I'd like to book a demo")
            for number, answer in enumerate(("grace@hopper.example", "Hopper Labs", None), start=2):
                try:  # the last reply done: the widget takes a message again
                    await page.wait_for_function(
                        f"() => document.querySelectorAll('[data-testid=cw-bot]').length === {number - 1} && "
                        "!document.querySelector('.cw-form button').disabled", timeout=30000)
                except Exception:
                    log = await page.locator("[data-testid=cw-log]").inner_text()
                    raise AssertionError(f"reply {number - 1} not done; the widget shows:\n{log}") from None
                if answer is not None:
                    await page.fill("[data-testid=cw-input]", answer)
                    await page.press("[data-testid=cw-input]", "Enter")
            session = await page.evaluate("localStorage.getItem('concierge:demo:session')")
        finally:
            await browser.close()

    def concierge(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli", "briefs", *args, "--nats-url", system.nats_url],
                              cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    # Two briefs: one when the e-mail was captured, one when the booking ended with the company.
    deadline = time.monotonic() + 30
    while "Hopper Labs" not in (shown := concierge("show", "--site", "demo", "--lead", session)).stdout:
        assert time.monotonic() < deadline, shown.stdout + shown.stderr
        await asyncio.sleep(0.5)
    assert shown.returncode == 0 and "grace@hopper.example" in shown.stdout
    assert all(f"## {name}" in shown.stdout for name in REQUIRED_SECTIONS), shown.stdout
    assert all(f"## {name}" in shown.stdout for name in ("Talk track", "Objection handlers", "Close"))
    ranked = concierge("triage", "--site", "demo", "--timeout", "60")
    assert ranked.returncode == 0, ranked.stderr
    line = next(line for line in ranked.stdout.splitlines() if session in line)
    assert "grace@hopper.example" in line and "(from the brief's metadata)" in line

