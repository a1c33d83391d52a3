"""`concierge chaos`: one machine's Concierge under load while its parts fail, one fault at a
time, and an audit of every conversation's log afterwards.

A single nats-server (JetStream, file store), Redis, the scripted LLM and a local lead
webhook, with `--replicas` (1 or 2) of every service; `--sessions` visitors talk through
the gateways the whole time (the cluster rehearsal's visitors: two in three ask product
questions, one in three books a demo, so leads fire webhooks; each takes a turn as the
widget does, cli/harness/visitor.py: a message whose try started nothing or was cut before
the turn's `start` frame is sent again with the same `client_message_id`, a stream cut by
its gateway's death is resumed after its last frame, for up to 30 s). Beside them,
`--handoffs` visitors ask for a person again and again, and an operator client claims their
conversations, writes to them while they write too, and releases or closes them (handoffs.py:
its requests go to gateway `a` first; each visitor listens on its live channel; they end
their handoffs as the last fault strikes). Each scenario is some load, one fault, the
recovery and a few seconds to settle:

- `kill-<service>` (router, retriever, enricher, responder, gateway): SIGKILL replica `a`
  as soon as the service is busy with a turn (a `TurnRequested` stored, for the nodes that
  consume it; an answer's token on the bus, for the responder and the gateway), start it
  again after `--down-s`; recovery: kill → the replacement ready;
- `nats-restart`: SIGKILL the nats-server mid-answer and start it again after `--down-s`
  on the same port and store; recovery: kill → every process's `/readyz` 200 again, and
  `readyz_s`, from the server being back to that (what the processes do by themselves);
- `redis-stop`: SIGKILL redis-server when a turn starts, start it again after
  `--redis-down-s`; recovery: kill → Redis back;
- `duplicates`: freeze replica `a` of the responder (SIGSTOP) mid-answer for longer than
  its ack wait, so the server redelivers its messages while it still holds them, then let it
  go on (both copies finish: outputs with the same derived ids, one lead claim); then
  publish `--republish` stored conversation events again with their own `Nats-Msg-Id`, as
  a producer's retry would (JetStream must drop every one);
- `handoff`: SIGKILL gateway `a` as an operator's message goes to it (the handoffs' live
  channels are open on it too) and start it again at once: its start-up (3-5 s) is the
  outage the operator's retries and the live channels go through; recovery as `kill-gateway`.

A turn counts for the last fault before it ended for its visitor: the one it was under way
through, or else the last one before it was sent (a turn in flight across two faults counts
for the second; a stream that could not be resumed, for the fault that cut it). After the
load, the tool waits for quiescence and audits, from the conversation log and the webhook's
requests:

- errors_shown: an SSE `error`, a cut stream that could not be resumed, or a message that
  could not be sent after every try; resumed: turns completed through a resumed stream
  (counted as completed, as a widget's visitor reads them); sent_again: turns whose message
  was sent again (a try that started nothing, or was cut before the `start` frame);
- lost_events: a `TurnRequested` never ended in the log, or a turn shown complete without a
  `TurnCompleted` (the rehearsal's audit);
- corrupted_logs: conversations whose log holds an event id twice, a turn with more than one
  `TurnCompleted` or requested twice, a turn started (requested or blocked) before the one
  before it ended (`TurnCompleted`, `TurnFailed`, `TurnBlocked`), or a folded history out of
  turn order (an answer after the next turn's message, an answer without its message);
- duplicate_side_effects: webhook deliveries beyond the first per `webhook-id` that its
  recorded outcome does not account for; resent_uncertain: those it does (its `uncertain`
  attempts: a sender killed or frozen between the receiver getting the request and the
  outcome stored, or a request never answered, sends again with the same id, by design);
- hung: a visitor's turn with no `complete` or `error` within the turn deadline + 15 s;
- enrichments_cut_short: `EnrichmentCompleted` stored with `trouble` (Redis unreachable,
  a source failed: the next turn enriches again), what an outage costs besides errors;
- answers_rewritten: turns whose answer a second attempt wrote (a token of attempt 2 or more
  on the bus): the fault did hit an answer being written;
- in_flight_end_s: per fault, the longest time from the fault to the end of a turn that was
  in flight at that moment, as its visitor saw it (a stream cut by its gateway's death ends
  when the resumed stream does);
- visitor_messages_lost / _doubled: a message whose turn the gateway named (`start`) missing
  from the log, or stored as more than one turn (by its `client_message_id`), every visitor;
- handoffs (handoffs.py says how each is found): operator messages answered 2xx missing from
  the log or stored twice, AI answers in turns routed HANDOFF, handoff events a live channel
  missed or got twice across its reconnections, handoffs that did not end as the operator
  ended them (and questions after an end the AI did not answer), operator steps refused.

The JSON also lists every turn not shown complete (session, outcome, scenario, when it ended)
to look up in the log and in the processes' logs (`--data-dir`).

Targets (exit status 1 when one does not hold): always 0 hung, 0 lost, 0 corrupted logs, 0
duplicate side effects, every republished event dropped, 0 visitor messages lost or doubled,
and of the handoffs (at least one) 0 of every count above; a NATS restart shows at most the
turns in flight as errors and `/readyz` is 200 everywhere within 5 s of the server being
back; with two replicas a service's SIGKILL (`handoff`'s too) shows no visitor an error;
with one, every turn in flight ends within 10 s of the kill. The last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

import httpx

from cli.harness.supervisor import SERVICES
from cli.harness.visitor import Turn, Visitor
from cli.measure.rehearsal import handoffs
from cli.measure.rehearsal.cluster import (
    ACK_WAIT_S,
    HANG_MARGIN_S,
    REPLICAS,
    SITE,
    Audit,
    Cluster,
    add_arguments,
    audit,
    duplicate_deliveries,
    rehearse,
    started,
)
from shared import events as ev
from shared import subjects
from shared.bus import Bus, connect
from shared.state import Record, fold

SCENARIOS = (*(f"kill-{s}" for s in SERVICES), "nats-restart", "redis-stop", "duplicates", "handoff")
BOUNDED = ("kill-responder", "nats-restart", "duplicates", "handoff")
# What a service is busy with when the next one of these appears: its kill lands mid-turn.
BUSY_ON = {"router": "requested", "retriever": "requested", "enricher": "requested",
           "responder": "tokens", "gateway": "tokens"}
ENDS = ("turn_completed", "turn_failed", "turn_blocked")
ERRORS = ("error", "cut", "refused")  # what a visitor sees as an error
HANDOFF_TARGETS = ("operator_messages_lost", "operator_messages_doubled", "ai_answers_in_handoff_turns", "live_missed",
                   "live_doubled", "wrong_states", "operator_refused")
READYZ_TARGET_S = 5.0
ONE_REPLICA_END_TARGET_S = 10.0


# --- the corrupted-log check (pure) ---------------------------------------------------------

def corruption(records: Sequence[Record]) -> list[str]:
    """What is wrong with one conversation's log, its records in stream order; [] when nothing."""
    problems = [f"event {event_id} stored {n} times"
                for event_id, n in Counter(r.event.event_id for r in records).items() if n > 1]
    completions = Counter(r.event.turn for r in records if isinstance(r.event, ev.TurnCompleted))
    problems += [f"turn {turn}: {n} TurnCompleted" for turn, n in sorted(completions.items()) if n > 1]
    started: set[int] = set()
    ended: set[int] = set()
    for record in records:
        kind, turn = ev.event_type(record.event), record.event.turn
        if kind in ("turn_requested", "turn_blocked") and turn not in started:
            started.add(turn)
            if turn > 1 and turn - 1 not in ended:
                problems.append(f"turn {turn} started (seq {record.seq}) before turn {turn - 1} ended")
        elif kind == "turn_requested":
            problems.append(f"turn {turn} requested again (seq {record.seq})")
        if kind in ENDS:
            ended.add(turn)
    previous = None
    for message in fold(records).messages:
        if message.role == "user":
            in_order = previous is None or message.turn > previous.turn
        else:
            in_order = previous is not None and previous.role == "user" and previous.turn == message.turn
        if not in_order:
            after = f"{previous.role} message of turn {previous.turn}" if previous else "the start"
            problems.append(f"history: {message.role} message of turn {message.turn} after {after}")
        previous = message
    return problems


def conversations(records: Sequence[Record]) -> dict[str, list[Record]]:
    """A site's records by conversation, each in stream order."""
    by_session: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_session[record.event.session_id].append(record)
    return by_session


# --- the processes ---------------------------------------------------------------------------

async def all_ready(urls: list[str], timeout: float) -> tuple[float, int]:
    """Poll every `/readyz` until all answer 200: when that happened (time.monotonic()), and
    how many were not ready at the first poll (evidence that readiness did drop)."""
    deadline = time.monotonic() + timeout
    pending = set(urls)
    at_first = None
    async with httpx.AsyncClient(timeout=1.0) as client:
        while pending:
            for url in list(pending):
                try:
                    if (await client.get(url)).status_code == 200:
                        pending.discard(url)
                except httpx.TransportError:
                    pass
            at_first = len(pending) if at_first is None else at_first
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"not ready {timeout:.0f} s after the restart: {sorted(pending)}")
            if pending:
                await asyncio.sleep(0.1)
    return time.monotonic(), at_first or 0


class Watch:
    """What the tool sees on the bus: turns starting and answers streaming (so a fault can
    wait for one and land mid-turn), and which answers were written again by a redelivery
    (a token of attempt 2 or more)."""

    def __init__(self) -> None:
        self.seen = {"requested": asyncio.Event(), "tokens": asyncio.Event()}
        self.rewritten: dict[tuple[str, int], float] = {}  # (session, turn) → first seen (monotonic)

    async def start(self, bus: Bus) -> None:
        await bus.nc.subscribe(subjects.conv_of_type("turn_requested", SITE), cb=self._requested)
        await bus.nc.subscribe(f"tokens.{SITE}.>", cb=self._token)

    async def _requested(self, msg) -> None:
        self.seen["requested"].set()

    async def _token(self, msg) -> None:
        self.seen["tokens"].set()
        try:
            event = ev.decode(msg.data)
        except ev.BadEvent:
            return
        if isinstance(event, ev.TokenChunk) and event.attempt > 1:
            self.rewritten.setdefault((event.session_id, event.turn), time.monotonic())

    async def busy(self, what: str, timeout: float) -> bool:
        """Until the next `what` (requested or tokens); False when none came within `timeout`."""
        self.seen[what].clear()
        try:
            await asyncio.wait_for(self.seen[what].wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


# --- the scenarios ---------------------------------------------------------------------------

@dataclass
class Scenario:
    name: str
    fault_at: float = 0.0  # time.monotonic() of the kill, stop or freeze
    mid_turn: bool = False  # the fault waited for a turn to be under way
    recovery_s: float | None = None
    detail: dict = field(default_factory=dict)


class Chaos:
    def __init__(self, args, cluster: Cluster, bus: Bus, watch: Watch, talks: handoffs.Handoffs, log):
        self.args, self.cluster, self.bus, self.watch, self.log = args, cluster, bus, watch, log
        self.talks = talks
        self.system = cluster.system
        self.t0 = time.monotonic()
        self.last: Scenario | None = None
        self.over = asyncio.Event()  # the handoff conversations end theirs, then stop

    def strike(self, scenario: Scenario) -> None:
        """The fault strikes now; the last one's recovery is when the handoffs end."""
        scenario.fault_at = time.monotonic()
        if scenario is self.last:
            self.over.set()

    def say(self, line: str) -> None:
        self.log(f"  {time.monotonic() - self.t0:6.1f}s  {line}")

    async def run(self, scenario: Scenario) -> None:
        """Some load, the fault and the recovery (the settling after it is the caller's)."""
        await asyncio.sleep(self.args.load_s)
        kind = scenario.name.split("-", 1)
        if kind[0] == "kill":
            await self.kill(scenario, kind[1])
        elif scenario.name == "handoff":
            await self.kill(scenario, "gateway", self.talks.busy(self.args.trigger_s), down_s=0.0)
        else:
            await {"nats-restart": self.nats_restart, "redis-stop": self.redis_stop,
                   "duplicates": self.duplicates}[scenario.name](scenario)

    async def kill(self, scenario: Scenario, service: str, busy: Awaitable[bool] | None = None,
                   down_s: float | None = None) -> None:
        """SIGKILL replica `a` once `busy` (by default: the next of what the service is busy
        with, BUSY_ON), start it again after `down_s` (by default --down-s)."""
        name = f"{service}-{REPLICAS[0]}"
        scenario.mid_turn = await (busy or self.watch.busy(BUSY_ON[service], self.args.trigger_s))
        self.strike(scenario)
        await asyncio.to_thread(self.system.kill, name)
        self.say(f"SIGKILL {name}{'' if scenario.mid_turn else ' (no turn seen under way)'}")
        await asyncio.sleep(self.args.down_s if down_s is None else down_s)
        offset = self.cluster.start(service, 0)
        await asyncio.to_thread(self.cluster.wait_ready, service, 0, offset, self.args.ready_timeout)
        scenario.recovery_s = round(time.monotonic() - scenario.fault_at, 1)
        self.say(f"{name} ready again ({scenario.recovery_s} s after the kill)")

    async def nats_restart(self, scenario: Scenario) -> None:
        scenario.mid_turn = await self.watch.busy("tokens", self.args.trigger_s)
        self.strike(scenario)
        await asyncio.to_thread(self.system.kill, "nats")
        self.say(f"SIGKILL nats-server{'' if scenario.mid_turn else ' (no answer seen streaming)'}")
        await asyncio.sleep(self.args.down_s)
        await asyncio.to_thread(self.system.start_nats)
        back = time.monotonic()
        self.say("nats-server started again (same port, same store)")
        urls = self.cluster.readyz_urls()
        ready, scenario.detail["not_ready_at_first"] = await all_ready(urls, self.args.ready_timeout)
        scenario.recovery_s = round(ready - scenario.fault_at, 1)
        scenario.detail["readyz_s"] = round(ready - back, 1)
        scenario.detail["readyz_endpoints"] = len(urls)
        self.say(f"every /readyz 200 again, {scenario.detail['readyz_s']} s after the server came back "
                 f"({scenario.detail['not_ready_at_first']} of {len(urls)} were not ready at first)")

    async def redis_stop(self, scenario: Scenario) -> None:
        scenario.mid_turn = await self.watch.busy("requested", self.args.trigger_s)
        self.strike(scenario)
        await asyncio.to_thread(self.system.kill, "redis")
        self.say("SIGKILL redis-server")
        await asyncio.sleep(self.args.redis_down_s)
        await asyncio.to_thread(self.system.start_redis)
        scenario.recovery_s = round(time.monotonic() - scenario.fault_at, 1)
        self.say(f"redis-server back ({scenario.recovery_s} s after the kill)")

    async def duplicates(self, scenario: Scenario) -> None:
        name = f"responder-{REPLICAS[0]}"
        scenario.mid_turn = await self.watch.busy("tokens", self.args.trigger_s)
        self.strike(scenario)
        await asyncio.to_thread(self.system.pause, name)
        self.say(f"SIGSTOP {name} for {ACK_WAIT_S + 2:g} s (its ack wait is {ACK_WAIT_S:g} s)")
        try:
            await asyncio.sleep(ACK_WAIT_S + 2)
        finally:
            await asyncio.to_thread(self.system.pause, name, False)
        self.say(f"SIGCONT {name}")
        scenario.detail.update(await self.republish())
        self.say(f"republished {scenario.detail['republished']} stored events with their Nats-Msg-Id: "
                 f"{scenario.detail['stored_again']} stored again")

    async def republish(self) -> dict:
        """Publish a sample of the stored conversation events again, bytes and `Nats-Msg-Id`
        as first published (a producer retrying after a lost ack), inside the dedupe window."""
        stored = [(subject, data) async for _, subject, data in self.bus.read_raw(subjects.conversation(SITE, "*"))]
        recent = [(s, d, ev.decode(d)) for s, d in stored]
        recent = [(s, d, e) for s, d, e in recent if time.time() - e.ts < self.bus.config.dedupe_window_s - 60]
        sample = recent[::max(1, len(recent) // self.args.republish)][:self.args.republish]
        kinds, again = Counter(), 0
        for subject, data, event in sample:
            ack = await self.bus.js.publish(subject, data, headers={"Nats-Msg-Id": event.event_id},
                                            stream=subjects.CONV_STREAM)
            again += not ack.duplicate
            kinds[ev.event_type(event)] += 1
        return {"republished": len(sample), "stored_again": again, "republished_types": len(kinds)}


# --- the run ---------------------------------------------------------------------------------

async def run(args, cluster: Cluster, log) -> tuple[list[Visitor], list[handoffs.Talk], list[Scenario], Audit,
                                                  list[Record], dict, float]:
    bus = await connect(cluster.bus_config(), name="chaos")
    watch = Watch()
    await watch.start(bus)
    try:
        talks = handoffs.Handoffs(args.handoffs, args.sessions, SITE, cluster.gateways,
                                  cluster.system.env["ADMIN_TOKEN"], args.think_ms / 1000,
                                  args.turn_deadline_s + HANG_MARGIN_S)
        chaos = Chaos(args, cluster, bus, watch, talks, log)
        scenarios = [Scenario(name) for name in args.scenarios]

        async def faults() -> list[handoffs.Talk]:
            chaos.last = scenarios[-1]
            talking = asyncio.create_task(talks.run(chaos.over))
            try:
                for scenario in scenarios:
                    await chaos.run(scenario)
                    await asyncio.sleep(args.settle_s)
            finally:
                chaos.over.set()
                done = await talking
            return done

        visitors, done, result, wall = await rehearse(args, cluster, bus, 1, faults, log)
        # The rehearsal's audit knew the other visitors only: what the handoffs' visitors were shown too.
        result = await audit(bus, [*visitors, *(t.visitor for t in done)])
        records = await bus.read(subjects.conversation(SITE, "*"))
    finally:
        await bus.close()
    return visitors, done, scenarios, result, records, watch.rewritten, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=2, help="processes of every service")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--handoffs", type=int, default=2,
                        help="visitors who ask for a person, served by an operator client (handoffs.py), besides "
                             "--sessions")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, in this order (default all: {','.join(SCENARIOS)})")
    parser.add_argument("--load-s", type=float, default=3.0, help="seconds of load before each fault")
    parser.add_argument("--trigger-s", type=float, default=5.0,
                        help="how long a fault waits for a turn under way before striking anyway")
    parser.add_argument("--down-s", type=float, default=2.0, help="how long a killed process stays down")
    parser.add_argument("--redis-down-s", type=float, default=5.0, help="how long redis-server stays down")
    parser.add_argument("--settle-s", type=float, default=3.0, help="seconds of load after each recovery")
    parser.add_argument("--republish", type=int, default=40, help="stored events published again (duplicates)")
    add_arguments(parser)
    parser.add_argument("--bounded", action="store_true",
                        help=f"the make-test version: 3 sessions and 2 handoff conversations, 2 replicas, "
                             f"{', '.join(BOUNDED)}, shorter pauses")
    args = parser.parse_args(argv)
    if args.bounded:
        args.sessions, args.handoffs, args.replicas, args.scenarios = 3, 2, 2, ",".join(BOUNDED)
        # The visitors talk all along: each fault waits for a turn under way, the last one's settling after.
        args.load_s, args.settle_s = 0.0, 2.0
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if unknown := [s for s in args.scenarios if s not in SCENARIOS]:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    if "handoff" in args.scenarios and args.handoffs < 1:
        parser.error("the handoff scenario needs --handoffs 1 or more")

    def log(line: str) -> None:
        print(line, flush=True)

    # The tool's own connection losing the nats-server it restarts is expected, not news.
    logging.getLogger("shared.bus").setLevel(logging.CRITICAL)
    with started(args, "chaos", args.replicas, log) as (cluster, receiver):
        log(f"{args.sessions} sessions and {args.handoffs} handoff conversations, "
            f"scenarios {', '.join(args.scenarios)}")
        visitors, talks, scenarios, result, records, rewritten, wall = asyncio.run(run(args, cluster, log))
    return report(args, visitors, talks, scenarios, result, records, rewritten, receiver.deliveries(), wall,
                  receiver.repeated())


# --- the report ------------------------------------------------------------------------------

def owner(scenarios: list[Scenario], at: float) -> str:
    """The scenario of the last fault at or before `at` (the first scenario's, before any)."""
    return max((s for s in scenarios if s.fault_at <= at), key=lambda s: s.fault_at, default=scenarios[0]).name


def turn_owner(scenarios: list[Scenario], turn: Turn) -> str:
    """The scenario of the last fault before the turn ended for its visitor. A stream that
    could not be resumed was cut by the first fault after it was sent (its gateway's death),
    though the visitor then tried to resume it for a while."""
    if turn.outcome == "cut":
        cutter = min((s for s in scenarios if s.fault_at >= turn.started), key=lambda s: s.fault_at, default=None)
        if cutter is not None:
            return cutter.name
    return owner(scenarios, turn.started + turn.seconds)


def scenario_figures(scenario: Scenario, scenarios: list[Scenario], turns: list[Turn], rewritten: dict,
                     records: list[Record]) -> dict:
    mine = [t for t in turns if turn_owner(scenarios, t) == scenario.name]
    wall = time.time() - time.monotonic()  # stored events carry wall-clock times
    short = [r for r in records if isinstance(r.event, ev.EnrichmentCompleted) and r.event.trouble
             and owner(scenarios, r.event.ts - wall) == scenario.name]
    outcomes = Counter(t.outcome for t in mine)
    fault = scenario.fault_at
    in_flight = [t for t in turns if t.started < fault < t.started + t.seconds]
    ends = [t.started + t.seconds - fault for t in in_flight]
    return {
        "turns": len(mine), "completed": outcomes["complete"],
        "errors_shown": sum(outcomes[o] for o in ERRORS),
        "resumed": sum(t.outcome == "complete" and t.resumed > 0 for t in mine),
        "hung": outcomes["hung"], "in_flight": len(in_flight),
        "in_flight_end_s": round(max(ends), 1) if ends else None,
        "recovery_s": scenario.recovery_s, "mid_turn": scenario.mid_turn,
        "answers_rewritten": sum(owner(scenarios, at) == scenario.name for at in rewritten.values()),
        "error_events": outcomes["error"], "streams_cut": outcomes["cut"], "refused": outcomes["refused"],
        "enrichments_cut_short": len(short),
        **scenario.detail,
    }


def not_completed(visitors: list[Visitor], scenarios: list[Scenario]) -> list[dict]:
    """Every turn not shown complete, to look up in the log and the processes' logs."""
    return [{"session_id": v.session_id, "turn": t.turn, "outcome": t.outcome, "status": t.status,
             "retries": t.retries, "resumed": t.resumed, "scenario": turn_owner(scenarios, t),
             "seconds": round(t.seconds, 1),
             "ended_at": round(time.time() - time.monotonic() + t.started + t.seconds, 1)}
            for v in visitors for t in v.turns if t.outcome != "complete"]


def unmet_targets(args, figures: dict) -> list[str]:
    unmet = [f"{key} {figures[key]} (target 0)" for key in
             ("hung", "lost_events", "corrupted_logs", "duplicate_side_effects") if figures[key]]
    for name, s in figures["scenarios"].items():
        if s.get("stored_again"):
            unmet.append(f"{name}: {s['stored_again']} republished events stored again (target 0)")
        if name == "nats-restart":
            if s["errors_shown"] > s["in_flight"]:
                unmet.append(f"{name}: {s['errors_shown']} errors shown, {s['in_flight']} turns in flight (target ≤)")
            if s["readyz_s"] > READYZ_TARGET_S:
                unmet.append(f"{name}: /readyz 200 everywhere {s['readyz_s']} s after the server was back "
                             f"(target {READYZ_TARGET_S:g})")
        elif killed(name) and args.replicas == 2 and s["errors_shown"]:
            unmet.append(f"{name}: {s['errors_shown']} errors shown with two replicas (target 0)")
        elif killed(name) and args.replicas == 1 and (s["in_flight_end_s"] or 0) > ONE_REPLICA_END_TARGET_S:
            unmet.append(f"{name}: a turn in flight ended {s['in_flight_end_s']} s after the kill "
                         f"(target {ONE_REPLICA_END_TARGET_S:g})")
    unmet += [f"{key} {figures[key]} (target 0)" for key in ("visitor_messages_lost", "visitor_messages_doubled")
              if figures[key]]
    if (h := figures["handoffs"])["conversations"]:
        unmet += [f"handoffs: {key} {h[key]} (target 0)" for key in HANDOFF_TARGETS if h[key]]
        if not h["handoffs"] or not h["operator_messages"]:
            unmet.append(f"handoffs: {h['handoffs']} claimed, {h['operator_messages']} operator messages (target > 0)")
    return unmet


def killed(name: str) -> bool:
    """Whether the scenario SIGKILLs a service's replica (`handoff`: a gateway)."""
    return name.startswith("kill-") or name == "handoff"


def report(args, visitors: list[Visitor], talks: list[handoffs.Talk], scenarios: list[Scenario], result: Audit,
           records: list[Record], rewritten: dict, deliveries: Counter, wall: float,
           repeated: dict[str, list[float]]) -> int:
    visitors = [*visitors, *(t.visitor for t in talks)]
    turns = [t for v in visitors for t in v.turns]
    outcomes = Counter(t.outcome for t in turns)
    logs = conversations(records)
    corrupted = {session: problems for session, rs in logs.items() if (problems := corruption(rs))}
    messages_lost, messages_doubled = [], []
    for visitor in visitors:
        lost, doubled = handoffs.visitor_messages(logs.get(visitor.session_id or "", []), visitor.turns)
        messages_lost += [f"{visitor.session_id}: {m}" for m in lost]
        messages_doubled += [f"{visitor.session_id}: {m}" for m in doubled]
    in_handoffs = [f"{session}: {p}" for session, rs in logs.items() for p in handoffs.ai_answers_in_handoffs(rs)]
    handed = {**handoffs.figures(talks, logs), "ai_answers_in_handoff_turns": len(in_handoffs)}
    handed["problems"] = (in_handoffs + handed["problems"])[:20]
    per_scenario = {s.name: scenario_figures(s, scenarios, turns, rewritten, records) for s in scenarios}
    recoveries = [s.recovery_s for s in scenarios if s.recovery_s is not None]
    figures = {
        "turns": len(turns),
        "completed": outcomes["complete"],
        "errors_shown": sum(outcomes[o] for o in ERRORS),
        "resumed": sum(t.outcome == "complete" and t.resumed > 0 for t in turns),
        "sent_again": sum(t.retries > t.resumed for t in turns),
        "hung": outcomes["hung"],
        "lost_events": len(result.lost),
        "corrupted_logs": len(corrupted),
        "duplicate_side_effects": duplicate_deliveries(deliveries, result.uncertain)[0],
        "recovery_s": max(recoveries) if recoveries else None,
        "scenarios": per_scenario,
        "turns_in_log": result.requested,
        "ended_in_log": result.ended_in_log,
        "leads": result.leads,
        "webhooks_recorded": result.webhooks_recorded,
        "webhook_deliveries": sum(deliveries.values()),
        "resent_uncertain": duplicate_deliveries(deliveries, result.uncertain)[1],
        # Each id delivered more than once: its deliveries' times (s after the first fault) and
        # the fault each came after, to tell which fault sent it again.
        "repeated_webhooks": [{"webhook_id": key, "at_s": [round(t - scenarios[0].fault_at, 2) for t in at],
                               "after": [owner(scenarios, t) for t in at]} for key, at in repeated.items()],
        "answers_rewritten": len(rewritten),
        "visitor_messages": sum(t.turn is not None for t in turns),
        "visitor_messages_lost": len(messages_lost),
        "visitor_messages_doubled": len(messages_doubled),
        "handoffs": handed,
        "replicas": args.replicas,
        "sessions": args.sessions,
        "bounded": args.bounded,
        "load_s": round(wall, 1),
    }
    columns = ("turns", "completed", "errors_shown", "resumed", "hung", "in_flight", "in_flight_end_s",
               "answers_rewritten", "recovery_s")
    heads = ("turns", "completed", "errors", "resumed", "hung", "in flight", "ended ≤ s", "rewritten", "recovery s")
    print(f"\n{'scenario':<16}" + "".join(f"{h:>11}" for h in heads))
    for name, s in [*per_scenario.items(), ("total", figures)]:
        cells = ["—" if s.get(c) is None else s[c] for c in columns]
        print(f"{name:<16}" + "".join(f"{c!s:>11}" for c in cells))
    print(f"\n{'turns in the log / ended there':<34}{figures['turns_in_log']} / {figures['ended_in_log']}")
    print(f"{'lost events':<34}{figures['lost_events']}")
    for line in result.lost[:10]:
        print(f"    {line}")
    print(f"{'corrupted logs':<34}{figures['corrupted_logs']}")
    for session, problems in list(corrupted.items())[:10]:
        print(f"    {session}: {'; '.join(problems[:3])}")
    print(f"{'leads / webhooks recorded':<34}{figures['leads']} / {figures['webhooks_recorded']}")
    print(f"{'webhook deliveries (duplicates)':<34}{figures['webhook_deliveries']} ({figures['duplicate_side_effects']}; "
          f"{figures['resent_uncertain']} sent again after an attempt of unknown fate)")
    for line in figures["repeated_webhooks"][:10]:
        print(f"    {line['webhook_id']}: at {line['at_s']} s, after {line['after']}")
    if "duplicates" in per_scenario:
        d = per_scenario["duplicates"]
        print(f"{'republished events (stored again)':<34}{d['republished']} ({d['stored_again']})")
    print(f"{'visitor messages (lost, doubled)':<34}{figures['visitor_messages']} "
          f"({figures['visitor_messages_lost']}, {figures['visitor_messages_doubled']})")
    for line in (messages_lost + messages_doubled)[:10]:
        print(f"    {line}")
    if talks:
        h = handed
        print(f"{'handoffs (released, closed)':<34}{h['handoffs']} ({h['released']}, {h['closed']})")
        print(f"{'operator messages 2xx / in log':<34}{h['operator_messages']} / {h['operator_messages_in_log']} "
              f"(lost {h['operator_messages_lost']}, doubled {h['operator_messages_doubled']}; "
              f"{h['sent_again']} sent again after their 2xx, {h['operator_retries']} requests tried again)")
        print(f"{'AI answers in HANDOFF turns':<34}{h['ai_answers_in_handoff_turns']} ({h['held_turns']} messages "
              f"written while held)")
        print(f"{'live frames (missed, twice)':<34}{h['live_frames']} ({h['live_missed']}, {h['live_doubled']}); "
              f"{h['live_connections']} connections, {h['live_resumed']} with Last-Event-ID")
        print(f"{'wrong handoff states / refused':<34}{h['wrong_states']} / {h['operator_refused']}")
        for line in h["problems"][:10]:
            print(f"    {line}")
    figures["unmet"] = unmet_targets(args, figures)
    for line in figures["unmet"]:
        print(f"target not met: {line}")
    figures["not_completed"] = not_completed(visitors, scenarios)[:30]
    figures["lost"] = result.lost[:10]
    figures["corrupted"] = {s: p[:3] for s, p in list(corrupted.items())[:10]}
    print(json.dumps(figures))
    return 1 if figures["unmet"] else 0
