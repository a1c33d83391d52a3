"""A stand-in for everything behind the gateway, for the gateway's load test: it answers
every `TurnRequested` on the bus the way the responder ends a turn, with no router, model
or knowledge base in between.

Per turn: `--tokens` token chunks on the turn's token subject (the first at once, then one
every `--inter-token-ms`), then `ResponseCompleted` with the whole text and `TurnCompleted`
in the log, so the gateway's relay streams the tokens and closes the SSE stream as it does
for a real answer.

    python -m cli.harness.responder_standin --nats-url nats://127.0.0.1:4222

It prints 'stand-in ready' once subscribed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from shared import events as ev
from shared import subjects
from shared.bus import Bus, connect
from shared.config import BusConfig

NODE = "standin"


async def answer(bus: Bus, requested: ev.TurnRequested, tokens: int, inter_token_s: float) -> None:
    parts = [f"word{i} " for i in range(tokens)]
    for index, part in enumerate(parts):
        if index and inter_token_s:
            await asyncio.sleep(inter_token_s)
        await bus.publish_token(ev.follow(requested, ev.TokenChunk, NODE, f"token-1-{index}", index=index,
                                          content=part))
    await bus.publish(ev.follow(requested, ev.ResponseCompleted, NODE, node=NODE, text="".join(parts),
                                token_count=len(parts)))
    await bus.publish(ev.follow(requested, ev.TurnCompleted, NODE, metadata={"route": "ANSWER"}))


async def serve(nats_url: str, tokens: int, inter_token_s: float) -> None:
    bus = await connect(BusConfig(url=nats_url), name=NODE)
    tasks: set[asyncio.Task] = set()

    async def on_turn(msg):
        task = asyncio.create_task(answer(bus, ev.decode(msg.data), tokens, inter_token_s))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await bus.nc.subscribe(subjects.conv_of_type("turn_requested"), cb=on_turn)
    print("stand-in ready", flush=True)
    await stop.wait()
    await bus.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.harness.responder_standin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--tokens", type=int, default=20, help="token chunks per answer")
    parser.add_argument("--inter-token-ms", type=float, default=20.0, help="delay between chunks")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.nats_url, args.tokens, args.inter_token_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
