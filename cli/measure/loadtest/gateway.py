"""`concierge loadtest gateway`: the gateway alone, swept over rising rates of chat turns
over HTTP SSE.

Starts nats-server, redis-server, the stand-in responder (cli/harness/responder_standin.py:
it answers every `TurnRequested` with `--tokens` token chunks, one every
`--inter-token-ms`, then `ResponseCompleted` and `TurnCompleted`, as the responder ends a
turn) and one gateway process. Each arrival is a new visitor's `POST /v1/chat` to a
configured site (the demo site's config), its SSE stream read to the end: every turn goes
through the gateway's whole path (rate limits, session guard, the log read, the relay's
subscriptions, `TurnRequested`, the tokens relayed as SSE frames, `complete`). The per-IP
limit is off (every visitor is 127.0.0.1); the per-site limit stays on, above any rate.

Timed from when each request was due: its **first SSE token** (the percentiles and the
objective) and its `complete` frame (`completion_p50_ms`, `completion_p99_ms`: the stand-in's
token pacing included). The sweep, its figures and the last line's JSON:
cli/measure/loadtest/sweep.py.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from cli.harness import sse
from cli.harness.supervisor import ROOT, free_port, make_system
from cli.measure.loadtest import driver, sweep

SITE = "loadtest"
LATENCY = "POST /v1/chat due → first SSE token read"
MESSAGES = ["What integrations do you offer?", "How does the scheduling engine work?", "Is there an API I can use?",
            "Does the mobile app work offline?", "Where is my data hosted?", "Can I export my data to CSV?"]


async def drive(base_url: str, rate: float, seconds: float) -> driver.Run:
    """New visitors' turns at `rate` per second for `seconds`, each timed to its first token
    and its `complete`; anything else that ends a stream is counted by what it was."""
    recorder = driver.Recorder(total=int(rate * seconds))
    # Enough connections for every stream open at once: a client-side queue would add
    # the generator's own waiting to the latencies.
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def arrive(i: int, due: float) -> None:
            first = True

            async def on_event(event: dict) -> None:
                nonlocal first
                if event["type"] == "token" and first:
                    first = False
                    recorder.mark(driver.FIRST_TOKEN, due)
                elif event["type"] == "complete":
                    recorder.mark(driver.COMPLETION, due)
                elif event["type"] == "error":
                    recorder.labels["error frame"] += 1

            try:
                result = await sse.chat(client, base_url, {"site": SITE, "message": MESSAGES[i % len(MESSAGES)]},
                                        on_event)
            except httpx.HTTPError as exc:
                recorder.labels[type(exc).__name__] += 1
                return
            recorder.labels["complete" if result.final and result.final["type"] == "complete"
                            else f"HTTP {result.status}"] += 1

        return await driver.open_loop(rate, seconds, arrive, recorder)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_arguments(parser, rates="10,25,50,100,150,200,300", objective_ms=50.0)
    parser.add_argument("--tokens", type=int, default=20, help="token chunks per answer (the stand-in's)")
    parser.add_argument("--inter-token-ms", type=float, default=20.0, help="the stand-in's delay between chunks")
    return parser


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="concierge-load-gateway-") as data:
        sites = Path(data) / "sites"
        sites.mkdir()
        shutil.copy(ROOT / "sites" / "demo.toml", sites / f"{SITE}.toml")
        system = make_system(Path(data), free_port(), free_port(), {
            "LOG_LEVEL": "WARNING", "SITES_DIR": str(sites),
            "RATE_LIMIT_PER_IP_PER_MIN": "0", "RATE_LIMIT_PER_SITE_PER_MIN": "10000000"})
        try:
            system.start_nats()
            system.start_redis()
            system.load_sites()  # the router's part
            system.spawn("standin", [sys.executable, "-m", "cli.harness.responder_standin",
                                     "--nats-url", system.nats_url, "--tokens", str(args.tokens),
                                     "--inter-token-ms", str(args.inter_token_ms)])
            system.wait_logged_ready("standin", 30, marker=b"stand-in ready")
            started = time.monotonic()
            pid = system.start_service("gateway").pid
            system.wait_ready("gateway", 60)
            print(f"gateway ready in {time.monotonic() - started:.1f} s (stand-in: {args.tokens} tokens, "
                  f"one every {args.inter_token_ms:g} ms)", flush=True)
            first = sweep.rates_of(args.rates)[0]
            asyncio.run(drive(system.gateway_url, first, args.warmup_s))
            points = sweep.sweep(pid, args, lambda rate: asyncio.run(drive(system.gateway_url, rate, args.seconds)),
                                 primary=driver.FIRST_TOKEN)
        finally:
            system.stop()
    return sweep.report("gateway", args, LATENCY, points, standin_tokens=args.tokens,
                        standin_inter_token_ms=args.inter_token_ms)


def main(argv: list[str] | None = None) -> int:
    return sweep.print_report(run(parser().parse_args(argv)))
