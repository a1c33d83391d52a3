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
from cli.replay.recorded_llm import RecordedLLM
from cli.replay.sandbox import Recording, Sandbox
from shared import events as ev
from shared import subjects
from shared.bus import Bus
from shared.config import LLM_ROLES, LLMRoleConfig
from shared.llm import LLMClient
from shared.site_config import SiteConfig
from shared.state import ConversationState, Record, fold

# Left out when one node's outputs are compared: a rerun's own ids, clocks and log
# positions; the time a decision took (measured, not decided: the local classifier's
# `latency_ms` differs on every run); the config and model versions (reported as version
# changes, diff.py).
VOLATILE = ("event_id", "ts", "input_seq", "causation_id", "latency_ms", "config_version", "classifier_version",
            "embedding_version")


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
        by_session[record.event.session_id].append(record)
    chosen = sorted((records for records in by_session.values() if records[0].event.ts >= since_ts),
                    key=lambda records: records[0].event.ts)
    if limit is not None:
        chosen = chosen[-limit:]
    return [Recording(records) for records in chosen]


def state_at(recording: Recording, seq: int) -> ConversationState:
    """The conversation's state folded from its events up to and including `seq`."""
    return fold(r for r in recording.records if r.seq <= seq)


def role_settings() -> dict[str, LLMRoleConfig]:
    """This process's settings of every LLM role (the deployment's, whose conversations are replayed)."""
    return {role: LLMRoleConfig.from_env(role) for role in LLM_ROLES}


def client(recording: Recording, llm: str, roles: dict[str, LLMRoleConfig] | None = None) -> LLMClient:
    if llm == "live":
        return LLMClient.from_env()
    if llm != "recorded":
        raise ValueError(f"--llm {llm!r}: use recorded or live")
    return RecordedLLM(recording.llm_calls(), roles or role_settings())


async def rerun(recording: Recording, graph: Graph, config: SiteConfig, llm: str = "recorded",
                node: str | None = None, turn: int | None = None,
                extra_inputs: tuple[ev.Envelope, ...] = (), roles: dict[str, LLMRoleConfig] | None = None) -> Result:
    """Run the conversation's recorded inputs (and `extra_inputs`) again. `node`: only that
    node runs, every other node's outputs are copied from the recording; `turn`: the turns
    before it are copied as they are, and only that turn runs. `roles`: the LLM role
    settings (default: read from the environment now)."""
    llm_client = client(recording, llm, roles)
    current = CURRENT_LLM.set(llm_client)
    try:
        return await _rerun(recording, graph, config, llm_client, node, turn, extra_inputs)
    finally:
        CURRENT_LLM.reset(current)


async def _rerun(recording: Recording, graph: Graph, config: SiteConfig, llm_client: LLMClient, node: str | None,
                 turn: int | None, extra_inputs: tuple[ev.Envelope, ...]) -> Result:
    nodes = graph.nodes(llm_client)
    names = {n.name for n in nodes}
    if node is not None and node not in names:
        raise ValueError(f"unknown node {node!r}; nodes: {', '.join(sorted(names))}")
    recorded = (names - {node}) if node else graph.recorded
    sandbox = Sandbox(nodes=nodes, config=config, recording=recording, recorded=frozenset(recorded),
                      live_for_new=graph.live_for_new if node is None else frozenset())
    inputs = recording.inputs()
    original = [r.event for r in recording.records]
    if turn is not None:
        sandbox.preload([e for e in original if e.turn < turn])
        inputs = [e for e in inputs if e.turn == turn]
        original = [e for e in original if e.turn == turn]
    events = await sandbox.run([*inputs, *extra_inputs])
    compared = [e for e in events if turn is None or e.turn == turn]
    divergences = list(sandbox.divergences)
    if isinstance(llm_client, RecordedLLM):
        divergences += [{"turn": m["turn"], "node": m["node"],
                         "divergence": f"no recorded {m['role']} call for: {m['last_message']!r}"}
                        for m in llm_client.missing]
    return Result(session_id=recording.records[0].event.session_id if recording.records else "",
                  turns=len({e.turn for e in inputs}), events=events,
                  differences=diff(original, compared), divergences=divergences,
                  node_differences=node_diff(original, compared, node) if node else [],
                  version_changes=version_changes(original, compared))


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
    turns: int = 0
    diverged: int = 0
    divergences: list[dict] = field(default_factory=list)
    # {what, recorded, rerun, conversations}: the conversations rerun under another site
    # config or model than they were recorded with (not divergences).
    version_changes: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time for it: steadier than `seconds` on a shared machine

    def figures(self, limit: int = 50) -> dict:
        return {"conversations": self.conversations, "turns": self.turns, "diverged": self.diverged,
                "divergences": self.divergences[:limit], "divergences_total": len(self.divergences),
                "version_changes": self.version_changes,
                "conversations_per_s": round(self.conversations / self.seconds, 1) if self.seconds else None,
                "seconds": round(self.seconds, 2), "cpu_s": round(self.cpu_s, 2),
                "cpu_ms_per_conversation": round(self.cpu_s * 1000 / self.conversations, 1) if self.conversations else None}


async def verify(recordings: list[Recording], graph: Graph, config: SiteConfig) -> Verification:
    """Rerun every recording with its recorded LLM calls; what diverges, and where."""
    out = Verification()
    started, cpu = time.perf_counter(), time.process_time()
    roles = role_settings()
    for recording in recordings:
        if not recording.inputs():
            continue
        result = await rerun(recording, graph, config, roles=roles)
        out.conversations += 1
        out.turns += result.turns
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
