"""`concierge eval accounts [--mock] [--dataset FILE]`: the account-report contract, case by case.

Each case of services/enricher/data/accounts_eval.json has a `kind`, and each kind is run and
scored by its own function (`EVALS`), through the enricher's own node exactly as the service
runs it. A case's `expect` is what a good answer has, whoever gives it; its `recorded` is the
path the recorded replies take through the node, checked with `--mock` only: a live model
takes whichever path its answers lead to.

"report": one account's gathered data (an `ev.ReportInputs`: usage metrics, ARR, renewal,
tier, matched deals) through `account_reporter` (writer pass, section re-prompt, metadata
fallback, numeric check, evaluator and its retry, sales script). `expect`: the proposition
and the figures the report must state. `recorded`: the sections the re-prompt supplies,
metadata by the structured fallback, a second attempt, the numeric warning, a report that
fails because its metadata validates neither way. Scored over the reports that should complete:

- `sections_complete_rate`: every required section (after the re-prompt);
- `metadata_valid_rate`: completed with validated metadata (the line or the fallback);
- `proposition_accuracy`: the metadata's proposition is the case's;
- `numbers_kept_rate`: the figures the case says a report must state, stated (not only as
  part of an ISO date: a renewal on 2027-02-10 states no 10);
- `numbers_warning_accuracy`: the numeric check warns as recorded (live: never, the writer
  is told to state every figure);
- `sales_scripts_complete_rate`: a sales script with every heading sales_script.md asks for;
- `fallback_cases_ok`, `sections_repaired`, `retried`: completed reports whose metadata came
  from the fallback, whose sections the re-prompt supplied, that took a second attempt;
- `failures_as_expected`: the cases recorded to fail that ended in `AccountReportFailed`
  (each counts as passed); `path_misses`: cases whose path is not the recorded one (live: null).

"opportunities": a batch of accounts (the site's portfolio) and the request's day through
`opportunity_finder` (the model's validated ranking, its repair round, the rule when it is
still not valid). `expect`: each account's proposition, how the ranking begins where that is
clear, the accounts pre-selected for reports. `recorded.path`: the model's first answer used
(`model`), its answer after the repair round (`repaired`), or the rule's ranking (`rule`:
still not valid, `backend` data, `model_error` said). Scored:

- `opportunities_accuracy`: the accounts whose proposition is the case's, of all the cases';
- `opportunities_top_accuracy`, `opportunities_selected_accuracy`: the cases whose ranking
  begins as expected, whose pre-selection is the expected accounts;
- `opportunities_repaired`, `opportunities_by_rule`: the cases that took each path;
- `opportunities_path_misses`: with `--mock`, the cases whose path is not the recorded one;
  live, those the rule ranked (the model's ranking is what is measured, and the expected
  propositions are the rule's).

"edit": a report (the data-only report of the case's account, its sections split, as the
log holds it after `account_reporter`), the sections the account manager rewrote by hand
before (a version 2), and an instruction, through `report_editor` (`update_report`: the
model's sections validated, its repair round, the rule editor when still not valid, hand
edits kept unless named). `expect`: the sections changed, those to come out shorter, what
the changed text mentions. `recorded`: the path (`model`, `repaired`, `rule`) and the
hand-edited sections the model changed without being asked, kept out (`ignored`). Scored:

- `edits_ok`: the edits that meet every expectation: the sections changed and no other, a
  hand-edited section the instruction does not ask to change left as written (the node's
  guarantee: `keep_hand_edits` takes out what the model rewrote unasked), shorter where
  asked, the mentions, no figure in the changed text that the account data does not hold,
  and, live, no hand-edited section the model rewrote unasked (`ignored`; with `--mock`
  what the recording has, checked with the path);
- `hand_edits_kept_rate`: the model's behaviour, not the node's filter: of the edits the
  model made (not the rule editor) of a report with hand edits the instruction does not
  name, the share whose reply left them alone (nothing `ignored`);
- `edit_ungrounded_numbers`: figures of the changed sections no input holds;
- `edits_repaired`, `edits_by_rule`, `edits_ignored`: the edits that took the repair round,
  that the rule editor made, that kept a hand edit the model touched;
- `edits_path_misses`: as for opportunities (live: the edits the rule editor made).

`--mock` serves the recorded replies (accounts_recorded.json) from the scripted
OpenAI-compatible server, so the eval is deterministic (make test runs it); without it, the
`briefs` LLM role's endpoint (LLM_BASE_URL / LLM_BRIEFS_BASE_URL) answers. Each miss is
printed; the last line is one JSON object. Exit 1 when it did not pass: every section,
metadata, sales script, figure to keep and warning as expected, proposition and
opportunities accuracy ≥ 0.8, every ranking's beginning and pre-selection and every edit as
expected, and no path miss.

A new kind of case: a Struct for its cases tagged with the kind's name (its inputs and
expectations), added to `Case`, and one async function from its cases to a `Scored` in
`EVALS`; its figures join the JSON line (under names of its own), its misses the list, its
verdict `passed`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Literal

import msgspec

from cli.measure.evals.brief_eval import DATA, eval_llm, run
from services.enricher import account_reporter, opportunity_finder, report_editor
from services.enricher.briefs import document as sectioned
from services.enricher.briefs.writer import PROMPTS, ROLE
from services.enricher.reports import document, plain
from shared import account_reports, accounts, citations, subjects
from shared import events as ev
from shared.llm import LLMClient
from shared.site_config import SiteConfig
from shared.state import Record

DATASET = DATA / "accounts_eval.json"
RECORDED = DATA / "accounts_recorded.json"
SITE = "eval"
ISO_DATE = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
MIN_PROPOSITION_ACCURACY = 0.8
MIN_OPPORTUNITIES_ACCURACY = 0.8
# The first words of the nodes' repair rounds (reports/opportunities.py, reports/edits.py): a
# model call that carries them is the repair round's.
RANKING_REPAIR = "That ranking is not valid"
EDIT_REPAIR = "That edit is not valid"
# The headings the sales-script prompt asks for, read from it: the check follows the prompt.
SCRIPT_SECTIONS = tuple(line[3:].strip() for line in (PROMPTS / "sales_script.md").read_text(encoding="utf-8")
                        .splitlines() if line.startswith("## "))


class ReportExpect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    proposition: ev.Proposition
    numbers: list[str] = []  # figures the report must state


class RecordedPath(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The recorded replies' way through the node (the defaults: the straight way)."""

    repaired: list[str] = []  # sections the focused re-prompt supplies
    metadata: Literal["line", "structured"] = "line"  # structured: the line does not validate, the fallback does
    attempts: int = 1  # 2: the evaluator fails the first draft and the rewrite passes
    numbers_warning: bool = False  # more than half of the input figures left out
    fails: bool = False  # the metadata validates neither way: AccountReportFailed


class ReportCase(msgspec.Struct, tag="report", tag_field="kind", kw_only=True, forbid_unknown_fields=True):
    id: str
    description: str
    inputs: ev.ReportInputs
    expect: ReportExpect
    recorded: RecordedPath = msgspec.field(default_factory=RecordedPath)


class RankingExpect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    propositions: dict[str, ev.Proposition]  # every account's, by id
    first: list[str]  # how the ranking begins, as far as that is clear
    selected: list[str]  # the accounts pre-selected for reports (in any order)


class RankingPath(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: Literal["model", "repaired", "rule"] = "model"


class OpportunitiesCase(msgspec.Struct, tag="opportunities", tag_field="kind", kw_only=True,
                        forbid_unknown_fields=True):
    id: str
    description: str
    site_name: str = "Tidewise"
    today: str  # YYYY-MM-DD: the request's day, the one renewals are counted from
    select: int = 3
    accounts: list[ev.Account]
    expect: RankingExpect
    recorded: RankingPath = msgspec.field(default_factory=RankingPath)


class EditExpect(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    changed: list[str]  # the sections the edit changes, and no other
    shorter: list[str] = []  # of those, the ones to come out shorter
    mentions: list[str] = []  # what the changed sections say between them (a date, a metric's name)


class EditPath(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: Literal["model", "repaired", "rule"] = "model"
    ignored: list[str] = []  # hand-edited sections the model changed unasked, kept as written


class EditCase(msgspec.Struct, tag="edit", tag_field="kind", kw_only=True, forbid_unknown_fields=True):
    id: str
    description: str
    inputs: ev.ReportInputs  # the account the report is of (its data-only report is the one edited)
    hand: list[ev.ReportSection] = []  # sections the account manager rewrote by hand first (version 2)
    instruction: str
    expect: EditExpect
    recorded: EditPath = msgspec.field(default_factory=EditPath)


Case = ReportCase | OpportunitiesCase | EditCase  # every kind's cases, a union tagged by `kind`


class Dataset(msgspec.Struct, kw_only=True):
    cases: list[Case]


@dataclass
class Scored:
    """One kind's cases, run and scored: its figures (for the JSON line), its misses, its verdict."""

    figures: dict
    misses: list[str]
    passed: bool


def load(path: Path) -> list[Case]:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Dataset, strict=True).cases
    except msgspec.MsgspecError as exc:
        raise ValueError(f"{path}: {exc}") from None


def kept(report: str, figure: str) -> bool:
    """Whether `report` states `figure`. An ISO date's parts are the date's, not figures: a
    renewal on 2027-02-10 does not state a limit of 10."""
    return citations.value(figure) in citations.values(ISO_DATE.sub(" ", report))


def script_complete(script: str) -> bool:
    return not sectioned.missing_sections(script, SCRIPT_SECTIONS)


def rate(hits: int, total: int) -> float:
    return round(hits / total, 3) if total else 1.0


async def reports(cases: list[ReportCase], llm: LLMClient, concurrency: int, mock: bool) -> Scored:
    """The "report" kind: each account's inputs through `account_reporter`, as the service runs it."""
    node = account_reporter.make_node(llm, concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def one(case: ReportCase) -> tuple[ev.Envelope, list[ev.AccountReportDrafted]]:
        gathered = ev.AccountReportGathered(
            event_id=ev.derived_id(case.id, "eval", "gathered"), site=SITE, turn=0, ts=ev.now(), request_id=case.id,
            session_id=account_reports.session_of(case.inputs.account.id), inputs=case.inputs)
        async with gate:
            returned, emitted = await run(node, gathered)
        return returned[0], [e for e in emitted if isinstance(e, ev.AccountReportDrafted)]

    outcomes = await asyncio.gather(*(one(case) for case in cases), return_exceptions=True)
    misses: list[str] = []
    path_misses, failed_as_expected = 0, 0
    # What should complete: every case but those recorded to fail (with the recorded replies).
    should = [c for c in cases if not (mock and c.recorded.fails)]
    done: dict[str, tuple[ev.AccountReportCompleted, ev.AccountReportDrafted]] = {}
    for case, outcome in zip(cases, outcomes):
        fails = mock and case.recorded.fails
        if isinstance(outcome, BaseException):  # the model failed (the service would store an AccountReportFailed)
            misses.append(f"{case.id}: no report: {type(outcome).__name__}: {outcome}")
            path_misses += fails
            continue
        report, drafts = outcome
        if isinstance(report, ev.AccountReportFailed):
            if fails:
                failed_as_expected += 1
            else:
                misses.append(f"{case.id}: no report: {report.reason}")
            continue
        if fails:
            misses.append(f"{case.id}: completed, but its recorded metadata is valid neither way: expected "
                          "AccountReportFailed")
            path_misses += 1
            continue
        done[case.id] = report, drafts[-1]
        misses += [f"{case.id}: {miss}" for miss in contract_misses(case, report, mock)]
        if mock and (off := path_off(case.recorded, report, drafts[-1])):
            misses.append(f"{case.id}: path: {off}")
            path_misses += 1
    by_id = {c.id: c for c in should}
    kept_figures = [kept(r.report, f) for i, (r, _) in done.items() for f in by_id[i].expect.numbers]
    n = len(should)
    figures = {
        "sections_complete_rate": rate(sum(not document.missing_sections(r.report) for r, _ in done.values()), n),
        "metadata_valid_rate": rate(len(done), n),
        "proposition_accuracy": rate(sum(r.metadata.proposition == by_id[i].expect.proposition
                                         for i, (r, _) in done.items()), n),
        "numbers_kept_rate": rate(sum(kept_figures), sum(len(c.expect.numbers) for c in should)),
        "numbers_warning_accuracy": rate(sum(r.numbers_warning == warns(by_id[i], mock)
                                             for i, (r, _) in done.items()), n),
        "sales_scripts_complete_rate": rate(sum(script_complete(r.sales_script) for r, _ in done.values()), n),
        "fallback_cases_ok": sum(d.metadata_method == "structured" for _, d in done.values()),
        "sections_repaired": sum(bool(d.repaired_sections) for _, d in done.values()),
        "retried": sum(r.attempts > 1 for r, _ in done.values()),
        "failures_as_expected": failed_as_expected,
        "path_misses": path_misses if mock else None,
        "verdicts": {v: sum(r.verdict == v for r, _ in done.values()) for v in ("pass", "marginal", "fail")},
    }
    passed = (all(figures[k] == 1.0 for k in ("sections_complete_rate", "metadata_valid_rate", "numbers_kept_rate",
                                              "numbers_warning_accuracy", "sales_scripts_complete_rate"))
              and figures["proposition_accuracy"] >= MIN_PROPOSITION_ACCURACY and not path_misses)
    return Scored(figures, misses, passed)


def warns(case: ReportCase, mock: bool) -> bool:
    """Whether the numeric check should warn: as recorded; a live model is told to state every figure."""
    return mock and case.recorded.numbers_warning


def contract_misses(case: ReportCase, report: ev.AccountReportCompleted, mock: bool) -> list[str]:
    out = []
    if missing := document.missing_sections(report.report):
        out.append(f"sections missing: {', '.join(missing)}")
    if report.metadata.proposition != case.expect.proposition:
        out.append(f"proposition {report.metadata.proposition}, expected {case.expect.proposition}")
    if lost := [f for f in case.expect.numbers if not kept(report.report, f)]:
        out.append(f"figures not kept: {', '.join(lost)}")
    if report.numbers_warning != warns(case, mock):
        out.append(f"numbers warning {report.numbers_warning}, expected {warns(case, mock)} "
                   f"(input figures left out: {', '.join(report.missing_numbers) or 'none'})")
    if missing := sectioned.missing_sections(report.sales_script, SCRIPT_SECTIONS):
        out.append(f"sales script lacks {', '.join(missing)}")
    return out


def path_off(path: RecordedPath, report: ev.AccountReportCompleted, last: ev.AccountReportDrafted) -> str:
    """How the report's way through the node differs from the recorded one ("" when it does not)."""
    went = {"repaired": (last.repaired_sections, path.repaired), "metadata": (last.metadata_method, path.metadata),
            "attempts": (report.attempts, path.attempts)}
    return "; ".join(f"{name} {got}, recorded {want}" for name, (got, want) in went.items() if got != want)


def took(emitted: list[ev.Envelope], phrase: str) -> bool:
    """Whether one of the node's model calls carried `phrase` (a repair round's)."""
    return any(phrase in str(message.get("content", "")) for e in emitted if isinstance(e, ev.LLMCallRecorded)
               for message in e.call.messages)


def path_miss(recorded: str, path: str, mock: bool, what: str) -> str:
    """How a case's path is wrong ("" when it is not): with the recorded replies, not the
    recorded one; live, the rule's (the model's answer is what is measured)."""
    if mock:
        return f"path {path}, recorded {recorded}" if path != recorded else ""
    return f"the model's {what} was not used: the rule's was" if path == "rule" else ""


def noon(day: str) -> float:
    """A request's time on `day` (UTC): the day the node counts renewals from."""
    return datetime.datetime.fromisoformat(day).replace(hour=12, tzinfo=datetime.timezone.utc).timestamp()


async def opportunities(cases: list[OpportunitiesCase], llm: LLMClient, concurrency: int, mock: bool) -> Scored:
    """The "opportunities" kind: each batch through `opportunity_finder`, as the service runs it."""
    node = opportunity_finder.make_node(llm)
    gate = asyncio.Semaphore(concurrency)

    async def one(case: OpportunitiesCase) -> tuple[ev.OpportunitiesCompleted, str]:
        request = msgspec.structs.replace(
            account_reports.opportunities_request(SITE, "eval", select=case.select, request_id=case.id),
            ts=noon(case.today))
        async with gate:
            returned, emitted = await run(node, request, portfolio=accounts.Portfolio(accounts=case.accounts),
                                          config=SiteConfig(name=case.site_name))
        done = returned[0]
        return done, "rule" if done.model_error else "repaired" if took(emitted, RANKING_REPAIR) else "model"

    outcomes = await asyncio.gather(*(one(case) for case in cases), return_exceptions=True)
    misses: list[str] = []
    right, tops, selections, path_misses = 0, 0, 0, 0
    paths: list[str] = []
    for case, outcome in zip(cases, outcomes):
        # No ranking (the service would store an OpportunitiesFailed): every expectation missed.
        if isinstance(outcome, BaseException):
            misses.append(f"{case.id}: no ranking: {type(outcome).__name__}: {outcome}")
            continue
        done, path = outcome
        paths.append(path)
        got = {item.account_id: item.proposition for item in done.items}
        for account_id, want in case.expect.propositions.items():
            right += got.get(account_id) == want
            if got.get(account_id) != want:
                misses.append(f"{case.id}: {account_id} {got.get(account_id)}, expected {want}")
        begins = [item.account_id for item in done.items][:len(case.expect.first)]
        tops += begins == case.expect.first
        if begins != case.expect.first:
            misses.append(f"{case.id}: the ranking begins {', '.join(begins)}, expected {', '.join(case.expect.first)}")
        selections += set(done.selected) == set(case.expect.selected)
        if set(done.selected) != set(case.expect.selected):
            misses.append(f"{case.id}: selected {', '.join(done.selected) or 'none'}, expected "
                          f"{', '.join(case.expect.selected) or 'none'}")
        if off := path_miss(case.recorded.path, path, mock, "ranking"):
            misses.append(f"{case.id}: {off}" + (f" ({done.model_error})" if done.model_error else ""))
            path_misses += 1
    figures = {
        "opportunities_accuracy": rate(right, sum(len(c.expect.propositions) for c in cases)),
        "opportunities_top_accuracy": rate(tops, len(cases)),
        "opportunities_selected_accuracy": rate(selections, len(cases)),
        "opportunities_repaired": paths.count("repaired"),
        "opportunities_by_rule": paths.count("rule"),
        "opportunities_path_misses": path_misses,
    }
    passed = (figures["opportunities_accuracy"] >= MIN_OPPORTUNITIES_ACCURACY and not path_misses
              and figures["opportunities_top_accuracy"] == figures["opportunities_selected_accuracy"] == 1.0)
    return Scored(figures, misses, passed)


def logged(*events: ev.Envelope) -> list[Record]:
    """`events` as the account's log holds them, in this order."""
    return [Record(seq=i, subject=subjects.conv(e.site, e.session_id, ev.event_type(e)), event=e)
            for i, e in enumerate(events, start=1)]


def edit_log(case: EditCase) -> tuple[ev.AccountReportEditRequested, list[Record], account_reports.Version]:
    """The case's edit request, the log it reads (the report as gathered and completed, the
    hand edit), and the version it edits."""
    account_id = case.inputs.account.id
    about = {"site": SITE, "session_id": account_reports.session_of(account_id), "turn": 0,
             "ts": noon(case.inputs.today), "request_id": case.id}
    text, metadata = plain.report(case.inputs)
    preamble, sections = document.split(text)
    gathered = ev.AccountReportGathered(event_id=ev.derived_id(case.id, "eval", "gathered"), inputs=case.inputs,
                                        **about)
    completed = ev.AccountReportCompleted(event_id=ev.derived_id(case.id, "eval", "completed"), account_id=account_id,
                                          backend="data", report=text, metadata=metadata, sales_script="",
                                          preamble=preamble, sections=sections, **about)
    hand = [ev.AccountReportRevised(event_id=ev.derived_id(case.id, "eval", "hand"), account_id=account_id,
                                    edit_id=f"{case.id}-hand", version=2, how="hand", actor="eval", changes=case.hand,
                                    hand_edited=[s.name for s in case.hand], **about)] if case.hand else []
    request = account_reports.edit_request(SITE, account_id, case.id, "asked", "eval", "eval", f"{case.id}-asked",
                                           instruction=case.instruction)
    return request, logged(gathered, completed, *hand), account_reports.versions(completed, hand)[-1]


def unnamed_hand_edits(case: EditCase) -> list[str]:
    """The case's hand-edited sections its instruction does not ask to change."""
    return [s.name for s in case.hand if s.name not in case.expect.changed]


def edit_misses(case: EditCase, revised: ev.AccountReportRevised, before: account_reports.Version,
                mock: bool) -> list[str]:
    """How the revision misses the case's expectations. The revision's `changes` are what the
    node applied, after `keep_hand_edits` took out the hand-edited sections the model rewrote
    unasked; those are its `ignored`, the model's own behaviour: live, any is a miss (with the
    recorded replies the path check compares them to the recording)."""
    changes = {c.name: c.text for c in revised.changes}
    out = []
    if sorted(changes) != sorted(case.expect.changed):
        out.append(f"changed {', '.join(changes) or 'nothing'}, expected {', '.join(case.expect.changed)}")
    if not mock and revised.ignored:
        out.append("the model rewrote hand-edited sections the instruction does not name: "
                   f"{', '.join(revised.ignored)} (the node kept them as written)")
    if overwritten := [name for name in unnamed_hand_edits(case) if name in changes]:  # the node's guarantee
        out.append(f"hand-edited and not to change, overwritten: {', '.join(overwritten)}")
    if longer := [n for n in case.expect.shorter if n in changes and len(changes[n]) >= len(before.sections[n])]:
        out.append(f"not shorter: {', '.join(longer)}")
    said = "\n".join(changes.values()).casefold()
    if unsaid := [m for m in case.expect.mentions if m.casefold() not in said]:
        out.append(f"does not mention {', '.join(unsaid)}")
    if invented := ungrounded(revised, case.inputs):
        out.append(f"figures the account data does not hold: {', '.join(invented)}")
    return out


def ungrounded(revised: ev.AccountReportRevised, inputs: ev.ReportInputs) -> list[str]:
    return [f for change in revised.changes for f in document.ungrounded_numbers(change.text, inputs)]


async def report_edits(cases: list[EditCase], llm: LLMClient, concurrency: int, mock: bool) -> Scored:
    """The "edit" kind: each asked-for change through `report_editor`, as the service runs it."""
    node = report_editor.make_node(llm)
    gate = asyncio.Semaphore(concurrency)

    async def one(case: EditCase) -> tuple[ev.Envelope, str, account_reports.Version]:
        request, log, before = edit_log(case)
        async with gate:
            returned, emitted = await run(node, request, log, config=SiteConfig(name=case.inputs.site_name))
        outcome = returned[0]
        path = ("rule" if getattr(outcome, "backend", "") == "data" else
                "repaired" if took(emitted, EDIT_REPAIR) else "model")
        return outcome, path, before

    outcomes = await asyncio.gather(*(one(case) for case in cases), return_exceptions=True)
    misses: list[str] = []
    ok, path_misses, invented, kept_out = 0, 0, 0, 0
    asked, left_alone = 0, 0  # the model's edits of a report with unnamed hand edits; those that left them alone
    paths: list[str] = []
    for case, outcome in zip(cases, outcomes):
        # No revision (the service would store an AccountReportEditFailed): not ok, whatever it expects.
        if isinstance(outcome, BaseException):
            misses.append(f"{case.id}: no revision: {type(outcome).__name__}: {outcome}")
            continue
        revised, path, before = outcome
        if not isinstance(revised, ev.AccountReportRevised):
            misses.append(f"{case.id}: no revision: {getattr(revised, 'reason', revised)}")
            continue
        paths.append(path)
        kept_out += bool(revised.ignored)
        if unnamed_hand_edits(case) and path != "rule":  # the rule editor's edit says nothing of the model
            asked += 1
            left_alone += not revised.ignored
        invented += len(ungrounded(revised, case.inputs))
        found = edit_misses(case, revised, before, mock)
        ok += not found
        misses += [f"{case.id}: {miss}" for miss in found]
        off = path_miss(case.recorded.path, path, mock, "edit")
        if mock and revised.ignored != case.recorded.ignored:
            off = "; ".join(filter(None, [off, f"ignored {revised.ignored}, recorded {case.recorded.ignored}"]))
        if off:
            misses.append(f"{case.id}: {off}")
            path_misses += 1
    figures = {
        "edits_ok": ok,
        "hand_edits_kept_rate": rate(left_alone, asked),
        "edit_ungrounded_numbers": invented,
        "edits_repaired": paths.count("repaired"),
        "edits_by_rule": paths.count("rule"),
        "edits_ignored": kept_out,
        "edits_path_misses": path_misses,
    }
    return Scored(figures, misses, ok == len(cases) and not path_misses)


# Each kind of case: the function that runs its cases and scores them.
EVALS: dict[type, Callable[[list, LLMClient, int, bool], Awaitable[Scored]]] = {
    ReportCase: reports, OpportunitiesCase: opportunities, EditCase: report_edits}


async def evaluate(cases: list[Case], llm: LLMClient, concurrency: int, mock: bool) -> dict:
    started = time.monotonic()
    kinds: dict[type, list] = {}
    for case in cases:
        kinds.setdefault(type(case), []).append(case)
    result: dict = {"cases": len(cases), "kinds": {kind.__struct_config__.tag: len(of) for kind, of in kinds.items()}}
    misses: list[str] = []
    passed = True
    try:
        for kind, of in kinds.items():
            scored = await EVALS[kind](of, llm, concurrency, mock)
            if shared := result.keys() & scored.figures.keys():  # one kind's figure would hide another's
                raise ValueError(f"{kind.__name__}'s figures {sorted(shared)} are named already")
            result.update(scored.figures)
            misses += scored.misses
            passed = passed and scored.passed
    finally:  # its connections closed in its own loop (aiohttp warns about a session left open)
        for endpoint in llm.endpoints(ROLE):
            await endpoint.client.close()
    result["seconds"] = round(time.monotonic() - started, 2)
    result["passed"] = passed
    for miss in misses:
        print(f"miss: {miss}")
    return result


def eval_accounts(dataset: Path = DATASET, mock: bool = False, recording: Path = RECORDED, concurrency: int = 2) -> int:
    cases = load(dataset)
    with eval_llm("accounts", mock, recording, ROLE) as llm:
        if llm is None:
            return 2
        result = asyncio.run(evaluate(cases, llm, concurrency, mock))
    print(json.dumps(result))
    return 0 if result["passed"] else 1
