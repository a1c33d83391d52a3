"""A site's existing customers, for operators (under the operator prefix: operator.py): its
accounts and historical deals, imported or pulled (shared/accounts.py).

- `POST accounts/import`: a JSON body (`{"accounts": [...], "deals": [...]}`, or a list of
  accounts) or a CSV file's text (`Content-Type: text/csv`), at most 8 MiB; stores what is
  new or changed and answers the counts (`added`, `changed`, `unchanged`); a problem is a
  422 naming every field (`accounts[3].arr`, `line 4: renewal_date`), nothing stored;
- `GET  accounts` (`?limit=200&offset=0`): the site's accounts, one line each, a page at a
  time (`total`, `next_offset`; pulled first from the site's connector when it has one and its
  last fetch is older than `accounts.pull_ttl_s`); a site holds at most 10,000 accounts and
  10,000 deals (an import past that is a 422 naming the cap);
- `GET  accounts/{account_id}`: one account in full, its usage metrics included;
- `GET  deals` (`?outcome=won`, `?tier=Growth`, `?limit`, `?offset`): the historical deals,
  newest first, a page at a time;
- `POST accounts/pull`: fetch from the site's connector now, whatever its cache (404: the
  site has none; 502: the connector failed, with why);
- `POST accounts/reports` (`{"accounts": [id, ...], "request_id": optional}`): one work item
  per account for its report (shared/account_reports.py), 202 with the request id; the same
  `request_id` again queues nothing twice (404: an id is not one of the site's accounts);
- `GET  accounts/{account_id}/reports`: every report of the account, oldest first, one line
  each (a failed one with why); `GET accounts/{account_id}/reports/latest`: the newest in
  full, `report` its current version as the operator reads it (404: none yet);
- `GET  accounts/{account_id}/reports/{request_id}` (`?version=N`, default the latest): one
  report as of a version; `…/versions`: every version, how it came (generated, hand, asked),
  by whom, which sections changed; `…/diff?from=1&to=3`: each section that differs, before
  and after, and a unified diff;
- `POST accounts/{account_id}/reports/{request_id}/edits`: a hand edit (`{"section", "text",
  "base_version"}`) or a change asked for in words (`{"instruction"}`), queued for the
  enricher's `report_editor`, 202 with its `edit_id`; `GET …/edits/{edit_id}`: pending,
  done (the version it made) or failed (why);
- `POST accounts/opportunities` (`{"accounts": [...] (default all), "select": 3}`): a search
  for opportunities across the accounts, 202 with its request id; `GET accounts/opportunities`:
  the newest, ranked best first, each with its proposition and reason, the pre-selected
  flagged (404: none yet);
- `POST accounts/paste`: the paste-your-data demo: one account as JSON (either usage format)
  or free text (`Content-Type: text/plain`; services/gateway/account_paste.py), parsed and queued for a
  report at once, 202 with the account as read (422 naming what is missing); the report
  then at `GET accounts/{account_id}/reports/latest`. Nothing is stored in the portfolio.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from services.gateway import account_paste
from shared import account_reports, accounts
from shared import events as ev
from shared import subjects
from services.gateway.access import operator_of_site
from services.gateway.errors import NotFound
from services.gateway.openapi import ACCOUNTS_IMPORT_OPENAPI, ID_PATTERN, SiteId, schema_of
from services.gateway.operators import Operator
from services.gateway.schemas import RequestError, decode, read_body

router = APIRouter()
AccountId = Annotated[str, Path(pattern=ID_PATTERN, description="an account's id")]
Who = Annotated[Operator, Depends(operator_of_site)]
Token = Annotated[str, msgspec.Meta(pattern=subjects.TOKEN_RE.pattern)]


class ReportsRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    accounts: Annotated[list[Token], msgspec.Meta(min_length=1, max_length=accounts.MAX_ACCOUNTS)]
    request_id: Token | None = None  # the caller's: sent again, nothing is queued twice


_reports_request = msgspec.json.Decoder(ReportsRequest)


class OpportunitiesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    accounts: Annotated[list[Token], msgspec.Meta(max_length=accounts.MAX_ACCOUNTS)] = []
    select: Annotated[int, msgspec.Meta(ge=0, le=account_reports.MAX_SELECT)] = 3
    request_id: Token | None = None


_opportunities_request = msgspec.json.Decoder(OpportunitiesRequest)
SectionName = Annotated[str, msgspec.Meta(max_length=100)]


class EditRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A hand edit (`section`, `text`, the `base_version` it was written on) or a change asked
    for (`instruction`), never both."""

    section: SectionName | None = None
    text: Annotated[str, msgspec.Meta(max_length=account_reports.MAX_SECTION_CHARS)] | None = None
    base_version: Annotated[int, msgspec.Meta(ge=0)] = 0
    instruction: Annotated[str, msgspec.Meta(max_length=account_reports.MAX_INSTRUCTION_CHARS)] | None = None
    edit_id: Token | None = None  # the caller's: sent again, nothing is queued twice


_edit_request = msgspec.json.Decoder(EditRequest)
RequestId = Annotated[str, Path(pattern=ID_PATTERN, description="a report's request id")]


def _body(struct: type) -> dict:
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": schema_of(struct)}}}}


PASTE_OPENAPI = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "description": "one account (its usage a list of {metric, "
                                                                      "current, limit, unit} or a mapping)"}},
    "text/plain": {"schema": {"type": "string", "description": "an account described in free text: labelled lines "
                                                               "(Tier: Growth, ARR: $48,000, Renewal: 2027-02-15) "
                                                               "or prose (45 of 50 technician seats)"}}}}}


def _media(request: Request) -> str:
    """The body's media type, without its parameters ("text/plain; charset=utf-8" → "text/plain")."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def _kind(request: Request) -> str:
    """An import's format from its Content-Type (none or another: sniffed from the text)."""
    media = _media(request)
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


PAGE_LIMIT = 500  # rows of a listing at most (each account's row reads its last report)
Limit = Annotated[int, Query(ge=1, le=PAGE_LIMIT, description=f"rows in this page (at most {PAGE_LIMIT})")]
Offset = Annotated[int, Query(ge=0, description="rows skipped: the previous page's `next_offset`")]


def _page(rows: list, offset: int, limit: int) -> tuple[list, dict]:
    """One page of `rows` and where it stands (`total`, `next_offset`: None at the end)."""
    end = offset + limit
    return rows[offset:end], {"total": len(rows), "offset": offset, "limit": limit,
                              "next_offset": end if end < len(rows) else None}


@router.get("/accounts")
async def list_accounts(request: Request, site: SiteId, limit: Limit = 200, offset: Offset = 0):
    """The site's accounts by name, a page at a time (`limit`, `offset`), each with its ARR,
    renewal, the metrics near their limit and its last report."""
    pulled = None
    try:
        pulled = _pulled(await _pull(request, site, force=False))
    except accounts.PullError as exc:  # what is stored still answers; the failure is shown
        pulled = {"fetched": True, "error": str(exc), "errors": exc.errors}
    bus = request.app.state.bus
    found, page = _page(await accounts.accounts(bus, site), offset, limit)
    last = await asyncio.gather(*(account_reports.last_report(bus, site, a.id) for a in found))
    return {"site": site, "accounts": [{**accounts.row(a), "last_report": r} for a, r in zip(found, last)],
            **page, "pull": pulled}


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


@router.post("/accounts/reports", status_code=202, openapi_extra=_body(ReportsRequest))
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


@router.post("/accounts/opportunities", status_code=202, openapi_extra=_body(OpportunitiesRequest))
async def request_opportunities(request: Request, site: SiteId):
    """Queue a search for opportunities across the site's accounts (those named, or all)."""
    body = decode(await request.body() or b"{}", _opportunities_request)
    bus = request.app.state.bus
    wanted = list(dict.fromkeys(body.accounts))
    if wanted:
        known = {a.id for a in await accounts.accounts(bus, site)}
        if missing := [i for i in wanted if i not in known]:
            raise NotFound(str(account_reports.UnknownAccount(site, missing)))
    item = account_reports.opportunities_request(site, "gateway", wanted, body.select, body.request_id)
    await bus.publish_work(item)
    return {"site": site, "request_id": item.request_id}


@router.get("/accounts/opportunities")
async def show_opportunities(request: Request, site: SiteId):
    """The site's newest opportunity search: the accounts ranked, best first, with reasons."""
    bus = request.app.state.bus
    latest = await account_reports.latest_opportunities(bus, site)
    if latest is None:
        raise NotFound(f"no opportunity search in site {site} yet")
    names = {a.id: a.name for a in await accounts.accounts(bus, site)}
    return {"site": site, **account_reports.opportunities_view(latest, names)}


@router.post("/accounts/paste", status_code=202, openapi_extra=PASTE_OPENAPI)
async def paste_account(request: Request, site: SiteId):
    """The paste-your-data demo: one account (JSON, or free text) → its report, queued now."""
    data = await read_body(request, 4 * account_paste.MAX_CHARS)  # UTF-8: at most 4 bytes a character
    media = _media(request)
    kind = "text" if media.startswith("text/") else "json" if media.endswith("json") else ""
    # AccountsError: a 422 naming what is missing. In a thread: a 20,000-character paste is
    # read by many patterns, and the event loop serves every other request meanwhile.
    account = await asyncio.to_thread(account_paste.parse, data, kind)
    item = account_reports.pasted_request(site, account, "gateway")
    await request.app.state.bus.publish_work(item)
    return {"site": site, "account_id": account.id, "request_id": item.request_id,
            "account": accounts.as_data([account])[0]}


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
    current = None
    if isinstance(latest, ev.AccountReportCompleted):
        current = account_reports.view(latest, await account_reports.history_of(request.app.state.bus, site, latest))
    return {"site": site, "account_id": account_id, "type": ev.event_type(latest), "event": ev.to_builtins(latest),
            "report": current}


async def _report(request: Request, site: str, account_id: str, request_id: str):
    found = await account_reports.report(request.app.state.bus, site, account_id, request_id)
    if found is None:
        raise NotFound(f"no completed report {request_id} for account {account_id} in site {site}")
    return found


@router.get("/accounts/{account_id}/reports/{request_id}")
async def show_report(request: Request, site: SiteId, account_id: AccountId, request_id: RequestId,
                      version: Annotated[int | None, Query(ge=1)] = None):
    """One report as of `version` (default: its latest)."""
    completed, history = await _report(request, site, account_id, request_id)
    try:
        return {"site": site, **account_reports.view(completed, history, version)}
    except KeyError:
        raise NotFound(f"report {request_id} has no version {version} (it has {len(history)})") from None


@router.get("/accounts/{account_id}/reports/{request_id}/versions")
async def report_versions(request: Request, site: SiteId, account_id: AccountId, request_id: RequestId):
    """Every version of the report, oldest first: how it came, by whom, what it changed."""
    _, history = await _report(request, site, account_id, request_id)
    return {"site": site, "account_id": account_id, "request_id": request_id,
            "versions": [v.line() for v in history]}


@router.get("/accounts/{account_id}/reports/{request_id}/diff")
async def report_diff(request: Request, site: SiteId, account_id: AccountId, request_id: RequestId,
                      old: Annotated[int, Query(alias="from", ge=1)] = 1,
                      new: Annotated[int | None, Query(alias="to", ge=1)] = None):
    """What changed between two versions (default: the first and the latest)."""
    completed, history = await _report(request, site, account_id, request_id)
    try:
        return {"site": site, **account_reports.diff(completed, history, old, new or history[-1].version)}
    except KeyError as exc:
        raise NotFound(f"report {request_id} has no version {exc.args[0]} (it has {len(history)})") from None


@router.post("/accounts/{account_id}/reports/{request_id}/edits", status_code=202, openapi_extra=_body(EditRequest))
async def edit_report(request: Request, site: SiteId, account_id: AccountId, request_id: RequestId, who: Who):
    """Queue an edit of the report: a section by hand, or a change asked for in words."""
    body = decode(await request.body() or b"{}", _edit_request)
    hand = body.section is not None or body.text is not None
    if hand == (body.instruction is not None):
        raise RequestError(None, "give either section and text (a hand edit) or instruction (a change asked for)")
    if hand:
        section = account_reports.canonical(body.section or "")
        if section is None:
            raise RequestError("section", f"not a section of the report: one of {', '.join(account_reports.SECTIONS)}")
        if not (body.text or "").strip():
            raise RequestError("text", "the section's text is empty")
        fields = {"section": section, "text": body.text.strip(), "base_version": body.base_version}
    else:
        if not body.instruction.strip():
            raise RequestError("instruction", "the instruction is empty")
        fields = {"instruction": body.instruction.strip()}
    await _report(request, site, account_id, request_id)
    item = account_reports.edit_request(site, account_id, request_id, "hand" if hand else "asked", who.actor,
                                        "gateway", body.edit_id, **fields)
    await request.app.state.bus.publish_work(item)
    return {"site": site, "account_id": account_id, "request_id": request_id, "edit_id": item.edit_id}


@router.get("/accounts/{account_id}/reports/{request_id}/edits/{edit_id}")
async def edit_status(request: Request, site: SiteId, account_id: AccountId, request_id: RequestId,
                      edit_id: Annotated[str, Path(pattern=ID_PATTERN)]):
    """How an edit went: pending, done (the version it made) or failed (why)."""
    outcome = await account_reports.edit_outcome(request.app.state.bus, site, account_id, request_id, edit_id)
    line = {"site": site, "account_id": account_id, "request_id": request_id, "edit_id": edit_id}
    match outcome:
        case ev.AccountReportRevised():
            return {**line, "status": "done", "version": outcome.version, "how": outcome.how,
                    "changed": [c.name for c in outcome.changes], "ignored": outcome.ignored,
                    "backend": outcome.backend}
        case ev.AccountReportEditFailed():
            return {**line, "status": "failed", "reason": outcome.reason}
    return {**line, "status": "pending"}


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
                     tier: Annotated[str | None, Query(max_length=accounts.MAX_TEXT)] = None,
                     limit: Limit = 200, offset: Offset = 0):
    """The site's historical deals, newest first (only those of an outcome, a tier), a page at a time."""
    found = [d for d in await accounts.deals(request.app.state.bus, site)
             if (outcome is None or d.outcome == outcome) and (tier is None or d.tier.casefold() == tier.casefold())]
    found, page = _page(found, offset, limit)
    return {"site": site, "deals": accounts.as_data(found), **page}
