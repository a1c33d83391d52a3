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
        addresses unless CRAWL_ALLOW_PRIVATE_NETWORKS=1; its key from the ACCOUNTS_KEY_*
        variable the site names
    accounts report --site SITE --account ID [--account ID ...]
        queue a report for each account (one work item each on the BRIEFS work queue; the
        enricher's report nodes write it: shared/account_reports.py) and print the request id
    accounts report show --site SITE --account ID [--json]
        the account's latest report in full (its sales script included), and how many
        reports it has (every one is kept)

Exit status: 0; 1 when a pull failed, or the latest report failed; 2 for bad input (an
unknown account, no report yet; for an import (a file that cannot be read, or a
problem in it: every line and field named, nothing stored).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from pathlib import Path

from cli import options
from shared import account_reports, accounts
from shared import events as ev
from shared.bus import Bus, connect
from shared.config import env_bool
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
    report.add_argument("action", nargs="?", choices=("show",), help="show: the account's latest report")
    report.add_argument("--site", required=True, type=options.site_id)
    report.add_argument("--account", required=True, action="append", dest="accounts", metavar="ID")
    report.add_argument("--json", action="store_true", help="show: the event as JSON")
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
        return await {"import": load, "list": listing, "pull": pull, "report": report}[args.command](bus, args)
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
    from shared.web import WebClient

    config = (await SiteConfigs(bus).get(args.site)).accounts
    keys = {name: value for name, value in os.environ.items() if name.startswith(ACCOUNTS_KEY_PREFIX)}
    client = WebClient(accounts.USER_AGENT, env_bool("CRAWL_ALLOW_PRIVATE_NETWORKS", False),
                       max_bytes=accounts.MAX_IMPORT_BYTES)
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
    if args.action == "show":
        return await show_report(bus, args)
    try:
        items = await account_reports.requests_for(bus, args.site, args.accounts, "cli")
    except account_reports.UnknownAccount as exc:
        print(f"refused  {exc}", file=sys.stderr)
        return 2
    await account_reports.queue(bus, items)
    print(f"site {args.site}: queued {len(items)} account reports, request {items[0].request_id} "
          f"({', '.join(i.account_id for i in items)})")
    return 0


async def show_report(bus: Bus, args) -> int:
    if len(args.accounts) != 1:
        print("refused  report show takes one --account", file=sys.stderr)
        return 2
    account_id = args.accounts[0]
    found = await account_reports.reports(bus, args.site, account_id)
    if not found:
        print(f"no report for account {account_id} in site {args.site} "
              f"(queue one: concierge accounts report --site {args.site} --account {account_id})", file=sys.stderr)
        return 2
    latest = found[-1]
    if args.json:
        print(json.dumps({"type": ev.event_type(latest), "event": ev.to_builtins(latest), "reports": len(found)}))
        return 1 if isinstance(latest, ev.AccountReportFailed) else 0
    if isinstance(latest, ev.AccountReportFailed):
        print(f"account {account_id}: the latest report failed ({latest.node}): {latest.reason}")
        return 1
    meta = latest.metadata
    print(f"account {account_id}: report {len(found)} of {len(found)}, {latest.backend}, {meta.proposition}, "
          f"success {meta.success_percent}%, priority {meta.priority}"
          + (f", verdict {latest.verdict}" if latest.verdict else "")
          + (f"; input figures not stated: {', '.join(latest.missing_numbers)}" if latest.numbers_warning else ""))
    print()
    print(latest.report.strip())
    print()
    print(latest.sales_script.strip())
    return 0


def _age(at: float) -> str:
    import time

    return f"{max(0.0, time.time() - at):.0f} s"
