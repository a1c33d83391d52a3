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
deadline) are met or nothing else can run.

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

from shared import events as ev
from shared import subjects
from shared.node import Context, Inputs, Node
from shared.site_config import SiteConfig
from shared.state import ConversationState, Record, fold

INPUT_TYPES = ("turn_requested", "turn_blocked")
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

    def inputs(self) -> list[ev.Envelope]:
        """What the visitor did: the gateway's turn-starting events, in order."""
        return [r.event for r in self.records if r.event.producer == "gateway" and ev.event_type(r.event) in INPUT_TYPES]

    def llm_calls(self) -> list[ev.LLMCall]:
        return [r.event.call for r in self.records if isinstance(r.event, ev.LLMCallRecorded)]

    def visible(self, node: str, cause_id: str) -> set[str] | None:
        """The ids of the original events the node's handler was given for this cause, or None
        when the original does not say (no output, or one from before outputs recorded it)."""
        outputs = self.outputs.get((node, cause_id))
        seq = max((o.input_seq for o in outputs), default=0) if outputs else 0
        if not seq:
            return None
        return {r.event.event_id for r in self.records if r.seq <= seq}


class SandboxBus:
    """What a handler's context sends before it returns: events into the sandbox log, tokens
    kept apart."""

    max_event_bytes = 1 << 20

    def __init__(self, sandbox: "Sandbox"):
        self.sandbox = sandbox

    async def publish(self, event: ev.Envelope) -> None:
        self.sandbox.append(event)

    async def publish_token(self, chunk) -> None:
        self.sandbox.tokens.append(chunk)


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
    live_for_new: frozenset[str] = frozenset()  # recorded nodes run for a cause the recording lacks
    log: list[ev.Envelope] = field(default_factory=list)
    tokens: list = field(default_factory=list)
    divergences: list[dict] = field(default_factory=list)  # {turn, node, divergence}
    _ids: set[str] = field(default_factory=set)
    _calls: list[Call] = field(default_factory=list)

    def __post_init__(self):
        self.bus = SandboxBus(self)
        self._consumers: dict[str, list[Node]] = defaultdict(list)
        for node in self.nodes:
            for kind in node.consumes:
                self._consumers[kind].append(node)

    def append(self, event: ev.Envelope) -> bool:
        """Store one event (False when its id is stored already) and queue its consumers."""
        if event.event_id in self._ids:
            return False
        self._ids.add(event.event_id)
        self.log.append(event)
        self._calls.extend(Call(node, event) for node in self._consumers.get(ev.event_type(event), ()))
        return True

    def preload(self, events: list[ev.Envelope]) -> None:
        """Events taken as they are (earlier turns, when one turn is rerun): stored, not handled."""
        for event in events:
            if event.event_id not in self._ids:
                self._ids.add(event.event_id)
                self.log.append(event)

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

    def _visible(self, call: Call) -> set[str] | None:
        if self.recording is None:
            return None
        return self.recording.visible(call.node.name, call.event.event_id)

    def _waiting(self, call: Call) -> bool:
        visible = self._visible(call)
        if visible is not None:
            return any(i not in self._ids and self.recording.type_of[i] not in NOT_WAITED for i in visible)
        seen = self._seen(self.log, call.event.turn)
        return any(wait.deadline_s > 0 and not set(wait.kinds) <= seen for wait in call.node.needs.waits)

    @staticmethod
    def _seen(events: list[ev.Envelope], turn: int) -> set[str]:
        return {ev.event_type(e) for e in events if e.turn == turn}

    def _state(self, call: Call) -> ConversationState:
        visible = self._visible(call)
        events = self.log if visible is None else [
            e for e in self.log if e.event_id in visible or e.event_id not in self.recording.seq_of]
        return fold(Record(seq=i, subject=subjects.conv(e.site, e.session_id, ev.event_type(e)), event=e)
                    for i, e in enumerate(events, start=1))

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
        state = self._state(call) if (needs.state or needs.waits) else ConversationState()
        seen = set(state.turns[event.turn].seen) if event.turn in state.turns else set()
        late = tuple(kind for wait in needs.waits for kind in wait.kinds if kind not in seen)
        ctx = Context(bus=self.bus, node=node.name, cause=event, attempt=1, input_seq=state.last_seq)
        CURRENT_CALL.set((node.name, event.turn))
        try:
            return list(await node.handle(event, Inputs(state=state, config=self.config, late=late), ctx))
        except Exception as exc:  # noqa: BLE001 - the runner would end the turn; so does the rerun
            reason = f"{type(exc).__name__}: {exc}"
            self.divergences.append({"turn": event.turn, "node": node.name,
                                     "divergence": f"failed on {ev.event_type(event)}: {reason}"})
            return [ev.follow(event, ev.TurnFailed, node.name, key="failed", node=node.name, reason=reason[:2000],
                              attempts=1, failed_event_id=event.event_id)]
