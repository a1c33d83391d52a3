"""A site's existing customers, for operators (under the operator prefix: operator.py): its
accounts and historical deals, imported or pulled (shared/accounts.py).

- `POST accounts/import`: a JSON body (`{"accounts": [...], "deals": [...]}`, or a list of
  accounts) or a CSV file's text (`Content-Type: text/csv`), at most 8 MiB; stores what is
  new or changed and answers the counts (`added`, `changed`, `unchanged`); a problem is a
  422 naming every field (`accounts[3].arr`, `line 4: renewal_date`), nothing stored;
- `GET  accounts`: the site's accounts, one line each (pulled first from the site's
  connector when it has one and its last fetch is older than `accounts.pull_ttl_s`);
- `GET  accounts/{account_id}`: one account in full, its usage metrics included;
- `GET  deals` (`?outcome=won`, `?tier=Growth`): the historical deals, newest first;
- `POST accounts/pull`: fetch from the site's connector now, whatever its cache (404: the
  site has none; 502: the connector failed, with why);
- `POST accounts/reports` (`{"accounts": [id, ...], "request_id": optional}`): one work item
  per account for its report (shared/account_reports.py), 202 with the request id; the same
  `request_id` again queues nothing twice (404: an id is not one of the site's accounts);
- `GET  accounts/{account_id}/reports`: every report of the account, oldest first, one line
  each (a failed one with why); `GET accounts/{account_id}/reports/latest`: the newest in
  full (404: none yet).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from shared import account_reports, accounts
from shared import events as ev
from shared import subjects
from services.gateway.access import operator_of_site
from services.gateway.errors import NotFound
from services.gateway.openapi import ACCOUNTS_IMPORT_OPENAPI, ID_PATTERN, SiteId
from services.gateway.operators import Operator
from services.gateway.schemas import decode, read_body

router = APIRouter()
AccountId = Annotated[str, Path(pattern=ID_PATTERN, description="an account's id")]
Who = Annotated[Operator, Depends(operator_of_site)]
Token = Annotated[str, msgspec.Meta(pattern=subjects.TOKEN_RE.pattern)]


class ReportsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    accounts: Annotated[list[Token], msgspec.Meta(min_length=1, max_length=accounts.MAX_ACCOUNTS)]
    request_id: Token | None = None  # the caller's: sent again, nothing is queued twice


_reports_request = msgspec.json.Decoder(ReportsRequest)


def _kind(request: Request) -> str:
    """The body's format from its Content-Type (none or another: sniffed from the text)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return "csv" if media in ("text/csv", "application/csv") else "json" if media.endswith("json") else ""


async def _pull(request: Request, site: str, force: bool) -> accounts.PullResult | None:
    config = (await request.app.state.sites.get(site)).accounts
    return await accounts.pull(request.app.state.bus, site, config, request.app.state.web,
                               request.app.state.settings.account_keys, force=force)


def _pulled(result: accounts.PullResult | None) -> dict | None:
    if result is None:
        return None
    return {"fetched": result.fetched, "at": result.at, "url": result.url, "error": result.error or None,
            "counts": result.counts}


@router.post("/accounts/import", openapi_extra=ACCOUNTS_IMPORT_OPENAPI)
async def import_accounts(request: Request, site: SiteId, who: Who):
    """Import accounts and deals: what is new or changed is stored, the rest left as it is."""
    data = await read_body(request, accounts.MAX_IMPORT_BYTES)
    portfolio = accounts.parse(data, _kind(request))  # AccountsError: a 422 naming each field (errors.py)
    event = await accounts.store(request.app.state.bus, site, portfolio, who.actor, "api")
    return {"site": site, **accounts.counts_of(portfolio, event)}


@router.get("/accounts")
async def list_accounts(request: Request, site: SiteId):
    """The site's accounts by name, each with its ARR, renewal and the metrics near their limit."""
    pulled = None
    try:
        pulled = _pulled(await _pull(request, site, force=False))
    except accounts.PullError as exc:  # what is stored still answers; the failure is shown
        pulled = {"fetched": True, "error": str(exc), "errors": exc.errors}
    found = await accounts.accounts(request.app.state.bus, site)
    return {"site": site, "accounts": [accounts.row(a) for a in found], "pull": pulled}


@router.post("/accounts/pull")
async def pull_accounts(request: Request, site: SiteId):
    """Fetch the site's accounts from its connector now (`[accounts] pull_url`)."""
    try:
        result = await _pull(request, site, force=True)
    except accounts.PullError as exc:
        return JSONResponse({"error": "pull_failed", "detail": str(exc), "errors": exc.errors}, status_code=502)
    if result is None:
        raise NotFound(f"site {site} has no account pull connector (accounts.pull_url)")
    return {"site": site, "pull": _pulled(result)}


@router.post("/accounts/reports", status_code=202)
async def request_reports(request: Request, site: SiteId):
    """Queue a report for each account named: one work item per account."""
    body = decode(await request.body() or b"{}", _reports_request)
    bus = request.app.state.bus
    try:
        items = await account_reports.requests_for(bus, site, body.accounts, "gateway", body.request_id)
    except account_reports.UnknownAccount as exc:
        raise NotFound(str(exc)) from None
    await account_reports.queue(bus, items)
    return {"site": site, "request_id": items[0].request_id, "accounts": [i.account_id for i in items]}


@router.get("/accounts/{account_id}/reports")
async def list_reports(request: Request, site: SiteId, account_id: AccountId):
    """Every report of the account (and every give-up), oldest first; the last is the latest."""
    found = await account_reports.reports(request.app.state.bus, site, account_id)
    return {"site": site, "account_id": account_id, "reports": [account_reports.row(r) for r in found]}


@router.get("/accounts/{account_id}/reports/latest")
async def latest_report(request: Request, site: SiteId, account_id: AccountId):
    """The account's newest report in full: an AccountReportCompleted, or its AccountReportFailed."""
    latest = await account_reports.latest(request.app.state.bus, site, account_id)
    if latest is None:
        raise NotFound(f"no report for account {account_id} in site {site}")
    return {"site": site, "account_id": account_id, "type": ev.event_type(latest), "event": ev.to_builtins(latest)}


@router.get("/accounts/{account_id}")
async def show_account(request: Request, site: SiteId, account_id: AccountId):
    """One account in full."""
    found = await accounts.account(request.app.state.bus, site, account_id)
    if found is None:
        raise NotFound(f"no account {account_id} in site {site}")
    return {"site": site, "account": accounts.as_data([found])[0]}


@router.get("/deals")
async def list_deals(request: Request, site: SiteId,
                     outcome: Annotated[Literal["won", "lost", "churned", "expanded"] | None, Query()] = None,
                     tier: Annotated[str | None, Query(max_length=accounts.MAX_TEXT)] = None):
    """The site's historical deals, newest first (only those of an outcome, a tier)."""
    found = [d for d in await accounts.deals(request.app.state.bus, site)
             if (outcome is None or d.outcome == outcome) and (tier is None or d.tier.casefold() == tier.casefold())]
    return {"site": site, "deals": accounts.as_data(found)}
