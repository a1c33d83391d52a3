"""What both rehearsals share (`concierge cluster-rehearsal`, cluster_rehearsal.py, and
`concierge chaos`, chaos.py): the system they start, the visitors who talk to it while its
parts fail, and the audit of the log afterwards.

- `started`: the demo site (as the rehearsal site and a warm-up site) sending its leads to a
  local webhook that counts deliveries by `webhook-id`; Redis; the scripted LLM (streaming,
  `--ttft-ms`); one nats-server, or several clustered by routes on loopback with streams
  and buckets of as many replicas; `replicas` processes of every service (`Cluster`); one
  warm-up turn through each gateway; every process stopped on the way out;
- `rehearse`: `--sessions` visitors over the gateways for as long as the faults go on, each
  turn to the other gateway than the last (two in three ask product questions, one in
  three books a demo, so leads fire webhooks), then quiescence and the audit;
- `quiesce`: the audit, again until every requested turn ended in the log and every lead's
  webhook is recorded; what is still open at the deadline is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from cli.harness.supervisor import (
    ROOT,
    SERVICES,
    System,
    free_port,
    make_system,
    wait_http,
)
from cli.harness.visitor import Turn, Visitor, ask
from cli.harness.webhook_receiver import WebhookReceiver
from cli.measure.bench import BOOKING, QUESTIONS
from services.responder import webhook_claims
from shared import events as ev
from shared import subjects
from shared.bus import Bus, connect
from shared.config import BusConfig

SITE = "rehearsal"
SCRIPTS = [QUESTIONS, QUESTIONS[5:] + QUESTIONS[:5], BOOKING]  # session i follows SCRIPTS[i % 3]
REPLICAS = ("a", "b")
ACK_WAIT_S = 4.0  # CONSUMER_ACK_WAIT_S of every node: a dead or frozen replica's messages go elsewhere after it
HANG_MARGIN_S = 15  # past the turn deadline, a visitor's try with neither `complete` nor `error` hangs
TERMINAL = ("turn_completed", "turn_failed")
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the visitors, the scripted LLM and the waits, the same in both rehearsals."""
    parser.add_argument("--think-ms", type=float, default=1000.0, help="a visitor's pause between turns")
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="scripted LLM time to first token")
    parser.add_argument("--turn-deadline-s", type=float, default=20.0, help="TURN_DEADLINE_S of the gateways")
    parser.add_argument("--ready-timeout", type=float, default=90.0)
    parser.add_argument("--quiesce-s", type=float, default=60.0)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep the stores and every process's log here (default: a temporary directory)")


# --- the processes -------------------------------------------------------------------------

def rotated(urls: list[str], k: int) -> str:
    return ",".join(urls[k % len(urls):] + urls[:k % len(urls)])


class Cluster:
    """Every process of a rehearsal, and how each replica is started again: replica `a`,
    `b`, ... of each service, `gateway_ports` one port per replica."""

    def __init__(self, system: System, gateway_ports: list[int]):
        self.system, self.gateway_ports = system, gateway_ports
        self.urls = system.cluster_urls or [system.nats_url]

    @property
    def replicas(self) -> int:
        return len(self.gateway_ports)

    @property
    def gateways(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.gateway_ports]

    def bus_config(self) -> BusConfig:
        """The rehearsal's own connection: every server, streams with one replica per server."""
        return BusConfig(url=",".join(self.urls), replicas=len(self.urls))

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
        started = [(s, r, self.start(s, r)) for s in SERVICES for r in range(self.replicas)]
        for service, replica, offset in started:
            self.wait_ready(service, replica, offset, timeout)

    def readyz_urls(self) -> list[str]:
        ops = [f"http://127.0.0.1:{port}/readyz" for port in self.system.ops_ports.values()]
        return ops + [f"http://127.0.0.1:{port}/readyz" for port in self.gateway_ports]


@contextmanager
def started(args, name: str, replicas: int, log, nats_servers: int = 1) -> Iterator[tuple[Cluster, WebhookReceiver]]:
    """The rehearsal's system up and warmed up, its stores and every process's log in
    `--data-dir` (or a temporary directory); with the webhook that receives its leads."""
    receiver = WebhookReceiver()
    try:
        with tempfile.TemporaryDirectory(prefix=f"concierge-{name}-") as tmp:
            data = args.data_dir or Path(tmp)
            llm_port = free_port()
            system = make_system(data, free_port(), free_port(), {
                "SITES_DIR": str(write_sites(data, receiver.url)),
                "LLM_BASE_URL": f"http://127.0.0.1:{llm_port}/v1",
                "ANSWER_BACKEND": "llm",
                "BRIEFS_BACKEND": "data",  # the audit is of turns; leads' briefs make no model call
                "NATS_REPLICAS": str(nats_servers),
                "TURN_DEADLINE_S": str(args.turn_deadline_s),
                # A killed or frozen replica's unacked events go to another after this, not after 30 s.
                "CONSUMER_ACK_WAIT_S": str(ACK_WAIT_S),
                "CONSUMER_BACKOFF_S": "0.2,0.5,1",
                "ANSWER_WAIT_S": "5",
                "ANSWER_RETRIEVAL_WAIT_S": "5",
                "LEAD_WEBHOOK_BACKOFF_S": "0.2",
                "OUTBOUND_ALLOWED": receiver.address,  # the webhook on 127.0.0.1
                # Every simulated visitor comes from 127.0.0.1.
                "RATE_LIMIT_PER_IP_PER_MIN": "0",
                "RATE_LIMIT_PER_SITE_PER_MIN": "100000",
                # The retrievers' turns partitioned by site as deploy/k8s has them: a retriever
                # killed has its partitions moved to the other within this TTL.
                "RETRIEVER_PARTITIONS": "4",
                "PARTITION_MEMBER_TTL_S": "3",
            })
            began = time.monotonic()
            try:
                llm = system.spawn("scripted-llm", [sys.executable, "-m", "cli", "scripted-llm", "--port",
                                                    str(llm_port), "--ttft-ms", str(args.ttft_ms),
                                                    "--inter-token-ms", "20"])
                if nats_servers > 1:
                    system.start_nats_cluster(nats_servers)
                    system.env["NATS_URL"] = ",".join(system.cluster_urls)
                else:
                    system.start_nats()
                system.start_redis()
                if nats_servers > 1:
                    asyncio.run(wait_cluster(system.cluster_urls, args.ready_timeout))
                wait_http(f"http://127.0.0.1:{llm_port}/v1/models", 30, llm)
                system.ingest(SITE)
                cluster = Cluster(system, [free_port() for _ in range(replicas)])
                cluster.start_all(args.ready_timeout)
                servers = f"{nats_servers} nats-server{'s' if nats_servers > 1 else ''}"
                log(f"up after {time.monotonic() - began:.0f} s: {servers}, {len(SERVICES) * replicas} service "
                    f"processes; warming up")
                asyncio.run(warm_up(cluster))
                yield cluster, receiver
            finally:
                system.stop()
    finally:
        receiver.close()


async def wait_cluster(urls: list[str], timeout: float) -> None:
    """Until the cluster has a JetStream meta leader; the streams and buckets are made then,
    with a replica on every server, before any service connects."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            bus = await connect(BusConfig(url=",".join(urls), replicas=len(urls), request_timeout=2.0),
                                name="rehearsal-setup")
        except Exception:  # no meta leader elected yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        await bus.close()
        return


def write_sites(data: Path, webhook_url: str) -> Path:
    """The demo site's config as the rehearsal site (and a warm-up site), leads to `webhook_url`."""
    sites = data / "sites"
    sites.mkdir(parents=True)
    text = (ROOT / "sites" / "demo.toml").read_text() + f'\n[lead]\nwebhook_url = "{webhook_url}"\n'
    for name in (SITE, "warmup"):
        (sites / f"{name}.toml").write_text(text)
    return sites


async def warm_up(cluster: Cluster) -> None:
    """One turn through each gateway on another site: first turns load what is lazy."""
    async with httpx.AsyncClient(timeout=60) as client:
        for port in cluster.gateway_ports:
            response = await client.post(f"http://127.0.0.1:{port}/v1/chat", json={"site": "warmup", "message": "hello"})
            response.raise_for_status()


# --- the visitors ----------------------------------------------------------------------------

async def drive(gateways: list[str], sessions: int, min_turns: int, think_s: float, faults_over: asyncio.Event,
                hang_s: float) -> list[Visitor]:
    """`sessions` visitors, each `min_turns` turns and more until the faults are over, each
    turn to the other gateway than the last (cli/harness/visitor.py: how a visitor takes a turn)."""
    visitors = [Visitor(i) for i in range(sessions)]
    limits = httpx.Limits(max_connections=sessions * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(hang_s, connect=2.0), limits=limits) as client:

        async def converse(visitor: Visitor) -> None:
            await asyncio.sleep(think_s * visitor.index / sessions)
            script = SCRIPTS[visitor.index % len(SCRIPTS)]
            t = 0
            while t < min_turns or not faults_over.is_set():
                turn = Turn(visitor.index, script[t % len(script)].format(i=visitor.index, t=t))
                visitor.turns.append(turn)
                await ask(client, SITE, gateways, (visitor.index + t) % len(gateways), visitor, turn, hang_s)
                t += 1
                await asyncio.sleep(think_s)

        await asyncio.gather(*(converse(v) for v in visitors))
    return visitors


async def rehearse(args, cluster: Cluster, bus: Bus, min_turns: int, faults: Callable[[], Awaitable[T]],
                   log) -> tuple[list[Visitor], T, Audit, float]:
    """The visitors talk for as long as `faults()` runs (each at least `min_turns` turns);
    then the audit, once the system is quiet. The visitors, what `faults()` returned, the
    audit and the seconds of load."""
    faults_over = asyncio.Event()

    async def run_faults() -> T:
        try:
            return await faults()
        finally:
            faults_over.set()

    started = time.monotonic()
    visitors, outcome = await asyncio.gather(
        drive(cluster.gateways, args.sessions, min_turns, args.think_ms / 1000, faults_over,
              args.turn_deadline_s + HANG_MARGIN_S),
        run_faults())
    wall = time.monotonic() - started
    log(f"load over after {wall:.1f}s; waiting for quiescence")
    return visitors, outcome, await quiesce(bus, visitors, args.quiesce_s), wall


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
    handoffs_requested: int = 0  # turns with a HandoffRequested
    handoff_webhooks_recorded: int = 0  # of those, turns whose request's webhook outcome is stored
    # Per `webhook-id`, the attempts whose fate its outcome calls unknown (`uncertain`): the
    # copies beyond one a receiver may have got by design.
    uncertain: dict[str, int] = field(default_factory=dict)


def duplicate_deliveries(deliveries: Counter, uncertain: dict[str, int]) -> tuple[int, int]:
    """Deliveries beyond the first per `webhook-id`: (those no outcome accounts for, the side
    effects counted twice; those its `uncertain` attempts account for, a sender that died or
    heard no answer mid-request, for the receiver to drop by id)."""
    beyond = {key: n - 1 for key, n in deliveries.items() if n > 1}
    explained = {key: min(n, uncertain.get(key, 0)) for key, n in beyond.items()}
    return sum(beyond.values()) - sum(explained.values()), sum(explained.values())


async def audit(bus: Bus, visitors: list[Visitor]) -> Audit:
    """Every conversation of the site in the log (those whose id no visitor learned, their
    first turn cut, included), against what the visitors were shown."""
    result = Audit()
    kinds: dict[tuple[str, int], Counter] = defaultdict(Counter)
    requested_at: dict[tuple[str, int], int] = {}
    for record in await bus.read(subjects.conversation(SITE, "*")):
        key = record.event.session_id, record.event.turn
        kind = ev.event_type(record.event)
        if kind == "webhook_recorded":
            hook = record.event
            webhook_id = (webhook_claims.lead_id(SITE, hook.session_id) if hook.hook == "lead"
                          else webhook_claims.handoff_id(SITE, hook.session_id, hook.causation_id or ""))
            result.uncertain[webhook_id] = max(result.uncertain.get(webhook_id, 0), hook.uncertain)
            if hook.hook != "lead":
                kind = "webhook_recorded:" + hook.hook  # a handoff's webhook: not a lead's
        kinds[key][kind] += 1
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
        result.handoffs_requested += counts["handoff_requested"] > 0
        result.handoff_webhooks_recorded += counts["handoff_requested"] > 0 and counts["webhook_recorded:handoff"] > 0
    for visitor in visitors:
        for turn in visitor.turns:
            if turn.outcome == "complete" and not kinds[visitor.session_id, turn.turn]["turn_completed"]:
                result.lost.append(f"{visitor.session_id} turn {turn.turn}: shown complete, no TurnCompleted")
    return result


async def quiesce(bus: Bus, visitors: list[Visitor], timeout: float) -> Audit:
    """Audit until every requested turn ended and every lead's and handoff request's webhook
    is recorded (after its outcome no copy is sent: the receiver's count is final), or
    `timeout`: what is still open then is lost."""
    deadline = time.monotonic() + timeout
    while True:
        result = await audit(bus, visitors)
        settled = (not result.lost and result.webhooks_recorded >= result.leads
                   and result.handoff_webhooks_recorded >= result.handoffs_requested)
        if settled or time.monotonic() > deadline:
            return result
        await asyncio.sleep(1.0)
