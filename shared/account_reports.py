"""Account reports as operators ask for and read them: the work items that ask for an
account's report, and an account's reports (every one kept; the newest is the latest).

One place for both ways in: `concierge accounts report` (cli/accounts.py) and the gateway's
operator API (services/gateway/routes/accounts.py). The reports are written by the
enricher's report nodes (services/enricher/report_gatherer.py, account_reporter.py), which
take the work items off the BRIEFS queue and store every step in the account's own log:

    conv.<site>._acct-<account id>.account_report_*

a session no widget conversation can have (a leading underscore), so an account's reports
never touch a visitor's log, and erasing a visitor never touches them. An account id too
long for a subject token next to the prefix is named by its hash (`session_of`); every
event carries the account id itself.

A report's versions: version 1 is its `AccountReportCompleted` (its sections stored split),
each `AccountReportRevised` of the same `request_id` the next (the sections it changed, by
hand or asked for in words, and which sections are hand edits from then on). Nothing is
overwritten: `versions` rebuilds every version from the log, `view` shows one, `diff`
compares two. Edits are work items too (`edit_request`), taken one at a time across the
deployment by the enricher's `report_editor`, so two edits never write the same version.

Opportunity searches across the site's accounts: `opportunities_request` queues one, the
enricher's `opportunity_finder` stores its outcome in the site's `_opportunities` log,
`latest_opportunities` reads the newest.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from typing import Iterable

import msgspec

from shared import accounts as accounts_
from shared import events as ev
from shared import subjects
from shared.bus import Bus
from shared.state import Record

Outcome = ev.AccountReportCompleted | ev.AccountReportFailed
OUTCOMES = ("account_report_completed", "account_report_failed")


class UnknownAccount(Exception):
    """An account named for a report is not one of the site's."""

    def __init__(self, site: str, ids: Iterable[str]):
        self.site, self.ids = site, sorted(ids)
        super().__init__(f"no account {', '.join(self.ids)} on site {site!r}")


def session_of(account_id: str) -> str:
    """The account's log: `_acct-<id>`, or `_acct-h<hash>` when that would not be a subject
    token (64 characters at most)."""
    session = ev.ACCOUNT_PREFIX + account_id
    if subjects.TOKEN_RE.match(session):
        return session
    return ev.ACCOUNT_PREFIX + "h" + hashlib.blake2b(account_id.encode(), digest_size=16).hexdigest()


def report_request(site: str, account_id: str, producer: str, request_id: str | None = None
                   ) -> ev.AccountReportRequested:
    """One work item: this account's report. Its id derives from the request and the account,
    so the same request queued twice (a retried API call with the same id) is one item."""
    request_id = request_id or ev.new_id()
    # The site in the id too: two sites' callers choosing the same request id queue two items.
    return ev.AccountReportRequested(event_id=ev.derived_id(f"{site}/{request_id}", "reports", account_id), site=site,
                                     session_id=session_of(account_id), turn=0, ts=ev.now(), producer=producer,
                                     account_id=account_id, request_id=request_id)


def pasted_request(site: str, account: ev.Account, producer: str) -> ev.AccountReportRequested:
    """The paste-your-data demo's work item: the pasted account travels with it (it is
    stored in no portfolio); its id derives from what was pasted, its request is new."""
    return msgspec.structs.replace(report_request(site, account.id, producer), account=account)


async def requests_for(bus: Bus, site: str, ids: Iterable[str], producer: str, request_id: str | None = None
                       ) -> list[ev.AccountReportRequested]:
    """One work item per account named (each once, in the order given), all of one request.
    Raises `UnknownAccount` before anything is made when an id is not one of the site's."""
    wanted = list(dict.fromkeys(ids))
    missing = [i for i in wanted if not subjects.TOKEN_RE.match(i) or await accounts_.account(bus, site, i) is None]
    if missing:
        raise UnknownAccount(site, missing)
    request_id = request_id or ev.new_id()
    return [report_request(site, i, producer, request_id) for i in wanted]


async def queue(bus: Bus, items: Iterable[ev.AccountReportRequested]) -> None:
    for item in items:
        await bus.publish_work(item)


def ordered(records: Iterable[Record]) -> list[Outcome]:
    """Report outcomes oldest first (by stream sequence: two subjects' records come in any order)."""
    return [r.event for r in sorted(records, key=lambda r: r.seq)
            if isinstance(r.event, (ev.AccountReportCompleted, ev.AccountReportFailed))]


async def reports(bus: Bus, site: str, account_id: str) -> list[Outcome]:
    """Every report of the account (and every give-up), oldest first."""
    session = session_of(account_id)
    return ordered([record for kind in OUTCOMES for record in await bus.read(subjects.conv(site, session, kind))])


async def latest(bus: Bus, site: str, account_id: str) -> Outcome | None:
    """The account's newest report outcome: a failed retry after a good report is what an
    operator waiting for one must see."""
    found = await reports(bus, site, account_id)
    return found[-1] if found else None


def row(outcome: Outcome) -> dict:
    """One report as a line of a list."""
    line: dict = {"request_id": outcome.request_id, "ts": outcome.ts, "account_id": outcome.account_id}
    match outcome:
        case ev.AccountReportCompleted():
            line.update(status="completed", backend=outcome.backend, metadata=ev.to_builtins(outcome.metadata),
                        verdict=outcome.verdict or None, numbers_warning=outcome.numbers_warning)
        case ev.AccountReportFailed():
            line.update(status="failed", reason=outcome.reason)
    return line


# --- a report's versions and edits ------------------------------------------------------------

SECTIONS = ev.REPORT_SECTIONS
MAX_SECTION_CHARS = 20_000  # a section's text, as an operator may write it
MAX_INSTRUCTION_CHARS = 1_000
EDIT_OUTCOMES = ("account_report_revised", "account_report_edit_failed")


@dataclass(frozen=True)
class Version:
    version: int
    ts: float
    how: str  # generated | hand | asked
    actor: str
    sections: dict[str, str]  # every section's text at this version, canonical order
    changed: list[str] = field(default_factory=list)
    hand_edited: list[str] = field(default_factory=list)
    instruction: str = ""
    backend: str = ""
    ignored: list[str] = field(default_factory=list)
    edit_id: str = ""

    def line(self) -> dict:
        return {"version": self.version, "ts": self.ts, "how": self.how, "actor": self.actor,
                "instruction": self.instruction, "sections": self.changed, "hand_edited": self.hand_edited,
                "backend": self.backend, "ignored": self.ignored}


def canonical(name: str) -> str | None:
    """A section's canonical name from any case ("risks" → "Risks"), None: not a section."""
    return next((s for s in SECTIONS if s.casefold() == name.strip().casefold()), None)


def versions(completed: ev.AccountReportCompleted, revisions: Iterable[ev.AccountReportRevised]) -> list[Version]:
    """Every version of the report, oldest first: the completed report, then each revision
    of it in version order (a version stored twice counts once)."""
    sections = {s.name: s.text for s in completed.sections}
    out = [Version(version=1, ts=completed.ts, how="generated", actor=completed.producer, sections=dict(sections),
                   changed=list(sections), hand_edited=list(completed.hand_edited), backend=completed.backend)]
    seen: set[int] = {1}
    for revision in sorted((r for r in revisions if r.request_id == completed.request_id), key=lambda r: r.version):
        if revision.version in seen:
            continue
        seen.add(revision.version)
        for change in revision.changes:
            sections[change.name] = change.text
        out.append(Version(version=revision.version, ts=revision.ts, how=revision.how, actor=revision.actor,
                           sections={name: sections[name] for name in SECTIONS if name in sections},
                           changed=[c.name for c in revision.changes], hand_edited=list(revision.hand_edited),
                           instruction=revision.instruction, backend=revision.backend, ignored=list(revision.ignored),
                           edit_id=revision.edit_id))
    return out


def hand_edits(completed: Iterable[ev.AccountReportCompleted], revisions: Iterable[ev.AccountReportRevised]
               ) -> list[ev.ReportSection]:
    """The account manager's hand edits a new report keeps: for each section, the newest
    change made to it in any of the account's reports, when that change was a hand edit.
    A section a later asked-for change rewrote (its instruction named it) is the writer's
    again; a copy carried into a newer report is no change (its hand edit keeps its time)."""
    editable = {report.request_id for report in completed if report.sections}
    newest: dict[str, tuple[float, int, str, str]] = {}
    for revision in revisions:
        if revision.request_id not in editable:
            continue
        for change in revision.changes:
            mark = (revision.ts, revision.version)
            if change.name not in newest or mark >= newest[change.name][:2]:
                newest[change.name] = (*mark, revision.how, change.text)
    return [ev.ReportSection(name=name, text=newest[name][3]) for name in SECTIONS
            if name in newest and newest[name][2] == "hand"]


def text_of(preamble: str, sections: dict[str, str]) -> str:
    """A version as markdown: the report's preamble, then each section under its heading."""
    parts = [preamble] + [f"## {name}\n\n{sections[name]}" for name in SECTIONS if name in sections]
    return "\n\n".join(part for part in parts if part).strip() + "\n"


def view(completed: ev.AccountReportCompleted, history: list[Version], version: int | None = None) -> dict:
    """The report as of `version` (None: the latest), as the operator API shows it."""
    shown = history[-1] if version is None else next((v for v in history if v.version == version), None)
    if shown is None:
        raise KeyError(version)
    text = text_of(completed.preamble, shown.sections) if completed.sections else completed.report
    return {"request_id": completed.request_id, "account_id": completed.account_id, "version": shown.version,
            "versions": len(history), "ts": completed.ts, "edited_ts": shown.ts, "backend": completed.backend,
            "text": text, "hand_edited": shown.hand_edited,
            "sections": [{"name": name, "text": body, "hand_edited": name in shown.hand_edited}
                         for name, body in shown.sections.items()],
            "metadata": ev.to_builtins(completed.metadata), "sales_script": completed.sales_script,
            "verdict": completed.verdict or None, "numbers_warning": completed.numbers_warning,
            "missing_numbers": completed.missing_numbers, "deals": completed.deals,
            "editable": bool(completed.sections)}


def diff(completed: ev.AccountReportCompleted, history: list[Version], old: int, new: int) -> dict:
    """What changed from version `old` to `new`: each section that differs, before and after,
    and a unified diff of the two texts."""
    by = {v.version: v for v in history}
    if old not in by or new not in by:
        raise KeyError(old if old not in by else new)
    a, b = by[old].sections, by[new].sections
    changed = [{"section": name, "before": a.get(name, ""), "after": b.get(name, "")}
               for name in SECTIONS if a.get(name) != b.get(name)]
    unified = "".join(difflib.unified_diff(text_of(completed.preamble, a).splitlines(keepends=True),
                                           text_of(completed.preamble, b).splitlines(keepends=True),
                                           fromfile=f"version {old}", tofile=f"version {new}"))
    return {"from": old, "to": new, "sections": changed, "unified": unified}


async def _of(bus: Bus, site: str, account_id: str, kind: str) -> list:
    return [r.event for r in sorted(await bus.read(subjects.conv(site, session_of(account_id), kind)),
                                    key=lambda r: r.seq)]


async def report(bus: Bus, site: str, account_id: str, request_id: str
                 ) -> tuple[ev.AccountReportCompleted, list[Version]] | None:
    """The account's report `request_id` and its versions; None: no such completed report."""
    completed = next((c for c in await _of(bus, site, account_id, "account_report_completed")
                      if c.request_id == request_id), None)
    if completed is None:
        return None
    return completed, await history_of(bus, site, completed)


async def history_of(bus: Bus, site: str, completed: ev.AccountReportCompleted) -> list[Version]:
    """The versions of a completed report already read."""
    return versions(completed, await _of(bus, site, completed.account_id, "account_report_revised"))


def edit_request(site: str, account_id: str, request_id: str, how: str, actor: str, producer: str,
                 edit_id: str | None = None, **fields) -> ev.AccountReportEditRequested:
    """One edit of a report as a work item; its id derives from the edit's (the caller's,
    sent again: nothing is queued twice)."""
    edit_id = edit_id or ev.new_id()
    return ev.AccountReportEditRequested(event_id=ev.derived_id(f"{site}/{account_id}/{request_id}/{edit_id}",
                                                                "reports", "edit"), site=site,
                                         session_id=session_of(account_id), turn=0, ts=ev.now(),
                                         producer=producer, account_id=account_id, request_id=request_id,
                                         edit_id=edit_id, how=how, actor=actor, **fields)


async def edit_outcome(bus: Bus, site: str, account_id: str, request_id: str, edit_id: str
                       ) -> ev.AccountReportRevised | ev.AccountReportEditFailed | None:
    """How edit `edit_id` of report `request_id` ended; None: not yet (or no such edit)."""
    for kind in EDIT_OUTCOMES:
        found = next((e for e in await _of(bus, site, account_id, kind)
                      if e.edit_id == edit_id and e.request_id == request_id), None)
        if found is not None:
            return found
    return None


async def last_report(bus: Bus, site: str, account_id: str) -> dict | None:
    """The account's newest report as a line of the portfolio (None: none yet): its status,
    metadata and latest version."""
    session = session_of(account_id)
    outcome = await bus.newest(*(subjects.conv(site, session, kind) for kind in OUTCOMES))
    if outcome is None:
        return None
    line = {"request_id": outcome.request_id, "ts": outcome.ts}
    if isinstance(outcome, ev.AccountReportFailed):
        return {**line, "status": "failed", "reason": outcome.reason}
    revised = await bus.last(subjects.conv(site, session, "account_report_revised"))
    version = revised.version if isinstance(revised, ev.AccountReportRevised) and \
        revised.request_id == outcome.request_id else 1
    return {**line, "status": "completed", "version": version, **ev.to_builtins(outcome.metadata)}


# --- opportunities across the site's accounts ------------------------------------------------

MAX_SELECT = 20


def opportunities_request(site: str, producer: str, account_ids: Iterable[str] = (), select: int = 3,
                          request_id: str | None = None) -> ev.OpportunitiesRequested:
    request_id = request_id or ev.new_id()
    return ev.OpportunitiesRequested(event_id=ev.derived_id(f"{site}/{request_id}", "reports",
                                                            ev.OPPORTUNITIES_SESSION),
                                     site=site, session_id=ev.OPPORTUNITIES_SESSION, turn=0, ts=ev.now(),
                                     producer=producer, request_id=request_id, accounts=list(account_ids),
                                     select=select)


async def latest_opportunities(bus: Bus, site: str) -> ev.OpportunitiesCompleted | ev.OpportunitiesFailed | None:
    """The site's newest opportunity search, or its newest give-up when that came later."""
    return await bus.newest(*(subjects.conv(site, ev.OPPORTUNITIES_SESSION, kind)
                              for kind in ("opportunities_completed", "opportunities_failed")))


def opportunities_view(outcome: ev.OpportunitiesCompleted | ev.OpportunitiesFailed, names: dict[str, str]) -> dict:
    line = {"request_id": outcome.request_id, "ts": outcome.ts}
    if isinstance(outcome, ev.OpportunitiesFailed):
        return {**line, "status": "failed", "reason": outcome.reason, "items": [], "selected": []}
    chosen = set(outcome.selected)
    return {**line, "status": "completed", "backend": outcome.backend, "accounts": outcome.accounts,
            "model_error": outcome.model_error or None, "selected": outcome.selected,
            "items": [{"account_id": o.account_id, "name": names.get(o.account_id, o.account_id),
                       "proposition": o.proposition, "reason": o.reason, "selected": o.account_id in chosen}
                      for o in outcome.items]}
