"""`concierge sites add|set|show|export|delete`: sites as data, in the bus.

    concierge sites add --site SITE --name NAME [--origin URL ...]
    concierge sites set --site SITE KEY=VALUE ... [--file PATCH.toml]
    concierge sites show --site SITE [--versions]
    concierge sites export --site SITE [> sites/SITE.toml]
    concierge sites delete --site SITE

The same writes, checks and audit as the operator API (shared/site_store.py): a change that
does not validate is refused with every field's problem, one per line, and exit status 1.
`set` takes dotted keys for tables (`widget.primary_color=#0a7`); a value is read as TOML
when it is one (`3`, `true`, `["a", "b"]`, `"quoted"`), else as text (`Acme Corp`, `#0a7`);
lists are replaced whole. `--file` is a TOML file of the keys to change (an export, edited).

These talk to the bus (NATS_URL, `--nats-url`), as the other operator commands do, not to
the gateway: no token to hand around, they work while no gateway runs, and an operator who
may use the bus may change any site anyway (docs/security.md). Exit status: 0 done, 1
refused (invalid, no such site, already there), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
import tomllib
from typing import Any

from cli import options
from shared.bus import connect
from shared.config import BusConfig
from shared.site_config import SiteConfigError
from shared.site_store import Change, SiteExists, SiteNotFound, SiteStore, as_data, exported, merged
from shared.toml_text import dumps


class BadInput(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="concierge sites", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--site", required=True, type=options.site_id)
    options.add_bus(common)
    sub = top.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", parents=[common], help="create a site")
    add.add_argument("--name", required=True, help="the company name the assistant speaks for")
    add.add_argument("--origin", action="append", default=[], metavar="URL",
                     help="a page origin that may embed the widget, https://shop.example (repeatable)")
    change = sub.add_parser("set", parents=[common], help="change some of a site's settings")
    change.add_argument("assignments", nargs="*", metavar="KEY=VALUE")
    change.add_argument("--file", help="a TOML file of the keys to change")
    show = sub.add_parser("show", parents=[common], help="a site's config (every key)")
    show.add_argument("--versions", action="store_true", help="the versions kept, newest first, and who made each")
    sub.add_parser("export", parents=[common], help="a site's config as a sites/<site>.toml file (what differs "
                                                    "from the defaults)")
    sub.add_parser("delete", parents=[common], help="delete a site (its log and earlier versions stay)")
    return top


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        patch = _patch(args) if args.command == "set" else {}
    except BadInput as exc:
        print(exc, file=sys.stderr)
        return 2
    return asyncio.run(run(options.bus_config(args), args, patch))


def assignments(pairs: list[str]) -> dict[str, Any]:
    """`["widget.primary_color=#0a7", "cta.first_turn=3"]` as a patch:
    `{"widget": {"primary_color": "#0a7"}, "cta": {"first_turn": 3}}`."""
    patch: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise BadInput(f"{pair!r}: expected KEY=VALUE (dotted keys for tables: widget.title=Hello)")
        table = patch
        for part in parts[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise BadInput(f"{pair!r}: {part} is set to a value and used as a table")
        table[parts[-1]] = _value(text)
    return patch


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _patch(args: argparse.Namespace) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    if args.file:
        try:
            with open(args.file, "rb") as f:
                patch = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise BadInput(f"{args.file}: {exc}") from None
    patch = merged(patch, assignments(args.assignments))
    if not patch:
        raise BadInput("nothing to set: give KEY=VALUE pairs or --file")
    return patch


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in this environment (a container's uid)
        return "cli"


async def run(config: BusConfig, args: argparse.Namespace, patch: dict[str, Any]) -> int:
    bus = await connect(config, name="sites-cli")
    store = SiteStore(bus)
    try:
        if args.command == "add":
            change = await store.put(args.site, {"name": args.name, "allowed_origins": args.origin}, actor(),
                                     must_create=True)
            return _done(args.site, change, "created")
        if args.command == "set":
            return _done(args.site, await store.patch(args.site, patch, actor()), "changed")
        if args.command == "delete":
            change = await store.delete(args.site, actor())
            print(f"deleted site {args.site} (its last version {change.event.previous_version} stays in the history)")
            return 0
        if args.command == "show" and args.versions:
            return _versions(args.site, await store.versions(args.site))
        current = await store.read(args.site)
        if current is None:
            raise SiteNotFound(args.site)
        if args.command == "show":
            print(f"# site {args.site}, version {current.version}")
            print(dumps(as_data(current)), end="")
        else:
            print(f"# site {args.site}, exported at version {current.version} (`concierge sites export`)")
            print(dumps(exported(current)), end="")
        return 0
    except SiteConfigError as exc:
        print(f"refused: site {args.site} was not changed", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error.field or '(config)'}: {error.message}", file=sys.stderr)
        return 1
    except SiteNotFound:
        print(f"no site {args.site} (concierge sites add --site {args.site} --name NAME)", file=sys.stderr)
        return 1
    except SiteExists:
        print(f"site {args.site} exists already (change it with concierge sites set)", file=sys.stderr)
        return 1
    finally:
        await bus.close()


def _done(site: str, change: Change, verb: str) -> int:
    if change.event is None:
        print(f"site {site} unchanged (version {change.config.version})")
        return 0
    fields = ", ".join(change.event.fields_changed) or "nothing"
    print(f"{verb} site {site}: version {change.event.version} (was {change.event.previous_version or 'none'}); "
          f"fields: {fields}")
    return 0


def _versions(site: str, versions: list[dict[str, Any]]) -> int:
    if not versions:
        raise SiteNotFound(site)
    for v in versions:
        if v["deleted"]:
            print(f"{v['revision']:>6}  (deleted)")
            continue
        made = v["change"] or {}
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(made["ts"])) if made else "?"
        print(f"{v['revision']:>6}  {v['version']}  {when}  {made.get('change', '?')} by {made.get('actor', '?')}  "
              f"{', '.join(made.get('fields_changed', []))}")
    return 0
