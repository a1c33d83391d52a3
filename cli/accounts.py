"""`concierge accounts`: a site's existing customers and its historical deals (shared/accounts.py).

    accounts import --site SITE FILE [--format json|csv]
        store the file's accounts and deals (JSON: {"accounts": [...], "deals": [...]}, or
        a CSV file of accounts or of deals; docs/operations.md, "Accounts"): what is new or
        changed is stored, the rest left as it is, and the counts printed
    accounts list --site SITE [--json]
        the site's accounts, one line each (--json: every field, and the deals)
    accounts pull --site SITE [--force]
        fetch from the site's pull connector (`[accounts] pull_url` in its config) when its
        last fetch is older than `pull_ttl_s` (--force: now); it refuses loopback and private
        addresses unless OUTBOUND_ALLOW_PRIVATE_NETWORKS=1; its key from the ACCOUNTS_KEY_*
        variable the site names
    accounts report --site SITE --account ID [--account ID ...]
        queue a report for each account (one work item each on the BRIEFS work queue; the
        enricher's report nodes write it: shared/account_reports.py) and print the request id
    accounts report show --site SITE --account ID [--report REQUEST] [--version N] [--json]
        the account's latest report (or REQUEST) in full as of its latest version (or N),
        its sales script included, and how many reports and versions it has (all are kept)
    accounts report edit --site SITE --account ID [--report REQUEST]
                         (--section NAME (--text TEXT | --file FILE) [--base-version N] | --ask TEXT)
        a section rewritten by hand (kept by later edits and later reports), or a change asked
        for in words ("make the risks section shorter and mention the renewal": only what it
        asks changes); waits for the new version (--wait seconds, default 60) and prints it
    accounts report history --site SITE --account ID [--report REQUEST] [--diff A B]
        every version of the report: how it came (generated, hand, asked), by whom, which
        sections changed (--diff: what changed from version A to B)
    accounts opportunities --site SITE [--account ID ...] [--select N] [--wait S]
        rank the accounts (all, or those named) by opportunity: upsell, negotiation, churn or
        healthy, each with its reason; the best N (default 3) pre-selected for reports, and
        the command that asks for them printed

Exit status: 0; 1 when a pull failed, the latest report failed, an edit was refused (why
printed) or nothing answered within --wait; 2 for bad input (an unknown account or section,
no report yet; for an import a file that cannot be read, or a problem in it: every line
and field named, nothing stored).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import getpass
import json
import os
import sys
import time
from pathlib import Path

from cli import options
from shared import account_reports, accounts
from shared import events as ev
from shared.bus import Bus, connect
from shared.site_config import ACCOUNTS_KEY_PREFIX, SiteConfigs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="concierge accounts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_bus(p)
    commands = p.add_subparsers(dest="command", required=True)
    load = commands.add_parser("import", help="accounts and deals from a JSON or CSV file")
    load.add_argument("--site", required=True, type=options.site_id)
    load.add_argument("file", type=Path)
    load.add_argument("--format", choices=("json", "csv"), default=None,
                      help="default: from the file's suffix, else its first character")
    listing = commands.add_parser("list", help="the site's accounts")
    listing.add_argument("--site", required=True, type=options.site_id)
    listing.add_argument("--json", action="store_true")
    pull = commands.add_parser("pull", help="fetch from the site's pull connector")
    pull.add_argument("--site", required=True, type=options.site_id)
    pull.add_argument("--force", action="store_true", help="whatever the cache's age")
    report = commands.add_parser("report", help="queue account reports, or show one (report show)")
    report.add_argument("action", nargs="?", choices=("show", "edit", "history"),
                        help="show: a report; edit: change it; history: its versions")
    report.add_argument("--site", required=True, type=options.site_id)
    report.add_argument("--account", required=True, action="append", dest="accounts", metavar="ID",
                        type=options.record_id)
    report.add_argument("--report", dest="request_id", metavar="REQUEST", type=options.record_id,
                        help="a report's request id (default: the latest)")
    report.add_argument("--version", type=int, help="show: this version (default: the latest)")
    report.add_argument("--json", action="store_true", help="show: the report as JSON")
    report.add_argument("--section", type=options.text, help="edit: the section rewritten by hand")
    given = report.add_mutually_exclusive_group()
    given.add_argument("--text", type=options.text, help="edit: the section's new text")
    given.add_argument("--file", type=Path, help="edit: the section's new text, from a file")
    given.add_argument("--ask", metavar="INSTRUCTION", type=options.text, help="edit: a change asked for in words")
    report.add_argument("--base-version", type=int, default=0, help="edit: the version the text was written on")
    report.add_argument("--diff", type=int, nargs=2, metavar=("A", "B"), help="history: what changed from A to B")
    report.add_argument("--wait", type=options.seconds, default=60.0, help="edit: seconds to wait for the new version")
    found = commands.add_parser("opportunities", help="rank the accounts by opportunity")
    found.add_argument("--site", required=True, type=options.site_id)
    found.add_argument("--account", action="append", dest="accounts", default=[], metavar="ID", type=options.record_id)
    found.add_argument("--select", type=int, default=3, help="how many to pre-select for reports (0-20)")
    found.add_argument("--wait", type=options.seconds, default=60.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "import":
        try:
            data = args.file.read_bytes()
            portfolio = accounts.parse(data, args.format or _format(args.file))
        except OSError as exc:
            print(f"refused  {args.file}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        except accounts.AccountsError as exc:
            for error in exc.errors:
                print(f"refused  {args.file}: {error['field']}: {error['message']}", file=sys.stderr)
            return 2
        args.portfolio = portfolio
    return asyncio.run(run(options.bus_config(args), args))


def _format(path: Path) -> str:
    return {".json": "json", ".csv": "csv"}.get(path.suffix.lower(), "")


async def run(config, args: argparse.Namespace) -> int:
    bus = await connect(config, name="accounts-cli")
    try:
        return await {"import": load, "list": listing, "pull": pull, "report": report,
                      "opportunities": opportunities}[args.command](bus, args)
    finally:
        await bus.close()


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def counts_line(counts: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{what} {n['accounts']} accounts and {n['deals']} deals" for what, n in counts.items())


async def load(bus: Bus, args) -> int:
    event = await accounts.store(bus, args.site, args.portfolio, actor(), "cli")
    print(f"site {args.site}: {counts_line(accounts.counts_of(args.portfolio, event))}")
    return 0


async def listing(bus: Bus, args) -> int:
    found = await accounts.accounts(bus, args.site)
    if args.json:
        print(json.dumps({"site": args.site, "accounts": accounts.as_data(found),
                          "deals": accounts.as_data(await accounts.deals(bus, args.site))}))
        return 0
    if not found:
        print(f"site {args.site} has no accounts (import some: concierge accounts import --site {args.site} FILE)")
        return 0
    print(f"{'id':<24} {'name':<34} {'tier':<11} {'ARR':>12}  {'renewal':<10}  {'owner':<18} near limit")
    for row in map(accounts.row, found):
        arr = f"{row['arr']:,.0f} {row['currency']}"
        print(f"{row['id'][:24]:<24} {row['name'][:34]:<34} {row['tier'][:11]:<11} {arr:>12}  "
              f"{row['renewal_date'] or '-':<10}  {row['owner'][:18]:<18} {', '.join(row['near_limit']) or '-'}")
    print(f"{len(found)} accounts, {len(await accounts.deals(bus, args.site))} deals")
    return 0


async def pull(bus: Bus, args) -> int:
    from shared.web import Outbound, WebClient

    config = (await SiteConfigs(bus).get(args.site)).accounts
    keys = {name: value for name, value in os.environ.items() if name.startswith(ACCOUNTS_KEY_PREFIX)}
    client = WebClient(accounts.USER_AGENT, Outbound.from_env(), max_bytes=accounts.MAX_IMPORT_BYTES)
    try:
        result = await accounts.pull(bus, args.site, config, client, keys, force=args.force)
    except accounts.PullError as exc:
        print(f"pull failed  {exc}", file=sys.stderr)
        for error in exc.errors[:20]:
            print(f"  {error['field']}: {error['message']}", file=sys.stderr)
        return 1
    finally:
        await client.close()
    if result is None:
        print(f"site {args.site} has no pull connector (set accounts.pull_url in its config)", file=sys.stderr)
        return 2
    if not result.fetched:
        print(f"site {args.site}: fetched {result.url} {_age(result.at)} ago (younger than accounts.pull_ttl_s "
              f"{config.pull_ttl_s:.0f} s; --force to fetch now)" + (f"; it failed: {result.error}" if result.error else ""))
        return 1 if result.error else 0
    print(f"site {args.site}: fetched {result.url}: {counts_line(result.counts)}")
    return 0


async def report(bus: Bus, args) -> int:
    if args.action in ("show", "edit", "history"):
        if len(args.accounts) != 1:
            print(f"refused  report {args.action} takes one --account", file=sys.stderr)
            return 2
        return await {"show": show_report, "edit": edit_report, "history": history}[args.action](bus, args)
    try:
        items = await account_reports.requests_for(bus, args.site, args.accounts, "cli")
    except account_reports.UnknownAccount as exc:
        print(f"refused  {exc}", file=sys.stderr)
        return 2
    await account_reports.queue(bus, items)
    print(f"site {args.site}: queued {len(items)} account reports, request {items[0].request_id} "
          f"({', '.join(i.account_id for i in items)})")
    return 0


async def _which(bus: Bus, args) -> tuple[ev.AccountReportCompleted, list] | int:
    """The report --report names (default: the account's latest completed one) and its
    versions, or the exit status after saying why there is none."""
    account_id = args.accounts[0]
    request_id = args.request_id
    if request_id is None:
        done = [r for r in await account_reports.reports(bus, args.site, account_id)
                if isinstance(r, ev.AccountReportCompleted)]
        if not done:
            print(f"no completed report for account {account_id} in site {args.site} "
                  f"(queue one: concierge accounts report --site {args.site} --account {account_id})", file=sys.stderr)
            return 2
        request_id = done[-1].request_id
    found = await account_reports.report(bus, args.site, account_id, request_id)
    if found is None:
        print(f"no completed report {request_id} for account {account_id} in site {args.site}", file=sys.stderr)
        return 2
    return found


async def show_report(bus: Bus, args) -> int:
    account_id = args.accounts[0]
    found = await account_reports.reports(bus, args.site, account_id)
    if not found:
        print(f"no report for account {account_id} in site {args.site} "
              f"(queue one: concierge accounts report --site {args.site} --account {account_id})", file=sys.stderr)
        return 2
    latest = found[-1]
    if isinstance(latest, ev.AccountReportFailed) and args.request_id is None:
        if args.json:
            print(json.dumps({"type": ev.event_type(latest), "event": ev.to_builtins(latest), "reports": len(found)}))
        else:
            print(f"account {account_id}: the latest report failed ({latest.node}): {latest.reason}")
        return 1
    which = await _which(bus, args)
    if isinstance(which, int):
        return which
    completed, history = which
    try:
        shown = account_reports.view(completed, history, args.version)
    except KeyError:
        print(f"refused  report {completed.request_id} has no version {args.version} (it has {len(history)})",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**shown, "reports": len(found)}))
        return 0
    meta = completed.metadata
    position = next(i for i, r in enumerate(found, 1) if r.request_id == completed.request_id)
    print(f"account {account_id}: report {position} of {len(found)} ({completed.request_id}), version "
          f"{shown['version']} of {shown['versions']}, {completed.backend}, {meta.proposition}, "
          f"success {meta.success_percent}%, priority {meta.priority}"
          + (f", verdict {completed.verdict}" if completed.verdict else "")
          + (f", edited by hand: {', '.join(shown['hand_edited'])}" if shown["hand_edited"] else "")
          + (f"; input figures not stated: {', '.join(completed.missing_numbers)}" if completed.numbers_warning else ""))
    print()
    print(shown["text"].strip())
    print()
    print(completed.sales_script.strip())
    return 0


async def edit_report(bus: Bus, args) -> int:
    account_id = args.accounts[0]
    if (args.ask is None) == (args.section is None):
        print("refused  report edit takes --section with --text or --file (a hand edit), or --ask", file=sys.stderr)
        return 2
    fields: dict = {}
    if args.ask is not None:
        if not args.ask.strip() or len(args.ask) > account_reports.MAX_INSTRUCTION_CHARS:
            print(f"refused  --ask: empty, or longer than {account_reports.MAX_INSTRUCTION_CHARS} characters",
                  file=sys.stderr)
            return 2
        fields = {"instruction": args.ask.strip()}
    else:
        section = account_reports.canonical(args.section)
        if section is None:
            print(f"refused  --section {args.section!r}: one of {', '.join(account_reports.SECTIONS)}", file=sys.stderr)
            return 2
        try:
            text = args.file.read_text(encoding="utf-8") if args.file else args.text
        except (OSError, UnicodeDecodeError) as exc:
            print(f"refused  {args.file}: {exc}", file=sys.stderr)
            return 2
        if not (text or "").strip() or len(text) > account_reports.MAX_SECTION_CHARS:
            print(f"refused  the section's text: empty, or longer than {account_reports.MAX_SECTION_CHARS} "
                  "characters (--text or --file)", file=sys.stderr)
            return 2
        fields = {"section": section, "text": text.strip(), "base_version": args.base_version}
    which = await _which(bus, args)
    if isinstance(which, int):
        return which
    completed = which[0]
    item = account_reports.edit_request(args.site, account_id, completed.request_id,
                                        "asked" if args.ask is not None else "hand", actor(), "cli", **fields)
    await bus.publish_work(item)
    outcome = await _answer(lambda: account_reports.edit_outcome(bus, args.site, account_id, completed.request_id,
                                                                 item.edit_id), args.wait, f"edit {item.edit_id}")
    if outcome is None:
        return 1
    if isinstance(outcome, ev.AccountReportEditFailed):
        print(f"edit refused: {outcome.reason}", file=sys.stderr)
        return 1
    print(f"account {account_id}: report {completed.request_id} version {outcome.version} ({outcome.how}"
          + (f", {outcome.backend}" if outcome.backend else "") + f"): changed {', '.join(c.name for c in outcome.changes)}"
          + (f"; hand edits kept: {', '.join(outcome.ignored)}" if outcome.ignored else ""))
    for change in outcome.changes:
        print(f"\n## {change.name}\n\n{change.text}")
    return 0


async def history(bus: Bus, args) -> int:
    which = await _which(bus, args)
    if isinstance(which, int):
        return which
    completed, versions = which
    if args.diff:
        try:
            changed = account_reports.diff(completed, versions, *args.diff)
        except KeyError as exc:
            print(f"refused  report {completed.request_id} has no version {exc.args[0]} (it has {len(versions)})",
                  file=sys.stderr)
            return 2
        print(changed["unified"] or f"versions {args.diff[0]} and {args.diff[1]} read the same")
        return 0
    print(f"account {args.accounts[0]}: report {completed.request_id}, {len(versions)} versions")
    for v in versions:
        when = datetime.datetime.fromtimestamp(v.ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        what = f" \"{v.instruction}\"" if v.instruction else ""
        print(f"{v.version:>3}  {when}  {v.how:<9} {v.actor[:24]:<24} {', '.join(v.changed)}{what}"
              + (f" (hand edits kept: {', '.join(v.ignored)})" if v.ignored else ""))
    return 0


async def opportunities(bus: Bus, args) -> int:
    if not 0 <= args.select <= account_reports.MAX_SELECT:
        print(f"refused  --select: 0 to {account_reports.MAX_SELECT}", file=sys.stderr)
        return 2
    known = {a.id: a.name for a in await accounts.accounts(bus, args.site)}
    if missing := [i for i in args.accounts if i not in known]:
        print(f"refused  {account_reports.UnknownAccount(args.site, missing)}", file=sys.stderr)
        return 2
    item = account_reports.opportunities_request(args.site, "cli", dict.fromkeys(args.accounts), args.select)
    await bus.publish_work(item)

    async def ours():
        latest = await account_reports.latest_opportunities(bus, args.site)
        return latest if latest is not None and latest.request_id == item.request_id else None

    latest = await _answer(ours, args.wait, f"search {item.request_id}")
    if latest is None:
        return 1
    shown = account_reports.opportunities_view(latest, known)
    if shown["status"] == "failed":
        print(f"the search failed: {shown['reason']}", file=sys.stderr)
        return 1
    print(f"site {args.site}: {shown['accounts']} accounts ranked ({shown['backend']})"
          + (f"; the model's ranking was not used: {shown['model_error']}" if shown["model_error"] else ""))
    for rank, o in enumerate(shown["items"], 1):
        print(f"{rank:>3}. {'*' if o['selected'] else ' '} {o['name'][:34]:<34} {o['proposition']:<11} {o['reason']}")
    if shown["selected"]:
        print(f"pre-selected (*): concierge accounts report --site {args.site} "
              + " ".join(f"--account {i}" for i in shown["selected"]))
    return 0


async def _answer(check, wait_s: float, what: str):
    """`check()`'s answer once it has one (not None), polled until `wait_s` has passed; None
    then, said on stderr: the work item is queued, nothing took it."""
    deadline = time.monotonic() + wait_s
    while (found := await check()) is None:
        if time.monotonic() > deadline:
            print(f"{what} queued; no answer within {wait_s:.0f} s (is the enricher running?)", file=sys.stderr)
            return None
        await asyncio.sleep(0.2)
    return found


def _age(at: float) -> str:
    return f"{max(0.0, time.time() - at):.0f} s"
