"""`concierge sources add|upload|list|sync|remove --site SITE ...`: a site's knowledge
sources, on the bus (NATS_URL) like the operator API (the same checks, the same events:
shared/sources.py); the retriever runs the syncs.

  sources add --site SITE --url URL [--every 24h] [--include /docs/*] [--exclude /blog/*] [--max-pages N]
  sources add --site SITE --title TITLE --text TEXT
  sources upload --site SITE FILE...
  sources list --site SITE
  sources sync --site SITE [--source ID] [--wait [--timeout S]]
  sources remove --site SITE --source ID

`--wait` returns when the runs have ended: 0 when each completed, 1 when one failed (its
reason printed), 3 when the timeout came first. `add` and `upload` start a first run
(with `--wait`, they wait for it too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import msgspec

from cli import options
from shared import sources, subjects
from shared.bus import Bus, connect
from shared.config import BusConfig
from shared.state import fold


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="concierge sources", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_bus(p)
    commands = p.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="a website (start page or sitemap) or a text snippet")
    add.add_argument("--site", required=True, type=options.site_id)
    add.add_argument("--url", default="")
    add.add_argument("--every", default=None, help="re-sync this often (e.g. 24h); default: on demand only")
    add.add_argument("--include", action="append", default=[], help="only paths matching (repeatable), e.g. /docs/*")
    add.add_argument("--exclude", action="append", default=[], help="never paths matching (repeatable)")
    add.add_argument("--max-pages", type=int, default=500)
    add.add_argument("--title", default="")
    add.add_argument("--text", default="")
    add.add_argument("--wait", action="store_true", help="return when the first run has ended")
    add.add_argument("--timeout", type=float, default=600.0)
    upload = commands.add_parser("upload", help="files (pdf, docx, pptx, html, md, txt)")
    upload.add_argument("--site", required=True, type=options.site_id)
    upload.add_argument("files", nargs="+", type=Path)
    upload.add_argument("--wait", action="store_true")
    upload.add_argument("--timeout", type=float, default=600.0)
    listing = commands.add_parser("list", help="the site's sources and their last runs")
    listing.add_argument("--site", required=True, type=options.site_id)
    listing.add_argument("--json", action="store_true")
    sync = commands.add_parser("sync", help="run the sources again now")
    sync.add_argument("--site", required=True, type=options.site_id)
    sync.add_argument("--source", action="append", default=[], help="only this source (repeatable); default: all")
    sync.add_argument("--wait", action="store_true", help="return when the runs have ended (1 if one failed)")
    sync.add_argument("--timeout", type=float, default=600.0)
    remove = commands.add_parser("remove", help="remove a source: its pages leave the knowledge base")
    remove.add_argument("--site", required=True, type=options.site_id)
    remove.add_argument("--source", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return asyncio.run(run(options.bus_config(args), args))


async def run(config: BusConfig, args: argparse.Namespace) -> int:
    bus = await connect(config, name="sources-cli")
    try:
        return await {"add": add, "upload": upload, "list": listing, "sync": sync, "remove": remove}[args.command](
            bus, args)
    except sources.SourceError as exc:
        for error in exc.errors:
            print(f"refused  {error['field']}: {error['message']}", file=sys.stderr)
        return 2
    finally:
        await bus.close()


async def add(bus: Bus, args) -> int:
    spec = sources.spec_of(sources.SourceInput(url=args.url, every=args.every, include=args.include,
                                               exclude=args.exclude, max_pages=args.max_pages, title=args.title,
                                               text=args.text))
    await sources.define(bus, args.site, spec, "cli")
    run_, _ = await sources.request_sync(bus, args.site, spec.id, "added", "cli")
    print(f"source {spec.id} ({spec.url or spec.title}): run {run_.turn} requested")
    return await _wait(bus, args.site, {spec.id: run_.turn}, args.timeout) if args.wait else 0


async def upload(bus: Bus, args) -> int:
    runs = {}
    for path in args.files:
        try:
            data = path.read_bytes()
        except OSError as exc:
            print(f"refused  {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        spec = sources.file_spec(path.name, len(data))
        spec = msgspec.structs.replace(spec, upload=sources.upload_key(args.site, spec.id, spec.name))
        await sources.room_for(bus, args.site, spec)  # before the bytes are stored
        await sources.Staging(bus).upload(spec.upload, data)
        await sources.define(bus, args.site, spec, "cli")
        run_, _ = await sources.request_sync(bus, args.site, spec.id, "added", "cli")
        runs[spec.id] = run_.turn
        print(f"source {spec.id} ({spec.name}, {len(data)} bytes): run {run_.turn} requested")
    return await _wait(bus, args.site, runs, args.timeout) if args.wait else 0


async def _views(bus: Bus, site: str, only: list[str] | None = None) -> list[dict]:
    views = []
    for spec in (await sources.definitions(bus, site)).values():
        if only and spec.id not in only:
            continue
        state = fold(await bus.read(subjects.conversation(site, sources.session_of(spec.id))))
        views.append(await sources.status(bus, site, spec, state.sync))
    return views


def _line(view: dict) -> str:
    what = view["url"] or view["name"] or view["title"]
    done = view.get("last_completed")
    last = (f"last completed run {done['turn']}: {done['pages']} pages, {done['added']} added, "
            f"{done['replaced']} replaced, {done['unchanged']} unchanged, {done['removed']} removed, "
            f"{done['failed']} failed" if done else "no completed run")
    progress = view.get("progress")
    state = view["state"] + (f" ({progress['done']}/{progress['pages']} pages)" if progress and view["state"] == "running"
                             else "")
    failure = view.get("last_failure")
    why = f"; run {failure['run']} failed: {failure['reason']}" if failure and failure["run"] == view["run"] else ""
    return f"{view['id']}  {view['kind']:<7} {what}\n    run {view['run']} {state}; {last}{why}"


async def listing(bus: Bus, args) -> int:
    views = await _views(bus, args.site)
    if args.json:
        print(json.dumps({"site": args.site, "sources": views}))
    elif not views:
        print(f"site {args.site} has no knowledge sources (add one: concierge sources add --site {args.site} --url URL)")
    for view in views if not args.json else ():
        print(_line(view))
    return 0


async def sync(bus: Bus, args) -> int:
    known = await sources.definitions(bus, args.site)
    if unknown := [s for s in args.source if s not in known]:
        print(f"no source {unknown[0]} in site {args.site} (see: concierge sources list --site {args.site})",
              file=sys.stderr)
        return 2
    if not known:
        print(f"site {args.site} has no knowledge sources", file=sys.stderr)
        return 2
    runs = {}
    for source in args.source or list(known):
        run_, new = await sources.request_sync(bus, args.site, source, "operator", "cli")
        runs[source] = run_.turn
        print(f"source {source}: run {run_.turn} {'requested' if new else 'already running'}")
    return await _wait(bus, args.site, runs, args.timeout) if args.wait else 0


async def _wait(bus: Bus, site: str, runs: dict[str, int], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    pending = dict(runs)
    failed = False
    while pending:
        for view in await _views(bus, site, list(pending)):
            if view["run"] >= pending[view["id"]] and view["state"] in ("completed", "failed"):
                print(_line(view))
                failed |= view["state"] == "failed"
                pending.pop(view["id"])
        if pending and time.monotonic() > deadline:
            print(f"timed out after {timeout:.0f} s waiting for {', '.join(pending)}", file=sys.stderr)
            return 3
        if pending:
            await asyncio.sleep(0.5)
    return 1 if failed else 0


async def remove(bus: Bus, args) -> int:
    if args.source not in await sources.definitions(bus, args.site):
        print(f"no source {args.source} in site {args.site}", file=sys.stderr)
        return 2
    await sources.remove(bus, args.site, args.source, "cli")
    print(f"source {args.source} removed: its pages leave the knowledge base")
    return 0
