"""`concierge eval answers [--dataset FILE] [--base-url URL] [--site SITE]`: are the answers right?

Each question of the dataset (`services/responder/data/answers_eval.jsonl`, written from
`knowledge/demo`) is asked through the running system over HTTP SSE, as a visitor would,
with whatever answer backend the system has. One row per line:

    {"id": str, "lang": str, "messages": [str, ...], "facts": [[spelling, ...], ...], "forbidden": [str, ...]}

`messages` are one conversation's visitor turns; only the answer to the last one is scored
(the earlier ones make follow-ups such as "And Xero?" meaningful). Scoring, per answer:

- facts: every fact must appear, in any of its spellings (case-insensitive, whitespace and
  `**` bold markers ignored; a spelling starting or ending with a digit does not match inside
  a longer number, so "29" is not found in "290");
- forbidden: no forbidden statement may appear (same matching);
- cited: the sources the turn sent (the `sources` SSE event) that the answer cites;
- unsupported numbers: figures of the answer that no message of the conversation, no text
  the answer was grounded on and none of the site's words in the `complete` metadata (its
  CTA label, the qualifying question) hold.

Citations and figures are read by the server's audit's rule (shared/citations.py). The
grounding text is the full title and content of the documents the answer was given, read
from the conversation log (operator endpoint) when an operator token is at hand (the system
this command starts; `ADMIN_TOKEN` or `make run`'s `.data/admin-token` with `--base-url`);
otherwise only the sources' titles and snippets (their first 240 characters, so more numbers
count as unsupported). The JSON says which (`grounding`). Reported, not a target. With the
log at hand the eval also reads the server's own audit of each answer (the `complete`
metadata's `cited` flags, `ResponseCompleted.unsupported_numbers`): `audit_disagreements`
counts the answers where the two differ (expected 0: one rule, the same inputs).

Without `--base-url` the command starts its own system (as `concierge bench` does) with the
demo knowledge base ingested for the site `demo` and the LLM environment as it is set (no
`LLM_BASE_URL`: the system's default answer backend), warms it up with one unscored turn,
and stops it at the end. With `--base-url` it asks a running gateway (e.g. `make run`).

Prints each miss, then, last, one JSON line of figures. Exit 1 below `all_facts_rate` 0.85 or
`citation_rate` 0.90, or with any forbidden statement; 2 for a malformed dataset.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from cli.harness.sse import ChatResult, Conversation
from cli.harness.supervisor import ROOT
from cli.measure.stats import percentile
from shared import citations
from shared.facts import forbidden_found, has_fact, missing_facts, normalize  # noqa: F401 - the scoring

DATASET = ROOT / "services" / "responder" / "data" / "answers_eval.jsonl"
MIN_ALL_FACTS_RATE = 0.85
MIN_CITATION_RATE = 0.90
MAX_FORBIDDEN = 0
RATE_LIMITED_RETRIES = 30  # a `make run` gateway allows 30 chats per minute per IP: wait, do not fail


@dataclass(frozen=True)
class Question:
    id: str
    lang: str
    messages: list[str]
    facts: list[list[str]]
    forbidden: list[str]


def read_dataset(path: Path) -> list[Question]:
    questions = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            assert isinstance(row["id"], str) and row["id"]
            assert isinstance(row["messages"], list) and row["messages"]
            assert all(isinstance(m, str) and m.strip() for m in row["messages"])
            assert isinstance(row["facts"], list) and all(
                isinstance(f, list) and f and all(isinstance(s, str) and s.strip() for s in f) for f in row["facts"])
            forbidden = row.get("forbidden") or []
            assert isinstance(forbidden, list) and all(isinstance(s, str) and s.strip() for s in forbidden)
        except (ValueError, KeyError, AssertionError, TypeError):
            raise ValueError(f"{path}:{number}: expected {{\"id\": str, \"messages\": [str, ...], "
                             f"\"facts\": [[spelling, ...], ...], \"forbidden\": [str, ...], \"lang\": str}}") from None
        questions.append(Question(id=row["id"], lang=row.get("lang", "?"), messages=row["messages"],
                                  facts=row["facts"], forbidden=forbidden))
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


# --- scoring (pure) ---------------------------------------------------------------------

def site_words(metadata: dict) -> list[str]:
    """The site's words a reply repeats, as the `complete` metadata shows them: the CTA's
    label, the qualifying question (the server's audit reads the same from the site's config)."""
    cta = metadata.get("cta") or {}
    question = (metadata.get("skill_selection_state") or {}).get("qualification_question")
    return [text for text in (cta.get("label"), question) if text]


@dataclass(frozen=True)
class Audit:
    """What the server's audit found in an answer: the sources it cites (sorted), its
    unsupported figures."""
    cited: list[int]
    unsupported: list[str]


@dataclass
class Scored:
    question: Question
    answer: str
    route: str | None
    missing: list[list[str]]
    forbidden: list[str]
    cited: list[int]  # the sent sources the answer cites
    unsupported: list[str]
    ttft_ms: float | None
    error: str | None = None
    grounding: str = "snippets"  # documents | snippets
    server: Audit | None = None  # the server's own audit, when the log was read

    @property
    def disagrees(self) -> bool:
        return self.server is not None and self.server != Audit(sorted(self.cited), self.unsupported)


def score(question: Question, answer: str, sources: list[dict], grounding: list[str], *, route: str | None = None,
          ttft_ms: float | None = None, error: str | None = None, grounding_kind: str = "snippets",
          server: Audit | None = None) -> Scored:
    """`grounding`: the texts the answer's figures may come from besides the conversation's
    messages (its documents or their snippets, the site's words)."""
    return Scored(question=question, answer=answer, route=route, missing=missing_facts(answer, question.facts),
                  forbidden=forbidden_found(answer, question.forbidden),
                  cited=citations.cited(answer, [s.get("n") for s in sources]),
                  unsupported=citations.unsupported(answer, grounding + question.messages), ttft_ms=ttft_ms,
                  error=error, grounding=grounding_kind, server=server)


def figures(scored: list[Scored]) -> dict:
    n = len(scored)
    ttfts = [s.ttft_ms for s in scored if s.ttft_ms is not None]
    facts_total = sum(len(s.question.facts) for s in scored)
    kinds = {s.grounding for s in scored}
    out = {
        "answers": n,
        "failed_turns": sum(1 for s in scored if s.error),
        "all_facts_rate": round(sum(1 for s in scored if not s.missing) / n, 4),
        "fact_recall": round(1 - sum(len(s.missing) for s in scored) / facts_total, 4) if facts_total else 1.0,
        "citation_rate": round(sum(1 for s in scored if s.cited) / n, 4),
        "forbidden": sum(len(s.forbidden) for s in scored),
        "unsupported_numbers": sum(len(s.unsupported) for s in scored),
        "answers_with_unsupported_numbers": sum(1 for s in scored if s.unsupported),
        "grounding": kinds.pop() if len(kinds) == 1 else "mixed",
        "audit_disagreements": (sum(1 for s in scored if s.disagrees)
                                if all(s.server is not None for s in scored) else None),
        "ttft_ms_p50": None if not ttfts else round(percentile(ttfts, 50), 1),
        "ttft_ms_p90": None if not ttfts else round(percentile(ttfts, 90), 1),
        "routes": {},
        "languages": sorted({s.question.lang for s in scored}),
    }
    for s in scored:
        out["routes"][s.route or "none"] = out["routes"].get(s.route or "none", 0) + 1
    out["passed"] = (out["all_facts_rate"] >= MIN_ALL_FACTS_RATE and out["citation_rate"] >= MIN_CITATION_RATE
                     and out["forbidden"] <= MAX_FORBIDDEN)
    return out


def miss_lines(s: Scored) -> list[str]:
    problems = []
    if s.error:
        problems.append(f"turn failed: {s.error}")
    if s.missing:
        problems.append("missing " + "; ".join(" | ".join(f) for f in s.missing))
    if s.forbidden:
        problems.append("FORBIDDEN " + "; ".join(repr(f) for f in s.forbidden))
    if not s.cited:
        problems.append("no citation of a sent source")
    if s.unsupported:
        problems.append("unsupported numbers " + ", ".join(s.unsupported))
    if s.disagrees:
        problems.append(f"the server's audit differs: cited {s.server.cited}, unsupported {s.server.unsupported}")
    if not problems:
        return []
    answer = " ".join(s.answer.split())
    return [f"  {s.question.id} [{s.question.lang}, {s.route or 'no route'}] {s.question.messages[-1]!r}: "
            + "; ".join(problems), f"      answer: {answer[:300]!r}"]


# --- asking the system ------------------------------------------------------------------

async def _say(visitor: Conversation, message: str) -> ChatResult:
    for _ in range(RATE_LIMITED_RETRIES):
        result = await visitor.say(message)
        if result.status != 429:
            return result
        await asyncio.sleep(2.0)
    return result


async def _logged_turn(client: httpx.AsyncClient, base_url: str, site: str, session: str, turn: int,
                       token: str) -> tuple[list[str], list[str]] | None:
    """From the log: the titles and full texts of the documents the answer of `turn` was
    given, and the figures the server's audit found unsupported; None when the operator
    endpoint refuses or the log does not say."""
    response = await client.get(f"{base_url}/v1/admin/sites/{site}/conversations/{session}/events",
                                headers={"Authorization": f"Bearer {token}"})
    if response.status_code != 200:
        return None
    events = [e for e in response.json()["events"] if e["event"].get("turn") == turn]
    completed = next((e["event"] for e in events if e["type"] == "response_completed"), None)
    if completed is None:
        return None
    retrieved = [d for e in events if e["type"] == "retrieval_completed" for d in e["event"].get("documents", [])]
    given = set(completed.get("sources", []))
    texts = [text for d in retrieved if d.get("n") in given for text in (d.get("title", ""), d.get("content", ""))]
    return texts, completed.get("unsupported_numbers", [])


async def ask(client: httpx.AsyncClient, base_url: str, site: str, question: Question,
              admin_token: str | None) -> Scored:
    visitor = Conversation(client, base_url, site)
    earlier_error = None
    for message in question.messages[:-1]:
        earlier = await _say(visitor, message)
        if earlier.status != 200 or (earlier.final or {}).get("type") != "complete":
            earlier_error = f"an earlier turn failed ({earlier.status}, {(earlier.final or {}).get('type')})"
    result = await _say(visitor, question.messages[-1])
    final = result.final or {}
    sources = next((e["sources"] for e in result.events if e["type"] == "sources"), [])
    metadata = final.get("metadata") or {}
    error = earlier_error
    if result.status != 200:
        error = f"HTTP {result.status} {json.dumps(result.body)[:200]}"
    elif final.get("type") != "complete":
        error = f"{final.get('type', 'no event')}: {final.get('message', '')}"[:200]
    grounding = [text for s in sources for text in (s.get("title", ""), s.get("snippet", ""))]
    kind, server = "snippets", None
    if admin_token and final.get("type") == "complete" and result.session_id:
        logged = await _logged_turn(client, base_url, site, result.session_id, final["turn"], admin_token)
        if logged is not None:
            grounding, kind = logged[0], "documents"
            server = Audit(cited=sorted(s["n"] for s in metadata.get("sources") or [] if s.get("cited")),
                           unsupported=logged[1])
    ttft = None if result.first_token_s is None else result.first_token_s * 1000
    return score(question, result.text, sources, grounding + site_words(metadata), route=metadata.get("route"),
                 ttft_ms=ttft, error=error, grounding_kind=kind, server=server)


async def ask_all(base_url: str, site: str, questions: list[Question], admin_token: str | None,
                  concurrency: int = 1) -> list[Scored]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=180) as client:
        async def one(question: Question) -> Scored:
            async with gate:
                return await ask(client, base_url, site, question, admin_token)

        return list(await asyncio.gather(*(one(q) for q in questions)))


def report(scored: list[Scored], dataset: Path, base_url: str, out=sys.stdout) -> int:
    result = figures(scored)
    result = {"dataset": str(dataset), "base_url": base_url, **result}
    print(f"answer eval: {dataset} ({len(scored)} questions asked through {base_url})", file=out)
    misses = [line for s in scored for line in miss_lines(s)]
    if misses:
        print("answers with a miss:\n" + "\n".join(misses), file=out)
    print(f"all facts {result['all_facts_rate']:.3f} (target ≥ {MIN_ALL_FACTS_RATE})  "
          f"cited {result['citation_rate']:.3f} (target ≥ {MIN_CITATION_RATE})  "
          f"forbidden {result['forbidden']} (target {MAX_FORBIDDEN})  "
          f"unsupported numbers {result['unsupported_numbers']} (checked against {result['grounding']}; "
          f"differing from the server's audit: {result['audit_disagreements']})  "
          f"TTFT p50 {result['ttft_ms_p50']} ms", file=out)
    print(json.dumps(result, ensure_ascii=False), file=out)
    return 0 if result["passed"] else 1


def _operator_token() -> str | None:
    if os.environ.get("ADMIN_TOKEN"):
        return os.environ["ADMIN_TOKEN"]
    made_by_run = ROOT / ".data" / "admin-token"
    return made_by_run.read_text().strip() if made_by_run.is_file() else None


def eval_answers(dataset: Path = DATASET, base_url: str | None = None, site: str = "demo",
                 concurrency: int = 1) -> int:
    questions = read_dataset(dataset)
    if base_url:
        scored = asyncio.run(ask_all(base_url.rstrip("/"), site, questions, _operator_token(), concurrency))
        return report(scored, dataset, base_url)
    from cli.harness.supervisor import free_port, make_system

    with tempfile.TemporaryDirectory(prefix="concierge-answer-eval-") as data:
        # Every question comes from 127.0.0.1: the per-IP limit would stop the eval, not measure it.
        system = make_system(Path(data), free_port(), free_port(), {"RATE_LIMIT_PER_IP_PER_MIN": "0"})
        backend = os.environ.get("LLM_ANSWER_BASE_URL") or os.environ.get("LLM_BASE_URL") or "the system's default"
        print(f"answer eval: starting a system (answer LLM: {backend}); logs in {system.log_dir} while it runs",
              flush=True)
        try:
            try:
                system.ingest(site)
                system.start_all()
            except (subprocess.CalledProcessError, TimeoutError, RuntimeError) as exc:
                print(f"answer eval: the system did not start: {exc}", file=sys.stderr)
                return 1
            warmup = Question(id="warm-up", lang="en", messages=["What does Tidewise do?"], facts=[], forbidden=[])
            asyncio.run(ask_all(system.gateway_url, site, [warmup], None))  # loads the models; not scored
            scored = asyncio.run(ask_all(system.gateway_url, site, questions, system.env["ADMIN_TOKEN"], concurrency))
        finally:
            system.stop()
        return report(scored, dataset, system.gateway_url + " (started by this command)")
