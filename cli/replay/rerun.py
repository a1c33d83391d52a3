"""Re-running recorded conversations with the current code: one conversation (`rerun`), one
node's decisions (`rerun --node`), a branch with a new message (`fork`), or many at once as a
regression gate (`verify`). Nothing touches the original log, the bus or the world: the
conversations run in a sandbox (sandbox.py), LLM calls are answered from the recording
unless `llm="live"` (recorded_llm.py), side-effect nodes are copied (graph.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import msgspec

from cli.replay.diff import Difference, VersionChange, diff, version_changes
from cli.replay.graph import CURRENT_LLM, Graph
from cli.replay.recorded_llm import RecordedCalls, RecordedLLM
from cli.replay.sandbox import BETWEEN_TURNS, Recording, Sandbox
from cli.replay.turn_config import NotRerunnable, Plan, unanswerable_reason
from shared import events as ev
from shared import subjects
from shared.bus import Bus
from shared.llm import LLMClient
from shared.site_config import SiteConfig
from shared.state import ConversationState, Record, fold

# Left out when one node's outputs are compared: a rerun's own ids, clocks (an answer's
# first token's too) and log positions; the time a decision took (measured, not decided: the local classifier's
# `latency_ms` differs on every run); the config and model versions (reported as version
# changes, diff.py); the LLM roles a node had (turn_config.py: a rerun runs under the recorded ones or,
# asked to, under the deployment's).
VOLATILE = ("event_id", "ts", "first_token_ts", "input_seq", "causation_id", "latency_ms", "config_version", "classifier_version",
            "embedding_version", "llm_roles")


@dataclass
class Result:
    session_id: str
    turns: int
    events: list[ev.Envelope]  # the rerun's log
    differences: list[Difference]
    divergences: list[dict]  # what could not run as recorded: {turn, node, divergence}
    node_differences: list[dict] = field(default_factory=list)  # --node: that node's outputs, original vs rerun
    # Site config or models the rerun's nodes ran under that differ from the recorded ones:
    # said, not a divergence.
    version_changes: list[VersionChange] = field(default_factory=list)
    # {turn, reason}: the turns that could not be re-run as asked (turn_config.py), copied
    # as recorded and not compared: not divergences.
    skipped: list[dict] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return bool(self.differences or self.divergences or self.node_differences)


async def read(bus: Bus, site: str, session_id: str) -> Recording:
    return Recording(await bus.read(subjects.conversation(site, session_id)))


async def read_site(bus: Bus, site: str, since_ts: float = 0.0, limit: int | None = None) -> list[Recording]:
    """Every recorded conversation of the site (one read of the log), oldest first; those
    started before `since_ts` left out; the newest `limit`."""
    by_session: dict[str, list[Record]] = defaultdict(list)
    for record in await bus.read(subjects.conversation(site, "*")):
        if ev.is_conversation(record.event.session_id):
            by_session[record.event.session_id].append(record)
    chosen = sorted((records for records in by_session.values() if records[0].event.ts >= since_ts),
                    key=lambda records: records[0].event.ts)
    if limit is not None:
        chosen = chosen[-limit:]
    return [Recording(records) for records in chosen]


def state_at(recording: Recording, seq: int) -> ConversationState:
    """The conversation's state folded from its events up to and including `seq`."""
    return fold(r for r in recording.records if r.seq <= seq)


async def rerun(recording: Recording, graph: Graph, config: SiteConfig, llm: str = "recorded",
                node: str | None = None, turn: int | None = None, extra_inputs: tuple[ev.Envelope, ...] = (),
                current_config: bool = False, stored_configs: dict[str, SiteConfig] | None = None) -> Result:
    """Run the conversation's recorded inputs (and `extra_inputs`) again. `node`: only that
    node runs, every other node's outputs are copied from the recording; `turn`: the turns
    before it are copied as they are, and only that turn runs.

    Each turn runs under the LLM roles, answer backend and site config it was recorded with
    (turn_config.py: `config` is the site's now, `stored_configs` the other versions still
    stored, by version); `current_config`: under this deployment's roles (`graph.roles()`)
    and `config`. `llm="live"` sends the calls to this deployment's endpoints, so its roles
    are the deployment's. A turn that cannot run as asked is copied and listed in `skipped`."""
    if llm not in ("recorded", "live"):
        raise ValueError(f"--llm {llm!r}: use recorded or live")
    plan = Plan(recording, graph.roles(), config, stored_configs or {}, current=current_config)
    setups = {t: plan.setup(t) for t in plan.recorded}
    skipped = {t: s.reason for t, s in setups.items() if isinstance(s, NotRerunnable)}
    current = CURRENT_LLM.set(LLMClient({}))  # each turn's own is set as it runs
    try:
        while True:  # again without the turns found unanswerable, until none is
            result, unanswerable = await _rerun(recording, graph, plan, llm, node, turn, extra_inputs, skipped)
            found = {m["turn"]: unanswerable_reason(m["role"]) for m in unanswerable if m["turn"] not in skipped}
            if not found:
                return result
            skipped.update(found)
    finally:
        CURRENT_LLM.reset(current)


async def _rerun(recording: Recording, graph: Graph, plan: Plan, llm: str, node: str | None, turn: int | None,
                 extra_inputs: tuple[ev.Envelope, ...], skipped: dict[int, str]) -> tuple[Result, list[dict]]:
    calls = RecordedCalls(recording.llm_calls())
    live = LLMClient(plan.deployment) if llm == "live" else None
    sandbox = Sandbox(nodes=[], config=plan.config, recording=recording, recorded=graph.recorded,
                      versions={} if plan.current else plan.stored,
                      live_for_new=graph.live_for_new if node is None else frozenset())
    inputs = recording.inputs()
    original = [r.event for r in recording.records]
    if turn is not None:
        sandbox.preload([e for e in original if e.turn < turn])
        inputs = [e for e in inputs if e.turn == turn]
        original = [e for e in original if e.turn == turn]
    for event in [*inputs, *extra_inputs]:
        if ev.event_type(event) in BETWEEN_TURNS:  # an operator's: back in the log as it was, nothing runs
            sandbox.preload([event])
            continue
        if event.turn in skipped:  # as recorded: what later turns saw
            sandbox.preload([e for e in original if e.turn == event.turn])
            continue
        setup = plan.setup(event.turn)
        client = live or RecordedLLM(calls, setup.roles, setup.keyless)
        CURRENT_LLM.set(client)
        nodes = graph.nodes(client, "" if live else setup.answer_backend)
        if node is not None:
            names = {n.name for n in nodes}
            if node not in names:
                raise ValueError(f"unknown node {node!r}; nodes: {', '.join(sorted(names))}")
            sandbox.recorded = frozenset(names - {node})
        sandbox.use(nodes, setup.config)
        await sandbox.run([event])
    events = sandbox.log
    compared = [e for e in events if turn is None or e.turn == turn]
    divergences = list(sandbox.divergences)
    divergences += [{"turn": m["turn"], "node": m["node"],
                     "divergence": f"no recorded {m['role']} call for: {m['last_message']!r}"} for m in calls.missing]
    result = Result(session_id=recording.records[0].event.session_id if recording.records else "",
                    turns=len({e.turn for e in inputs if e.turn not in skipped}), events=events,
                    differences=diff(original, compared), divergences=divergences,
                    node_differences=node_diff(original, compared, node) if node else [],
                    version_changes=version_changes(original, compared),
                    skipped=[{"turn": t, "reason": reason} for t, reason in sorted(skipped.items())
                             if turn is None or t == turn])
    return result, calls.unanswerable


def node_diff(original: list[ev.Envelope], rerun: list[ev.Envelope], node: str) -> list[dict]:
    """One node's outputs, per turn, where the rerun's differ from the original's (`VOLATILE`
    fields and LLM call records left out)."""
    def outputs(events):
        per_turn: dict[int, list] = defaultdict(list)
        for e in events:
            if e.producer == node and not isinstance(e, ev.LLMCallRecorded):
                per_turn[e.turn].append({k: v for k, v in msgspec.to_builtins(e).items() if k not in VOLATILE})
        return per_turn

    before, after = outputs(original), outputs(rerun)
    return [{"turn": t, "node": node, "original": before.get(t, []), "rerun": after.get(t, [])}
            for t in sorted(set(before) | set(after)) if before.get(t, []) != after.get(t, [])]


def fork_input(recording: Recording, at_seq: int, message: str) -> tuple[Recording, ev.TurnRequested]:
    """The recording up to `at_seq`, and a new visitor message as the turn after it, in a new
    conversation (a fork never shares ids with the original)."""
    kept = [r for r in recording.records if r.seq <= at_seq]
    if not kept:
        raise ValueError(f"no event at or before {at_seq}")
    last = kept[-1].event
    turn = max(r.event.turn for r in kept) + 1
    requested = ev.TurnRequested(event_id=ev.derived_id(last.event_id, "fork", message), site=last.site,
                                 session_id=last.session_id, turn=turn, ts=time.time(), producer="gateway",
                                 message=message)
    return Recording(kept), requested


@dataclass
class Verification:
    conversations: int = 0
    turns: int = 0  # re-run and compared
    diverged: int = 0
    divergences: list[dict] = field(default_factory=list)
    # {what, recorded, rerun, conversations}: the conversations rerun under another site
    # config or model than they were recorded with (not divergences).
    version_changes: list[dict] = field(default_factory=list)
    # {session_id, turn, reason}: the turns that could not be re-run as asked (not divergences).
    not_rerunnable: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time for it: steadier than `seconds` on a shared machine

    def figures(self, limit: int = 50) -> dict:
        return {"conversations": self.conversations, "turns": self.turns, "diverged": self.diverged,
                "skipped": len(self.not_rerunnable), "not_rerunnable": self.not_rerunnable[:limit],
                "divergences": self.divergences[:limit], "divergences_total": len(self.divergences),
                "version_changes": self.version_changes,
                "conversations_per_s": round(self.conversations / self.seconds, 1) if self.seconds else None,
                "seconds": round(self.seconds, 2), "cpu_s": round(self.cpu_s, 2),
                "cpu_ms_per_conversation": round(self.cpu_s * 1000 / self.conversations, 1) if self.conversations else None}


async def verify(recordings: list[Recording], graph: Graph, config: SiteConfig, current_config: bool = False,
                 stored_configs: dict[str, SiteConfig] | None = None) -> Verification:
    """Rerun every recording with its recorded LLM calls, each turn under what it was
    recorded with (`current_config`: under this deployment's, see `rerun`); what diverges,
    and where, and which turns could not be re-run."""
    out = Verification()
    started, cpu = time.perf_counter(), time.process_time()
    for recording in recordings:
        if not recording.inputs():
            continue
        result = await rerun(recording, graph, config, current_config=current_config, stored_configs=stored_configs)
        out.conversations += 1
        out.turns += result.turns
        out.not_rerunnable += [{"session_id": result.session_id, **s} for s in result.skipped]
        for change in result.version_changes:
            seen = next((c for c in out.version_changes if (c["what"], c["recorded"], c["rerun"])
                         == (change.what, change.recorded, change.rerun)), None)
            if seen is None:
                seen = {"what": change.what, "recorded": change.recorded, "rerun": change.rerun, "conversations": 0}
                out.version_changes.append(seen)
            seen["conversations"] += 1
        if result.diverged:
            out.diverged += 1
            out.divergences += [{"session_id": result.session_id, **d.to_builtins()} for d in result.differences]
            out.divergences += [{"session_id": result.session_id, **d} for d in result.divergences]
    out.seconds, out.cpu_s = time.perf_counter() - started, time.process_time() - cpu
    return out
