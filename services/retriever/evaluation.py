"""Retrieval quality on the demo knowledge base: hit@5 and MRR per mode, with the limiter
and without.

The shipped set (`data/retrieval_eval.jsonl`) has one `{"question", "expected": [file, ...],
"history"?: [earlier visitor messages]}` per line; a question counts as a hit@5 when one
of its expected files is the source of one of the first five documents retrieved, and its
reciprocal rank is 1 / the rank of the first such document. The knowledge base is the demo
site's (`knowledge/demo`), ingested into a temporary directory, so the eval measures what
the repository ships. Target: hit@5 ≥ 0.85 in mix mode with the limiter (the defaults).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import msgspec

from services.retriever import documents
from services.retriever.knowledge import KnowledgeBase
from services.retriever.search import Retriever, search_text
from services.retriever.settings import RetrievalSettings
from shared.embeddings import Embedder
from shared import site_config

ROOT = Path(__file__).resolve().parents[2]
DEMO_KB = ROOT / "knowledge" / "demo"
DEMO_SITE = ROOT / "sites" / "demo.toml"
EVAL = Path(__file__).parent / "data" / "retrieval_eval.jsonl"
MODES = ("mix", "hybrid", "local", "global", "naive")
TARGET_HIT5 = 0.85


def read_dataset(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            assert isinstance(row["question"], str) and row["question"].strip()
            assert isinstance(row["expected"], list) and row["expected"]
        except (ValueError, KeyError, AssertionError, TypeError):
            raise ValueError(f"{path}:{number}: expected {{\"question\": str, \"expected\": [file, ...]}}") from None
        rows.append(row)
    return rows


async def _run(dataset: Path, kb_dir: Path) -> dict:
    rows = read_dataset(dataset)
    kb = KnowledgeBase(kb_dir, Embedder()).open()
    try:
        started = time.monotonic()
        await kb.ingest_many("demo", [documents.read("demo", path, path.name) for path in documents.collect([DEMO_KB])])
        ingest_s = time.monotonic() - started
        results = {}
        config = site_config.parse(DEMO_SITE)  # the demo site's own settings (its name, ...), as served
        for mode in MODES:
            for limiter_on in (True, False):
                settings = RetrievalSettings(mode=mode, limiter_enabled=limiter_on)
                retriever = Retriever(kb=kb, base=settings, rerankers={})
                hits, rr, latencies = 0, 0.0, []
                for row in rows:
                    history = row.get("history") or []
                    query = search_text(history[-1] if history else "", row["question"])
                    t = time.perf_counter()
                    found = await retriever.retrieve("demo", query, config, _no_record)
                    latencies.append((time.perf_counter() - t) * 1000)
                    files = [Path(kb.registry("demo")[d.doc_id]["path"]).name if d.doc_id else "" for d in found.documents]
                    rank = next((i for i, f in enumerate(files, start=1) if f in row["expected"]), None)
                    hits += rank is not None and rank <= 5
                    rr += 1 / rank if rank else 0.0
                latencies.sort()
                results[f"{mode}{'' if limiter_on else '_no_limiter'}"] = {
                    "hit_at_5": round(hits / len(rows), 3), "mrr": round(rr / len(rows), 3),
                    "p50_ms": round(latencies[len(latencies) // 2], 2)}
        return {"questions": len(rows), "ingest_s": round(ingest_s, 2), "results": results}
    finally:
        await kb.close()


async def _no_record(_call) -> None:
    return None


def eval_retrieval(dataset: Path = EVAL) -> int:
    with tempfile.TemporaryDirectory(prefix="concierge-eval-kb-") as tmp:
        report = asyncio.run(_run(dataset, Path(tmp)))
    print(f"retrieval on {dataset.name}: {report['questions']} questions, demo KB ingested in {report['ingest_s']} s")
    print(f"{'mode':<20}{'hit@5':>8}{'MRR':>8}{'p50 ms':>10}")
    for name, r in report["results"].items():
        print(f"{name:<20}{r['hit_at_5']:>8.3f}{r['mrr']:>8.3f}{r['p50_ms']:>10.2f}")
    hit5 = report["results"]["mix"]["hit_at_5"]
    passed = hit5 >= TARGET_HIT5
    print(f"mix hit@5 {hit5:.3f} (target ≥ {TARGET_HIT5})")
    print(msgspec.json.encode({"dataset": str(dataset), **report, "mix_hit_at_5": hit5, "passed": passed}).decode())
    return 0 if passed else 1
