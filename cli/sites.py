"""`concierge sites check [DIR]`: validate site config files the way the router does.
`concierge sites key --site SITE`: make an operator API key for one site."""

from __future__ import annotations

import argparse
import hashlib
import secrets
import sys
from pathlib import Path

from shared.site_config import SiteConfigError, parse, site_of
from shared.subjects import TOKEN_RE

USAGE = "usage: concierge sites check [DIR] | concierge sites key --site SITE"


def main(argv: list[str]) -> int:
    if argv and argv[0] == "key":
        return key(argv[1:])
    if not argv or argv[0] != "check":
        print(USAGE, file=sys.stderr)
        return 2
    directory = Path(argv[1] if len(argv) > 1 else "sites")
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


def key(argv: list[str]) -> int:
    """A new key, shown once: the site's file keeps only its SHA-256, so a leaked config
    leaks no key; add the hash next to the old one, hand out the key, then drop the old."""
    parser = argparse.ArgumentParser(prog="concierge sites key", description=key.__doc__)
    parser.add_argument("--site", required=True)
    args = parser.parse_args(argv)
    if not TOKEN_RE.match(args.site):
        print("--site: letters, digits, '-' or '_' (1-64)", file=sys.stderr)
        return 2
    api_key = f"ck_{args.site}_{secrets.token_hex(24)}"  # hex: no '_' in the secret part
    print(f"API key for site {args.site} (shown once; give it to the site's operators):")
    print(f"  {api_key}")
    print(f"Add its hash to sites/{args.site}.toml (keep the old entry until the old key is retired):")
    print(f'  operator_key_sha256 = ["{hashlib.sha256(api_key.encode()).hexdigest()}"]')
    return 0
