"""The process around a set of nodes: logging, tracing, bus, runners, and a clean stop.

On SIGTERM or SIGINT the runners stop fetching, in-flight handlers get
`drain_timeout_s` to finish, and the connection is drained, so a rolling restart
loses nothing: whatever was not acked is redelivered to another replica.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Awaitable, Callable, Sequence

from shared import logs, telemetry
from shared.bus import Bus, connect
from shared.config import BusConfig, ConsumerConfig, env_float
from shared.consumer import ConsumerRunner, Node

log = logging.getLogger(__name__)

NodeFactory = Callable[[Bus], Awaitable[Sequence[Node]]]


async def serve(service: str, make_nodes: NodeFactory) -> None:
    bus = await connect(BusConfig.from_env(), name=service)
    nodes = await make_nodes(bus)
    lookback = env_float("CONSUMER_START_LOOKBACK_S", 300.0)
    runners = [ConsumerRunner(bus, node, ConsumerConfig.from_env(node.name), start_lookback_s=lookback) for node in nodes]
    for runner in runners:
        await runner.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    # Start-up objects (modules, clients, configs) never die: keep them out of the cyclic
    # GC's generations so its pauses stay short on the hot path.
    gc.freeze()
    log.info("service ready", extra={"nodes": [n.name for n in nodes]})
    await stop.wait()

    log.info("stopping")
    await asyncio.gather(*(runner.stop() for runner in runners))
    await bus.close()
    log.info("stopped")


def _dump_tasks() -> None:
    """SIGUSR1: log where every task is waiting (what is this node doing right now?)."""
    for task in asyncio.all_tasks():
        stack = "".join(f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}\n" for f in task.get_stack(limit=12))
        log.warning("task", extra={"task": task.get_name(), "stack": stack})


def main(service: str, make_nodes: NodeFactory) -> None:
    logs.setup(service)
    telemetry.setup(service)
    asyncio.run(serve(service, make_nodes))
