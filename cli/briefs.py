"""`concierge briefs`: a sales user's view of the site's leads (shared/briefs.py).

    briefs generate --site SITE [--lead SESSION ...] [--wait [--timeout S]]
        queue a brief for each lead named (default: every lead of the site); --wait prints
        each brief's outcome as the enricher stores it
    briefs show --site SITE [--lead SESSION]
        one lead's latest brief, then its call script; without --lead, the site's leads
        with their priority, stage and verdict
    briefs triage --site SITE [--timeout S]
        rank the site's open leads (those with a brief): call_first, nurture, disqualify

The briefs are written by the enricher's brief nodes (they must be running: `make run`
starts them), which take the work items off the BRIEFS queue. Exit status: 0; 1 when
there is nothing to show, a brief failed, or an outcome did not come in time; 2 for bad
input (an invalid site or session id, a session that is no lead), with nothing queued.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime, timezone

from shared import briefs
from shared import events as ev
from shared import subjects
from shared.bus import Bus, connect
from shared.config import BusConfig

DEFAULT_TIMEOUT_S = 180.0


class BadInput(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="concierge briefs", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--site", required=True)
    common.add_argument("--nats-url", default=None, help="default: $NATS_URL or nats://127.0.0.1:4222")
    sub = top.add_subparsers(dest="command", required=True)
    generate = sub.add_parser("generate", parents=[common], help="queue briefs for the site's leads")
    generate.add_argument("--lead", action="append", default=[], metavar="SESSION", help="a lead (repeatable)")
    generate.add_argument("--wait", action="store_true", help="wait for each brief and print its outcome")
    generate.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds --wait waits in all")
    show = sub.add_parser("show", parents=[common], help="a lead's latest brief, or the site's leads")
    show.add_argument("--lead", default=None, metavar="SESSION")
    triage = sub.add_parser("triage", parents=[common], help="rank the site's open leads")
    triage.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    return top


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(argv))


async def amain(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    named = getattr(args, "lead", None) or []
    leads = named if isinstance(named, list) else [named]
    if bad := [v for v in (args.site, *leads) if not subjects.TOKEN_RE.match(v)]:
        print(f"invalid site or session id {bad[0]!r}: letters, digits, '_' and '-' only", file=sys.stderr)
        return 2
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    return await run(config, args)


async def run(config: BusConfig, args: argparse.Namespace) -> int:
    bus = await connect(config, name="briefs-cli")
    try:
        return await {"generate": generate, "show": show, "triage": triage}[args.command](bus, args)
    except BadInput as exc:
        print(str(exc), file=sys.stderr)
        return 2
    finally:
        await bus.close()


# --- generate ----------------------------------------------------------------------------

async def generate(bus: Bus, args: argparse.Namespace) -> int:
    try:
        items = await briefs.requests_for(bus, args.site, args.lead or None, producer="cli")
    except briefs.UnknownLead as exc:
        raise BadInput(str(exc)) from exc
    if not items:
        print(f"no leads captured on site {args.site}: nothing queued")
        return 1
    wanted = {item.request_id: item.session_id for item in items}
    async with Outcomes(bus, [subjects.conv(args.site, "*", "brief_completed"),
                              subjects.conv(args.site, "*", "brief_failed")], set(wanted)) as outcomes:
        await briefs.queue(bus, items)
        for item in items:
            print(f"queued {args.site}/{item.session_id} (request {item.request_id})")
        if not args.wait:
            print(f"read them with: concierge briefs show --site {args.site} --lead SESSION")
            return 0
        failures = 0
        async for outcome in outcomes.arriving(args.timeout):
            failures += isinstance(outcome, ev.BriefFailed)
            print(outcome_line(outcome))
        late = [wanted[r] for r in wanted if r not in outcomes.got]
    if late:
        print(f"no outcome within {args.timeout:g} s for: {', '.join(late)} (is the enricher running?)",
              file=sys.stderr)
    return 1 if failures or late else 0


def outcome_line(outcome: briefs.Outcome) -> str:
    if isinstance(outcome, ev.BriefFailed):
        return f"{outcome.site}/{outcome.session_id}: failed ({outcome.node}): {outcome.reason}"
    m = outcome.metadata
    return (f"{outcome.site}/{outcome.session_id}: brief ready: priority {m.priority}, {m.stage}, "
            f"verdict {outcome.verdict or '-'}, backend {outcome.backend}")


class Outcomes:
    """The events with the given request ids, heard on `filters` from before the work is
    queued (so none can be missed): plain subscriptions, nothing left on the server."""

    def __init__(self, bus: Bus, filters: list[str], request_ids: set[str]):
        self.bus, self.filters, self.request_ids = bus, filters, request_ids
        self.got: dict[str, ev.Envelope] = {}
        self.queue: asyncio.Queue[ev.Envelope] = asyncio.Queue()
        self.subs: list = []

    async def __aenter__(self) -> "Outcomes":
        async def heard(msg):
            try:
                event = ev.decode(msg.data)
            except ev.BadEvent:
                return  # not ours to judge: the log's readers report it
            if ev.subject_mismatch(event, msg.subject) is None and \
                    getattr(event, "request_id", None) in self.request_ids:
                self.queue.put_nowait(event)

        self.subs = [await self.bus.nc.subscribe(f, cb=heard) for f in self.filters]
        await self.bus.nc.flush()  # the server has them before anything is queued
        return self

    async def __aexit__(self, *exc) -> None:
        for sub in self.subs:
            await sub.unsubscribe()

    async def arriving(self, timeout_s: float):
        """Each request's first outcome as it comes, until all came or `timeout_s` passed."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.got) < len(self.request_ids):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            try:
                event = await asyncio.wait_for(self.queue.get(), left)
            except asyncio.TimeoutError:
                return
            if event.request_id not in self.got:
                self.got[event.request_id] = event
                yield event


# --- show --------------------------------------------------------------------------------

async def show(bus: Bus, args: argparse.Namespace) -> int:
    captures = await briefs.leads(bus, args.site)
    if args.lead is None:
        return leads_table(args.site, captures, await briefs.outcomes(bus, args.site))
    capture = captures.get(args.lead)
    if capture is None:
        raise BadInput(str(briefs.UnknownLead(args.site, [args.lead])))
    latest = (await briefs.outcomes(bus, args.site, args.lead)).get(args.lead)
    if latest is None:
        print(f"no brief yet for {args.site}/{args.lead}: "
              f"concierge briefs generate --site {args.site} --lead {args.lead} --wait", file=sys.stderr)
        return 1
    if isinstance(latest, ev.BriefFailed):
        print(f"the latest brief of {args.site}/{args.lead} failed ({when(latest.ts)}, {latest.node}, "
              f"{latest.attempts} attempt(s), request {latest.request_id}): {latest.reason}", file=sys.stderr)
        return 1
    print(brief_text(latest, capture))
    return 0


def brief_text(brief: ev.BriefCompleted, capture: ev.LeadCaptured) -> str:
    m = brief.metadata
    lines = [
        f"# Brief: {brief.site}/{brief.session_id} ({capture.email})",
        f"written {when(brief.ts)} by the {brief.backend} backend in {brief.duration_s:.1f} s, "
        f"{brief.attempts} draft(s), request {brief.request_id}",
        f"priority {m.priority}/10 · stage {m.stage} · ~{m.estimated_seats} seats · confidence {m.confidence}%",
        f"evaluator: {brief.verdict or 'not evaluated'}",
    ]
    lines += [f"  - issue: {issue}" for issue in brief.issues]
    if brief.ungrounded_numbers:
        lines.append(f"numbers found in no input (check them): {', '.join(brief.ungrounded_numbers)}")
    if brief.missing_sections:
        lines.append(f"sections missing: {', '.join(brief.missing_sections)}")
    lines += ["", brief.brief.strip(), "", "# Call script", "", brief.call_script.strip()]
    return "\n".join(lines)


def leads_table(site: str, captures: dict[str, ev.LeadCaptured], latest: dict[str, briefs.Outcome]) -> int:
    if not captures:
        print(f"no leads captured on site {site}")
        return 1
    rows = [briefs.row(capture, latest.get(session)) for session, capture in captures.items()]
    rows.sort(key=lambda r: (-(r["priority"] or 0), -r["captured"]))
    table = [("LEAD", "EMAIL", "PRIORITY", "STAGE", "VERDICT", "BRIEF", "WHEN")]
    table += [(r["session_id"], r["email"], str(r["priority"] or "-"), r["stage"] or "-", r["verdict"] or "-",
               r["status"], when(r["ts"]) if r["ts"] else "-") for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return 0


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# --- triage ------------------------------------------------------------------------------

async def triage(bus: Bus, args: argparse.Namespace) -> int:
    captures = await briefs.leads(bus, args.site)
    latest = await briefs.outcomes(bus, args.site)
    if not briefs.open_leads(captures, latest):
        print(f"no open leads on site {args.site} (a lead is open once its brief is written): "
              f"concierge briefs generate --site {args.site} --wait", file=sys.stderr)
        return 1
    item = briefs.triage_request(args.site, producer="cli")
    # A triage node that gives up says so with the brief nodes' failure event, in the triage's log.
    filters = [subjects.conv(args.site, ev.TRIAGE_SESSION, t) for t in ("triage_completed", "brief_failed")]
    async with Outcomes(bus, filters, {item.request_id}) as outcomes:
        await briefs.queue(bus, [item])
        print(f"triage queued (request {item.request_id}); waiting up to {args.timeout:g} s")
        result = [outcome async for outcome in outcomes.arriving(args.timeout)]
    if not result:
        print(f"no triage within {args.timeout:g} s (is the enricher running?)", file=sys.stderr)
        return 1
    if isinstance(result[0], ev.BriefFailed):
        print(f"the triage failed: {result[0].reason}", file=sys.stderr)
        return 1
    print(triage_text(result[0], captures, latest))
    return 0


def triage_text(done: ev.TriageCompleted, captures: dict[str, ev.LeadCaptured],
                latest: dict[str, briefs.Outcome]) -> str:
    lines = [f"# Triage: {done.site}, {done.leads} open lead(s) ({done.backend} backend, {when(done.ts)})"]
    if done.model_error:
        lines.append(f"(ranked by each brief's metadata: {done.model_error})")
    heading = None
    for rank, item in enumerate(briefs.ranked(done), start=1):
        if item.classification != heading:
            heading = item.classification
            lines += ["", heading.upper().replace("_", " ")]
        brief = latest.get(item.session_id)
        capture = captures.get(item.session_id)
        known = [capture.email if capture else "",
                 f"priority {brief.metadata.priority}" if isinstance(brief, ev.BriefCompleted) else ""]
        about = ", ".join(k for k in known if k)
        lines.append(f"{rank:>3}. {item.session_id}" + (f" ({about})" if about else "") + f": {item.reason}")
    if not done.items:
        lines.append("(no leads ranked)")
    return "\n".join(lines)
