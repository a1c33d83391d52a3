"""A site's own test cases: a visitor's message (with the conversation before it) and what
should have happened, saved by an operator from a real turn or written by hand.

Each case has a log of its own in the site's stream (session `ev.EVAL_CASE_PREFIX` + id, a
name no visitor's session has): `EvalCaseSaved` per version (turn N: version N), then
`EvalCaseRetired` when it is withdrawn; the newest version counts. A case made from a
turn names it (`from_session`, `from_turn`), so `concierge erase-visitor` finds the cases
holding what that visitor wrote and rewrites their logs redacted (cli/erase.py).

What a case expects, any of (at least one):
- `intent` and `route`: what the router should decide;
- `facts`: each one in any of its spellings must be in the answer (the answers eval's form,
  `[["QuickBooks"], ["10 minutes", "ten minutes"]]`), `forbidden` phrases must not;
- `pages`: URLs the answer must cite (each of them);
- `decline`: the assistant should say it does not know (no fact invented).
The shipped evaluation sets (services/*/data/*_eval.jsonl) hold the same fields.
"""

from __future__ import annotations

import hashlib
from itertools import groupby
from typing import Annotated, get_args

import msgspec

from shared import events as ev
from shared import subjects
from shared.bus import Bus

INTENTS = ("LEARN", "CONTEXT", "SUPPORT", "OFFTOPIC", "OTHER", "BOOKING", "STOP_BOOKING", "HACK")  # the router's
ROUTES = get_args(ev.Route)
MAX_MESSAGE = 2000
MAX_HISTORY = 20  # the conversation before the message, its last messages
MAX_CASES = 500  # a site's cases (retired ones not counted)

HistoryMessage, Expect, EvalCase = ev.HistoryMessage, ev.Expect, ev.EvalCase


class CaseInput(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What an operator sends: the message and history written out, or `from_session` and
    `from_turn` (the server reads them from the conversation's log)."""

    message: Annotated[str, msgspec.Meta(max_length=MAX_MESSAGE)] = ""
    history: list[HistoryMessage] = []
    lang: Annotated[str, msgspec.Meta(max_length=8)] = ""
    expect: Expect = msgspec.field(default_factory=Expect)
    note: Annotated[str, msgspec.Meta(max_length=500)] = ""
    from_session: Annotated[str, msgspec.Meta(max_length=64)] = ""
    from_turn: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0


class CaseError(ValueError):
    """Each problem as {field, message} (a 422 names them all)."""

    def __init__(self, errors: list[dict]):
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))
        self.errors = errors


def check(case: EvalCase) -> None:
    """CaseError naming every field that is wrong."""
    errors = []

    def bad(field: str, message: str) -> None:
        errors.append({"field": field, "message": message})

    if not case.message.strip():
        bad("message", "the visitor's message: not empty")
    elif len(case.message) > MAX_MESSAGE:
        bad("message", f"at most {MAX_MESSAGE} characters")
    if len(case.history) > MAX_HISTORY:
        bad("history", f"at most the last {MAX_HISTORY} messages")
    for i, m in enumerate(case.history):
        if m.role not in ("user", "assistant"):
            bad(f"history[{i}].role", "user or assistant")
    e = case.expect
    if e.intent and e.intent not in INTENTS:
        bad("expect.intent", f"one of {', '.join(INTENTS)}")
    if e.route and e.route not in ROUTES:
        bad("expect.route", f"one of {', '.join(ROUTES)}")
    if len(e.facts) > 20 or any(not f or len(f) > 10 or any(not s.strip() or len(s) > 200 for s in f) for f in e.facts):
        bad("expect.facts", "at most 20 facts, each 1 to 10 spellings of at most 200 characters")
    if len(e.forbidden) > 20 or any(not s.strip() or len(s) > 200 for s in e.forbidden):
        bad("expect.forbidden", "at most 20 phrases of at most 200 characters")
    if len(e.pages) > 10 or any(not p.startswith(("http://", "https://", "upload://", "text://")) or len(p) > 2000
                                for p in e.pages):
        bad("expect.pages", "at most 10 page addresses (http, https, or a source's upload:// or text://)")
    if e.decline and (e.facts or e.pages):
        bad("expect.decline", "a case that should decline expects no fact and no page")
    if not (e.intent or e.route or e.facts or e.forbidden or e.pages or e.decline):
        bad("expect", "at least one expectation: intent, route, facts, forbidden, pages or decline")
    if errors:
        raise CaseError(errors)


def case_id(site: str, message: str, from_session: str = "", from_turn: int = 0) -> str:
    """A case's id: from the turn it was made from (saving that turn again edits it), else
    from its message."""
    key = f"{site}|{from_session}|{from_turn}" if from_session else f"{site}|{message.strip().lower()}"
    return "case-" + hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def session_of(case: str) -> str:
    return ev.EVAL_CASE_PREFIX + case


async def _last_version(bus: Bus, site: str, case: str) -> int:
    last = await bus.last(subjects.conv(site, session_of(case), "eval_case_saved"))
    return last.turn if last is not None else 0


async def save(bus: Bus, site: str, case: EvalCase, actor: str) -> ev.EvalCaseSaved:
    """Store `case` as its next version (CaseError when it is wrong or the site has no room).
    The same content again is a version too: an edit is what the operator says it is."""
    check(case)
    version = await _last_version(bus, site, case.id)
    if version == 0 and len(await current(bus, site)) >= MAX_CASES:
        raise CaseError([{"field": "case", "message": f"the site has {MAX_CASES} cases: retire one first"}])
    saved = ev.EvalCaseSaved(event_id=ev.derived_id(f"{site}/{case.id}", "eval_cases", f"v{version + 1}"), site=site,
                             session_id=session_of(case.id), turn=version + 1, ts=ev.now(), producer="eval_cases",
                             case=case, actor=actor)
    await bus.publish(saved)
    return saved


async def retire(bus: Bus, site: str, case: str, actor: str) -> ev.EvalCaseRetired | None:
    """Withdraw the case (None: there is no such case); its versions stay in its log."""
    version = await _last_version(bus, site, case)
    if version == 0:
        return None
    retired = ev.EvalCaseRetired(event_id=ev.derived_id(f"{site}/{case}", "eval_cases", f"retired-{version}"),
                                 site=site, session_id=session_of(case), turn=version, ts=ev.now(),
                                 producer="eval_cases", actor=actor)
    await bus.publish(retired)
    return retired


async def versions(bus: Bus, site: str, case: str) -> list[ev.Envelope]:
    """The case's log: its versions and its retirement, oldest first."""
    return [r.event for r in await bus.read(subjects.conversation(site, session_of(case)))]


def latest(log: list[ev.Envelope]) -> tuple[ev.EvalCaseSaved, bool] | None:
    """A case's newest version in its log (oldest first), and whether it is retired (a
    version saved after the retirement brings it back); None: no version."""
    found = None
    for event in log:
        if isinstance(event, ev.EvalCaseSaved):
            found = (event, False)
        elif isinstance(event, ev.EvalCaseRetired) and found is not None:
            found = (found[0], True)
    return found


async def current(bus: Bus, site: str) -> dict[str, tuple[ev.EvalCaseSaved, bool]]:
    """Every case of the site: its newest version, and whether it is retired."""
    records = [*await bus.read(subjects.conv(site, "*", "eval_case_saved")),
               *await bus.read(subjects.conv(site, "*", "eval_case_retired"))]
    records.sort(key=lambda r: (r.event.session_id, r.seq))
    found = {}
    for session, log in groupby(records, key=lambda r: r.event.session_id):
        if (case := latest([r.event for r in log])) is not None:
            found[case[0].case.id] = case
    return found


# --- the shipped evaluation sets' format ----------------------------------------------------------
# A row of the answers eval (services/responder/data/answers_eval.jsonl, cli/measure/evals/
# answer_eval.py): {"id", "lang", "messages": [the visitor's messages, the last one asked],
# "facts", "forbidden"}, and optionally "intent", "route", "pages", "decline". The same
# rows are a site's cases: `concierge eval site --import FILE`, and `make run` imports the
# demo's (sites/demo.cases.jsonl).

def from_row(site: str, row: dict) -> EvalCase:
    """The case a row of the shipped sets' format describes (its id derived from the site and
    the row's id, so importing the row again edits that case); CaseError when it is wrong."""
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, str) for m in messages):
        raise CaseError([{"field": "messages", "message": "the visitor's messages, the last one asked"}])
    try:
        expect = msgspec.convert({k: row[k] for k in ("intent", "route", "facts", "forbidden", "pages", "decline")
                                  if k in row}, Expect)
    except msgspec.ValidationError as exc:
        raise CaseError([{"field": "expect", "message": str(exc)}]) from None
    case = EvalCase(id="case-" + hashlib.blake2b(f"{site}|row|{row.get('id', messages[-1])}".encode(),
                                                 digest_size=6).hexdigest(),
                    message=messages[-1], history=[HistoryMessage(role="user", content=m) for m in messages[:-1]],
                    lang=str(row.get("lang", "")), expect=expect, note=str(row.get("id", "")))
    check(case)
    return case


async def import_rows(bus: Bus, site: str, rows: list[dict], actor: str) -> dict[str, int]:
    """Each row saved as a case of the site unless its current version says the same (so an
    import run again, `make run` each time, adds no version); a retired one is brought back.
    {"saved", "unchanged"}; CaseError naming the first wrong row."""
    cases = []
    for number, row in enumerate(rows, start=1):
        try:
            cases.append(from_row(site, row))
        except CaseError as exc:
            raise CaseError([{**e, "field": f"row {number}: {e['field']}"} for e in exc.errors]) from None
    have = await current(bus, site)
    counts = {"saved": 0, "unchanged": 0}
    for case in cases:
        known = have.get(case.id)
        if known is not None and not known[1] and known[0].case == case:
            counts["unchanged"] += 1
            continue
        await save(bus, site, case, actor)
        counts["saved"] += 1
    return counts
