"""`concierge replay serve`: reruns, diffs, forks and verifies for the operator API.

The gateway's operator API (`/v1/admin/sites/{site}/…`) checks the operator's credentials,
then asks over the bus (request-reply on `replay.request.<op>`, queue group `replay`, so
replicas share the work); this process answers with JSON. It reads the log and never writes to it, like every replay.
A request: `{"site", "session_id", ...}` (`turn`, `node`, `llm`, `current_config`; fork: `at`,
`message`, `instructions` to use in place of the site's; verify: `since_s`, `limit`,
`current_config`). A reply: `{"ok": true, ...}` or `{"ok": false, "error": "..."}`; a rerun's
and a verify's say which turns could not be re-run, and why (`skipped`, `not_rerunnable`).

Like the services it has an ops port (`OPS_PORT`: `/healthz` from the start, `/readyz` once
the models are loaded and it listens on the bus, `/metrics`), follows the knowledge base's
published snapshots when the vectors are on a Qdrant server (`KB_SNAPSHOTS=bus`: a fork's
new message is searched as the retriever would), and on SIGTERM stops taking requests and
gives the one under way `CONSUMER_DRAIN_TIMEOUT_S` to finish. It reads the log, the site
configs and the snapshots, and answers requests: its NATS user (`replay`,
deploy/nats-server.conf) may do nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import time

import msgspec

from cli.replay import rerun as reruns
from cli.replay.diff import outcomes
from cli.replay.graph import Graph
from shared import logs, service, subjects
from shared.bus import Bus, connect
from shared.config import BusConfig, env_float, env_int, env_str
from shared.service import start_ops
from shared.site_config import SiteConfigs, stored_versions

log = logging.getLogger(__name__)


def _outcome(o) -> dict | None:
    return msgspec.to_builtins(o.__dict__) if o is not None else None


async def answer(bus: Bus, graph: Graph, op: str, request: dict) -> dict:
    site = request["site"]
    config = await SiteConfigs(bus).get(site)
    stored = await stored_versions(bus, site)  # the versions a turn may have recorded
    current = bool(request.get("current_config"))
    if op == "verify":
        since = time.time() - float(request["since_s"]) if request.get("since_s") else 0.0
        recordings = await reruns.read_site(bus, site, since, request.get("limit"))
        return (await reruns.verify(recordings, graph, config, current_config=current, stored_configs=stored)).figures()
    recording = await reruns.read(bus, site, request["session_id"])
    if not recording.records:
        raise ValueError(f"no conversation {request['session_id']} on site {site}")
    if op == "fork":
        if request.get("instructions") is not None:
            config = msgspec.structs.replace(config, instructions=str(request["instructions"]))
        prefix, message = reruns.fork_input(recording, int(request["at"]), str(request["message"]))
        result = await reruns.rerun(prefix, graph, config, llm=request.get("llm", "live"), extra_inputs=(message,),
                                    current_config=True)
        original = outcomes([r.event for r in recording.records]).get(message.turn)
        return {"turn": message.turn, "original": _outcome(original),
                "fork": _outcome(outcomes(result.events).get(message.turn)), "divergences": result.divergences}
    result = await reruns.rerun(recording, graph, config, llm=request.get("llm", "recorded"),
                                node=request.get("node") or None, turn=request.get("turn"),
                                current_config=current, stored_configs=stored)
    return {"session_id": result.session_id, "turns": result.turns, "diverged": result.diverged,
            "skipped": result.skipped,
            "differences": [d.to_builtins() for d in result.differences],
            "node_differences": result.node_differences, "divergences": result.divergences,
            "version_changes": [c.to_builtins() for c in result.version_changes],
            "outcomes": {t: _outcome(o) for t, o in outcomes(result.events).items()}}


async def serve(bus_config: BusConfig, stop: asyncio.Event) -> None:
    listening = asyncio.Event()  # set while requests reach this process
    bus: Bus | None = None

    def ready() -> bool:
        return listening.is_set() and bus is not None and bus.nc.is_connected

    ops = await start_ops(ready, env_int("OPS_PORT", 9000), env_str("OPS_HOST", "0.0.0.0"))
    try:
        # A fork's new message is searched in the knowledge base (a copy, or the Qdrant server).
        graph = await asyncio.to_thread(Graph, False, True)
        bus = await connect(bus_config, name="replay")
        follower = await graph.follow_kb_snapshots(bus)
        try:
            await _answer_until(stop, bus, graph, listening)
        finally:
            if follower is not None:
                await follower.stop()
            await bus.close()
    finally:
        if ops is not None:
            await ops.stop()


async def _answer_until(stop: asyncio.Event, bus: Bus, graph: Graph, listening: asyncio.Event) -> None:
    lock = asyncio.Lock()  # one rerun at a time: they share the models and the CPU

    async def on_request(msg) -> None:
        op = msg.subject.rsplit(".", 1)[-1]
        async with lock:  # held until answered: a stop waits for the reply to be sent
            try:
                reply = {"ok": True, **await answer(bus, graph, op, json.loads(msg.data))}
            except Exception as exc:  # noqa: BLE001 - the operator sees the reason; this process goes on
                log.warning("replay request failed", extra={"op": op, "error": repr(exc)})
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            await msg.respond(json.dumps(reply, default=str).encode())

    subs = [await bus.nc.subscribe(subjects.replay_request(op), queue="replay", cb=on_request)
            for op in subjects.REPLAY_OPS]
    await bus.nc.flush()  # the server has the subscriptions: requests reach this process from now
    listening.set()
    log.info("replay ready", extra={"ops": list(subjects.REPLAY_OPS)})
    try:
        await stop.wait()
    finally:
        listening.clear()
        for sub in subs:  # no new requests: another replica (or none, 503) answers them
            await sub.unsubscribe()
    log.info("stopping")
    drain_s = env_float("CONSUMER_DRAIN_TIMEOUT_S", 30.0)
    try:
        await asyncio.wait_for(lock.acquire(), drain_s)  # the request under way, if any, answered (kept: none follows)
    except asyncio.TimeoutError:
        log.warning("a replay request was still running at the drain timeout", extra={"seconds": drain_s})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge replay serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    logs.setup("replay")
    service.one_blas_thread()  # it runs the services' nodes: the same reason

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(BusConfig.from_env(), stop)

    asyncio.run(run())
    return 0
