"""What many test modules use: events to start a turn, the state folded from given events,
a fast consumer config, a runner started on a node, waiting for a condition, a test's own
names and site filter, and a fixed site config."""

from __future__ import annotations

import asyncio
import inspect
import dataclasses
import uuid

from shared import events as ev
from shared import subjects
from shared.config import ConsumerConfig
from cli.replay.sandbox import LogBus
from services.responder.webhook_claims import Claim, lead_key
from shared.consumer import ConsumerRunner
from shared.node import Context, gather
from shared.store import MemoryStore
from shared.site_config import SiteConfig
from shared.state import ConversationState, Record, encode_state, fold


def requested(site, session="s1", turn=1, event_id=None):
    return ev.TurnRequested(event_id=event_id or ev.new_id(), site=site, session_id=session, turn=turn,
                            ts=ev.now(), producer="test", message="hello")


def turn(site, session, number, message, **fields) -> ev.TurnRequested:
    """The visitor's message that starts turn `number`."""
    return ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=number, ts=ev.now(),
                            producer="test", message=message, **fields)


def records_of(*events: ev.Envelope) -> list[Record]:
    """`events` as the log would hold them, stored in this order (no bus)."""
    return [Record(seq=i, subject=subjects.conv(e.site, e.session_id, ev.event_type(e)), event=e)
            for i, e in enumerate(events, start=1)]


def state_of(*events: ev.Envelope) -> ConversationState:
    """The conversation's state after `events`, stored in this order (no bus)."""
    return fold(records_of(*events))


def fast(**over) -> ConsumerConfig:
    return ConsumerConfig(**{"max_deliver": 3, "ack_wait_s": 2.0, "backoff_s": (0.05, 0.1), "concurrency": 4,
                             "drain_timeout_s": 2.0, **over})


async def wait_for(predicate, timeout=10.0, what="condition"):
    """The first truthy answer of `predicate` (a plain or an async function), polled until
    `timeout`; `what` names the condition in the failure."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not met within {timeout} s")


async def events_of(bus, site, session="s1"):
    return [r.event for r in await bus.read(subjects.conversation(site, session))]


async def briefs_queue_empty(bus) -> bool:
    """The briefs work queue holds nothing: every item acked (and so removed)."""
    return (await bus.js.stream_info(subjects.BRIEFS_STREAM)).state.messages == 0


def unique(name):
    return f"{name}_{uuid.uuid4().hex[:8]}"


def own(site, handle):
    """Durables see every site's events; a test's handler acts only on its own site's."""

    async def guarded(event, inputs, ctx):
        if event.site != site:
            return []
        return await handle(event, inputs, ctx)

    return guarded


def isolated(node, site, name=None):
    """`node` under a durable of its own (`name`, else a unique one) acting only on `site`'s
    events: tests share one server, and a durable sees every site's events. Another site's
    event does not concern it (`Needs.when`): acked with nothing gathered, so its inputs'
    waits never hold the runner up for other tests' conversations."""
    when = node.needs.when
    needs = dataclasses.replace(node.needs, when=lambda event: event.site == site and (when is None or when(event)))
    return dataclasses.replace(node, name=name or unique(node.name), handle=own(site, node.handle), needs=needs)


async def start(bus, node, config=None, configs=None):
    runner = ConsumerRunner(bus, node, config or fast(), configs=configs, start_lookback_s=5)
    await runner.start()
    return runner


class ClaimsInMemory:
    """WebhookClaims (services/responder/webhook_claims.py) without the bucket: the first event
    to claim a conversation's lead, or a handoff request's delivery, owns it."""

    def __init__(self, key=lead_key):
        self.key = key
        self.claims: dict[str, Claim] = {}

    async def claim(self, site, session_id, event_id):
        return self.claims.setdefault(self.key(site, session_id, event_id), Claim(owner=event_id))

    async def settle(self, site, session_id, owner, outcome):
        self.claims[self.key(site, session_id, owner)] = Claim(owner=owner, outcome=outcome)


class FixedConfigs:
    """A `SiteConfigs` that gives every site the same config."""

    def __init__(self, config):
        self.config = config

    async def get(self, site):
        return self.config


class RecordingBus(LogBus):
    """Stands in for the bus when a node's decision is tested alone: what the handler sends
    before it returns (LLM call records, tokens) is kept, in order (what it reads comes from
    a `MemoryStore` over `log`)."""

    def __init__(self, log: list[Record] | None = None):
        self.log = log or []
        self.emitted: list[ev.Envelope] = []
        self.tokens: list[ev.Envelope] = []
        super().__init__(self.emitted.append, self.tokens.append)


@dataclasses.dataclass
class Decision:
    events: list  # what the handler returned (the runner stores them)
    emitted: list  # what it stored itself before returning
    tokens: list  # what it streamed


async def decide(node, event, *given, config=None, late=(), attempt=1) -> Decision:
    """Given these events (the conversation so far), when `event` arrives, then the node
    decides these events: its handler on the inputs the runner would gather, no server.
    `event` is in the state, as it is in the log by the time a node sees it."""
    records = records_of(*given, event)
    bus = RecordingBus(records)
    if not node.concerns(event):
        return Decision([], [], [])
    inputs = await gather(node.needs, event, MemoryStore(lambda: records), FixedConfigs(config or SiteConfig()))
    if inputs is None:  # a join this event does not complete: acked, nothing out
        return Decision([], [], [])
    inputs = dataclasses.replace(inputs, late=tuple(late))
    ctx = Context(out=bus, node=node.name, cause=event, attempt=attempt)
    given_state = encode_state(inputs.state)
    outputs = list(await node.handle(event, inputs, ctx))
    # The store hands handlers its cached state itself (shared/store/cached.py), shared by all.
    assert encode_state(inputs.state) == given_state, f"{node.name} changed the state it was given"
    return Decision(outputs, bus.emitted, bus.tokens)


class StructuredLLM:
    """Stands in for `LLMClient` where a node asks for a structured answer
    (`structured(role, messages, record, cls)`): each call gets the next of `answers` (the last
    one again once they run out), raised when it is an exception; `calls` keeps the messages
    of each call."""

    def __init__(self, *answers, history_tokens: int = 8000):
        self.answers = list(answers)
        self.calls: list[list[dict]] = []
        self._history_tokens = history_tokens

    def history_tokens(self, role: str) -> int:
        return self._history_tokens

    def configured(self, role: str) -> bool:
        return True

    def role_record(self, role: str) -> ev.LLMRole:
        return ev.LLMRole(model="structured")

    async def structured(self, role, messages, record, cls, **params):
        self.calls.append(messages)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def record_conversations(system, site: str, scripts) -> list[str]:
    """Each script's messages said in a conversation of its own over HTTP SSE, every turn read
    to its end: the session ids, in the scripts' order."""
    import httpx

    from cli.harness.sse import Conversation

    sessions = []
    async with httpx.AsyncClient(timeout=30) as client:
        for script in scripts:
            visitor = Conversation(client, system.gateway_url, site)
            for message in script:
                result = await visitor.say(message)
                assert result.final["type"] == "complete", result.events[-1:]
            sessions.append(visitor.session_id)
    return sessions


def gateway_paths(app) -> set[str]:
    """Every path the gateway's app serves, those of its included routers too (FastAPI keeps
    an included router as one node of `app.routes`)."""
    from fastapi.routing import iter_route_contexts

    return {route.path for route in iter_route_contexts(app.routes)}


def graph_under(env: dict[str, str]):
    """A rerun's nodes as a process with `env` (and no other LLM setting) makes them: it reads
    its settings when they are made."""
    import pytest

    from cli.replay.graph import Graph

    with pytest.MonkeyPatch.context() as patch:
        for name in ("LLM_BASE_URL", "LLM_SUGGESTIONS_BASE_URL", "ANSWER_BACKEND"):
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        return Graph()
