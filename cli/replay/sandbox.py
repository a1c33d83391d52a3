"""A conversation re-run in one process: the graph's nodes called as the consumer runner
calls them, on an in-memory log, with no bus and no side effects.

The visitor's inputs (the gateway's `TurnRequested` and `TurnBlocked`) are fed in order;
after each, every node consuming an event is called with the inputs its `Needs` ask for,
its outputs appended to the sandbox log (ids derived as in production, so an unchanged node
makes the same ids and a repeat is dropped, as JetStream's dedupe would), until nothing is
left to run. Then the next input.

What a node is handed reproduces what it saw: every output in the log records the position
of the state its handler was given (`input_seq`), so a node handling an event it handled in
the original sees exactly the events the original saw then, and waits until the rerun has
made them. Where the original has no such record (a new event, a node that produced
nothing), the node sees the whole sandbox log so far, after its waits (those with a
deadline) are met or nothing else can run. Its site config is the version its original
handler recorded (`config_version`) when the rerun has that version (`versions`), else the
rerun's (`config`).

Nodes in `recorded` are not run: they read or change the world outside the conversation
(enrichment's company lookups, the retriever's knowledge base, the lead webhook), so their
outputs for the same cause are copied from the original, and a cause the original never
had gets none. A node that raises ends its turn with `TurnFailed`, as the runner would, and
is listed as a divergence.
"""

from __future__ import annotations

import contextvars
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from shared import events as ev
from shared import subjects
from shared.node import Context, Node, gather
from shared.store import MemoryStore
from shared.site_config import SiteConfig
from shared.state import ConversationState, Record, apply, copy_state, fold

INPUT_TYPES = ("turn_requested", "turn_blocked")
# What operators did between turns (a handoff: claimed, answered, handed back): no node of a
# rerun makes them, and the turns after them depend on them (a held conversation gets no AI
# answer), so a rerun puts them back where they were in the log.
BETWEEN_TURNS = (*ev.HANDOFF_EVENTS, "handoff_requested")  # the last: an operator's choice to join
# Nodes the clock wakes, not the conversation (a handoff nobody joined in time): a rerun does
# not run them and puts what they stored back where it was, as it does the operators' steps.
CLOCK_NODES = ("handoff_timer",)
# The node call under way (node name, turn): what a recorded LLM names in a divergence.
CURRENT_CALL: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("replay_call", default=("", 0))
# Outputs that do not change what a node decides: not waited for.
NOT_WAITED = ("llm_call_recorded",)


class Recording:
    """The original conversation, indexed for a rerun."""

    def __init__(self, records: list[Record]):
        self.records = records
        self.seq_of = {r.event.event_id: r.seq for r in records}
        self.type_of = {r.event.event_id: ev.event_type(r.event) for r in records}
        self.outputs: dict[tuple[str, str], list[ev.Envelope]] = defaultdict(list)
        for record in records:
            if record.event.causation_id:
                self.outputs[record.event.producer, record.event.causation_id].append(record.event)
        # What a rerun waits for, in log order: the events a node's decision can depend on.
        self.waited = [r for r in records if ev.event_type(r.event) not in NOT_WAITED]

    def inputs(self) -> list[ev.Envelope]:
        """What the visitor, the operators and the clock did: the gateway's turn-starting
        events and the handoff steps of the operators and `CLOCK_NODES` (`BETWEEN_TURNS`), in order."""
        return [r.event for r in self.records
                if (r.event.producer == "gateway" and ev.event_type(r.event) in (*INPUT_TYPES, *BETWEEN_TURNS))
                or (r.event.producer in CLOCK_NODES and ev.event_type(r.event) in BETWEEN_TURNS)]

    def llm_calls(self) -> list[ev.LLMCall]:
        return [r.event.call for r in self.records if isinstance(r.event, ev.LLMCallRecorded)]

    def input_seq(self, node: str, cause_id: str) -> int:
        """Where in the log the state the node's handler was given for this cause ended; 0
        when the original does not say (no output, or one from before outputs recorded it)."""
        outputs = self.outputs.get((node, cause_id))
        return max((o.input_seq for o in outputs), default=0) if outputs else 0


class LogBus:
    """Where handlers run without a server (a rerun, a test of one decision) send what they
    send before returning: events to `on_event`, tokens to `on_token`. (What they read comes
    from a `MemoryStore` over the same log.)"""

    max_event_bytes = 1 << 20

    def __init__(self, on_event: Callable, on_token: Callable):
        self._on_event, self._on_token = on_event, on_token

    async def publish(self, event: ev.Envelope) -> None:
        self._on_event(event)

    async def publish_token(self, chunk) -> None:
        self._on_token(chunk)


class FixedConfig:
    """A site's configs as a rerun has them: one config for the call."""

    def __init__(self, config: SiteConfig):
        self.config = config

    async def get(self, site: str) -> SiteConfig:
        return self.config


@dataclass
class Call:
    node: Node
    event: ev.Envelope


@dataclass
class Sandbox:
    nodes: list[Node]
    config: SiteConfig
    recording: Recording | None = None
    recorded: frozenset[str] = frozenset()  # nodes whose outputs are copied, not computed
    versions: dict[str, SiteConfig] = field(default_factory=dict)  # site configs a node may have recorded, by version
    live_for_new: frozenset[str] = frozenset()  # recorded nodes run for a cause the recording lacks
    log: list[ev.Envelope] = field(default_factory=list)
    tokens: list = field(default_factory=list)
    divergences: list[dict] = field(default_factory=list)  # {turn, node, divergence}
    _ids: set[str] = field(default_factory=set)
    _calls: list[Call] = field(default_factory=list)
    _by_id: dict[str, ev.Envelope] = field(default_factory=dict)
    _new: set[str] = field(default_factory=set)  # ids the original does not have
    _next: int = 0  # index into recording.waited: the frontier
    _running: ConversationState = field(default_factory=ConversationState)  # fold along the original's log
    _running_at: int = 0  # records folded into it
    _running_seq: int = 0

    def __post_init__(self):
        self.bus = LogBus(self._emitted, self.tokens.append)
        self.use(self.nodes, self.config)

    def use(self, nodes: list[Node], config: SiteConfig) -> None:
        """The nodes and the site config the next inputs run with (each turn of a rerun runs
        under its own: turn_config.py)."""
        self.nodes, self.config = nodes, config
        self._consumers: dict[str, list[Node]] = defaultdict(list)
        for node in nodes:
            for kind in node.consumes:
                self._consumers[kind].append(node)

    def append(self, event: ev.Envelope) -> bool:
        """Store one event (False when its id is stored already) and queue its consumers."""
        if event.event_id in self._ids:
            return False
        self._remember(event)
        self._calls.extend(Call(node, event) for node in self._consumers.get(ev.event_type(event), ()))
        return True

    def _emitted(self, event: ev.Envelope) -> None:
        """An event a handler stored before returning (an LLM call record)."""
        self.append(event)

    def _remember(self, event: ev.Envelope) -> None:
        self._ids.add(event.event_id)
        self._by_id[event.event_id] = event
        if self.recording is None or event.event_id not in self.recording.seq_of:
            self._new.add(event.event_id)
        self.log.append(event)

    def preload(self, events: list[ev.Envelope]) -> None:
        """Events taken as they are (earlier turns, when one turn is rerun): stored, not handled."""
        for event in events:
            if event.event_id not in self._ids:
                self._remember(event)

    async def run(self, inputs: list[ev.Envelope]) -> list[ev.Envelope]:
        """Feed the inputs one at a time, each run until nothing is left; the sandbox log."""
        for event in inputs:
            self.append(event)
            await self._drain()
        return self.log

    async def _drain(self) -> None:
        while self._calls:
            ready = next((call for call in self._calls if not self._waiting(call)), None)
            call = ready or self._calls[0]  # nothing can progress: the first waiting call runs with what there is
            self._calls.remove(call)
            for out in await self._invoke(call):
                self.append(out)

    def _input_seq(self, call: Call) -> int:
        return self.recording.input_seq(call.node.name, call.event.event_id) if self.recording else 0

    def _frontier(self) -> int:
        """The log position of the first original event (of those waited for) the rerun has
        not made yet: a node whose original state ended before it can run now."""
        waited = self.recording.waited
        while self._next < len(waited) and waited[self._next].event.event_id in self._ids:
            self._next += 1
        return waited[self._next].seq if self._next < len(waited) else 1 << 62

    def _waiting(self, call: Call) -> bool:
        seq = self._input_seq(call)
        if seq:
            return seq >= self._frontier()
        seen = self._seen(self.log, call.event.turn)
        return any(wait.deadline_s > 0 and not set(wait.kinds) <= seen for wait in call.node.needs.waits)

    @staticmethod
    def _seen(events: list[ev.Envelope], turn: int) -> set[str]:
        return {ev.event_type(e) for e in events if e.turn == turn}

    def _state(self, call: Call) -> ConversationState:
        """What the node is handed: the events the original handler saw, as the rerun made
        them, in the original's order (a fold kept running along the log while the rerun
        has made every event so far and nothing new); or the whole sandbox log."""
        seq = self._input_seq(call)
        if not seq:
            return self._fold(self.log)
        by_id = self._by_id
        if not self._new and seq < self._frontier() and seq >= self._running_seq:
            for record in self.recording.records[self._running_at:]:
                if record.seq > seq:
                    break
                self._running_at += 1
                if (made := by_id.get(record.event.event_id)) is not None:
                    apply(self._running, Record(seq=record.seq, subject=record.subject, event=made))
            self._running_seq = seq
            return copy_state(self._running)
        visible = [by_id[r.event.event_id] for r in self.recording.records
                   if r.seq <= seq and r.event.event_id in by_id]
        return self._fold(visible + [e for e in self.log if e.event_id in self._new])

    def _config(self, node: str, event: ev.Envelope) -> SiteConfig:
        """The site config version the original handler of this event recorded, when it is
        in `versions` (a turn during a config change may have run on two); else `config`.
        Its outputs are found as `_invoke` copies them: under this event, or under the
        event's own cause (the intent router names the turn's request as its cause)."""
        if self.recording is not None and self.versions:
            outputs = self.recording.outputs
            for out in (*outputs.get((node, event.event_id), ()), *outputs.get((node, event.causation_id or ""), ())):
                if out.config_version and out.config_version in self.versions:
                    return self.versions[out.config_version]
        return self.config

    def records(self) -> list[Record]:
        """The sandbox log as the store reads it."""
        return [_record(i, e) for i, e in enumerate(self.log, start=1)]

    @staticmethod
    def _fold(events: list[ev.Envelope]) -> ConversationState:
        return fold(_record(i, e) for i, e in enumerate(events, start=1))



    async def _invoke(self, call: Call) -> list[ev.Envelope]:
        node, event = call.node, call.event
        if not node.concerns(event):
            return []
        new = self.recording is None or event.event_id not in self.recording.seq_of
        if node.name in self.recorded and not (new and node.name in self.live_for_new):
            if self.recording is None:
                return []
            # Its outputs for this event, or for the event's own cause (a node that names the
            # turn's TurnRequested as the cause, as intent_router does).
            return [*self.recording.outputs.get((node.name, event.event_id), []),
                    *self.recording.outputs.get((node.name, event.causation_id or ""), [])]
        needs = node.needs
        config = self._config(node.name, event)
        state = self._state(call) if needs.folds else ConversationState()
        store = MemoryStore(self.records, given=state)
        CURRENT_CALL.set((node.name, event.turn))
        try:
            inputs = await gather(needs, event, store, FixedConfig(config))
            if inputs is None:  # a join this event does not complete
                return []
            # Outputs are stamped with their cause's time: a rerun's log is the same every time.
            ctx = Context(out=self.bus, node=node.name, cause=event, attempt=1, input_seq=state.last_seq,
                          config_version=config.version if needs.config else "", clock=lambda: event.ts)
            return list(await node.handle(event, inputs, ctx))
        except Exception as exc:  # noqa: BLE001 - the runner would end the turn; so does the rerun
            reason = f"{type(exc).__name__}: {exc}"
            self.divergences.append({"turn": event.turn, "node": node.name,
                                     "divergence": f"failed on {ev.event_type(event)}: {reason}"})
            return [ev.follow(event, ev.TurnFailed, node.name, key="failed", ts=event.ts, node=node.name,
                              reason=reason[:2000], attempts=1, failed_event_id=event.event_id)]


def _record(seq: int, event: ev.Envelope) -> Record:
    return Record(seq=seq, subject=subjects.conv(event.site, event.session_id, ev.event_type(event)), event=event)
