"""Runs of a site's test cases (shared/eval_cases.py): each current case asked of the
system as it is now, through the real nodes, and judged against what it expects.

A run is a log of its own in the site's stream (session `ev.EVAL_RUN_PREFIX` + run id):
`EvalRunRequested`, then one `EvalCaseResult` per case as it is judged, then
`EvalRunCompleted` (how many passed, which failed, which failed first this time). The
gateway's `eval_runner` node (services/gateway/eval_runner.py) carries it out with `execute`:
each case's conversation before it and its message are published as turns of a session of
the case's own in this run (`ev.EVAL_TRY_PREFIX`), which the router, retriever and responder
answer as any turn; no visitor's conversation is touched, and a session with a leading
underscore is not a conversation: the listings, the insight figures and the lead and
handoff webhooks leave it out (`ev.is_conversation`).

A run asked for by something that happened (a sync that changed the knowledge, a config
change) has an id derived from it: asked again for the same cause, it is the same run.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Awaitable, Callable

import msgspec

from shared import eval_cases, subjects
from shared import events as ev
from shared.bus import Bus
from shared.facts import forbidden_found, missing_facts

REASONS = ("operator", "sync", "config")
CONCURRENCY = 2  # cases asked at once: a run never takes more than a visitor or two's share
POLL_S = 0.1
MAX_ANSWER = 4000  # characters of an answer kept in its result


def new_run_id(site: str, reason: str, cause: str = "") -> str:
    """A run's id: derived from its cause when it has one (one run per cause, whatever the
    reason: a sync and a config change settled together ask for one run)."""
    key = f"{site}|{cause}" if cause else f"{site}|{ev.new_id()}"
    return "run-" + hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def session_of(run: str) -> str:
    return ev.EVAL_RUN_PREFIX + run


def run_of(session: str) -> str:
    return session.removeprefix(ev.EVAL_RUN_PREFIX)


def try_session(run: str, case: str) -> str:
    """Where one case is asked in one run: `_try-<run hex>-<case hex>`."""
    return f"{ev.EVAL_TRY_PREFIX}{run.removeprefix('run-')}-{case.removeprefix('case-')}"


async def request(bus: Bus, site: str, reason: str, actor: str = "", cause: str = "") -> ev.EvalRunRequested:
    """Ask for a run of the site's cases (the gateway's eval_runner carries it out)."""
    if reason not in REASONS:
        raise ValueError(f"reason {reason!r}: one of {', '.join(REASONS)}")
    run = new_run_id(site, reason, cause)
    if cause and (asked := await bus.last(subjects.conv(site, session_of(run), "eval_run_requested"))) is not None:
        return asked  # asked for already (a trigger redelivered after JetStream's dedupe window)
    requested = ev.EvalRunRequested(event_id=ev.derived_id(f"{site}/{run}", "eval_runs", "requested"), site=site,
                                    session_id=session_of(run), turn=1, ts=ev.now(), producer="eval_runs",
                                    reason=reason, actor=actor, cause=cause)
    await bus.publish(requested)
    return requested


# --- judging (pure) ----------------------------------------------------------------------------

def _address(url: str) -> str:
    return url.strip().rstrip("/").lower()


def judge(expect: ev.Expect, *, intent: str, route: str, answer: str, cited: list[str]) -> list[str]:
    """Each expectation the turn missed, in words; [] when it passed."""
    failures = []
    if expect.intent and intent != expect.intent:
        failures.append(f"intent {intent or 'none'}, expected {expect.intent}")
    if expect.route and route != expect.route:
        failures.append(f"route {route or 'none'}, expected {expect.route}")
    failures += [f"missing fact: {spellings[0]}" for spellings in missing_facts(answer, expect.facts)]
    failures += [f"said what it must not: {phrase}" for phrase in forbidden_found(answer, expect.forbidden)]
    given = {_address(url) for url in cited}
    failures += [f"page not cited: {page}" for page in expect.pages if _address(page) not in given]
    if expect.decline and cited:
        failures.append(f"answered from {len(cited)} cited source(s), expected to decline")
    return failures


def _cited(metadata: dict) -> list[str]:
    return [s.get("url") or s.get("title", "") for s in metadata.get("sources") or [] if s.get("cited")]


# --- carrying a run out (the gateway's eval_runner) ---------------------------------------------

async def _ended(bus: Bus, site: str, session: str, turn: int, deadline_s: float) -> ev.Envelope | None:
    """The turn's TurnCompleted or TurnFailed, waited for up to `deadline_s`; None after."""
    until = time.monotonic() + deadline_s
    while True:
        for kind in ("turn_completed", "turn_failed"):
            last = await bus.last(subjects.conv(site, session, kind))
            if last is not None and last.turn == turn:
                return last
        if time.monotonic() >= until:
            return None
        await asyncio.sleep(POLL_S)


async def _ask(bus: Bus, site: str, session: str, turn: int, message: str, previous: str,
               deadline_s: float) -> ev.Envelope | None:
    """One turn of a case's session, published once (asked again after a crash, the stored
    request is waited for), and its end."""
    stored = await bus.last(subjects.conv(site, session, "turn_requested"))
    if stored is None or stored.turn < turn:
        await bus.publish(ev.TurnRequested(
            event_id=ev.derived_id(f"{site}/{session}/{turn}", "eval_runner", "turn"), site=site,
            session_id=session, turn=turn, ts=ev.now(), producer="eval_runner", message=message,
            previous=previous))
    return await _ended(bus, site, session, turn, deadline_s)


async def ask_case(bus: Bus, site: str, run: str, saved: ev.EvalCaseSaved, deadline_s: float) -> dict:
    """The case's conversation before it (its visitor's messages, each answered afresh) and
    its message, asked in its own session; what the last turn did, judged."""
    case = saved.case
    session = try_session(run, case.id)
    started = time.monotonic()
    asked = [m.content for m in case.history if m.role == "user"] + [case.message]
    end = None
    for turn, message in enumerate(asked, start=1):
        end = await _ask(bus, site, session, turn, message, asked[turn - 2] if turn > 1 else "", deadline_s)
        if not isinstance(end, ev.TurnCompleted):
            break
    fields = {"case_id": case.id, "version": saved.turn, "message": case.message}
    if not isinstance(end, ev.TurnCompleted):
        what = (f"turn failed in {end.node}: {end.reason[:300]}" if isinstance(end, ev.TurnFailed)
                else f"no answer within {deadline_s:.0f} s")
        return {**fields, "passed": False, "failures": [what], "seconds": round(time.monotonic() - started, 2)}
    response = await bus.last(subjects.conv(site, session, "response_completed"))
    answer = response.text if response is not None and response.turn == end.turn else ""
    metadata = end.metadata or {}
    intent, route, cited = metadata.get("intent") or "", metadata.get("route") or "", _cited(metadata)
    failures = judge(case.expect, intent=intent, route=route, answer=answer, cited=cited)
    return {**fields, "passed": not failures, "failures": failures, "intent": intent, "route": route,
            "answer": answer[:MAX_ANSWER], "cited": cited, "seconds": round(time.monotonic() - started, 2)}


async def results(bus: Bus, site: str, run: str) -> list[ev.EvalCaseResult]:
    return [r.event for r in await bus.read(subjects.conv(site, session_of(run), "eval_case_result"))]


async def previous_completed(bus: Bus, site: str, run: str) -> ev.EvalRunCompleted | None:
    """The site's newest completed run other than `run`."""
    done = [r.event for r in await bus.read(subjects.conv(site, "*", "eval_run_completed"))
            if r.event.session_id != session_of(run) and not r.event.error]
    return max(done, key=lambda e: e.ts, default=None)


async def execute(bus: Bus, requested: ev.EvalRunRequested,
                  emit: Callable[[dict], Awaitable[None]], deadline_s: float = 60.0,
                  concurrency: int = CONCURRENCY) -> dict:
    """Ask every current case, `concurrency` at a time, handing each result to `emit` (the
    node stores it) as it comes; the cases a result is already stored for (a run taken up
    again after a crash) are not asked again. The fields of the run's `EvalRunCompleted`."""
    site, run = requested.site, run_of(requested.session_id)
    started = time.monotonic()
    cases = [saved for saved, retired in (await eval_cases.current(bus, site)).values() if not retired]
    passed = {r.case_id: r.passed for r in await results(bus, site, run)}
    gate = asyncio.Semaphore(concurrency)

    async def one(saved: ev.EvalCaseSaved) -> None:
        async with gate:
            result = await ask_case(bus, site, run, saved, deadline_s)
        await emit(result)
        passed[saved.case.id] = result["passed"]

    await asyncio.gather(*(one(saved) for saved in cases if saved.case.id not in passed))
    mine = {saved.case.id: passed[saved.case.id] for saved in cases if saved.case.id in passed}
    failed = sorted(case for case, ok in mine.items() if not ok)
    previous = await previous_completed(bus, site, run)
    newly: list[str] = []
    if previous is not None:
        before = {r.case_id: r.passed for r in await results(bus, site, run_of(previous.session_id))}
        newly = [case for case in failed if before.get(case) is True]
    return {"cases": len(mine), "passed": len(mine) - len(failed), "failed": failed, "newly_failing": newly,
            "previous_run": run_of(previous.session_id) if previous is not None else "",
            "seconds": round(time.monotonic() - started, 2)}


# --- reading runs (the operator API) -----------------------------------------------------------

async def runs(bus: Bus, site: str) -> list[dict]:
    """The site's runs, newest first: when, why, and (once ended) how many passed."""
    requested = {r.event.session_id: r.event for r in await bus.read(subjects.conv(site, "*", "eval_run_requested"))}
    ended = {r.event.session_id: r.event for r in await bus.read(subjects.conv(site, "*", "eval_run_completed"))}
    out = [summary(event, ended.get(session)) for session, event in requested.items()]
    return sorted(out, key=lambda r: r["requested_at"], reverse=True)


def summary(requested: ev.EvalRunRequested, completed: ev.EvalRunCompleted | None) -> dict:
    shown = {"run": run_of(requested.session_id), "reason": requested.reason, "cause": requested.cause,
             "actor": requested.actor, "requested_at": requested.ts, "state": "running"}
    if completed is not None:
        shown.update(state="failed" if completed.error else "completed", completed_at=completed.ts,
                     cases=completed.cases, passed=completed.passed, failed=completed.failed,
                     newly_failing=completed.newly_failing, previous_run=completed.previous_run,
                     seconds=completed.seconds, error=completed.error,
                     pass_rate=round(completed.passed / completed.cases, 3) if completed.cases else None)
    return shown


async def run_detail(bus: Bus, site: str, run: str) -> dict | None:
    """One run: its summary and each case's result; None: no such run."""
    log = [r.event for r in await bus.read(subjects.conversation(site, session_of(run)))]
    requested = next((e for e in log if isinstance(e, ev.EvalRunRequested)), None)
    if requested is None:
        return None
    completed = next((e for e in log if isinstance(e, ev.EvalRunCompleted)), None)
    return {**summary(requested, completed),
            "results": [{k: v for k, v in msgspec.to_builtins(e).items() if k in RESULT_FIELDS}
                        for e in log if isinstance(e, ev.EvalCaseResult)]}


RESULT_FIELDS = ("case_id", "version", "passed", "failures", "message", "intent", "route", "answer", "cited",
                 "seconds", "ts")
