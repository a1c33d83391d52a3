"""`concierge loadtest router`: the router service alone, under a set rate of turns.

Starts nats-server and one router process (nothing else), publishes `TurnRequested`
events at `--rate` per second for `--seconds`, and times each one to its `RouteDecided`
(three analyses in parallel, then the routing decision). Messages are the labeled sets'
(training and evaluation), varied with the greetings and sign-offs visitors add, so every
message of a run is distinct and no cache answers for a previous turn; the local
classifier decides (no LLM). Sessions run `--turns` turns each, so the router also
reads conversation state with history. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from cli.harness.supervisor import free_port, make_system
from cli.measure import driver
from services.router.local_model import EVAL, TRAIN, read_jsonl

SITE = "loadtest"


PREFIXES = ("", "Hi, ", "Hello! ", "Quick question: ", "Hey - ", "Good morning. ", "Sorry, ", "OK. ")
SUFFIXES = ("", " Thanks!", " Thank you.", " :)", " Cheers", " Please.", " Thx", " (asking for my team)")


def variants(seed: int):
    """Distinct, plausible messages: every base message with every greeting and sign-off,
    the order shuffled per run."""
    import random
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge loadtest router", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="turns per second offered")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="concierge-load-router-") as data:
        system = make_system(Path(data), free_port(), free_port(), {"LOG_LEVEL": "WARNING", "ROUTER_CLASSIFIER": "local"})
        try:
            system.start_nats()
            started = time.monotonic()
            system.start_service("router")
            # Ready once it routes a turn (model load, and training on a cold cache).
            routed = 0
            while routed == 0 and time.monotonic() - started < 120:
                routed = asyncio.run(drive(system.nats_url, 5, 1, 1, f"warm{int(time.monotonic())}")).answered
            print(f"router ready in {time.monotonic() - started:.1f} s", flush=True)
            asyncio.run(drive(system.nats_url, args.rate / 4, 2, args.turns, "warmup"))
            result = asyncio.run(drive(system.nats_url, args.rate, args.seconds, args.turns, f"run{time.time_ns()}"))
        finally:
            system.stop()
    print(json.dumps({"offered_per_s": result.offered_per_s, "sent": result.sent, "routed": result.answered,
                      "turns_per_s": result.answered_per_s, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
                      "routes": result.labels, "service": "router", "classifier": "local",
                      "turns_per_session": args.turns}))
    return 0 if result.answered == result.sent else 1
