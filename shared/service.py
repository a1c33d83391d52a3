"""The process around a set of nodes: logging, tracing, bus, runners, the ops port, and a
clean stop.

`NODES` (comma-separated) makes the process host only those of its service's nodes, so a
node can be scaled on its own; empty hosts them all. The ops port (`OPS_PORT`, 9000; 0:
none) answers `/healthz` from the start, `/readyz` once connected with every hosted
node's consumer bound (rechecked every `OPS_CHECK_S`, so it recovers by itself after a
reconnect) and `/metrics` (shared/metrics.py).

On SIGTERM or SIGINT the runners stop fetching, in-flight handlers get
`drain_timeout_s` to finish, and the connection is drained, so a rolling restart
loses nothing: whatever was not acked is redelivered to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from typing import Awaitable, Callable, Sequence, TypeVar

import msgspec
import uvloop

from shared import llm, logs, metrics, partitions, telemetry
from shared.bus import Bus, connect
from shared.config import BusConfig, ConfigError, ConsumerConfig, Settings, env_float, env_int, env_str
from shared.consumer import ConsumerRunner
from shared.partitions import PartitionedRunner
from shared.node import Node
from shared.ops import OpsServer
from shared.site_config import SiteConfigs
from shared.store import CachedStore

log = logging.getLogger(__name__)

NodeFactory = Callable[[Bus], Awaitable[Sequence[Node]]]
S = TypeVar("S")


class ProcessSettings(Settings):
    """What every consumer process reads, whatever its service. Each hosted node's delivery
    policy (`ConsumerConfig.from_env`, its variables named after the node) is read when its
    runner is made, at start too."""

    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    nodes: str = ""  # comma-separated names of the nodes to host; empty: all
    ops_port: int = 9000  # 0: no ops port
    ops_host: str = "0.0.0.0"
    ops_check_s: float = 5.0
    start_lookback_s: float = 300.0  # where a node's new durable starts
    site_config_ttl_s: float = 2.0
    # A partitioned node's replica (shared/partitions.py): its name among its node's members
    # (empty: host name and process id), and how long its key outlives its last renewal.
    partition_member: str = ""
    partition_ttl_s: float = 6.0

    @classmethod
    def from_env(cls) -> "ProcessSettings":
        d = cls()
        return cls(
            bus=BusConfig.from_env(),
            nodes=env_str("NODES", d.nodes),
            ops_port=env_int("OPS_PORT", d.ops_port),
            ops_host=env_str("OPS_HOST", d.ops_host),
            ops_check_s=env_float("OPS_CHECK_S", d.ops_check_s),
            start_lookback_s=env_float("CONSUMER_START_LOOKBACK_S", d.start_lookback_s),
            site_config_ttl_s=env_float("SITE_CONFIG_TTL_S", d.site_config_ttl_s),
            partition_member=env_str("PARTITION_MEMBER", d.partition_member),
            partition_ttl_s=env_float("PARTITION_MEMBER_TTL_S", d.partition_ttl_s),
        )


def select_nodes(service: str, nodes: Sequence[Node], selected: str) -> list[Node]:
    """The nodes named in `selected` (comma-separated; empty: all), in the service's order.
    A name the service does not define stops the process: a typo would otherwise leave a
    node hosted nowhere, its events waiting in silence."""
    names = [name.strip() for name in selected.split(",") if name.strip()]
    if not names:
        return list(nodes)
    known = [node.name for node in nodes]
    if unknown := [name for name in names if name not in known]:
        raise ConfigError(f"NODES={selected!r}: {', '.join(unknown)} not a node of {service}; "
                          f"its nodes are {', '.join(known)}")
    return [node for node in nodes if node.name in names]


class Process:
    """What /readyz reads: the bus once connected, the runners once started, the site
    registry once loaded (before, a node would take a configured site for one without a
    config and run it on the defaults)."""

    def __init__(self) -> None:
        self.bus: Bus | None = None
        self.runners: list[ConsumerRunner | PartitionedRunner] = []
        self.configs: SiteConfigs | None = None
        self.sites_loaded = False
        self.started = False

    def ready(self) -> bool:
        return (self.started and self.sites_loaded and self.bus is not None and self.bus.nc.is_connected
                and all(runner.bound for runner in self.runners))

    async def watch(self, every_s: float) -> None:
        """Check every runner's durable (readiness, pending gauges) every `every_s`, and the
        site registry every second until it is loaded."""
        checked = float("-inf")
        while True:
            if self.bus is not None and self.bus.nc.is_connected:  # disconnected: ready() says so already
                if not self.sites_loaded and self.configs is not None:
                    with contextlib.suppress(Exception):  # the bucket unreachable: asked again next round
                        self.sites_loaded = await self.configs.loaded()
                if time.monotonic() - checked >= every_s:
                    checked = time.monotonic()
                    await asyncio.gather(*(runner.check() for runner in self.runners))
            await asyncio.sleep(min(every_s, 1.0) if not self.sites_loaded else every_s)


def make_runner(bus: Bus, node: Node, settings: ProcessSettings, configs: SiteConfigs,
                store: CachedStore) -> ConsumerRunner | PartitionedRunner:
    """What consumes a node's events here: its durable's runner, or for a partitioned node
    the runners of the partitions this replica is given."""
    def of(partition: int | None) -> ConsumerRunner:
        return ConsumerRunner(bus, node, ConsumerConfig.from_env(node.name), configs=configs, store=store,
                              start_lookback_s=settings.start_lookback_s, partition=partition)

    if node.partitions <= 0:
        return of(None)
    if settings.partition_ttl_s < 1:
        raise ConfigError(f"PARTITION_MEMBER_TTL_S={settings.partition_ttl_s}: at least 1 second")
    return PartitionedRunner(bus, node, of, settings.partition_member or partitions.member_name(),
                             settings.partition_ttl_s, settings.start_lookback_s)


async def start_ops(ready: Callable[[], bool], port: int, host: str) -> OpsServer | None:
    """The ops port answering /readyz with `ready()`; None when there is none (port 0, or taken)."""
    if port == 0:
        return None
    server = OpsServer(ready)
    try:
        await server.start(host, port)
    except OSError as exc:
        # Several services on one machine (`concierge up`) would all want 9000: the port is
        # for orchestrators, so its absence is reported, not fatal.
        log.error("ops port unavailable: no /healthz, /readyz or /metrics from this process "
                  "(set OPS_PORT per process, or 0)", extra={"port": port, "error": str(exc)})
        return None
    log.info("ops port listening", extra={"host": host, "port": port})
    return server


async def serve(service: str, make_nodes: NodeFactory, settings: ProcessSettings, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None, process: Process | None = None, follow_log: bool = False) -> None:
    """Run the service until SIGTERM/SIGINT, or until `stop` is set when given (tests);
    `ready` is set once every runner is started."""
    process = process or Process()
    ops = await start_ops(process.ready, settings.ops_port, settings.ops_host)
    watcher = None
    store = None
    try:
        bus = process.bus = await connect(settings.bus, name=service)
        nodes = select_nodes(service, await make_nodes(bus), settings.nodes)
        configs = process.configs = SiteConfigs(bus, settings.site_config_ttl_s)  # one cache for every node
        store = CachedStore(bus)  # where every node's inputs are read: one fold cache for all of them
        process.runners = [make_runner(bus, node, settings, configs, store) for node in nodes]
        if follow_log and any(node.needs.folds for node in nodes):
            await store.follow()
        for runner in process.runners:
            await runner.start()
        process.started = True
        watcher = asyncio.create_task(process.watch(settings.ops_check_s), name="ops-watch")

        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        # Start-up objects (modules, clients, configs) never die: keep them out of the cyclic
        # GC's generations so its pauses stay short on the hot path.
        gc.freeze()
        metrics.observe_gc()
        log.info("service ready", extra={"nodes": [n.name for n in nodes]})
        if ready is not None:
            ready.set()
        await stop.wait()

        log.info("stopping")
        process.started = False  # not ready while draining: no new work should be routed here
        await asyncio.gather(*(runner.stop() for runner in process.runners))
        await store.close()
        store = None
        await bus.close()
        log.info("stopped")
    finally:
        if process.bus is not None:
            await process.bus.close()  # already closed after a clean stop; here for a failed start
        if store is not None:
            await store.close()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await llm.close_clients()
        if ops is not None:
            await ops.stop()


def _dump_tasks() -> None:
    """SIGUSR1: log where every task is waiting (what is this node doing right now?): each
    coroutine it awaits, outermost first (`Task.get_stack` shows only the task's own frame)."""
    for task in asyncio.all_tasks():
        log.warning("task", extra={"task": task.get_name(), "stack": "".join(logs.awaiting(task.get_coro()))})


def one_blas_thread() -> None:
    """numpy's OpenBLAS runs a vector search or a similarity on a pool of threads, one per
    core, that spin for a while after each call before they sleep: a service doing a few
    small products a turn would burn far more CPU spinning than multiplying, on cores the
    other services want. A replica is one event loop; it scales by replicas."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def main(service: str, load: Callable[[], S], make_nodes: Callable[[Bus, S], Awaitable[Sequence[Node]]],
         follow_log: bool = False) -> None:
    """Run `service`: its settings read once here (`load`, its `from_env`, and the process's
    own), then its nodes made by `make_nodes(bus, settings)`. `follow_log`: the process keeps
    its cached conversation states current from the log as it is stored (shared/store/feed.py), for
    a service whose nodes' loads are on a turn's way to its first token (router, responder);
    it costs the process every conversation's events, folded as they come."""
    logs.setup(service)
    telemetry.setup(service)
    one_blas_thread()
    try:
        process, settings = ProcessSettings.from_env(), load()
        # On uvloop, as uvicorn runs the gateway: the event loop and its sockets in C. Most of
        # a node's work per message is the loop's and nats-py's I/O (reading, writing acks and
        # publishes), which the default loop does in Python.
        uvloop.run(serve(service, lambda bus: make_nodes(bus, settings), process, follow_log=follow_log))
    except ConfigError as exc:
        log.error("configuration error", extra={"error": str(exc)})
        raise SystemExit(f"{service}: {exc}") from None
