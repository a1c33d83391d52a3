"""`concierge sites check [DIR]`: validate site config files the way the router does.
`concierge sites webhook-secret --site SITE [--dir DIR]`: print the secret that site's lead
webhooks are signed with, for the operator to give to that customer (`--new`: a fresh
random one bound to the site, `<site>:whsec_…`, for the variable its `lead.webhook_secret_env` names).
`concierge sites key --site SITE [--operator NAME]`: make an operator API key for one site
(with --operator, a named operator's own key).
`concierge sites add|set|show|export|delete`: a site's config in the bus (cli/site_data.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from shared import subjects, webhook_secret
from shared.site_config import OPERATOR_NAME_RE, SiteConfig, SiteConfigError, parse, site_of
from shared.site_store import key_sha256, new_key

USAGE = ("usage: concierge sites check [DIR] | webhook-secret --site SITE [--dir DIR | --new] | "
         "key --site SITE [--operator NAME]\n"
         "       | add --site SITE --name NAME [--origin URL ...] | set --site SITE KEY=VALUE ... [--file PATCH.toml]\n"
         "       | show --site SITE [--versions] | export --site SITE | delete --site SITE")
DATA_COMMANDS = ("add", "set", "show", "export", "delete")


def main(argv: list[str]) -> int:
    if argv and argv[0] in DATA_COMMANDS:
        from cli import site_data  # the bus client, only for these

        return site_data.main(argv)
    if argv and argv[0] == "check":
        return check(argv[1:])
    if argv and argv[0] == "webhook-secret":
        return secret(argv[1:])
    if argv and argv[0] == "key":
        return key(argv[1:])
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
    parser.add_argument("--new", action="store_true",
                        help="print a fresh random secret bound to --site: the value of the variable the "
                             "site's lead.webhook_secret_env names (`<site>:whsec_…`)")
    args = parser.parse_args(argv)
    if not args.site:
        parser.error("--site is required")
    if not subjects.TOKEN_RE.match(args.site):
        parser.error(f"--site {args.site!r}: not a site id ([A-Za-z0-9_-], ≤ 64 chars)")
    if args.new:
        print(webhook_secret.bound(args.site, webhook_secret.new()))
        return 0
    path = Path(args.dir) / f"{args.site}.toml"
    try:
        config = parse(path) if path.exists() else SiteConfig()  # no file: the defaults, as the services do
        print(webhook_secret.WebhookSecrets.from_env().for_site(args.site, config.lead))
    except (SiteConfigError, webhook_secret.WebhookSecretError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def key(argv: list[str]) -> int:
    """A new key, shown once: the site's file keeps only its SHA-256, so a leaked config
    leaks no key; add the hash next to the old one, hand out the key, then drop the old."""
    parser = argparse.ArgumentParser(prog="concierge sites key", description=key.__doc__)
    parser.add_argument("--site", required=True)
    parser.add_argument("--operator", default="", metavar="NAME",
                        help="a named operator's own key: what they do in a handoff is recorded as theirs")
    args = parser.parse_args(argv)
    if not subjects.TOKEN_RE.match(args.site):
        parser.error(f"--site {args.site!r}: not a site id ([A-Za-z0-9_-], ≤ 64 chars)")
    if args.operator and not OPERATOR_NAME_RE.match(args.operator):
        parser.error(f"--operator {args.operator!r}: 1-64 letters, digits, spaces, '.', '_' or '-'")
    api_key = new_key(args.site)
    if args.operator:
        print(f"API key of {args.operator} for site {args.site} (shown once; give it to them only):")
        print(f"  {api_key}")
        print(f"Add their account to sites/{args.site}.toml:")
        print("  [[operators]]")
        print(f"  name = {json.dumps(args.operator)}")
        print(f'  key_sha256 = "{key_sha256(api_key)}"')
        print('(or in one step: POST /v1/admin/sites/SITE/keys with {"operator": NAME})')
        return 0
    print(f"API key for site {args.site} (shown once; give it to the site's operators):")
    print(f"  {api_key}")
    print(f"Add its hash to sites/{args.site}.toml (keep the old entry until the old key is retired):")
    print(f'  operator_key_sha256 = ["{key_sha256(api_key)}"]')
    print("(or make the key and store its hash in one step: POST /v1/admin/sites/SITE/keys, the operator UI's Site view)")
    return 0
