"""`concierge loadtest SERVICE [ARGS]`: one service alone under a set rate; each service's
load test is a module of its own, with its own arguments (`concierge loadtest router --help`)."""

from __future__ import annotations

import importlib
import sys

SERVICES = {
    "enricher": "cli.measure.loadtest_enricher",
    "router": "cli.measure.loadtest_router",
    "retriever": "cli.measure.loadtest_retriever",
}
USAGE = f"usage: concierge loadtest {{{','.join(SERVICES)}}} [ARGS]  (concierge loadtest SERVICE --help)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SERVICES:
        print(USAGE, file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(SERVICES[argv[0]]).main(argv[1:])
