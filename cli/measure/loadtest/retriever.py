"""`concierge loadtest retriever`: the retriever service alone, on a large knowledge base.

Generates a knowledge base of `--sites` sites × `--docs` documents of `--sections`
sections each (fictional B2B products with features, prices, integrations and regions;
every section a chunk, so the defaults give 5,000 chunks), ingests it the way `concierge
ingest` does and reports chunks/s; then starts nats-server and one retriever process on
that knowledge base, publishes `TurnRequested` questions about the sites' content at each
of `--rates` per second for `--seconds`, and times each to its `RetrievalCompleted` (mix
mode, the limiter, offline keywords: the embedded defaults; `--variant` sweeps again, in
a new process, with other retriever settings). The sweep, its figures and the last line's
JSON: cli/measure/loadtest/sweep.py (the variant's sweep under `variant`).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from cli.harness.supervisor import free_port, make_system
from cli.measure.loadtest import driver, sweep

LATENCY = "TurnRequested published → RetrievalCompleted received"

PRODUCTS = ["Atlas", "Beacon", "Cedar", "Delta", "Ember", "Fjord", "Granite", "Harbor", "Iris", "Juniper",
            "Kestrel", "Lumen", "Meridian", "Nimbus", "Orchid", "Pioneer", "Quarry", "Raven", "Summit", "Tundra"]
FEATURES = ["scheduling", "dispatch", "invoicing", "reporting", "inventory", "payroll", "routing", "quotes",
            "contracts", "analytics", "forecasting", "approvals", "timesheets", "onboarding", "audits"]
TOOLS = ["Salesforce", "HubSpot", "QuickBooks", "Xero", "Slack", "Zapier", "Stripe", "Okta", "Jira", "Zendesk",
         "Pipedrive", "NetSuite", "Shopify", "Twilio", "Workday"]
REGIONS = ["Frankfurt", "Virginia", "Sydney", "Tokyo", "Dublin", "Toronto", "Singapore", "Paris"]
QUESTION_TEMPLATES = ["How much does {product} {feature} cost?", "Does {product} integrate with {tool}?",
                      "Where is {product} data hosted?", "What does the {feature} module of {product} do?",
                      "Can {product} sync {feature} with {tool}?", "Is there a free trial of {product}?"]


def make_corpus(root: Path, sites: int, docs: int, sections: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    names = [f"load{n:02d}" for n in range(sites)]
    for site in names:
        folder = root / site
        folder.mkdir(parents=True)
        for d in range(docs):
            product = rng.choice(PRODUCTS)
            lines = [f"# {product} {rng.choice(FEATURES).title()} guide {d}", ""]
            for s in range(sections):
                feature, tool, region = rng.choice(FEATURES), rng.choice(TOOLS), rng.choice(REGIONS)
                price = rng.randint(5, 400)
                lines += [f"## {feature.title()} part {s}",
                          f"The {product} {feature} module costs ${price} per user per month for the {site} edition. "
                          f"It integrates with {tool} and syncs {feature} records every {rng.randint(1, 60)} minutes. "
                          f"Data for {feature} is hosted in {region}, encrypted with AES-256, and kept for "
                          f"{rng.randint(7, 90)} days. Teams of {rng.randint(2, 500)} people use {product} "
                          f"{feature} with {tool} to cut manual work by {rng.randint(5, 60)} percent.", ""]
            (folder / f"doc{d:03d}.md").write_text("\n".join(lines))
    return names


def questions(count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(QUESTION_TEMPLATES).format(product=rng.choice(PRODUCTS), feature=rng.choice(FEATURES),
                                                  tool=rng.choice(TOOLS)) + f" (ref {i})" for i in range(count)]


async def ingest_corpus(corpus: Path, kb_dir: Path, sites: list[str]) -> dict:
    from services.retriever import documents
    from services.retriever.knowledge import KnowledgeBase
    from shared.embeddings import Embedder

    kb = KnowledgeBase(kb_dir, Embedder()).open()
    chunks, started = 0, time.monotonic()
    try:
        for site in sites:
            await kb.ingest_many(site, [documents.read(site, path, path.name)
                                        for path in documents.collect([corpus / site])])
            chunks += sum(len(r["chunks"]) for r in kb.documents(site))
            print(f"  {site}: {len(kb.documents(site))} documents, {chunks} chunks so far "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        await kb.close()
    seconds = time.monotonic() - started
    return {"chunks": chunks, "ingest_s": round(seconds, 1), "chunks_per_s": round(chunks / seconds, 1)}


def _ingest(corpus: Path, kb_dir: Path, sites: list[str]) -> dict:
    return asyncio.run(ingest_corpus(corpus, kb_dir, sites))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest retriever", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_arguments(parser, rates="5,10,15,20,30,40", objective_ms=250.0)
    parser.add_argument("--variant", default="", help="also sweep with these retriever settings, e.g. RETRIEVAL_GRAPH_TOP_K=20")
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--docs", type=int, default=25, help="documents per site")
    parser.add_argument("--sections", type=int, default=20, help="sections (≈ chunks) per document")
    return parser


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="concierge-load-retriever-") as data:
        data_dir = Path(data)
        sites = make_corpus(data_dir / "corpus", args.sites, args.docs, args.sections)
        print(f"ingesting {args.sites} sites × {args.docs} documents × {args.sections} sections", flush=True)
        # In a child process: the ingest leaves millions of objects behind (LightRAG's shared
        # stores), and the load generator's garbage collections over them would pause its
        # event loop and add their pauses to the measured latencies.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            ingest = child.submit(_ingest, data_dir / "corpus", data_dir / "kb", sites).result()
        print(f"ingested {ingest['chunks']} chunks in {ingest['ingest_s']} s ({ingest['chunks_per_s']} chunks/s)",
              flush=True)
        points = _sweep(data_dir, sites, args, {})
        variant = None
        if args.variant:
            overrides = dict(kv.split("=", 1) for kv in args.variant.split(","))
            variant_points = _sweep(data_dir, sites, args, overrides)
            variant = {"settings": overrides, "rates": variant_points,
                       "max_sustainable_rate": sweep.max_sustainable(variant_points)}
    return sweep.report("retriever", args, LATENCY, points, mode="mix", sites=args.sites, **ingest,
                        **({"variant": variant} if variant else {}))


def main(argv: list[str] | None = None) -> int:
    return sweep.print_report(run(parser().parse_args(argv)))


def _sweep(data_dir: Path, sites: list[str], args: argparse.Namespace, overrides: dict[str, str]) -> list[dict]:
    """One retriever process (with `overrides` in its environment), swept over the rates."""
    system = make_system(data_dir / f"run-{time.time_ns()}", free_port(), free_port(),
                         {"LOG_LEVEL": "WARNING", "KB_DIR": str(data_dir / "kb"), **overrides})
    try:
        system.start_nats()
        started = time.monotonic()
        system.load_sites()  # the router's part: no service is ready before
        pid = system.start_service("retriever").pid
        system.wait_ready("retriever", 120)
        print(f"retriever ready in {time.monotonic() - started:.1f} s ({overrides or 'defaults'})", flush=True)
        # Every site's graph and key-value files are loaded on its first query: the warm-up
        # asks each site at least once, so no measured query pays for a first load.
        first = sweep.rates_of(args.rates)[0]
        warmup_s = max(args.warmup_s, len(sites) / first)
        asyncio.run(_drive(system.nats_url, first, warmup_s, "warmup", questions(int(first * warmup_s), seed=1), sites))

        def run_at(rate: float) -> driver.Run:
            asked = questions(int(rate * args.seconds), seed=int(rate * 100) + len(overrides))
            return asyncio.run(_drive(system.nats_url, rate, args.seconds, f"run{time.time_ns()}", asked, sites))

        return sweep.sweep(pid, args, run_at)
    finally:
        system.stop()


async def _drive(nats_url: str, rate: float, seconds: float, tag: str, asked: list[str], sites: list[str]) -> driver.Run:
    """Questions at `rate` per second, one turn per session, each timed to its `RetrievalCompleted`."""
    return await driver.drive(nats_url, rate, seconds, driver.conversations(tag, asked, tuple(sites)),
                              "retrieval_completed", labels=lambda event: [_label(event)])


def _label(event) -> str:
    if event.cancelled:
        return "cancelled"
    if event.error:
        return "error"
    return "documents" if event.documents else "empty"
