"""`concierge loadtest ingest`: how fast the offline path fills a knowledge base.

Generates the retriever load test's corpus (cli/measure/loadtest/retriever.py: `--sites`
sites × `--docs` documents × `--sections` sections, every section a chunk; the defaults
give 2,000 chunks), then reads, extracts, embeds and stores it the way `concierge ingest`
does, in this process, into a fresh knowledge base (Qdrant's local mode) in a temporary
directory. Nothing else runs: no NATS, no retriever.

The last line is one JSON object: chunks, seconds, chunks_per_s, and each stage's share of
those seconds (`shares`; their seconds under `stage_seconds`):

- read: the files parsed into documents;
- extract: chunking and the offline entity and relationship extraction;
- embed: the embedding model (chunks and entity descriptions; a relationship takes its chunk's vector), one pass per site;
- store: LightRAG's writes besides the embedding (graph, key-value files, Qdrant points);
- registry: the site's documents.json written.

The stages run one after the other; what their shares leave below 1 is the rest (opening
each site's stores). Shares adding up to more than 1 mean stages overlapped: LightRAG
embedding inside the store a text `ingest_many` had not prepared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from cli.measure import machine
from cli.measure.loadtest.retriever import make_corpus

STAGES = ("read", "extract", "embed", "store", "registry")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--docs", type=int, default=25, help="documents per site")
    parser.add_argument("--sections", type=int, default=20, help="sections (≈ chunks) per document")
    return parser


async def ingest(corpus: Path, kb_dir: Path, sites: list[str]) -> dict:
    from services.retriever import documents
    from services.retriever.knowledge import KnowledgeBase
    from shared.embeddings import Embedder

    kb = KnowledgeBase(kb_dir, Embedder()).open()
    read_s, chunks, docs = 0.0, 0, 0
    started, cpu_started = time.monotonic(), time.process_time()
    try:
        for site in sites:
            t = time.perf_counter()
            batch = [documents.read(site, path, path.name) for path in documents.collect([corpus / site])]
            read_s += time.perf_counter() - t
            await kb.ingest_many(site, batch)
            docs += len(batch)
            chunks += sum(len(r["chunks"]) for r in kb.documents(site))
            print(f"  {site}: {len(batch)} documents, {chunks} chunks so far ({time.monotonic() - started:.0f} s)",
                  flush=True)
    finally:
        await kb.close()
    seconds, cpu_seconds = time.monotonic() - started, time.process_time() - cpu_started
    stage_seconds = {"read": read_s, **{stage: kb.clock.seconds[stage] for stage in STAGES[1:]}}
    return {"test": "ingest", "sites": len(sites), "documents": docs, "chunks": chunks,
            "seconds": round(seconds, 2), "chunks_per_s": round(chunks / seconds, 1),
            # This process's CPU time, every thread's: steadier than the seconds on a shared machine.
            "cpu_seconds": round(cpu_seconds, 1),
            "shares": {stage: round(stage_seconds[stage] / seconds, 3) for stage in STAGES},
            "stage_seconds": {stage: round(stage_seconds[stage], 2) for stage in STAGES},
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "machine_gauge_ms": machine.gauge_ms()}


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="concierge-load-ingest-") as data:
        data_dir = Path(data)
        sites = make_corpus(data_dir / "corpus", args.sites, args.docs, args.sections)
        print(f"ingesting {args.sites} sites × {args.docs} documents × {args.sections} sections", flush=True)
        return asyncio.run(ingest(data_dir / "corpus", data_dir / "kb", sites))


def main(argv: list[str] | None = None) -> int:
    result = run(parser().parse_args(argv))
    print(f"ingest: {result['chunks']} chunks in {result['seconds']} s ({result['chunks_per_s']} chunks/s)", flush=True)
    print(json.dumps(result), flush=True)
    return 0
