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
from collections import Counter
from pathlib import Path

from cli.bench import percentile
from cli.supervisor import free_port, make_system
from services.router.local_model import EVAL, TRAIN, read_jsonl
from shared import events as ev
from shared import subjects
from shared.bus import connect
from shared.config import BusConfig

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


async def drive(nats_url: str, rate: float, seconds: float, turns_per_session: int, tag: str,
                messages: list[str] | None = None, sites: tuple[str, ...] = (SITE,), answer: str = "route_decided",
                label=lambda event: f"{event.route}/{event.branch}") -> dict:
    """Publish `TurnRequested` at `rate` per second for `seconds` and time each turn to its
    `answer` event (any single-service load test: the router's RouteDecided, the
    retriever's RetrievalCompleted); sessions take turns among `sites`; `label` counts the
    answers by kind."""
    messages = messages or variants(hash(tag) & 0xFFFF)
    bus = await connect(BusConfig(url=nats_url), name="loadtest")
    sent: dict[tuple[str, int], float] = {}
    latencies: list[float] = []
    routes: Counter = Counter()
    done = asyncio.Event()
    total = int(rate * seconds)
    last_done = [0.0]

    async def on_route(msg):
        event = ev.decode(msg.data)
        started = sent.pop((event.session_id, event.turn), None)
        if started is not None:
            latencies.append((time.perf_counter() - started) * 1000)
            routes[label(event)] += 1
            last_done[0] = time.perf_counter()
            if len(latencies) >= total:
                done.set()

    sub = await bus.nc.subscribe(subjects.conv_of_type(answer, sites[0] if len(sites) == 1 else "*"), cb=on_route)
    began = time.perf_counter()
    try:
        for i in range(total):
            target = began + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            session, turn = f"{tag}-{i // turns_per_session}", i % turns_per_session + 1
            site = sites[(i // turns_per_session) % len(sites)]
            message = messages[i % len(messages)]
            sent[(session, turn)] = time.perf_counter()
            await bus.publish(ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=turn,
                                               ts=ev.now(), producer="loadtest", message=message))
        try:
            await asyncio.wait_for(done.wait(), 30)
        except asyncio.TimeoutError:
            pass
    finally:
        await sub.unsubscribe()
        await bus.close()
    elapsed = (last_done[0] or time.perf_counter()) - began
    return {
        "offered_per_s": rate,
        "sent": total,
        "routed": len(latencies),
        "turns_per_s": round(len(latencies) / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "routes": dict(routes.most_common()),
    }


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
            warm = {"routed": 0}
            while warm["routed"] == 0 and time.monotonic() - started < 120:
                warm = asyncio.run(drive(system.nats_url, 5, 1, 1, f"warm{int(time.monotonic())}"))
            print(f"router ready in {time.monotonic() - started:.1f} s", flush=True)
            asyncio.run(drive(system.nats_url, args.rate / 4, 2, args.turns, "warmup"))
            result = asyncio.run(drive(system.nats_url, args.rate, args.seconds, args.turns, f"run{time.time_ns()}"))
        finally:
            system.stop()
    result.update({"service": "router", "classifier": "local", "turns_per_session": args.turns})
    print(json.dumps(result))
    return 0 if result["routed"] == result["sent"] else 1
