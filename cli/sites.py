"""`concierge sites check [DIR]`: validate site config files the way the router does."""

from __future__ import annotations

import sys
from pathlib import Path

from shared.site_config import SiteConfigError, parse, site_of


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "check":
        print("usage: concierge sites check [DIR]", file=sys.stderr)
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
