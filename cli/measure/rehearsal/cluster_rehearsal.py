"""`concierge cluster-rehearsal`: the production topology on one machine, under load, losing
one process at a time.

- three nats-servers clustered by routes on loopback, JetStream streams and buckets with 3
  replicas (NATS_REPLICAS=3);
- Redis, the scripted LLM (streaming, `--ttft-ms`), and a local lead webhook (the site's
  `lead.webhook_url`) that counts deliveries by `webhook-id`;
- two replicas of every service: gateway-a and gateway-b on two ports, and two processes
  of each consumer service, each given the server list in another order;
- `--sessions` visitors over SSE, each turn to the other gateway than the last: two in
  three ask product questions (ANSWER), one in three books a demo (a lead, so a webhook);
- meanwhile, every `--kill-interval` seconds, one process is SIGKILLed, restarted after
  `--down-s` and awaited until ready, in turn: the nats-server leading the conversation
  stream, then one replica of each service.

Each visitor takes a turn as the widget does (cli/harness/visitor.py): a try that started
nothing, or whose connection ended before the turn's `start` frame, is sent again with the
same `client_message_id` (a gateway that had stored the turn streams it), a stream cut by
its gateway's death is resumed from the other gateway after its last frame
(`Last-Event-ID`), up to the widget's pauses (30 s). Then it waits for quiescence (every
requested turn ended in the log, every lead's webhook recorded) and audits, from the log on
the bus and the webhook's requests:

- turns: turns the visitors asked for; completed: ended with SSE `complete` (a resumed
  stream's included; `resumed` counts those); errors_shown: the visitor saw an error (an SSE
  `error`, a stream it could not resume, or a message it could not send after every try);
  hung: a try with no `complete` or `error` within the turn deadline plus a margin;
  turns = completed + errors_shown + hung;
- lost_events: a `TurnRequested` with neither `TurnCompleted` nor `TurnFailed` after
  quiescence, or a turn shown complete that has no `TurnCompleted` in the log;
- duplicate_side_effects: webhook deliveries beyond the first, per lead (`webhook-id`), that
  its recorded outcome's `uncertain` attempts do not account for (resent_uncertain: those
  they do: a sender that died mid-request sends again with the same id, by design);
- recovery_s: the longest SIGKILL → replacement ready, over the processes killed.

The last line printed is one JSON object with every figure. Exit status 0 when the
targets hold: 0 lost, 0 hung, 0 duplicate side effects, >= 99% completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

from cli.harness.supervisor import SERVICES
from cli.harness.visitor import Visitor
from cli.measure.rehearsal.cluster import (
    REPLICAS,
    Audit,
    Cluster,
    add_arguments,
    duplicate_deliveries,
    rehearse,
    started,
)
from shared import subjects
from shared.bus import Bus, connect

TARGET_COMPLETED = 0.99


async def stream_leader(bus: Bus) -> str:
    """The nats-server leading the conversation stream (the one whose loss costs an election)."""
    info = await bus.js.stream_info(subjects.CONV_STREAM)
    return info.cluster.leader


async def chaos(cluster: Cluster, bus: Bus, victims: list[str], kill_interval: float, down_s: float,
                ready_timeout: float, log) -> dict[str, float]:
    """Kill each victim in turn (SIGKILL), start it again after `down_s`, wait until it is
    ready; the seconds from the kill to ready again, per process."""
    recovery: dict[str, float] = {}
    began = time.monotonic()
    for victim in victims:
        await asyncio.sleep(kill_interval)
        if victim.startswith("nats"):
            leader = await stream_leader(bus)
            name = leader if victim == "nats-leader" else next(
                f"nats-{i}" for i in range(len(cluster.urls)) if f"nats-{i}" != leader)
            index = int(name.rsplit("-", 1)[1])
        else:
            name, index = f"{victim}-a", 0
        killed = time.monotonic()
        await asyncio.to_thread(cluster.system.kill, name)
        log(f"  {time.monotonic() - began:6.1f}s  SIGKILL {name}")
        await asyncio.sleep(down_s)
        if victim.startswith("nats"):
            await asyncio.to_thread(cluster.system.start_nats_member, index)
        else:
            offset = cluster.start(victim, index)
            await asyncio.to_thread(cluster.wait_ready, victim, index, offset, ready_timeout)
        recovery[name] = round(time.monotonic() - killed, 1)
        log(f"  {time.monotonic() - began:6.1f}s  {name} ready again ({recovery[name]}s after the kill)")
    return recovery


async def trace_lost(bus: Bus, seqs: list[int], log) -> None:
    """Where did the lost turns' messages go? Each durable's view of the stream beside them:
    delivered and ack floor (stream sequences), pending, and which server leads it."""
    if not seqs:
        return
    log(f"lost TurnRequested at stream sequences {sorted(seqs)}; the durables of {subjects.CONV_STREAM}:")
    try:
        for info in sorted(await bus.js.consumers_info(subjects.CONV_STREAM), key=lambda i: i.name):
            cluster = info.cluster
            log(f"  {info.name:<28} delivered {info.delivered.stream_seq:>6} ack floor {info.ack_floor.stream_seq:>6} "
                f"pending {info.num_pending} ack pending {info.num_ack_pending} redelivered {info.num_redelivered} "
                f"leader {cluster.leader if cluster else '-'} created {info.created} "
                f"start {info.config.opt_start_time}")
    except Exception as exc:  # noqa: BLE001 - a trace, best effort after the figures
        log(f"  consumer info unavailable: {exc!r}")


# --- the command -----------------------------------------------------------------------------

async def run(args, cluster: Cluster, log) -> tuple[list[Visitor], dict[str, float], Audit, float]:
    bus = await connect(cluster.bus_config(), name="rehearsal")
    try:
        victims = [f"nats-{args.nats_victim}", *(["gateway", "responder"] if args.bounded else SERVICES)]
        visitors, recovery, result, wall = await rehearse(
            args, cluster, bus, args.turns_per_session,
            lambda: chaos(cluster, bus, victims, args.kill_interval, args.down_s, args.ready_timeout, log), log)
        await trace_lost(bus, result.lost_seqs, log)
    finally:
        await bus.close()
    return visitors, recovery, result, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge cluster-rehearsal", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns-per-session", type=int, default=5,
                        help="at least this many; sessions go on until the last killed process is back")
    parser.add_argument("--kill-interval", type=float, default=5.0, help="seconds of load between kills")
    parser.add_argument("--down-s", type=float, default=2.0, help="how long a killed process stays down")
    add_arguments(parser)
    parser.add_argument("--nats-victim", choices=("leader", "follower"), default="leader",
                        help="which nats-server is killed: the conversation stream's leader (an election) "
                             "or another one")
    parser.add_argument("--bounded", action="store_true",
                        help="the make-test version: kill only a nats-server, a gateway and a responder")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    with started(args, "rehearsal", len(REPLICAS), log, nats_servers=3) as (cluster, receiver):
        log(f"{args.sessions} sessions over both gateways")
        visitors, recovery, result, wall = asyncio.run(run(args, cluster, log))
    return report(args, visitors, recovery, result, wall, receiver.deliveries())


def report(args, visitors: list[Visitor], recovery: dict[str, float], result: Audit, wall: float,
           deliveries: Counter) -> int:
    turns = [t for v in visitors for t in v.turns]
    outcomes = Counter(t.outcome for t in turns)
    figures = {
        "turns": len(turns),
        "completed": outcomes["complete"],
        "errors_shown": outcomes["error"] + outcomes["cut"] + outcomes["refused"],
        "hung": outcomes["hung"],
        "lost_events": len(result.lost),
        "duplicate_side_effects": duplicate_deliveries(deliveries, result.uncertain)[0],
        "resent_uncertain": duplicate_deliveries(deliveries, result.uncertain)[1],
        "recovery_s": max(recovery.values()) if recovery else None,
        "error_events": outcomes["error"],
        "streams_cut": outcomes["cut"],
        "refused": outcomes["refused"],
        "resumed": sum(t.outcome == "complete" and t.resumed > 0 for t in turns),
        "sent_again": sum(t.retries > t.resumed for t in turns),
        "retried_requests": sum(t.retries for t in turns),
        "turns_in_log": result.requested,
        "ended_in_log": result.ended_in_log,
        "duplicate_turn_completions": result.duplicate_completions,
        "leads": result.leads,
        "webhooks_recorded": result.webhooks_recorded,
        "webhook_deliveries": sum(deliveries.values()),
        "killed": recovery,
        "sessions": args.sessions,
        "bounded": args.bounded,
        "load_s": round(wall, 1),
    }
    share = figures["completed"] / figures["turns"] if figures["turns"] else 0.0
    print(f"\n{'turns asked':<34}{figures['turns']}")
    print(f"{'completed (SSE complete)':<34}{figures['completed']} ({share:.1%})")
    print(f"{'errors shown':<34}{figures['errors_shown']} (error events {figures['error_events']}, "
          f"streams cut {figures['streams_cut']}, refused {figures['refused']})")
    print(f"{'completed after a resumed stream':<34}{figures['resumed']}")
    print(f"{'hung':<34}{figures['hung']}")
    print(f"{'messages sent again / all retries':<34}{figures['sent_again']} / {figures['retried_requests']}")
    print(f"{'turns in the log / ended there':<34}{figures['turns_in_log']} / {figures['ended_in_log']}")
    print(f"{'lost events':<34}{figures['lost_events']}")
    for line in result.lost[:10]:
        print(f"    {line}")
    print(f"{'leads / webhooks recorded':<34}{figures['leads']} / {figures['webhooks_recorded']}")
    print(f"{'webhook deliveries (duplicates)':<34}{figures['webhook_deliveries']} ({figures['duplicate_side_effects']})")
    print(f"{'killed → ready again (s)':<34}{json.dumps(recovery)}")
    print(json.dumps(figures))
    met = (figures["lost_events"] == 0 and figures["hung"] == 0 and figures["duplicate_side_effects"] == 0
           and share >= TARGET_COMPLETED)
    return 0 if met else 1
