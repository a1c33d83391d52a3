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
"""

from __future__ import annotations

import hashlib
from typing import Iterable

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
    return ev.AccountReportRequested(event_id=ev.derived_id(request_id, "reports", account_id), site=site,
                                     session_id=session_of(account_id), turn=0, ts=ev.now(), producer=producer,
                                     account_id=account_id, request_id=request_id)


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
