"""report_gatherer: everything an account's report may say, gathered once.

Takes `AccountReportRequested` work items from the BRIEFS work queue (each item to one
replica; gathering runs in parallel, unlike the model calls after it) and stores an
`AccountReportGathered` in the account's log (`_acct-<id>`): the account as stored now (its
usage metrics, ARR, renewal, tier), the site's most relevant historical deals (at most 8,
reports/deals.py, matched for the situation its figures show: reports/rules.py), and the
day the report is written for (the request's, so a redelivered item gathers the same), and
the sections the account manager wrote by hand (each section's newest hand edit across the
account's reports, as each report's latest version reads: the new report keeps them). An account pasted into the
demo comes with its item (`AccountReportRequested.account`) and is read from nowhere else.
An account that is not the site's (deleted since it was asked for) fails the item
(`AccountReportFailed`). A request already handled (its step stored) gathers nothing again.
"""

from __future__ import annotations

import datetime

from services.enricher.reports import deals, rules
from services.enricher.reports.failure import report_failed
from shared import account_reports
from shared import events as ev
from shared import subjects
from shared.briefs import has_step_in
from shared.node import Context, Inputs, Needs, Node, PermanentError

NAME = "report_gatherer"


def gathered(account: ev.Account, history: list[ev.Deal], site_name: str, today: str,
             kept: list[ev.ReportSection] | None = None) -> ev.ReportInputs:
    situation = rules.proposition(rules.read(account, today))
    return ev.ReportInputs(site_name=site_name, account=account, deals=deals.match(account, situation, history),
                           today=today, kept_sections=kept or [])


async def gather(event: ev.AccountReportRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    if has_step_in(inputs.log, event.request_id):
        return []
    account = event.account or inputs.account
    if account is None:
        raise PermanentError(f"no account {event.account_id!r} on site {event.site!r}")
    today = datetime.datetime.fromtimestamp(event.ts, datetime.timezone.utc).date().isoformat()
    data = gathered(account, list(inputs.deals), inputs.config.name or event.site, today,
                    account_reports.hand_edits(inputs.log["account_report_completed"],
                                               inputs.log["account_report_revised"]))
    return [ctx.follow(ev.AccountReportGathered, request_id=event.request_id, inputs=data)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("account_report_requested",), handle=gather,
                needs=Needs(config=True, portfolio=True, log=("account_report_gathered", "account_report_completed",
                                                              "account_report_revised")),
                stream=subjects.BRIEFS_STREAM, failure=report_failed)

