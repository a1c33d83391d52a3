"""`concierge loadtest SERVICE [ARGS]`: one service alone, swept over rising rates; each
service's load test is a module of its own, with its own arguments (`concierge loadtest
router --help`), and all share the rate driver (driver.py) and the sweep (sweep.py), so
every one ends with the same JSON line.

`concierge loadtest all` runs them one after the other with their defaults (what `make
loadtest` does), prints each one's line as it ends and, last, one line with them all;
`--docs` writes their table into docs/benchmarks.md, `--chart` their latency chart, and
`--reuse LOG` takes the services an earlier run's output already holds (one service
measured again without the others).

`concierge loadtest ingest` is no service and no rate sweep: how many chunks a second the
offline ingest stores (cli/measure/loadtest/ingest.py); `all` leaves it out.
`concierge loadtest tenants --sites N` is the whole system with N sites: memory, cold and
hot first answers (cli/measure/loadtest/tenants.py); `all` leaves it out too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from pathlib import Path

SERVICES = {
    "gateway": "cli.measure.loadtest.gateway",
    "router": "cli.measure.loadtest.router",
    "retriever": "cli.measure.loadtest.retriever",
    "enricher": "cli.measure.loadtest.enricher",
    "responder": "cli.measure.loadtest.responder",
}
INGEST = "cli.measure.loadtest.ingest"
TENANTS = "cli.measure.loadtest.tenants"
USAGE = (f"usage: concierge loadtest {{{','.join(SERVICES)},all,ingest,tenants}} [ARGS]  "
         "(concierge loadtest SERVICE --help, concierge loadtest all --help)")


def run_all(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="concierge loadtest all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SERVICES), help="the services, in order (default: all five)")
    parser.add_argument("--seconds", type=float, help="how long each rate is offered (default: each test's own)")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="SERVICE=ARGS",
                        help="more arguments for one service's test, e.g. --with 'retriever=--sites 4'")
    parser.add_argument("--reuse", type=Path, metavar="LOG",
                        help="take the services already measured from an earlier run's output (its JSON lines) "
                             "and run only the others: one service measured again, the table and chart rebuilt")
    parser.add_argument("--docs", type=Path, help="write the table between the markers of this file")
    parser.add_argument("--chart", type=Path, help="write the latency chart (PNG) here")
    args = parser.parse_args(argv)
    services = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := [s for s in services if s not in SERVICES]:
        parser.error(f"unknown service {', '.join(unknown)}: choose from {', '.join(SERVICES)}")
    extra: dict[str, list[str]] = {}
    for item in args.extra:
        service, _, more = item.partition("=")
        if service not in SERVICES:
            parser.error(f"--with {item!r}: SERVICE=ARGS with SERVICE one of {', '.join(SERVICES)}")
        extra.setdefault(service, []).extend(shlex.split(more))
    reused = earlier_results(args.reuse) if args.reuse else {}
    results = []
    for service in services:
        if service in reused:
            print(f"== {service}: measured {reused[service]['date']}, taken from {args.reuse}", flush=True)
            results.append(reused[service])
            continue
        print(f"== {service}", flush=True)
        module = importlib.import_module(SERVICES[service])
        seconds = ["--seconds", str(args.seconds)] if args.seconds else []
        result = module.run(module.parser().parse_args(seconds + extra.get(service, [])))
        print(json.dumps(result), flush=True)
        results.append(result)
    from cli.measure.loadtest import report

    if args.chart:
        report.chart(results, args.chart)
        print(f"chart written to {args.chart}", flush=True)
    if args.docs:
        command = shlex.join(["concierge", "loadtest", "all", *argv])
        report.write_docs(args.docs, results, command, args.chart)
        print(f"table written to {args.docs}", flush=True)
    print("max sustainable rate per replica: " + ", ".join(
        f"{r['service']} {r['max_sustainable_rate']}/s" for r in results), flush=True)
    print(json.dumps({"services": results}), flush=True)
    return 0 if all(p["answered"] for r in results for p in r["rates"]) else 1


def earlier_results(log: Path) -> dict[str, dict]:
    """Each service's last result in an earlier run's output: its own JSON line, or the
    closing line of `all`."""
    found: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        printed = json.loads(line)
        for result in printed.get("services", [printed]):
            if "service" in result and "rates" in result:
                found[result["service"]] = result
    return found


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["all"]:
        return run_all(argv[1:])
    if argv[:1] == ["ingest"]:
        return importlib.import_module(INGEST).main(argv[1:])
    if argv[:1] == ["tenants"]:
        return importlib.import_module(TENANTS).main(argv[1:])
    if not argv or argv[0] not in SERVICES:
        print(USAGE, file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(SERVICES[argv[0]]).main(argv[1:])
