"""`concierge loadtest router`: the router service alone, swept over rising rates of turns.

Starts nats-server and one router process (nothing else), publishes `TurnRequested` events
at each of `--rates` per second for `--seconds`, and times each one to its `RouteDecided`
(two analyses in parallel, then the join that selects, routes and applies). Messages are the labeled sets'
(training and evaluation), varied with the greetings and sign-offs visitors add, so every
message of a run is distinct and no cache answers for a previous turn; the local
classifier decides (no LLM). Sessions run `--turns` turns each, so the router also
reads conversation state with history. The sweep, its figures and the last line's JSON:
cli/measure/loadtest/sweep.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from cli.harness.supervisor import free_port, make_system
from cli.measure.loadtest import driver, sweep
from services.router.local_model import EVAL, TRAIN, read_jsonl

SITE = "loadtest"
LATENCY = "TurnRequested published → RouteDecided received"

PREFIXES = ("", "Hi, ", "Hello! ", "Quick question: ", "Hey - ", "Good morning. ", "Sorry, ", "OK. ")
SUFFIXES = ("", " Thanks!", " Thank you.", " :)", " Cheers", " Please.", " Thx", " (asking for my team)")


def variants(seed: int):
    """Distinct, plausible messages: every base message with every greeting and sign-off,
    the order shuffled per run."""
    base = [r["message"] for r in read_jsonl(EVAL) + read_jsonl(TRAIN)]
    out = [f"{p}{m}{s}" for m in base for p in PREFIXES for s in SUFFIXES]
    random.Random(seed).shuffle(out)
    return out


async def drive(nats_url: str, rate: float, seconds: float, turns_per_session: int, tag: str) -> driver.Run:
    """`TurnRequested` at `rate` per second for `seconds`, each timed to its `RouteDecided`,
    counted by route and branch."""
    turn = driver.conversations(tag, variants(hash(tag) & 0xFFFF), (SITE,), turns_per_session)
    return await driver.drive(nats_url, rate, seconds, turn, "route_decided", SITE,
                              lambda event: [f"{event.route}/{event.branch}"])


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest router", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_arguments(parser, rates="25,50,100,200,300,400,600", objective_ms=100.0)
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    return parser


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="concierge-load-router-") as data:
        system = make_system(Path(data), free_port(), free_port(), {"LOG_LEVEL": "WARNING", "ROUTER_CLASSIFIER": "local"})
        try:
            system.start_nats()
            started = time.monotonic()
            pid = system.start_service("router").pid
            system.wait_ready("router", 120)  # model load, and training on a cold cache
            print(f"router ready in {time.monotonic() - started:.1f} s", flush=True)
            asyncio.run(drive(system.nats_url, sweep.rates_of(args.rates)[0], args.warmup_s, args.turns, "warmup"))
            points = sweep.sweep(pid, args, lambda rate: asyncio.run(
                drive(system.nats_url, rate, args.seconds, args.turns, f"run{time.time_ns()}")))
        finally:
            system.stop()
    return sweep.report("router", args, LATENCY, points, classifier="local", turns_per_session=args.turns)


def main(argv: list[str] | None = None) -> int:
    return sweep.print_report(run(parser().parse_args(argv)))
