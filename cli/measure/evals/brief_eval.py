"""`concierge eval briefs [--mock] [--dataset FILE]`: the lead-brief contract, case by case.

Each case (services/enricher/data/briefs_eval.json: a hot lead with a large team, a tire-kicker,
a competitor mentioned, a support-only visitor, a German conversation, messy captured data,
numbers to preserve, ...) is one lead's gathered data. The eval hands it to the enricher's
`lead_briefer` node, exactly as the service runs it (writer passes, section repair, metadata
fallback, numeric audit, evaluator and its retry, call script), then hands every completed
brief to `lead_triager` in one triage. It scores:

- `sections_complete_rate`: briefs with every required section (after the re-prompt);
- `metadata_valid_rate`: briefs completed with validated metadata (a line or the fallback);
- `stage_accuracy`: the metadata's stage is the case's;
- `numbers_kept_rate`: the figures the case says a brief must keep, kept;
- `ungrounded_numbers`: figures the audit flagged; `audit_misses`: cases where what it flagged
  is not what the case expects (a case whose recorded brief invents one says which);
- `call_scripts_complete_rate`: call scripts with a talk track, objection handlers and a close;
- `triage_accuracy`: the triage's class is the case's.

`--mock` serves the recorded model replies (briefs_recorded.json) from the scripted
OpenAI-compatible server, so the eval is deterministic (make test runs it); without it, the
`briefs` LLM role's endpoint (LLM_BASE_URL / LLM_BRIEFS_BASE_URL) writes the briefs. Each miss
is printed; the last line is one JSON object. Exit 1 when it did not pass: every section,
metadata, call script and kept figure, no audit miss, triage accuracy ≥ 0.8.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from cli.harness.supervisor import ROOT, free_port, wait_http
from cli.replay.sandbox import FixedConfig, LogBus
from services.enricher import lead_briefer, lead_triager
from services.enricher.briefs.document import missing_sections
from shared import citations, subjects
from shared import events as ev
from shared.accounts import Portfolio
from shared.config import LLMRoleConfig
from shared.llm import LLMClient
from shared.node import Context, gather
from shared.site_config import SiteConfig
from shared.store import MemoryStore
from shared.state import Record

DATA = ROOT / "services" / "enricher" / "data"
DATASET = DATA / "briefs_eval.json"
RECORDED = DATA / "briefs_recorded.json"
SITE = "eval"
MIN_TRIAGE_ACCURACY = 0.8
SCRIPT_SECTIONS = ("Talk track", "Objection handlers", "Close")


class Expect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    triage: ev.TriageClass
    stage: ev.BriefStage
    numbers: list[str] = []
    ungrounded: list[str] = []


class Case(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    session_id: str
    description: str
    inputs: ev.BriefInputs
    expect: Expect


class Dataset(msgspec.Struct, kw_only=True):
    cases: list[Case]


def load(path: Path) -> list[Case]:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Dataset, strict=True).cases
    except msgspec.MsgspecError as exc:
        raise ValueError(f"{path}: {exc}") from None


async def run(node, event: ev.Envelope, log: list[Record] | None = None, portfolio: Portfolio | None = None,
              config: SiteConfig | None = None) -> tuple[list[ev.Envelope], list[ev.Envelope]]:
    """One node's handler on one event, as the runner would call it, its inputs read from `log`
    (and the site's `portfolio` and `config`, for a node that needs them): (returned, emitted)."""
    emitted: list[ev.Envelope] = []
    store = MemoryStore(lambda: log or [], portfolio=portfolio)
    inputs = await gather(node.needs, event, store, FixedConfig(config) if config is not None else None)
    assert inputs is not None, "the enricher's nodes join nothing"
    ctx = Context(out=LogBus(emitted.append, lambda _: None), node=node.name, cause=event, attempt=1)
    return list(await node.handle(event, inputs, ctx)), emitted


def kept(brief: str, figure: str) -> bool:
    return citations.value(figure) in {citations.value(f) for f in citations.figures(brief)}


async def evaluate(cases: list[Case], llm: LLMClient, concurrency: int) -> dict:
    briefer, triager = lead_briefer.make_node(llm, concurrency), lead_triager.make_node(llm)
    gate = asyncio.Semaphore(concurrency)
    misses: list[str] = []

    async def one(case: Case) -> ev.Envelope:
        gathered = ev.BriefGathered(event_id=ev.derived_id(case.id, "eval", "gathered"), site=SITE,
                                    session_id=case.session_id, turn=1, ts=ev.now(), request_id=case.id,
                                    inputs=case.inputs)
        async with gate:
            returned, _ = await run(briefer, gathered)
        return returned[0]

    started = time.monotonic()
    outcomes = await asyncio.gather(*(one(case) for case in cases), return_exceptions=True)
    done = {o.session_id: o for o in outcomes if isinstance(o, ev.BriefCompleted)}
    for case, outcome in zip(cases, outcomes):
        if isinstance(outcome, BaseException):  # the model failed (the service would store a BriefFailed)
            misses.append(f"{case.id}: no brief: {type(outcome).__name__}: {outcome}")
            continue
        if isinstance(outcome, ev.BriefFailed):
            misses.append(f"{case.id}: no brief: {outcome.reason}")
            continue
        if missing := missing_sections(outcome.brief):
            misses.append(f"{case.id}: sections missing: {', '.join(missing)}")
        if outcome.metadata.stage != case.expect.stage:
            misses.append(f"{case.id}: stage {outcome.metadata.stage}, expected {case.expect.stage}")
        if lost := [f for f in case.expect.numbers if not kept(outcome.brief, f)]:
            misses.append(f"{case.id}: figures not kept: {', '.join(lost)}")
        if sorted(outcome.ungrounded_numbers) != sorted(case.expect.ungrounded):
            misses.append(f"{case.id}: audit flagged {outcome.ungrounded_numbers}, expected {case.expect.ungrounded}")
        if absent := [s for s in SCRIPT_SECTIONS if f"## {s}" not in outcome.call_script]:
            misses.append(f"{case.id}: call script lacks {', '.join(absent)}")
    # What the triager reads of the site: each lead's capture, then its brief.
    captures = [ev.LeadCaptured(event_id=ev.derived_id(c.id, "eval", "lead"), site=SITE, session_id=c.session_id,
                                turn=1, ts=ev.now(), email=c.inputs.email) for c in cases]
    log = [Record(seq=i, subject=subjects.conv(e.site, e.session_id, ev.event_type(e)), event=e)
           for i, e in enumerate([*captures, *done.values()], start=1)]
    request = ev.TriageRequested(event_id=ev.derived_id("eval", "eval", "triage"), site=SITE,
                                 session_id=ev.TRIAGE_SESSION, turn=0, ts=ev.now(), request_id="eval")
    classes: dict[str, str] = {}
    try:
        [ranked], _ = await run(triager, request, log)
        if ranked.model_error:  # the rule ranked them: the model's triage is what is measured
            misses.append(f"triage: the model's was not used: {ranked.model_error}")
        else:
            classes = {item.session_id: item.classification for item in ranked.items}
    except Exception as exc:  # noqa: BLE001 - a triage that fails is scored, and said
        misses.append(f"triage failed: {exc}")
    for case in cases:
        got = classes.get(case.session_id)
        if got != case.expect.triage:
            misses.append(f"{case.id}: triage {got}, expected {case.expect.triage}")
    n = len(cases)
    briefs = list(done.values())
    figures = sum(len(c.expect.numbers) for c in cases)
    result = {
        "cases": n,
        "sections_complete_rate": round(sum(not missing_sections(b.brief) for b in briefs) / n, 3),
        "metadata_valid_rate": round(len(briefs) / n, 3),
        "stage_accuracy": round(sum(done[c.session_id].metadata.stage == c.expect.stage
                                    for c in cases if c.session_id in done) / n, 3),
        "numbers_kept_rate": round(sum(kept(done[c.session_id].brief, f) for c in cases if c.session_id in done
                                       for f in c.expect.numbers) / figures, 3) if figures else 1.0,
        "ungrounded_numbers": sum(len(b.ungrounded_numbers) for b in briefs),
        "audit_misses": sum(c.session_id in done and sorted(done[c.session_id].ungrounded_numbers)
                            != sorted(c.expect.ungrounded) for c in cases),
        "call_scripts_complete_rate": round(sum(all(f"## {s}" in b.call_script for s in SCRIPT_SECTIONS)
                                                for b in briefs) / n, 3),
        "retried": sum(b.attempts > 1 for b in briefs),
        "verdicts": {v: sum(b.verdict == v for b in briefs) for v in ("pass", "marginal", "fail")},
        "triage_accuracy": round(sum(classes.get(c.session_id) == c.expect.triage for c in cases) / n, 3),
        "seconds": round(time.monotonic() - started, 2),
    }
    result["passed"] = (result["sections_complete_rate"] == 1.0 and result["metadata_valid_rate"] == 1.0
                        and result["numbers_kept_rate"] == 1.0 and result["audit_misses"] == 0
                        and result["call_scripts_complete_rate"] == 1.0
                        and result["triage_accuracy"] >= MIN_TRIAGE_ACCURACY)
    for miss in misses:
        print(f"miss: {miss}")
    return result


@contextlib.contextmanager
def recorded_llm(recording: Path):
    """The scripted OpenAI-compatible server answering with the recorded replies."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "scripted-llm", "--port", str(port), "--recorded",
                             str(recording)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def eval_llm(command: str, mock: bool, recording: Path, role_name: str = "briefs"):
    """The model an eval runs against: the recorded replies served by the scripted server
    (`mock`), else the role's endpoint; None (said on stderr) when there is neither."""
    role = LLMRoleConfig.from_env(role_name)
    with (recorded_llm(recording) if mock else contextlib.nullcontext(role.base_url)) as base_url:
        if not base_url:
            print(f"concierge eval {command}: no model to eval: set LLM_BASE_URL (or LLM_BRIEFS_BASE_URL), "
                  "or use --mock for the recorded replies", file=sys.stderr)
            yield None
            return
        if mock:
            role = LLMRoleConfig(role=role_name, base_url=base_url, api_key="not-needed", model="recorded",
                                 max_retries=0)
        yield LLMClient({role_name: role})


def eval_briefs(dataset: Path = DATASET, mock: bool = False, recording: Path = RECORDED, concurrency: int = 2) -> int:
    cases = load(dataset)
    with eval_llm("briefs", mock, recording) as llm:
        if llm is None:
            return 2
        result = asyncio.run(evaluate(cases, llm, concurrency))
    print(json.dumps(result))
    return 0 if result["passed"] else 1
