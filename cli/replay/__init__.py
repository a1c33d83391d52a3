"""`concierge replay`: read, re-run and compare recorded conversations.

    replay timeline SITE SESSION [--json]           every event, and the state after each turn
    replay SITE SESSION                             the same (the original form)
    replay state SITE SESSION --at SEQ              the folded state at any event
    replay rerun SITE SESSION [--turn N] [--node NAME] [--llm recorded|live] [--current-config] [--json]
    replay diff SITE SESSION [...]                  the rerun, compared turn by turn with the original
    replay fork SITE SESSION --at SEQ --message TEXT [--sites-dir DIR] [--prompts-dir DIR] [--llm ...]
    replay verify --site SITE [--since DURATION] [--limit N] [--current-config]
    replay serve                                    answer the operator API's reruns (/admin)

A rerun runs the conversation's recorded visitor messages through the current code in a
sandbox in this process: the original log is only read, nothing is published, no webhook
is sent, no Redis key written. With `--llm recorded` (the default for rerun, diff and
verify) every LLM call is answered from the conversation's recorded calls; a call with no
recording is reported as a divergence, never sent to a provider. Nodes that read or change
the world outside the conversation (enrichment, retrieval, lead_notifier, handoff_notifier)
are replayed from the record (`--live-retrieval` runs the retriever on this machine's
knowledge base).
`--node NAME` runs that node alone on its recorded inputs, every other node's outputs
copied. `verify` is the regression gate: it reruns many conversations and exits 1 when any
diverges; its last line is one JSON object.

Each turn is re-run under what it was recorded with (turn_config.py): its LLM roles (a role
that had no endpoint then has none now, one that had is answered from the recording), its
answer backend and its site config version. `--current-config` re-runs every turn under
this deployment's LLM roles and answer backend and the site's config now (the one on the
bus, or `DIR/<site>.toml` with `--sites-dir DIR`); fork always does, and `--llm live` calls
this deployment's endpoints. A turn that cannot be re-run so (its site config version is no
longer stored; a role it had no endpoint for is called now, with no recorded call to answer)
is copied as recorded and reported as not re-runnable, with why: not a divergence. The
other settings (router backends, embedding model) are this process's: run it with the
deployment's environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

import msgspec

from shared import prompts
from shared.bus import connect
from shared.config import BusConfig
from shared.site_config import SiteConfig, SiteConfigs, parse, stored_versions

SUBCOMMANDS = ("timeline", "state", "rerun", "diff", "fork", "verify", "serve")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
CURRENT_CONFIG = ("every turn under this deployment's LLM roles and answer backend and the site's config now, "
                  "not those it was recorded with")


def duration_s(text: str) -> float:
    match = DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90s, 30m, 12h or 7d")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="concierge replay", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", default=None, help="default: $NATS_URL or nats://127.0.0.1:4222")
    sub = top.add_subparsers(dest="command", required=True)

    def conversation(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, parents=[common])
        p.add_argument("site")
        p.add_argument("session_id")
        p.add_argument("--json", action="store_true", help="JSON instead of text")
        return p

    conversation("timeline", "every event, and the state after each turn")
    state = conversation("state", "the folded state at an event")
    state.add_argument("--at", type=int, required=True, metavar="SEQ", help="the event's stream sequence")
    for name, help_ in (("rerun", "run the conversation again with the current code"),
                        ("diff", "the rerun against the original, turn by turn")):
        p = conversation(name, help_)
        p.add_argument("--turn", type=int, default=None, help="only this turn (earlier turns as recorded)")
        p.add_argument("--node", default=None, help="only this node, on its recorded inputs")
        p.add_argument("--llm", choices=("recorded", "live"), default="recorded")
        p.add_argument("--live-retrieval", action="store_true")
        p.add_argument("--sites-dir", type=Path, default=None)
        p.add_argument("--current-config", action="store_true", help=CURRENT_CONFIG)
    fork = conversation("fork", "the conversation up to an event, then a new message")
    fork.add_argument("--at", type=int, required=True, metavar="SEQ")
    fork.add_argument("--message", required=True)
    fork.add_argument("--sites-dir", type=Path, default=None, help="the site's config from DIR/<site>.toml")
    fork.add_argument("--prompts-dir", type=Path, default=None, help="prompt templates to use instead (by name)")
    fork.add_argument("--llm", choices=("recorded", "live"), default="live")
    fork.add_argument("--live-retrieval", action="store_true")
    verify = sub.add_parser("verify", help="rerun many conversations; exit 1 when any diverges", parents=[common])
    verify.add_argument("--site", required=True)
    verify.add_argument("--since", type=duration_s, default=None, metavar="DURATION", help="e.g. 24h")
    verify.add_argument("--limit", type=int, default=None)
    verify.add_argument("--sites-dir", type=Path, default=None)
    verify.add_argument("--current-config", action="store_true", help=CURRENT_CONFIG)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from cli.replay.serve import main as serve

        return serve(argv[1:])
    if argv and argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
        argv = ["timeline", *argv]  # `concierge replay SITE SESSION`, as before
    args = parser().parse_args(argv)
    config = BusConfig.from_env()
    if args.nats_url:
        config.url = args.nats_url
    try:
        return asyncio.run(run(args, config))
    except ValueError as exc:
        print(f"concierge replay: {exc}", file=sys.stderr)
        return 2


async def site_config(bus, site: str, sites_dir: Path | None) -> SiteConfig:
    if sites_dir is not None:
        path = sites_dir / f"{site}.toml"
        if not path.exists():
            raise ValueError(f"{path} does not exist")
        return parse(path)
    return await SiteConfigs(bus).get(site)


async def run(args, bus_config: BusConfig) -> int:
    from cli.replay import rerun as reruns
    from cli.replay.diff import describe, describe_versions, outcomes
    from cli.replay.timeline import replay, state_summary

    if args.command == "timeline":
        return await replay(args.site, args.session_id, bus_config, args.json)
    bus = await connect(bus_config, name="replay")
    try:
        if args.command == "verify":
            since = time.time() - args.since if args.since else 0.0
            recordings = await reruns.read_site(bus, args.site, since, args.limit)
            config = await site_config(bus, args.site, args.sites_dir)
        else:
            recording = await reruns.read(bus, args.site, args.session_id)
            if not recording.records:
                raise ValueError(f"no events for conversation {args.site}/{args.session_id}")
            config = await site_config(bus, args.site, getattr(args, "sites_dir", None))
        stored = await stored_versions(bus, args.site)  # the versions a turn may have recorded
    finally:
        await bus.close()

    if args.command == "state":
        state = reruns.state_at(recording, args.at)
        out = msgspec.to_builtins(state) if args.json else state_summary(state)
        print(json.dumps(out, indent=None if args.json else 2, default=str))
        return 0

    from cli.replay.graph import Graph

    if args.command == "verify":
        result = await reruns.verify(recordings, Graph(), config, current_config=args.current_config,
                                     stored_configs=stored)
        for item in result.divergences[:20]:
            print(f"  {item['session_id']} turn {item['turn']}: {item.get('field') or item.get('node')} "
                  f"{item.get('divergence', '')}".rstrip())
        for item in result.not_rerunnable[:20]:
            print(f"  {item['session_id']} turn {item['turn']}: not re-runnable: {item['reason']}")
        for change in result.version_changes:
            print(f"note: {change['conversations']} conversations rerun under another {change['what']}: "
                  f"{', '.join(change['rerun'])} (recorded: {', '.join(change['recorded'])}); not a divergence")
        print(f"{result.conversations} conversations, {result.turns} turns: {result.diverged} diverged, "
              f"{len(result.not_rerunnable)} turns not re-runnable ({result.seconds:.1f} s)")
        print(json.dumps(result.figures()))
        return 1 if result.diverged else 0

    graph = Graph(live_retrieval=args.live_retrieval, retrieval_for_new=args.command == "fork")
    if args.command == "fork":
        if args.prompts_dir is not None:
            print(f"prompts from {args.prompts_dir}: {', '.join(prompts.override(args.prompts_dir)) or 'none'}",
                  file=sys.stderr)
        prefix, message = reruns.fork_input(recording, args.at, args.message)
        result = await reruns.rerun(prefix, graph, config, llm=args.llm, extra_inputs=(message,), current_config=True)
        new = outcomes(result.events).get(message.turn)
        old = outcomes([r.event for r in recording.records]).get(message.turn)
        if args.json:
            print(json.dumps({"turn": message.turn, "original": msgspec.to_builtins(old.__dict__) if old else None,
                              "fork": msgspec.to_builtins(new.__dict__) if new else None,
                              "divergences": result.divergences}))
        else:
            print(f"fork after event {args.at}: turn {message.turn} {args.message!r}")
            if old is not None:
                print(f"  original turn {message.turn}: {old.route} {old.answer!r}")
            print(f"  fork:               {new.route if new else None} {new.answer if new else None!r}")
            for item in result.divergences:
                print(f"  ! turn {item['turn']} {item['node']}: {item['divergence']}")
        return 0

    result = await reruns.rerun(recording, graph, config, llm=args.llm, node=args.node, turn=args.turn,
                                current_config=args.current_config, stored_configs=stored)
    if args.json:
        print(json.dumps({"session_id": result.session_id, "turns": result.turns, "diverged": result.diverged,
                          "skipped": result.skipped, "differences": [d.to_builtins() for d in result.differences],
                          "node_differences": result.node_differences, "divergences": result.divergences,
                          "version_changes": [c.to_builtins() for c in result.version_changes],
                          **({"events": [msgspec.to_builtins(e) for e in result.events]}
                             if args.command == "rerun" else {})}, default=str))
        return 1 if result.diverged else 0
    if args.command == "rerun":
        for turn, o in sorted(outcomes(result.events).items()):
            print(f"turn {turn}: {o.route} intent={o.intent} skills={o.skills} sources={len(o.sources)}")
            print(f"  answer: {o.answer!r}")
            print(f"  suggestions: {o.suggestions}")
    print(describe(result.differences))
    if result.version_changes:
        print(describe_versions(result.version_changes))
    for item in result.node_differences:
        print(f"turn {item['turn']} {item['node']}:\n  - original: {item['original']}\n  + rerun:    {item['rerun']}")
    for item in result.divergences:
        print(f"! turn {item['turn']} {item['node']}: {item['divergence']}")
    for item in result.skipped:
        print(f"turn {item['turn']}: not re-runnable: {item['reason']}")
    return 1 if result.diverged else 0
