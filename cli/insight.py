"""`concierge insight --site SITE [--since 7d]`: does the assistant work for a site?

    concierge insight --site SITE [--since 7d] [--until 1d] [--language fr] [--route ANSWER]
    concierge insight rebuild --site SITE

The first prints the site's figures over the range (conversations, turns, routes, answered
from the knowledge base, "not found", redirected, bookings, leads, feedback, time to first
token, languages, each conversation's outcome and the resolution rate; per day) and its
knowledge gaps, largest first (shared/insight.py and shared/gaps.py define each). Its last
line is one JSON object: what the operator API serves at /v1/admin/sites/SITE/insight.
`--since 7d`: conversations that started in the last 7 days (`--until 1d`: and more than a
day ago).

`rebuild` makes every conversation's insight record of the site again from the log (what
the enricher's `insight_projector` keeps current as turns end) and deletes those of
conversations the log no longer holds.

These talk to the bus (NATS_URL, `--nats-url`), as the other operator commands do. Exit
status: 0 done, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from cli import options
from shared import gaps, insight
from shared.bus import connect
from shared.config import BusConfig


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="concierge insight", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("action", nargs="?", choices=("show", "rebuild"), default="show")
    top.add_argument("--site", required=True, type=options.site_id)
    top.add_argument("--since", default="7d", help="conversations started this long ago or later (default 7d)")
    top.add_argument("--until", default=None, help="and started more than this long ago (default: now)")
    top.add_argument("--language", default=None, help="only conversations in this language (en, fr, ...)")
    top.add_argument("--route", default=None, choices=("ANSWER", "REDIRECT", "BOOKING", "HANDOFF"),
                     help="only conversations with a turn of this route, and those turns")
    options.add_bus(top)
    return top


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        now = time.time()
        filters = insight.Filters(since=now - insight.since_seconds(args.since),
                                  until=now - insight.since_seconds(args.until) if args.until else float("inf"),
                                  language=args.language, route=args.route)
    except ValueError as exc:
        print(f"--since/--until: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(options.bus_config(args), args, filters))


async def run(config: BusConfig, args: argparse.Namespace, filters: insight.Filters) -> int:
    bus = await connect(config, name="insight-cli")
    try:
        if args.action == "rebuild":
            done = await insight.rebuild(bus, args.site)
            print(f"{args.site}: {done['conversations']} conversations projected again from the log, "
                  f"{done['deleted']} records deleted, in {done['seconds']} s")
            print(json.dumps(done))
            return 0
        from shared.embeddings import shared_embedder

        report = await gaps.report(bus, args.site, filters, shared_embedder().embed_many)
    finally:
        await bus.close()
    print(summary(report))
    print(json.dumps(report, ensure_ascii=False))
    return 0


def summary(report: dict) -> str:
    rate = report["resolution_rate"]
    lines = [f"{report['site']}: {report['conversations']} conversations, {report['turns']} turns",
             f"  answered {report['answered']} · not found {report['not_found']} · redirected {report['redirected']}"
             f" · blocked {report['blocked']} · failed {report['failed']}",
             f"  bookings {report['bookings']} (completed {report['bookings_completed']}) · leads {report['leads']}"
             f" · handoffs {report['handoffs']}",
             f"  feedback 👍 {report['feedback_up']} 👎 {report['feedback_down']} · resolution rate "
             f"{'–' if rate is None else f'{rate:.0%}'} · outcomes "
             + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()),
             f"  time to first token p50 {report['ttft_ms_p50']} ms, p95 {report['ttft_ms_p95']} ms"
             f" · languages {report['languages']}"]
    for day in report["days"]:
        lines.append(f"  {day['day']}: {day['conversations']} conversations, {day['answered']} answered, "
                     f"{day['not_found']} not found, {day['leads']} leads")
    lines.append(f"knowledge gaps: {len(report['gaps'])}")
    for gap in report["gaps"][:10]:
        lines.append(f"  [{gap['status']}] {gap['size']} visitors, {gap['questions']} questions: "
                     + " | ".join(gap["examples"][:3]))
    return "\n".join(lines)
