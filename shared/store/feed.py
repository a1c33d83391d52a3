"""The conversation log pushed to this process as it is stored, folded into the fold cache,
so a handler's load for the event it acts on finds its state current without reading the
log (cached.py: `CachedStore.state`).

Without it, every handler's load is a read of the log: a round trip to the server on the
turn's critical path, and the fold of what the conversation stored since this process last
looked (for the router's analyses at a `TurnRequested`, the previous turn's tail: its
retrieved documents and LLM call records). With it, the events are decoded and folded as
they come, mostly while the visitor reads.

One ordered push consumer a process, over every conversation (`conv.>`, from the newest
message), in memory on the server and gone with the connection. How it stays right:

- A cached state is *attached* once it is known to hold every event of its conversation up
  to a log position from which the feed holds every message it has been delivered: a read
  made for an event (complete up to that event: the read's `at`) whose position is at or
  after the start of the feed's memory of recent messages (`RECENT` of them), once the feed
  has delivered that event (a lagging feed attaches nothing, so loads do not wait for it). The
  conversation's messages in that memory past the event are folded in at once. Or a
  conversation the process has just made up (the gateway's new session, `CachedStore.begin`):
  empty, it holds every event there is.
- An attached state gets each later event of its conversation as the feed delivers it, so
  the cached state and the messages waiting to be folded hold every event of that
  conversation up to the feed's position. A load for an event at or before that position
  folds the waiting messages and returns the cached state, no read.
- A break in the feed (a consumer sequence that skips: a message dropped by a slow
  subscription, the consumer re-created after a reset or a reconnect) detaches every state
  and clears the memory: loads read the log again, and attach anew.
- A conversation evicted from the cache, or dropped (a rewritten log, a fold that failed),
  is detached with it.

The cost: each process with a folding node receives every conversation's events, and
decodes and folds those of the conversations it has cached. Before, the same process read
(most of) those same events at each handler's load; with replicas, each replica receives
them all where it read only its own conversations' (see docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from nats.js import api

from shared import events as ev
from shared import metrics, subjects
from shared.bus import delivery, stored_event
from shared.state import Record, apply, fork

if TYPE_CHECKING:
    from shared.bus import Bus
    from shared.state import ConversationState

log = logging.getLogger(__name__)

# Messages remembered for attaching: a read attaches its state when its event is no older
# than the oldest of them. At 17 events a turn, 2048 are a few seconds of a busy process.
RECENT = 2048
# How long a load waits for the feed to reach its event (delivered to the node a moment
# before the feed had it, or the other way round) before it reads the log instead.
WAIT_S = 0.05


class Cache(Protocol):
    """What the feed asks of the fold cache (cached.py's `FoldCache`)."""

    def get(self, site: str, session_id: str) -> ConversationState | None: ...
    def peek(self, site: str, session_id: str) -> ConversationState | None: ...
    def unlent(self, site: str, session_id: str) -> ConversationState | None: ...
    def put(self, state: ConversationState, unlent: bool = False) -> None: ...
    def drop(self, site: str, session_id: str) -> None: ...
    def attached(self, site: str, session_id: str) -> bool: ...
    def attach(self, site: str, session_id: str) -> None: ...
    def detach_all(self) -> None: ...


class LogFeed:
    def __init__(self, cache: Cache, recent: int = RECENT):
        self.cache = cache
        self.position = 0  # the stream sequence of the last message delivered
        self._start: int | None = None  # every message after this one has been delivered (None: none yet)
        self._recent: deque[tuple[int, str, bytes]] = deque(maxlen=recent)
        self._waiting: dict[tuple[str, str], list[tuple[int, str, bytes]]] = {}
        self._consumer_seq = 0
        self._consumer: str | None = None
        self._reached: list[tuple[int, int, asyncio.Future]] = []  # (seq, tiebreak, future) heap
        self._tiebreak = itertools.count()
        self._flush_scheduled = False
        self._sub = None
        self.bus: Bus | None = None
        self.breaks = 0
        # Waits on a conversation's next message (`changed`): done then, or at a break.
        self._changes: dict[tuple[str, str], list[asyncio.Future]] = {}

    # --- the subscription ---------------------------------------------------------------

    @property
    def following(self) -> bool:
        """Whether its subscription is there, on an open connection."""
        return self._sub is not None and self.bus is not None and not self.bus.nc.is_closed

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        last = (await bus.js.stream_info(subjects.CONV_STREAM)).state.last_seq
        self._sub = await bus.js.subscribe(
            subjects.CONV_SUBJECTS, stream=subjects.CONV_STREAM, cb=self._on_message, ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.NEW)
        # nats-py makes an ordered consumer again (a missed heartbeat, a reconnect) from the
        # last stream sequence it delivered + 1: from 1 before its first message, which would
        # replay the whole log into every following process. From the stream's end when it
        # subscribed instead, as DeliverPolicy.NEW began (nats-py 2.16's own state; checked
        # by tests/test_feed.py).
        jsi = getattr(getattr(self._sub, "_sub", None), "_jsi", None)
        if jsi is not None and jsi._sseq == 0:
            jsi._sseq = last

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - a closed connection took it already
                pass
        self._break(counted=False)

    async def _on_message(self, msg) -> None:
        at = delivery(msg.reply)  # where the message sits, from its reply subject
        self.take(at.stream_seq, at.consumer_seq, at.consumer, msg.subject, msg.data)

    def take(self, seq: int, consumer_seq: int, consumer: str, subject: str, data: bytes) -> None:
        """One delivered message (`_on_message`; tests call it directly)."""
        if self._consumer is not None and (consumer != self._consumer or consumer_seq != self._consumer_seq + 1):
            log.info("log feed restarted: cached states detached", extra={
                "after_seq": self.position, "seq": seq, "consumer_seq": consumer_seq})
            metrics.log_feed_breaks.labels("restart").inc()
            self._break()
        self._consumer, self._consumer_seq = consumer, consumer_seq
        if self._start is None:
            self._start = seq - 1
        self.position = max(self.position, seq)
        self._recent.append((seq, subject, data))
        key = subjects.conversation_of(subject)
        if key is not None and self.cache.attached(*key):
            self._waiting.setdefault(key, []).append((seq, subject, data))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            for change in self._changes.pop(key, ()):
                if not change.done():
                    change.set_result(None)
        while self._reached and self._reached[0][0] <= self.position:
            future = heapq.heappop(self._reached)[2]
            if not future.done():
                future.set_result(None)

    def _break(self, counted: bool = True) -> None:
        """Forget what the feed held: every state detached, the memory cleared; the next
        message delivered starts them again."""
        if counted:
            self.breaks += 1
        self._start = None
        self._recent.clear()
        self._waiting.clear()
        self.cache.detach_all()
        changes, self._changes = self._changes, {}
        for change in itertools.chain.from_iterable(changes.values()):
            if not change.done():
                change.set_result(None)

    def _flush(self) -> None:
        """Fold what waits, once per burst of messages (at most one fork a conversation)."""
        self._flush_scheduled = False
        for key in list(self._waiting):
            self.fold(*key)

    # --- what loads ask ------------------------------------------------------------------

    def current(self, site: str, session_id: str, seq: int) -> bool:
        """Whether the cached state, once `fold`ed, holds the conversation's log up to `seq`."""
        return self.position >= seq and self.cache.attached(site, session_id)

    async def reach(self, seq: int, timeout_s: float = WAIT_S) -> bool:
        """Wait, at most `timeout_s`, until the feed has delivered `seq`."""
        if self.position >= seq:
            return True
        if self._start is None and self._sub is None:
            return False
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._reached, (seq, next(self._tiebreak), future))
        try:
            await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            pass
        return self.position >= seq

    def changed(self, site: str, session_id: str) -> asyncio.Future:
        """A future done when the feed delivers the conversation's next message (while it
        keeps the conversation's state) or breaks: what a wait on the cached state awaits.
        A waiter that stops waiting first hands it back (`unwatch`)."""
        change = asyncio.get_running_loop().create_future()
        self._changes.setdefault((site, session_id), []).append(change)
        return change

    def unwatch(self, site: str, session_id: str, change: asyncio.Future) -> None:
        changes = self._changes.get((site, session_id))
        if changes and change in changes:
            changes.remove(change)
            if not changes:
                del self._changes[(site, session_id)]

    def lagging(self, seq: int) -> None:
        """A load waited in vain for the feed to reach `seq` (a consumer gone, a process too
        busy to take its messages): loads read the log again until the feed has caught up
        and states are attached anew."""
        log.warning("log feed behind a handled event: cached states detached", extra={
            "position": self.position, "seq": seq})
        metrics.log_feed_breaks.labels("lagging").inc()
        self._break()

    def fold(self, site: str, session_id: str) -> None:
        """Fold the conversation's waiting messages into its cached state: in place when nobody
        got it since the feed folded it last (`FoldCache.unlent`), else into a fork."""
        key = (site, session_id)
        records = self._waiting.pop(key, None)
        if not records:
            return
        if not self.cache.attached(site, session_id):
            return
        # Folded in place when nobody got the state since the feed last folded it; else into a fork.
        folded = self.cache.unlent(site, session_id)
        state = folded or self.cache.peek(site, session_id)
        if state is None:
            return
        before = state.last_seq
        try:
            for seq, subject, data in records:
                if seq <= (folded or state).last_seq:
                    continue
                if (event := stored_event(seq, subject, data)) is None:
                    continue
                if isinstance(event, ev.TurnRequested) and event.turn <= (folded or state).turn:
                    # A turn folded already, appended again: the log was rewritten (a visitor's
                    # erasure). The next load folds it from the beginning.
                    self.cache.drop(site, session_id)
                    return
                folded = folded or fork(state)
                apply(folded, Record(seq=seq, subject=subject, event=event))
        except Exception:
            log.exception("log feed fold failed: the conversation is read again", extra={
                "site": site, "session_id": session_id})
            self.cache.drop(site, session_id)
            return
        if folded is not None and folded.last_seq > before:
            self.cache.put(folded, unlent=True)

    def adopt(self, site: str, session_id: str) -> None:
        """A conversation this process has just made up (a session id it issued): its cached
        state, empty, holds every event there is, so the feed keeps it current from its first."""
        state = self.cache.peek(site, session_id)
        if self.following and state is not None and state.event_count == 0:
            self.cache.attach(site, session_id)

    def attach(self, site: str, session_id: str, upto: int) -> None:
        """The cached state holds the conversation's log up to `upto` (a read for the event
        there): from now on the feed keeps it current, if its memory reaches back that far."""
        if self._start is None or self.position < upto or self.cache.get(site, session_id) is None:
            # Not before the feed has delivered the read's event: a feed that lags behind the
            # nodes' own deliveries leaves states detached, and loads read without waiting for it.
            return
        oldest = self._recent[0][0] - 1 if len(self._recent) == self._recent.maxlen else self._start
        if upto < oldest:
            return
        waiting = self._waiting.setdefault((site, session_id), [])
        past = []
        for seq, subject, data in reversed(self._recent):
            if seq <= upto:
                break
            if subjects.in_conversation(subject, site, session_id):
                past.append((seq, subject, data))
        waiting[:0] = reversed(past)
        self.cache.attach(site, session_id)
        self.fold(site, session_id)
