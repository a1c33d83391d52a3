"""`concierge eval sites [--site ID ...] [--split dev|test|all] [--docs DIR] [--base-url URL]`:
do answers hold on real websites nobody here wrote?

The sites are public documentation of real B2B products (site_corpus.py, realsites/sites.toml),
each served on 127.0.0.1 as its website and taken in through the product's own crawler: a
site created through the operator API (`PUT /v1/admin/sites/{site}`: its name and languages,
nothing tuned), its sitemap added as a source (`POST …/sources`), the run waited for. Then each
question of `realsites/<id>.jsonl` is asked over HTTP SSE as a visitor would, with whatever
answer backend the system has (no `LLM_BASE_URL`: the extractive default; with one, that
OpenAI-compatible endpoint). One row per line:

    {"id": str, "lang": str, "messages": [str, ...], "facts": [[spelling, ...], ...],
     "pages": [file, ...], "answerable": bool, "kind": str, "forbidden": [str, ...]}

Figures, per site and overall (answerable questions unless said):
- `all_facts`: every fact in the answer (answer_eval's matching: case, whitespace, bold and
  curly quotes ignored; a number never matched inside a longer one);
- `any_fact`: at least one;
- `right_page`: a page that answers it among the sources the answer cites;
- `refused`: routed away (REDIRECT) although the docs answer it, the "outside what I can
  help with" reply;
- `declined`: of the questions the docs do not answer, those answered with no citation (a
  "not found" naming where to ask) rather than with cited sentences;
- `forbidden`: statements the answer must not make; `ttft_ms_p50`/`p90`.

The split: a question is in `test` when the first byte of the SHA-256 of its id is odd,
else `dev` (about half each; tune on dev, report test). Exit 1 below the targets (TARGETS) on
the questions asked; 2 for a malformed dataset or no site at hand.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cli.harness.sse import Conversation
from cli.measure.evals import answer_eval, site_corpus
from cli.measure.stats import percentile
from shared import citations

TARGETS = {"all_facts": 0.75, "any_fact": 0.9, "right_page": 0.95, "declined": 0.9}
MAX_REFUSED = 0
MAX_FORBIDDEN = 0
SYNC_TIMEOUT_S = 900
LANGUAGES = ["en", "fr", "de"]


@dataclass(frozen=True)
class Question(answer_eval.Question):
    """The answers eval's question, with the pages that answer it, whether the docs do, and
    its kind (short, two-part, pricing...)."""
    pages: list[str]
    answerable: bool
    kind: str

    @property
    def split(self) -> str:
        return split_of(self.id)


def split_of(question_id: str) -> str:
    return "test" if hashlib.sha256(question_id.encode()).digest()[0] % 2 else "dev"


def _lines(path: Path):
    """(line number, line) of a JSONL file's lines that hold something."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            yield number, line


def read_questions(path: Path) -> list[Question]:
    out = []
    for number, line in _lines(path):
        try:
            row = json.loads(line)
            answerable = row["answerable"]
            assert isinstance(row["id"], str) and row["id"] and isinstance(answerable, bool)
            assert isinstance(row["messages"], list) and row["messages"]
            assert all(isinstance(m, str) and m.strip() for m in row["messages"])
            assert isinstance(row["facts"], list) and all(
                isinstance(f, list) and f and all(isinstance(s, str) and s.strip() for s in f) for f in row["facts"])
            assert isinstance(row["pages"], list) and all(isinstance(p, str) for p in row["pages"])
            assert (bool(row["facts"]) and bool(row["pages"])) == answerable
            forbidden = row.get("forbidden") or []
            assert isinstance(forbidden, list) and all(isinstance(s, str) and s.strip() for s in forbidden)
        except (ValueError, KeyError, AssertionError, TypeError):
            raise ValueError(f"{path}:{number}: expected {{\"id\", \"lang\", \"messages\": [str, ...], \"facts\": "
                             f"[[spelling, ...], ...], \"pages\": [file, ...], \"answerable\": bool}} (an answerable "
                             f"question has facts and pages, another neither)") from None
        out.append(Question(id=row["id"], lang=row.get("lang", "en"), messages=row["messages"], facts=row["facts"],
                            pages=row["pages"], answerable=answerable, kind=row.get("kind", ""),
                            forbidden=forbidden))
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


@dataclass
class Asked:
    question: Question
    answer: str
    route: str | None
    cited_pages: list[str]  # page paths of the cited sources
    ttft_ms: float | None
    error: str | None = None
    documents: list[dict] | None = None  # what retrieval gave the turn (from the log), with --save
    unknown_names: list[str] = field(default_factory=list)  # what the retriever found the site never mentions

    @property
    def missing(self) -> list[list[str]]:
        return answer_eval.missing_facts(self.answer, self.question.facts)

    @property
    def forbidden(self) -> list[str]:
        return answer_eval.forbidden_found(self.answer, self.question.forbidden)

    @property
    def refused(self) -> bool:
        return self.route == "REDIRECT"

    @property
    def declined(self) -> bool:
        """Answered with nothing cited: a "not found", a redirect."""
        return not self.cited_pages

    @property
    def right_page(self) -> bool:
        wanted = {site_corpus.url_path(p) for p in self.question.pages}
        return bool(wanted & set(self.cited_pages))


def figures(asked: list[Asked]) -> dict:
    answerable = [a for a in asked if a.question.answerable]
    unanswerable = [a for a in asked if not a.question.answerable]
    ttfts = [a.ttft_ms for a in asked if a.ttft_ms is not None]

    def rate(rows: list[Asked], test) -> float | None:
        return round(sum(1 for a in rows if test(a)) / len(rows), 4) if rows else None

    return {
        "questions": len(asked), "answerable": len(answerable), "unanswerable": len(unanswerable),
        "failed_turns": sum(1 for a in asked if a.error),
        "all_facts": rate(answerable, lambda a: not a.missing),
        "any_fact": rate(answerable, lambda a: len(a.missing) < len(a.question.facts)),
        "right_page": rate(answerable, lambda a: a.right_page),
        "declined": rate(unanswerable, lambda a: a.declined),
        "refused": sum(1 for a in answerable if a.refused),
        "answerable_declined": sum(1 for a in answerable if a.declined),
        "forbidden": sum(len(a.forbidden) for a in asked),
        "ttft_ms_p50": round(percentile(ttfts, 50), 1) if ttfts else None,
        "ttft_ms_p90": round(percentile(ttfts, 90), 1) if ttfts else None,
        # Every fact, by the question's language and by its kind (two-part, pricing...): where it holds.
        "all_facts_by_language": {lang: rate([a for a in answerable if a.question.lang == lang], lambda a: not a.missing)
                                  for lang in sorted({a.question.lang for a in answerable})},
        "all_facts_by_kind": {kind: rate([a for a in answerable if a.question.kind == kind], lambda a: not a.missing)
                              for kind in sorted({a.question.kind for a in answerable})},
    }


def passed(result: dict) -> bool:
    return (all(result[k] is None or result[k] >= target for k, target in TARGETS.items())
            and result["refused"] <= MAX_REFUSED and result["forbidden"] <= MAX_FORBIDDEN)


def miss_lines(a: Asked) -> list[str]:
    q = a.question
    problems = []
    if a.error:
        problems.append(f"turn failed: {a.error}")
    if q.answerable:
        if a.refused:
            problems.append("REFUSED")
        elif a.declined:
            problems.append("declined")
        if a.missing:
            problems.append("missing " + "; ".join(" | ".join(f) for f in a.missing))
        if not a.right_page and not a.declined:
            problems.append(f"cited {a.cited_pages}, not {[site_corpus.url_path(p) for p in q.pages]}")
    elif not a.declined:
        problems.append(f"answered an unanswerable question, citing {a.cited_pages}")
    if a.forbidden:
        problems.append("FORBIDDEN " + "; ".join(repr(f) for f in a.forbidden))
    if not problems:
        return []
    answer = " ".join(a.answer.split())
    return [f"  {q.id} [{q.lang}, {q.kind}, {a.route or 'no route'}] {q.messages[-1]!r}: " + "; ".join(problems),
            f"      answer: {answer[:400]!r}"]


# --- a site, taken in through the crawler -------------------------------------------------

def _headers(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def take_in(client: httpx.AsyncClient, base_url: str, token: str, site: str, name: str,
                  website: site_corpus.Website) -> dict:
    """The site created through the operator API, its website added by its sitemap, the first
    run waited for: the run's view (pages, failures) as `GET sources/{id}` shows it."""
    api = f"{base_url}/v1/admin/sites/{site}"
    created = await client.put(api, headers=_headers(token), json={"name": name, "languages": LANGUAGES})
    if created.status_code not in (200, 201):
        raise RuntimeError(f"PUT {api}: {created.status_code} {created.text[:300]}")
    added = await client.post(f"{api}/sources", headers=_headers(token),
                              json={"url": f"{website.url}/sitemap.xml", "max_pages": 1000})
    if added.status_code != 202:
        raise RuntimeError(f"POST {api}/sources: {added.status_code} {added.text[:300]}")
    source = added.json()["source"]
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while time.monotonic() < deadline:
        shown = (await client.get(f"{api}/sources/{source}", headers=_headers(token))).json()["source"]
        if shown["state"] in ("completed", "failed"):
            return shown
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{site}: the first run did not end within {SYNC_TIMEOUT_S} s")


async def ask(client: httpx.AsyncClient, base_url: str, site: str, website: site_corpus.Website,
              question: Question, token: str | None = None) -> Asked:
    """One question asked as a visitor; with the operator's `token`, the documents retrieval
    gave the answer are read from the conversation's log too."""
    visitor = Conversation(client, base_url, site)
    error = None
    for message in question.messages[:-1]:
        earlier = await answer_eval._say(visitor, message)
        if earlier.status != 200 or (earlier.final or {}).get("type") != "complete":
            error = f"an earlier turn failed ({earlier.status}, {(earlier.final or {}).get('type')})"
    result = await answer_eval._say(visitor, question.messages[-1])
    final = result.final or {}
    metadata = final.get("metadata") or {}
    if result.status != 200:
        error = f"HTTP {result.status} {json.dumps(result.body)[:200]}"
    elif final.get("type") != "complete":
        error = f"{final.get('type', 'no event')}: {final.get('message', '')}"[:200]
    sources = metadata.get("sources") or []
    cited = set(citations.cited(result.text, [s.get("n") for s in sources]))
    pages = [website.page_of(s.get("url") or "") for s in sources if s.get("n") in cited]
    ttft = None if result.first_token_s is None else result.first_token_s * 1000
    documents, unknown = None, []
    if token and result.session_id and final.get("type") == "complete":
        logged = await client.get(f"{base_url}/v1/admin/sites/{site}/conversations/{result.session_id}/events",
                                  headers=_headers(token))
        if logged.status_code == 200:
            retrieved = [e["event"] for e in logged.json()["events"] if e["type"] == "retrieval_completed"
                         and e["event"].get("turn") == final.get("turn")]
            documents = [d for r in retrieved[:1] for d in r.get("documents", [])]
            unknown = [n for r in retrieved[:1] for n in r.get("unknown_names", [])]
    return Asked(question=question, answer=result.text, route=metadata.get("route"),
                 cited_pages=[p for p in dict.fromkeys(pages) if p], ttft_ms=ttft, error=error, documents=documents,
                 unknown_names=unknown)


async def run_site(base_url: str, token: str, source: site_corpus.SiteSource, root: Path,
                   questions: list[Question], concurrency: int, out, save: bool = False,
                   under: str | None = None) -> tuple[list[Asked], dict]:
    pages = [p for p in site_corpus.pages(root, source.exclude) if not under or p.file.startswith(under)]
    website = site_corpus.Website(source.name, pages).start()
    try:
        async with httpx.AsyncClient(timeout=180) as client:
            started = time.monotonic()
            run = await take_in(client, base_url, token, source.id, source.name, website)
            took = time.monotonic() - started
            done = run.get("last_completed") or {}
            print(f"  {source.id}: {len(website.pages)} pages served, run {run['state']} in {took:.0f} s: "
                  f"{done.get('pages', 0)} pages, {done.get('added', 0)} added, {done.get('failed', 0)} failed",
                  file=out, flush=True)
            gate = asyncio.Semaphore(concurrency)

            async def one(question: Question) -> Asked:
                async with gate:
                    return await ask(client, base_url, source.id, website, question, token if save else None)

            asked = list(await asyncio.gather(*(one(q) for q in questions)))
            return asked, {"pages_served": len(website.pages), "sync_s": round(took, 1),
                           "pages_added": done.get("added", 0), "pages_failed": done.get("failed", 0)}
    finally:
        website.stop()


def _system(data: Path, extra: dict[str, str]):
    from cli.harness.supervisor import free_port, make_system

    # Every question comes from 127.0.0.1 (the per-IP limit would stop the eval, not measure
    # it); the sites are served there too, which the outbound guard allows by address only.
    return make_system(data, free_port(), free_port(), {"RATE_LIMIT_PER_IP_PER_MIN": "0",
                                                         "OUTBOUND_ALLOWED": "127.0.0.1", **extra})


def eval_sites(only: list[str] | None = None, split: str = "test", docs: Path | None = None,
               base_url: str | None = None, concurrency: int = 2, limit: int | None = None,
               save: Path | None = None, under: str | None = None, misses: bool = False, out=sys.stdout) -> int:
    """`save`: a JSONL file of every turn (the question, the answer, its route and cited pages,
    the documents retrieval gave it, as the log holds them). `under`: a part of each site
    (its pages under that directory, "cloud/"), asked only the questions those pages answer
    (a quick slice; what the docs do not answer is the whole site's to say). `misses`: say
    each missed question of the test split too (`shows_misses`)."""
    chosen = [s for s in site_corpus.sources() if not only or s.id in only]
    if only and (unknown := set(only) - {s.id for s in chosen}):
        print(f"concierge eval sites: no site {sorted(unknown)[0]} (known: "
              f"{', '.join(s.id for s in site_corpus.sources())})", file=sys.stderr)
        return 2
    at_hand: list[tuple[site_corpus.SiteSource, Path, list[Question]]] = []
    skipped = {}
    for source in chosen:
        root = site_corpus.locate(source, docs)
        if root is None:
            skipped[source.id] = f"not at hand: {source.how_to_get()}"
            continue
        questions = [q for q in read_questions(source.questions) if split == "all" or q.split == split]
        if under:
            questions = [q for q in questions if q.answerable and all(p.startswith(under) for p in q.pages)]
        at_hand.append((source, root, questions[:limit] if limit else questions))
    for site_id, why in skipped.items():
        print(f"site eval: {site_id} skipped, {why}", file=out)
    if not at_hand:
        print("site eval: no site at hand", file=sys.stderr)
        return 2
    backend = os.environ.get("LLM_ANSWER_BASE_URL") or os.environ.get("LLM_BASE_URL") or "the system's default"
    results: dict[str, list[Asked]] = {}
    runs: dict[str, dict] = {}

    async def all_sites(url: str, token: str) -> None:
        for source, root, questions in at_hand:
            results[source.id], runs[source.id] = await run_site(url, token, source, root, questions, concurrency, out,
                                                                 save is not None, under)

    if base_url:
        token = answer_eval._operator_token()
        if not token:
            print("site eval: --base-url needs ADMIN_TOKEN (or make run's .data/admin-token)", file=sys.stderr)
            return 2
        asyncio.run(all_sites(base_url.rstrip("/"), token))
    else:
        with tempfile.TemporaryDirectory(prefix="concierge-site-eval-") as data:
            system = _system(Path(data), {})
            print(f"site eval: starting a system (answer LLM: {backend}); logs in {system.log_dir} while it runs",
                  file=out, flush=True)
            try:
                try:
                    system.start_all()
                except (subprocess.CalledProcessError, TimeoutError, RuntimeError) as exc:
                    print(f"site eval: the system did not start: {exc}", file=sys.stderr)
                    return 1
                asyncio.run(all_sites(system.gateway_url, system.env["ADMIN_TOKEN"]))
            finally:
                system.stop()
    if save is not None:
        with save.open("w", encoding="utf-8") as file:
            for site_id, asked in results.items():
                for a in asked:
                    file.write(json.dumps({"site": site_id, "id": a.question.id, "route": a.route, "answer": a.answer,
                                           "cited_pages": a.cited_pages, "documents": a.documents,
                                           "unknown_names": a.unknown_names},
                                          ensure_ascii=False) + "\n")
    return report(results, runs, split, backend, skipped, out, misses)


def answer_again(saved: Path, out=sys.stdout, misses: bool = False) -> int:
    """`concierge eval sites --again FILE`: the extractive answerer run again, in this
    process, on the turns a `--save` file holds (each turn's documents, route and unknown
    names as the log had them), scored as the eval scores: what a change to the answerer
    does, without crawling and asking again. Also `in_documents`: the answerable questions
    with every fact among the documents the answer reads (the ceiling of any choice of
    sentences). A turn not answered (another route, a name the site never mentions) keeps
    its saved answer. The missed questions are said as `report` says them (a test
    question's only with `misses`)."""
    import msgspec

    from services.responder import extractive
    from services.responder.settings import AnswerSettings
    from shared import events as ev
    from shared.embeddings import shared_embedder

    questions = {q.id: (source, q) for source in site_corpus.sources() for q in read_questions(source.questions)}
    embedder, read = shared_embedder(), AnswerSettings().extractive_documents
    results: dict[str, list[Asked]] = {}
    holding = []
    for number, line in _lines(saved):
        try:
            row = json.loads(line)
            source, question = questions[row["id"]]
            documents = [msgspec.convert(d, ev.RetrievedDocument) for d in row["documents"] or []][:read]
        except (ValueError, KeyError, TypeError, msgspec.ValidationError):
            raise ValueError(f"{saved}:{number}: not a turn `concierge eval sites --save` writes") from None
        answer, cited = row["answer"], row["cited_pages"]
        if row["route"] == "ANSWER" and not row.get("unknown_names"):
            messages = question.messages
            picked = extractive.compose(messages[-1], documents, embedder.embed, name=source.name, lang=question.lang,
                                        previous=messages[-2] if len(messages) > 1 else "")
            urls = {d.n: d.source for d in documents}
            answer = " ".join(extractive.cite(p.text, p.n) for p in picked)
            cited = list(dict.fromkeys(site_corpus.url_path_of(urls[p.n]) for p in picked))
        results.setdefault(row["site"], []).append(
            Asked(question=question, answer=answer, route=row["route"], cited_pages=cited, ttft_ms=None))
        if question.answerable:
            holding.append(not answer_eval.missing_facts("\n".join(d.content for d in documents), question.facts))
    if not results:
        raise ValueError(f"{saved}: no turns")
    for asked in results.values():
        print_misses(asked, misses, out)
    overall = figures([a for asked in results.values() for a in asked])
    result = {"saved": str(saved), "sites": {site: figures(asked) for site, asked in results.items()},
              **overall, "in_documents": round(sum(holding) / len(holding), 4) if holding else None}
    print(f"site eval again: every fact {overall['all_facts']}  any fact {overall['any_fact']}  right page "
          f"{overall['right_page']}  declined {overall['declined']}  every fact among the documents read "
          f"{result['in_documents']}", file=out)
    print(json.dumps(result, ensure_ascii=False), file=out)
    return 0


def shows_misses(question: Question, misses: bool) -> bool:
    """Whether a missed question is said with its answer: a dev question always; a test
    question only when asked for (`--misses`), so that reporting the test split does not
    show it to whoever tunes the answers on the dev split."""
    return misses or question.split != "test"


def print_misses(asked: list[Asked], misses: bool, out) -> None:
    shown = [line for a in asked if shows_misses(a.question, misses) for line in miss_lines(a)]
    hidden = sum(1 for a in asked if not shows_misses(a.question, misses) and miss_lines(a))
    if shown:
        print("\n".join(shown), file=out)
    if hidden:
        print(f"  ({hidden} missed questions of the test split not shown: --misses shows them; never while "
              f"tuning)", file=out)


def report(results: dict[str, list[Asked]], runs: dict[str, dict], split: str, backend: str,
           skipped: dict[str, str], out=sys.stdout, misses: bool = False) -> int:
    for site_id, asked in results.items():
        print(f"site eval: {site_id} ({len(asked)} questions, split {split})", file=out)
        print_misses(asked, misses, out)
    per_site = {site_id: {**runs[site_id], **figures(asked)} for site_id, asked in results.items()}
    overall = figures([a for asked in results.values() for a in asked])
    for site_id, f in per_site.items():
        print(f"  {site_id:<11} all facts {f['all_facts']}  any fact {f['any_fact']}  right page {f['right_page']}  "
              f"declined {f['declined']}  refused {f['refused']}  forbidden {f['forbidden']}  "
              f"TTFT p50 {f['ttft_ms_p50']} ms", file=out)
    targets = ", ".join(f"{k} ≥ {v}" for k, v in TARGETS.items())
    print(f"  overall     all facts {overall['all_facts']}  any fact {overall['any_fact']}  right page "
          f"{overall['right_page']}  declined {overall['declined']}  refused {overall['refused']}  forbidden "
          f"{overall['forbidden']}  (targets: {targets}, refused {MAX_REFUSED}, forbidden {MAX_FORBIDDEN})", file=out)
    result = {"split": split, "backend": backend, "sites": per_site, "skipped": skipped, **overall,
              "passed": passed(overall)}
    print(json.dumps(result, ensure_ascii=False), file=out)
    return 0 if result["passed"] else 1
