"""`concierge loadtest enricher`: the enricher service alone, swept over rising rates of turns.

Starts nats-server, redis-server and one enricher process (nothing else), publishes
first-turn `TurnRequested` events at each of `--rates` per second for `--seconds`, and
times each one to its `EnrichmentCompleted`. `--scenario`:
- cache (the default): every visitor comes from the same IP, so after the first lookup
  the enrichment cache answers;
- slow-miss: every visitor has a new IP and the IP source is a local HTTP provider
  answering after `--provider-delay-ms` (the offline dataset is switched off); the
  objective is then that delay plus the cache scenario's.
The sweep, its figures and the last line's JSON: cli/measure/loadtest/sweep.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from cli.harness.supervisor import free_port, make_system, wait_http
from cli.measure.loadtest import driver, sweep
from shared import events as ev
from shared import privacy, redis_client

SITE = "loadtest"
LATENCY = "TurnRequested published → EnrichmentCompleted received"
SCENARIOS = ("cache", "slow-miss")
SHARED_IP = "203.0.113.10"
OBJECTIVE_MS = 100.0
CACHE_RATES = "25,50,100,200,300,400,600"
SLOW_RATES = "25,50,75,100,125,150"


def start_provider(delay_s: float) -> tuple[str, uvicorn.Server]:
    async def lookup(request):
        await asyncio.sleep(delay_s)
        return JSONResponse({"company_name": f"Company for {request.query_params.get('ip')}", "sector": "Software"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/ip", lookup)]), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    wait_http(f"http://127.0.0.1:{port}/ip", 10)
    return f"http://127.0.0.1:{port}/ip", server


async def drive(nats_url: str, redis_url: str, rate: float, seconds: float, same_ip: bool) -> driver.Run:
    """First turns at `rate` per second for `seconds`, each visitor's raw IP put in Redis
    beforehand (as the gateway keeps it), each turn timed to its `EnrichmentCompleted`."""
    redis = redis_client.connect(redis_url)
    secrets = privacy.PrivacySettings.from_env()
    run = ev.new_id()[:8]
    rng = random.Random(run)
    ips = [SHARED_IP if same_ip else f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{i % 250 + 1}"
           for i in range(int(rate * seconds))]

    def turn(i: int) -> ev.TurnRequested:
        return ev.TurnRequested(event_id=ev.new_id(), site=SITE, session_id=f"{run}-{i}", turn=1, ts=ev.now(),
                                producer="loadtest", message="hello", ip_hash=secrets.ip_hash(ips[i]))

    async def store_ip(i: int) -> None:
        await redis.set(privacy.raw_ip_key(SITE, f"{run}-{i}"), ips[i], ex=600)

    try:
        return await driver.drive(nats_url, rate, seconds, turn, "enrichment_completed", SITE,
                                  lambda event: (f"{name}: {status}" for name, status in event.sources.items()),
                                  store_ip)
    finally:
        await redis.aclose()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest enricher", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=SCENARIOS, default="cache")
    parser.add_argument("--provider-delay-ms", type=float, default=300.0, help="slow-miss: the IP provider's delay")
    sweep.add_arguments(parser, rates=None, objective_ms=None,
                        by=f"scenario: cache {CACHE_RATES} within {OBJECTIVE_MS:g} ms, slow-miss {SLOW_RATES} "
                           f"within the provider's delay + {OBJECTIVE_MS:g} ms")
    return parser


def run(args: argparse.Namespace) -> dict:
    slow = args.scenario == "slow-miss"
    # A slow miss cannot beat its provider: its objective is the provider's delay and the same margin.
    args.objective_ms = args.objective_ms or (args.provider_delay_ms + OBJECTIVE_MS if slow else OBJECTIVE_MS)
    args.rates = args.rates or (SLOW_RATES if slow else CACHE_RATES)
    provider = None
    env = {}
    if slow:
        url, provider = start_provider(args.provider_delay_ms / 1000)
        env = {"ENRICH_IP_API_URL": url, "ENRICH_IP_API_KEY": "load", "ENRICH_IP_API_TIMEOUT_S": "1.0",
               "ENRICH_DEADLINE_S": "1.5"}
    try:
        with tempfile.TemporaryDirectory(prefix=f"concierge-load-enricher-{args.scenario}-") as data:
            system = make_system(Path(data), free_port(), free_port(), {"LOG_LEVEL": "WARNING", **env})
            try:
                system.start_nats()
                system.start_redis()
                system.load_sites()  # the router's part: no service is ready before
                pid = system.start_service("enricher").pid
                system.wait_ready("enricher", 60)
                first = sweep.rates_of(args.rates)[0]
                asyncio.run(drive(system.nats_url, system.redis_url, first, args.warmup_s, not slow))
                points = sweep.sweep(pid, args, lambda rate: asyncio.run(
                    drive(system.nats_url, system.redis_url, rate, args.seconds, not slow)))
            finally:
                system.stop()
    finally:
        if provider is not None:
            provider.should_exit = True
    return sweep.report("enricher", args, LATENCY, points, scenario=args.scenario,
                        **({"provider_delay_ms": args.provider_delay_ms} if slow else {}))


def main(argv: list[str] | None = None) -> int:
    return sweep.print_report(run(parser().parse_args(argv)))
