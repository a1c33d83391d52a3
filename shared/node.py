"""The node seam: what a graph node declares, and what the runner hands it.

A node names the event types it consumes and everything it reads to decide (`Needs`): the
conversation's folded state, the site's config, events of this turn to wait for (each wait
with its deadline), the conversation's stored events of some types, the site's open leads,
the turn's route (to cancel work routed away), the knowledge base's vectors, and which of the
consumed events concern it at all (`when`). The runner (shared/consumer.py) gathers those
`Inputs` from the conversation store (shared/store), then calls

    handle(event, inputs, ctx) -> events

so a node reads top to bottom as inputs → decision → events, and its decision is tested by
handing it inputs, with no server (tests/helpers.py `decide`). A handler reads nothing else:
it never touches the bus. `ctx` makes the output events (derived ids, so a redelivered input
gives the same events) and sends what must go out before the handler returns (tokens, LLM
call records). The state in the inputs is shared with other handlers: read it, never change it.

    Node("answer_writer", consumes=("route_decided",), handle=answer,
         needs=Needs(config=True, waits=(Wait(("retrieval_completed", "skills_applied"), 1.5),),
                     when=lambda event: event.route == "ANSWER"))
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Awaitable, Callable, Mapping, Sequence

from shared import subjects
from shared import events as ev
from shared.bus import Bus, Position
from shared.site_config import SiteConfig, SiteConfigs
from shared.state import ConversationState
from shared.store import ConversationStore, Route

log = logging.getLogger(__name__)


class PermanentError(Exception):
    """The handler knows a retry cannot help (bad input, an exhausted dependency)."""


class Later(Exception):
    """Not yet: the handler's moment has not come (a deadline in the future). The runner hands
    the event back to the server to be delivered again in `delay_s` (counted as deferred, not
    retried; the server still counts the delivery against `max_deliver`, so a handler defers
    once or twice, not in a loop); the server keeps the time, so the event comes back however
    often the runner restarts."""

    def __init__(self, delay_s: float):
        super().__init__(f"not before {delay_s:.1f} s")
        self.delay_s = delay_s


@dataclass(frozen=True)
class Wait:
    """Wait for these event types of the event's turn, at most `deadline_s` after the event
    reached the runner; what is still missing then is named in `Inputs.late`."""

    kinds: tuple[str, ...]
    deadline_s: float
    # The conversation's own deadline, given the site's config and the state folded so far
    # (e.g. the site's `enrichment.budget_ms`), None for `deadline_s`, `NOT_WAITED` when the
    # wait does not apply (e.g. the profile is known already: its kinds are then not `late`
    # either); a node with such a wait needs the site's config.
    per_site: Callable[[SiteConfig, ConversationState], float | None] | None = None

    def deadline(self, config: SiteConfig, state: ConversationState) -> float:
        own = self.per_site(config, state) if self.per_site is not None else None
        return self.deadline_s if own is None else own


NOT_WAITED = -1.0  # Wait.per_site's answer for a wait that does not apply to this event


@dataclass(frozen=True)
class Needs:
    state: bool = False  # the conversation's folded state (snapshot + tail)
    config: bool = False  # the site's config (defaults for a site without one)
    waits: tuple[Wait, ...] = ()  # implies state: the state once these are in, or late
    log: tuple[str, ...] = ()  # every stored event of these types in the conversation → Inputs.log[type]
    latest: tuple[str, ...] = ()  # the newest stored event of each of these types → Inputs.latest[type]
    open_briefs: bool = False  # the latest brief of each of the site's open leads → Inputs.open_briefs
    # The account the event names (its `account_id`) and the site's historical deals →
    # Inputs.account, Inputs.deals (shared/accounts.py)
    portfolio: bool = False
    accounts: bool = False  # every account of the site → Inputs.accounts
    route: bool = False  # the turn's route as it is decided → Inputs.route, to cancel work routed away
    kb_vectors: bool = False  # the knowledge base's vectors bucket → Inputs.kb_vectors (None: none)
    # Implies state: a join of parallel analyses of one turn, the node consuming each of these
    # types. Only the delivery of the one the log stored last, once all are stored, reaches the
    # handler (the others are acked, nothing out): the turn is acted on once, not once per analysis.
    join: tuple[str, ...] = ()
    when: Callable[[ev.Envelope], bool] | None = None  # False: not this node's event (acked, nothing out)

    @property
    def folds(self) -> bool:
        """Whether the node is given the conversation's folded state."""
        return self.state or bool(self.waits) or bool(self.join)


_NOTHING: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Inputs:
    state: ConversationState = field(default_factory=ConversationState)
    config: SiteConfig = field(default_factory=SiteConfig)
    late: tuple[str, ...] = ()  # awaited event types not stored by their deadline
    log: Mapping[str, tuple[ev.Envelope, ...]] = field(default_factory=lambda: _NOTHING)
    latest: Mapping[str, ev.Envelope | None] = field(default_factory=lambda: _NOTHING)
    open_briefs: tuple[ev.BriefCompleted, ...] = ()
    account: ev.Account | None = None
    deals: tuple[ev.Deal, ...] = ()
    accounts: tuple[ev.Account, ...] = ()
    route: Route | None = None
    kb_vectors: object | None = None


@dataclass
class Context:
    """What a handler gets besides its event and inputs: a way to make and send events
    (`out`: where they go; a handler reads nothing through it)."""

    out: Bus
    node: str
    cause: ev.Envelope
    attempt: int
    input_seq: int = 0  # the log position of the state the handler was given, stamped on its outputs
    config_version: str = ""  # the version of the site config the handler was given, stamped likewise
    # The time outputs are stamped with: now, or in a replay a fixed one, so a rerun makes the
    # same log twice. Decisions read no clock.
    clock: Callable[[], float] = ev.now
    first_token_ts: float = 0.0  # when the handler's first token went out (`clock`; 0: none yet)
    _llm_calls: int = 0

    def follow(self, cls: type, key: str | None = None, *, cause_id: str | None = None, **fields):
        """An event caused by the handled event, or by the event `cause_id` names (one output
        per turn whichever of several inputs woke the node: its id derives from the cause)."""
        event = ev.follow(self.cause, cls, self.node, key, ts=self.clock(), **fields)
        event.input_seq = self.input_seq
        event.config_version = self.config_version
        if cause_id is None:
            return event
        event.causation_id = cause_id
        event.event_id = ev.derived_id(cause_id, self.node, key or cls.__struct_config__.tag)
        return event

    async def emit(self, event: ev.Envelope) -> None:
        """Store an event now, before the handler returns (e.g. an LLM call record)."""
        await self.out.publish(event)

    async def record_llm(self, call: ev.LLMCall) -> None:
        """Store one LLM call; each attempt's calls keep their own ids. A call too big for
        the bus is stored truncated (`call.truncated`), never failing the turn."""
        self._llm_calls += 1
        record = self.follow(ev.LLMCallRecorded, key=f"llm-{self.attempt}-{self._llm_calls}", node=self.node, call=call)
        record = ev.fit_llm_call(record, self.out.max_event_bytes)
        if record.call.truncated:
            log.warning("LLM call record truncated to fit the bus",
                        extra={"node": self.node, "role": call.role, "chars_cut": record.call.truncated})
        await self.emit(record)

    async def token(self, index: int, content: str) -> None:
        chunk = self.follow(
            ev.TokenChunk, key=f"token-{self.attempt}-{index}", index=index, content=content, attempt=self.attempt
        )
        await self.out.publish_token(chunk)
        if not self.first_token_ts:
            self.first_token_ts = chunk.ts

    async def stream(self, chunk: ev.SourcesAttached) -> None:
        """Send something on the turn's token stream besides tokens (the sources ahead of them)."""
        await self.out.publish_token(chunk)


Handler = Callable[[ev.Envelope, Inputs, Context], Awaitable[Sequence[ev.Envelope]]]


def conversation_only(event: ev.Envelope) -> bool:
    """A `Needs.when` for nodes whose work reaches outside (webhooks, e-mail, a lead's brief):
    a visitor's conversation only, never a site's own log (a test case's run asks its
    questions in sessions of its own: shared/eval_runs.py)."""
    return ev.is_conversation(event.session_id)


def turn_failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.Envelope:
    """The default failure event: the turn failed (the gateway ends its stream)."""
    return ev.follow(event, ev.TurnFailed, node, key="failed", node=node, reason=reason[:2000],
                     attempts=attempts, failed_event_id=event.event_id)


Failure = Callable[[ev.Envelope, str, int, str], ev.Envelope]


@dataclass(frozen=True)
class Node:
    """A graph node: the event types it consumes, what it needs, and its handler."""

    name: str
    consumes: tuple[str, ...]
    handle: Handler
    needs: Needs = Needs()
    stream: str = subjects.CONV_STREAM  # or BRIEFS: work items, each gone once handled
    # At most this many of the node's events handed out and not yet acked, across all its
    # replicas (the durable's max ack pending): a limit on e.g. LLM calls that holds for the
    # whole deployment. None: the runner's default (several times its own concurrency).
    max_in_flight: int | None = None
    failure: Failure = turn_failed  # the event that records its last attempt failing
    # > 0: the node's events split by site into this many partitions, each consumed by one of
    # its replicas at a time (shared/partitions.py); 0: one durable shared by all replicas.
    partitions: int = 0
    # Told the partitions this replica consumes (and their count) whenever they change.
    on_partitions: Callable[[frozenset[int], int], Awaitable[None]] | None = None

    def concerns(self, event: ev.Envelope) -> bool:
        return self.needs.when is None or self.needs.when(event)


def joined(kinds: tuple[str, ...], event: ev.Envelope, state: ConversationState) -> bool:
    """Whether `event` completes the join of `kinds` in its turn: all are stored, and it is the
    one stored last (the state's `seen` is in log order)."""
    record = state.turns.get(event.turn)
    if record is None or not set(kinds) <= set(record.seen):
        return False
    return [kind for kind in record.seen if kind in kinds][-1] == ev.event_type(event)


async def _portfolio(store: ConversationStore, event: ev.Envelope) -> dict:
    account, deals = await store.portfolio(event.site, getattr(event, "account_id", ""))
    return {"account": account, "deals": tuple(deals)}


async def gather(needs: Needs, event: ev.Envelope, store: ConversationStore, configs: SiteConfigs | None,
                 at: Position | None = None) -> Inputs | None:
    """Read what `needs` asks from `store`, for `event`'s conversation and turn; `at`: where
    `event` sits in the log (reads see the log at least that far). None: a join this event
    does not complete (`Needs.join`), nothing for the handler."""
    started = time.monotonic()
    site, session = event.site, event.session_id
    state = ConversationState()
    late: list[str] = []
    config: SiteConfig | None = None

    async def site_config() -> SiteConfig:
        nonlocal config
        if config is None:
            config = (await configs.get(site) if configs is not None else SiteConfig()) if needs.config else SiteConfig()
        return config

    if needs.waits:
        loaded = False
        skipped: set[str] = set()
        for wait in needs.waits:
            deadline = wait.deadline(await site_config(), state) if wait.per_site is not None else wait.deadline_s
            if deadline < 0 and loaded:  # NOT_WAITED: nothing to wait for, nothing late
                skipped.update(wait.kinds)
                continue
            deadline = max(deadline, 0.0)
            remaining = deadline - (time.monotonic() - started)
            record = state.turns.get(event.turn)
            missing = set(wait.kinds) - set(record.seen if record else ())
            # Past this wait's deadline (an earlier wait used it up), the log is still read
            # once more for what it may have stored meanwhile; a wait of 0 s reads nothing more.
            if remaining > 0 or not loaded or (missing and deadline > 0):
                state = await store.turn_state(event, set(wait.kinds), max(0.0, remaining), at)
                loaded = True
        record = state.turns.get(event.turn)
        seen = set(record.seen) if record else set()
        late = [kind for wait in needs.waits for kind in wait.kinds if kind not in seen and kind not in skipped]
    elif needs.state or needs.join:
        state = await store.state(site, session, at, event.turn)
    if needs.join and not joined(needs.join, event, state):
        return None
    config = await site_config()
    # A node reading several types reads them at once: one round trip, not one per type.
    logs = await asyncio.gather(*(store.events(site, session, kind, at) for kind in needs.log))
    return Inputs(
        state=state, config=config, late=tuple(late),
        log=MappingProxyType({kind: tuple(found) for kind, found in zip(needs.log, logs)}) if needs.log else _NOTHING,
        latest=MappingProxyType({kind: await store.latest(site, session, kind, at) for kind in needs.latest})
        if needs.latest else _NOTHING,
        open_briefs=tuple(await store.open_briefs(site)) if needs.open_briefs else (),
        **(await _portfolio(store, event) if needs.portfolio else {}),
        accounts=tuple(await store.accounts(site)) if needs.accounts else (),
        route=await store.route(event, at) if needs.route else None,
        kb_vectors=store.kb_vectors() if needs.kb_vectors else None)
