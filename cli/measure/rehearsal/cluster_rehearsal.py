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
- duplicate_side_effects: webhook deliveries beyond the first, per lead (`webhook-id`);
- recovery_s: the longest SIGKILL → replacement ready, over the processes killed.

The last line printed is one JSON object with every figure. Exit status 0 when the
targets hold: 0 lost, 0 hung, 0 duplicate side effects, >= 99% completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cli.harness.supervisor import ROOT, SERVICES, System, free_port, make_system, wait_http
from cli.harness.visitor import Turn, Visitor, ask
from cli.harness.webhook_receiver import WebhookReceiver
from cli.measure.bench import BOOKING, QUESTIONS
from shared import events as ev
from shared import subjects
from shared.bus import Bus, connect
from shared.config import BusConfig

SITE = "rehearsal"
SCRIPTS = [QUESTIONS, QUESTIONS[5:] + QUESTIONS[:5], BOOKING]  # session i follows SCRIPTS[i % 3]
CONSUMERS = tuple(s for s in SERVICES if s != "gateway")
REPLICAS = ("a", "b")
TERMINAL = ("turn_completed", "turn_failed")
TARGET_COMPLETED = 0.99


async def drive(gateways: list[str], sessions: int, min_turns: int, think_s: float, chaos_done: asyncio.Event,
                hang_s: float) -> list[Visitor]:
    """`sessions` visitors, each `min_turns` turns and more until the chaos is over, each turn
    to the other gateway than the last (cli/harness/visitor.py: how a visitor takes a turn)."""
    visitors = [Visitor(i) for i in range(sessions)]
    limits = httpx.Limits(max_connections=sessions * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(hang_s, connect=2.0), limits=limits) as client:

        async def converse(visitor: Visitor) -> None:
            await asyncio.sleep(think_s * visitor.index / sessions)
            script = SCRIPTS[visitor.index % len(SCRIPTS)]
            t = 0
            while t < min_turns or not chaos_done.is_set():
                turn = Turn(visitor.index, script[t % len(script)].format(i=visitor.index, t=t))
                visitor.turns.append(turn)
                await ask(client, SITE, gateways, (visitor.index + t) % len(gateways), visitor, turn, hang_s)
                t += 1
                await asyncio.sleep(think_s)

        await asyncio.gather(*(converse(v) for v in visitors))
    return visitors


# --- the processes -------------------------------------------------------------------------

def rotated(urls: list[str], k: int) -> str:
    return ",".join(urls[k % len(urls):] + urls[:k % len(urls)])


class Cluster:
    """Every process of the rehearsal, and how each replica is started again."""

    def __init__(self, system: System, gateway_ports: list[int]):
        self.system, self.gateway_ports = system, gateway_ports
        self.urls = system.cluster_urls

    def replica_env(self, service: str, replica: int) -> dict[str, str]:
        env = {"NATS_URL": rotated(self.urls, SERVICES.index(service) + replica)}
        if service == "retriever":
            env["KB_DIR"] = str(self.kb_copy(replica))
        if service == "gateway":
            env["GATEWAY_PORT"] = str(self.gateway_ports[replica])
        return env

    def kb_copy(self, replica: int) -> Path:
        """The embedded vector store opens in one process only, so each retriever replica
        reads its own copy of the ingested knowledge base (QDRANT_URL shares one instead)."""
        copy = self.system.data_dir / f"kb-{REPLICAS[replica]}"
        if not copy.exists():
            shutil.copytree(self.system.env["KB_DIR"], copy)
        return copy

    def start(self, service: str, replica: int) -> int:
        """Start the replica; the size of its log before, where its 'service ready' will follow."""
        name = f"{service}-{REPLICAS[replica]}"
        path = self.system.log_dir / f"{name}.log"
        offset = path.stat().st_size if path.exists() else 0
        self.system.start_service(service, self.replica_env(service, replica), name=name)
        return offset

    def wait_ready(self, service: str, replica: int, offset: int, timeout: float) -> None:
        name = f"{service}-{REPLICAS[replica]}"
        proc = self.system.procs[name]
        if service == "gateway":
            wait_http(f"http://127.0.0.1:{self.gateway_ports[replica]}/readyz", timeout, proc)
            return
        self.system.wait_logged_ready(name, timeout, offset)

    def start_all(self, timeout: float) -> None:
        started = [(s, r, self.start(s, r)) for s in SERVICES for r in range(len(REPLICAS))]
        for service, replica, offset in started:
            self.wait_ready(service, replica, offset, timeout)


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


# --- the audit -------------------------------------------------------------------------------

@dataclass
class Audit:
    requested: int = 0
    ended_in_log: int = 0
    lost: list[str] = field(default_factory=list)
    lost_seqs: list[int] = field(default_factory=list)  # stream sequences of the lost turns' TurnRequested
    duplicate_completions: int = 0
    leads: int = 0
    webhooks_recorded: int = 0


async def audit(bus: Bus, visitors: list[Visitor]) -> Audit:
    """Every conversation of the site in the log (those whose id no visitor learned, their
    first turn cut, included), against what the visitors were shown."""
    result = Audit()
    kinds: dict[tuple[str, int], Counter] = defaultdict(Counter)
    requested_at: dict[tuple[str, int], int] = {}
    for record in await bus.read(subjects.conversation(SITE, "*")):
        key = record.event.session_id, record.event.turn
        kinds[key][ev.event_type(record.event)] += 1
        if isinstance(record.event, ev.TurnRequested):
            requested_at[key] = record.seq
    for (session_id, number), counts in sorted(kinds.items()):
        if not counts["turn_requested"]:
            continue
        result.requested += 1
        if any(counts[k] for k in TERMINAL):
            result.ended_in_log += 1
        else:
            seen = ", ".join(sorted(k for k in counts if k != "turn_requested")) or "nothing else"
            result.lost.append(f"{session_id} turn {number}: requested (seq {requested_at[session_id, number]}), "
                               f"never ended; in the log: {seen}")
            result.lost_seqs.append(requested_at[session_id, number])
        result.duplicate_completions += max(0, counts["turn_completed"] - 1)
        result.leads += counts["lead_captured"] > 0
        result.webhooks_recorded += counts["webhook_recorded"] > 0
    for visitor in visitors:
        for turn in visitor.turns:
            if turn.outcome == "complete" and not kinds[visitor.session_id, turn.turn]["turn_completed"]:
                result.lost.append(f"{visitor.session_id} turn {turn.turn}: shown complete, no TurnCompleted")
    return result


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


async def quiesce(bus: Bus, visitors: list[Visitor], timeout: float) -> Audit:
    """Audit until every requested turn ended and every lead's webhook is recorded, or
    `timeout`: what is still open then is lost."""
    deadline = time.monotonic() + timeout
    while True:
        result = await audit(bus, visitors)
        settled = not result.lost and result.webhooks_recorded >= result.leads
        if settled or time.monotonic() > deadline:
            return result
        await asyncio.sleep(1.0)


# --- the command -----------------------------------------------------------------------------

def write_sites(data: Path, webhook_url: str) -> Path:
    """The demo site's config as the rehearsal site (and a warm-up site), leads to `webhook_url`."""
    sites = data / "sites"
    sites.mkdir(parents=True)
    text = (ROOT / "sites" / "demo.toml").read_text() + f'\n[lead]\nwebhook_url = "{webhook_url}"\n'
    for name in (SITE, "warmup"):
        (sites / f"{name}.toml").write_text(text)
    return sites


async def rehearse(args, cluster: Cluster, log) -> tuple[list[Visitor], dict[str, float], Audit, float]:
    gateways = [f"http://127.0.0.1:{p}" for p in cluster.gateway_ports]
    bus = await connect(BusConfig(url=",".join(cluster.urls), replicas=3), name="rehearsal")
    try:
        chaos_done = asyncio.Event()
        victims = [f"nats-{args.nats_victim}", *(["gateway", "responder"] if args.bounded else SERVICES)]

        async def run_chaos() -> dict[str, float]:
            try:
                return await chaos(cluster, bus, victims, args.kill_interval, args.down_s, args.ready_timeout, log)
            finally:
                chaos_done.set()

        hang_s = args.turn_deadline_s + 15
        started = time.monotonic()
        visitors, recovery = await asyncio.gather(
            drive(gateways, args.sessions, args.turns_per_session, args.think_ms / 1000, chaos_done, hang_s),
            run_chaos())
        wall = time.monotonic() - started
        log(f"load over after {wall:.1f}s; waiting for quiescence")
        result = await quiesce(bus, visitors, args.quiesce_s)
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
    parser.add_argument("--think-ms", type=float, default=1000.0, help="a visitor's pause between turns")
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="scripted LLM time to first token")
    parser.add_argument("--turn-deadline-s", type=float, default=20.0, help="TURN_DEADLINE_S of the gateways")
    parser.add_argument("--ready-timeout", type=float, default=90.0)
    parser.add_argument("--quiesce-s", type=float, default=60.0)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep the stores and every process's log here (default: a temporary directory)")
    parser.add_argument("--nats-victim", choices=("leader", "follower"), default="leader",
                        help="which nats-server is killed: the conversation stream's leader (an election) "
                             "or another one")
    parser.add_argument("--bounded", action="store_true",
                        help="the make-test version: kill only a nats-server, a gateway and a responder")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    receiver = WebhookReceiver()
    with tempfile.TemporaryDirectory(prefix="concierge-rehearsal-") as tmp:
        data = args.data_dir or Path(tmp)
        llm_port = free_port()
        system = make_system(data, free_port(), free_port(), {
            "SITES_DIR": str(write_sites(data, receiver.url)),
            "LLM_BASE_URL": f"http://127.0.0.1:{llm_port}/v1",
            "ANSWER_BACKEND": "llm",
            "BRIEFS_BACKEND": "data",  # the audit is of turns; leads' briefs make no model call
            "NATS_REPLICAS": "3",
            "TURN_DEADLINE_S": str(args.turn_deadline_s),
            # A killed replica's unacked events go to the other one after this, not after 30 s.
            "CONSUMER_ACK_WAIT_S": "4",
            "CONSUMER_BACKOFF_S": "0.2,0.5,1",
            "ANSWER_WAIT_S": "5",
            "ANSWER_RETRIEVAL_WAIT_S": "5",
            "LEAD_WEBHOOK_BACKOFF_S": "0.2",
            # Every simulated visitor comes from 127.0.0.1.
            "RATE_LIMIT_PER_IP_PER_MIN": "0",
            "RATE_LIMIT_PER_SITE_PER_MIN": "100000",
        })
        cluster = None
        try:
            llm = system.spawn("scripted-llm", [sys.executable, "-m", "cli", "scripted-llm", "--port", str(llm_port),
                                                "--ttft-ms", str(args.ttft_ms), "--inter-token-ms", "20"])
            system.start_nats_cluster(3)
            system.env["NATS_URL"] = ",".join(system.cluster_urls)
            system.start_redis()
            asyncio.run(wait_cluster(system.cluster_urls, args.ready_timeout))
            wait_http(f"http://127.0.0.1:{llm_port}/v1/models", 30, llm)
            system.ingest(SITE)
            cluster = Cluster(system, [free_port(), free_port()])
            cluster.start_all(args.ready_timeout)
            log(f"up: 3 nats-servers, {len(SERVICES) * 2} service processes; warming up, then "
                f"{args.sessions} sessions over both gateways")
            asyncio.run(warm_up(cluster))
            visitors, recovery, result, wall = asyncio.run(rehearse(args, cluster, log))
        finally:
            system.stop()
            receiver.close()
    deliveries = receiver.deliveries()
    return report(args, visitors, recovery, result, wall, deliveries)


async def wait_cluster(urls: list[str], timeout: float) -> None:
    """Until the cluster has a JetStream meta leader; the streams and buckets are made then,
    with 3 replicas, before any service connects."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            bus = await connect(BusConfig(url=",".join(urls), replicas=3, request_timeout=2.0), name="rehearsal-setup")
        except Exception:  # no meta leader elected yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        await bus.close()
        return


async def warm_up(cluster: Cluster) -> None:
    """One turn through each gateway on another site: first turns load what is lazy."""
    async with httpx.AsyncClient(timeout=60) as client:
        for port in cluster.gateway_ports:
            response = await client.post(f"http://127.0.0.1:{port}/v1/chat", json={"site": "warmup", "message": "hello"})
            response.raise_for_status()


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
        "duplicate_side_effects": sum(n - 1 for n in deliveries.values() if n > 1),
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
