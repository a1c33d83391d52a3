"""`concierge sites check [DIR]`: validate site config files the way the router does.
`concierge sites webhook-secret --site SITE [--dir DIR]`: print the secret that site's lead
webhooks are signed with, for the operator to give to that customer (`--new`: a fresh
random one, for a site's own `lead.webhook_secret_env` variable)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from shared import subjects, webhook_secret
from shared.site_config import SiteConfig, SiteConfigError, parse, site_of

USAGE = "usage: concierge sites check [DIR] | webhook-secret (--site SITE [--dir DIR] | --new)"


def main(argv: list[str]) -> int:
    if argv and argv[0] == "check":
        return check(argv[1:])
    if argv and argv[0] == "webhook-secret":
        return secret(argv[1:])
    print(USAGE, file=sys.stderr)
    return 2


def check(argv: list[str]) -> int:
    directory = Path(argv[0] if argv else "sites")
    files = sorted(directory.glob("*.toml"))
    if not files:
        print(f"{directory}: no *.toml site config files", file=sys.stderr)
        return 2
    failed = 0
    for path in files:
        try:
            site = site_of(path)
            config = parse(path)
        except SiteConfigError as exc:
            print(f"refused  {exc}")
            failed += 1
            continue
        print(f"ok       {path} (site {site}, version {config.version})")
    return 1 if failed else 0


def secret(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="concierge sites webhook-secret")
    parser.add_argument("--site", help="the site id")
    parser.add_argument("--dir", default=os.environ.get("SITES_DIR", "sites"), help="site config files (SITES_DIR)")
    parser.add_argument("--new", action="store_true", help="print a fresh random secret instead")
    args = parser.parse_args(argv)
    if args.new:
        print(webhook_secret.new())
        return 0
    if not args.site:
        parser.error("--site or --new is required")
    if not subjects.TOKEN_RE.match(args.site):
        parser.error(f"--site {args.site!r}: not a site id ([A-Za-z0-9_-], ≤ 64 chars)")
    path = Path(args.dir) / f"{args.site}.toml"
    try:
        config = parse(path) if path.exists() else SiteConfig()  # no file: the defaults, as the services do
        print(webhook_secret.for_site(args.site, config.lead))
    except (SiteConfigError, webhook_secret.WebhookSecretError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
