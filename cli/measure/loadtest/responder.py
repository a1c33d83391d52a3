"""`concierge loadtest responder`: the responder service alone, against the scripted LLM,
swept over rising rates of ANSWER turns.

Starts nats-server, the scripted OpenAI-compatible LLM (`--ttft-ms` before its first
chunk, `--inter-token-ms` between chunks, as `make bench`) and one responder process
(nothing else). Before the clock starts, each turn's log gets what the router, retriever
and enricher would have stored: `TurnRequested` (a product question), `RetrievalCompleted`
(three sources) and `EnrichmentCompleted`, so no node waits out a deadline for them. Then
`RouteDecided` (ANSWER) is published at each of `--rates` per second for `--seconds`:
answer_writer streams the model's answer as tokens, and the post-processing nodes
(dialog state, form fields, suggestions from the model, finalize) close the turn.

Timed from each `RouteDecided`: its **first token** (the percentiles and the objective:
minus the scripted first-token delay, so they are what the responder adds, as `make
bench`'s TTFT overhead) and its `TurnCompleted` (`completion_p50_ms`, `completion_p99_ms`:
the whole turn, model time included). The sweep, its figures and the last line's JSON:
cli/measure/loadtest/sweep.py.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from cli.harness.supervisor import free_port, make_system, wait_http
from cli.measure.loadtest import driver, sweep
from shared import events as ev
from shared.bus import connect
from shared.config import BusConfig

SITE = "loadtest"
LATENCY = "RouteDecided published → first token received, minus the scripted LLM's first-token delay"
QUESTIONS = ["What integrations do you offer?", "How does the scheduling engine work?", "Do you integrate with Salesforce?",
             "Is there an API I can use?", "Does the mobile app work offline?", "Where is my data hosted?",
             "Can I export my data to CSV?", "How long does onboarding take?", "Do you support single sign-on?",
             "What kind of reports can I build?"]
SOURCES = [
    ("Integrations", "FieldFlow integrates with Salesforce, HubSpot and QuickBooks. Contacts and work orders sync "
                     "both ways every five minutes; invoices go to QuickBooks when a job is closed."),
    ("Scheduling", "The scheduling engine assigns each job to the nearest qualified technician, taking skills, "
                   "travel time and working hours into account, and re-plans the day when a job overruns."),
    ("Security", "Customer data is hosted in Frankfurt and Virginia, encrypted at rest with AES-256; single "
                 "sign-on works with Okta, Azure AD and Google Workspace on the Business plan."),
]


def sources() -> list[ev.RetrievedDocument]:
    return [ev.RetrievedDocument(n=n, document_type="chunk", title=title, source=f"docs/{title.lower()}.md",
                                 snippet=text[:120], content=text)
            for n, (title, text) in enumerate(SOURCES, start=1)]


async def drive(nats_url: str, rate: float, seconds: float, tag: str) -> driver.Run:
    """ANSWER turns at `rate` per second for `seconds`, one per session, their logs filled
    beforehand; each timed to its first token and to its `TurnCompleted`."""
    bus = await connect(BusConfig(url=nats_url), name="loadtest-prepare")
    documents = sources()

    def session(i: int) -> str:
        return f"{tag}-{i}"

    async def prepare(i: int) -> None:
        requested = ev.TurnRequested(event_id=ev.new_id(), site=SITE, session_id=session(i), turn=1, ts=ev.now(),
                                     producer="loadtest", message=QUESTIONS[i % len(QUESTIONS)])
        await bus.publish(requested)
        await bus.publish(ev.follow(requested, ev.EnrichmentCompleted, "loadtest", profile=ev.VisitorProfile()))
        await bus.publish(ev.follow(requested, ev.RetrievalCompleted, "loadtest", documents=documents,
                                    query=requested.message))

    def turn(i: int) -> ev.RouteDecided:
        return ev.RouteDecided(event_id=ev.new_id(), site=SITE, session_id=session(i), turn=1, ts=ev.now(),
                               producer="loadtest", route="ANSWER", reason="loadtest", intent="LEARN",
                               branch="DEFAULT")

    try:
        return await driver.drive(nats_url, rate, seconds, turn, "turn_completed", SITE, prepare=prepare,
                                  first_token=True)
    finally:
        await bus.close()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest responder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_arguments(parser, rates="5,10,20,30,40,60,80", objective_ms=100.0)
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="scripted LLM time to first token")
    parser.add_argument("--inter-token-ms", type=float, default=20.0, help="scripted LLM delay between chunks")
    return parser


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="concierge-load-responder-") as data:
        llm_port = free_port()
        system = make_system(Path(data), free_port(), free_port(), {
            "LOG_LEVEL": "WARNING", "LLM_BASE_URL": f"http://127.0.0.1:{llm_port}/v1", "ANSWER_BACKEND": "llm"})
        try:
            llm = system.spawn("scripted-llm", [sys.executable, "-m", "cli", "scripted-llm", "--port", str(llm_port),
                                                "--ttft-ms", str(args.ttft_ms),
                                                "--inter-token-ms", str(args.inter_token_ms)])
            system.start_nats()
            wait_http(f"http://127.0.0.1:{llm_port}/v1/models", 30, llm)
            started = time.monotonic()
            system.load_sites()  # the router's part: no service is ready before
            pid = system.start_service("responder").pid
            system.wait_ready("responder", 120)
            print(f"responder ready in {time.monotonic() - started:.1f} s (scripted LLM: first token after "
                  f"{args.ttft_ms:g} ms, then one every {args.inter_token_ms:g} ms)", flush=True)
            first = sweep.rates_of(args.rates)[0]
            asyncio.run(drive(system.nats_url, first, args.warmup_s, f"warmup{time.time_ns()}"))
            points = sweep.sweep(pid, args, lambda rate: asyncio.run(
                drive(system.nats_url, rate, args.seconds, f"run{time.time_ns()}")),
                primary=driver.FIRST_TOKEN, offset_ms=args.ttft_ms)
        finally:
            system.stop()
    return sweep.report("responder", args, LATENCY, points, route="ANSWER", answer_backend="llm",
                        scripted_ttft_ms=args.ttft_ms, scripted_inter_token_ms=args.inter_token_ms)


def main(argv: list[str] | None = None) -> int:
    return sweep.print_report(run(parser().parse_args(argv)))
