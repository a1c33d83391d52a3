"""The conversation store: the one seam through which nodes and the gateway read.

Everything a node decides from (its `Inputs`, shared/node.py) is read here, as its `Needs`
declare, and nothing else reads the log for it:

    state(site, session, at)            the folded state holding the log up to `at`
    turn_state(event, kinds, timeout)   the state once the turn's `kinds` are in, or at the deadline
    events / latest(site, session, kind) a conversation's stored events of one type
    open_briefs(site)                   the latest brief of each of the site's open leads
    portfolio(site, account)            an account of the site and the site's historical deals
    accounts(site)                      every account of the site (an opportunity search's batch)
    route(event)                        the turn's route as it is decided (cancel work routed away)
    kb_vectors()                        the knowledge base's vectors bucket

`at` is the `Position` of the event acted on: a read given it sees the log at least that far,
even from a replica behind it. States given out are shared and never changed after: the
caller only reads them.

Three implementations:

    JetStreamStore (jetstream.py)  snapshot + tail, read from the bus each time (CLIs, tests)
    CachedStore    (cached.py)     the same with a fold cache kept current by the log feed
                                   (feed.py) and shared in-flight reads: one per process, the
                                   services' and the gateway's
    MemoryStore    (memory.py)     over a log in memory: a replay's sandbox, a node's test
"""

from __future__ import annotations

from typing import Protocol

from shared import events as ev
from shared.bus import Position
from shared.state import ConversationState
from shared.store.cached import CachedStore, FoldCache
from shared.store.jetstream import JetStreamStore
from shared.store.memory import MemoryStore
from shared.store.routes import Route


class ConversationStore(Protocol):
    async def state(self, site: str, session_id: str, at: Position | None = None,
                    turn: int = 0) -> ConversationState: ...

    async def turn_state(self, event: ev.Envelope, wanted: set[str], timeout_s: float,
                         at: Position | None = None) -> ConversationState: ...

    async def events(self, site: str, session_id: str, kind: str,
                     at: Position | None = None) -> list[ev.Envelope]: ...

    async def latest(self, site: str, session_id: str, kind: str,
                     at: Position | None = None) -> ev.Envelope | None: ...

    async def open_briefs(self, site: str) -> list[ev.BriefCompleted]: ...

    async def portfolio(self, site: str, account_id: str) -> tuple[ev.Account | None, list[ev.Deal]]: ...

    async def accounts(self, site: str) -> list[ev.Account]: ...

    async def route(self, event: ev.Envelope, at: Position | None = None) -> Route: ...

    def kb_vectors(self): ...


__all__ = ["CachedStore", "ConversationStore", "FoldCache", "JetStreamStore", "MemoryStore", "Position", "Route"]
