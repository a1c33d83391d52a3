"""`concierge loadtest enricher`: the enricher service alone, under a set rate of turns.

Starts nats-server, redis-server and one enricher process (nothing else), publishes
first-turn `TurnRequested` events at `--rate` per second for `--seconds`, and times
each one to its `EnrichmentCompleted`. Two scenarios:
- cache: every visitor comes from the same IP, so after the first lookup the
  enrichment cache answers;
- slow-miss: every visitor has a new IP and the IP source is a local HTTP provider
  answering after `--provider-delay-ms` (the offline dataset is switched off).
The last line printed is one JSON object with both scenarios' figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from cli.harness.supervisor import free_port, make_system, wait_http
from cli.measure import driver
from shared import events as ev
from shared import privacy, redis_client

SITE = "loadtest"


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


async def drive(nats_url: str, redis_url: str, rate: float, seconds: float, same_ip: bool) -> dict:
    redis = redis_client.connect(redis_url)
    secrets = privacy.PrivacySettings.from_env()
    run = ev.new_id()[:8]
    ips: dict[str, str] = {}

    def turn(i: int) -> ev.TurnRequested:
        session = f"{run}-{i}"
        ip = ips[session] = ("203.0.113.10" if same_ip else
                             f"10.{random.randint(0, 255)}.{random.randint(0, 255)}.{i % 250 + 1}")
        return ev.TurnRequested(event_id=ev.new_id(), site=SITE, session_id=session, turn=1, ts=ev.now(),
                                producer="loadtest", message="hello", ip_hash=secrets.ip_hash(ip))

    async def store_ip(request: ev.TurnRequested) -> None:  # the raw IP is in Redis, as the gateway keeps it
        await redis.set(privacy.raw_ip_key(SITE, request.session_id), ips.pop(request.session_id), ex=600)

    try:
        result = await driver.drive(nats_url, rate, seconds, turn, "enrichment_completed", SITE,
                                  lambda event: (f"{name}: {status}" for name, status in event.sources.items()),
                                  store_ip)
    finally:
        await redis.aclose()
    return {
        "offered_per_s": result.offered_per_s,
        "sent": result.sent,
        "completed": result.answered,
        "enrichments_per_s": result.answered_per_s,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "source_outcomes": result.labels,
    }


def scenario(name: str, env: dict[str, str], rate: float, seconds: float, same_ip: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"concierge-load-{name}-") as data:
        system = make_system(Path(data), free_port(), free_port(), {"LOG_LEVEL": "WARNING", **env})
        try:
            system.start_nats()
            system.start_redis()
            system.start_service("enricher")
            time.sleep(1.5)  # the consumer exists once the process is connected
            asyncio.run(drive(system.nats_url, system.redis_url, rate / 10, 1, same_ip))  # warm-up
            return asyncio.run(drive(system.nats_url, system.redis_url, rate, seconds, same_ip))
        finally:
            system.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge loadtest enricher", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="turns per second offered")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--provider-delay-ms", type=float, default=300.0)
    args = parser.parse_args(argv)

    results = {"service": "enricher"}
    results["cache"] = scenario("cache", {}, args.rate, args.seconds, same_ip=True)
    print(f"cache hits:  {json.dumps(results['cache'])}", flush=True)
    url, provider = start_provider(args.provider_delay_ms / 1000)
    try:
        results["slow_miss"] = scenario("slow", {
            "ENRICH_IP_API_URL": url, "ENRICH_IP_API_TIMEOUT_S": "1.0", "ENRICH_DEADLINE_S": "1.5",
        }, args.rate, args.seconds, same_ip=False)
    finally:
        provider.should_exit = True
    results["slow_miss"]["provider_delay_ms"] = args.provider_delay_ms
    print(f"slow misses: {json.dumps(results['slow_miss'])}")
    print(json.dumps(results))
    ok = all(results[s]["completed"] == results[s]["sent"] for s in ("cache", "slow_miss"))
    return 0 if ok else 1
