"""Human handoff in the gateway (issue 42): who holds a conversation, what the operator
wrote among its messages, and the visitor's live channel of what operators do.

- `Claims`: the first claim of a handoff wins, across requests and gateway replicas. The
  `handoff_claims` bucket's key `<site>.<session>` is `create`d by the winner (a JetStream
  compare-and-set); the value names the operator and the handoff it was for (the fold's
  `handoffs` count), so a key left behind by an earlier handoff (one ended by something
  other than this API) is taken over by a compare-and-set `update`, never honoured. The key
  is deleted when the handoff ends through this API.
- `transcript`: the fold's messages with the operator's among them (the fold keeps no
  operator message: prompts must never take one for the AI's answer).
- `follow`: the log's events on a few subjects as server-sent events, each framed with its
  stream sequence as its id, so `Last-Event-ID` resumes exactly; its two uses, `live`, a
  conversation's handoff events for its visitor, and `site_feed`, a site's handoff activity
  for its operators (the inbox's feed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from shared import events as ev
from shared import subjects
from shared.bus import Bus, stored_event
from shared.state import ConversationState
from shared.store import ConversationStore
from services.gateway import frames
from services.gateway.schemas import RequestError

# A live channel reads the log again this often with no wake-up: a wake-up (a core NATS
# message) may arrive before the stream's replica answering the read has stored its event.
POLL_S = 2.0
RECHECK_S = (0.05, 0.2, 0.5)  # a wake-up that found nothing new reads again after these


class Claim(msgspec.Struct, kw_only=True):
    operator: str
    handoff: int  # the fold's `handoff.handoffs` when claimed: which handoff of the conversation
    actor: str = ""  # the credential that claimed it (operators.Operator.actor)


class Taken(Exception):
    """Another operator holds the handoff."""

    def __init__(self, holder: str):
        super().__init__(f"{holder} holds this conversation")
        self.holder = holder


_claim = msgspec.json.Decoder(Claim)


class Claims:
    def __init__(self, bus: Bus):
        self.kv = bus.bucket(subjects.HANDOFF_CLAIM_BUCKET)

    async def claim(self, site: str, session_id: str, claim: Claim) -> int:
        """Hold the handoff for `claim.operator`: the key's revision (ours, new or already
        ours), or `Taken` naming who holds it."""
        key = subjects.kv_key(site, session_id)
        data = msgspec.json.encode(claim)
        while True:
            try:
                return await self.kv.create(key, data)
            except KeyWrongLastSequenceError:
                pass
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                continue  # deleted between the two: create again
            held = _claim.decode(entry.value)
            if held.handoff == claim.handoff:
                if held.operator != claim.operator:
                    raise Taken(held.operator)
                return entry.revision
            try:  # an earlier handoff's claim, left behind: taken over, first update wins
                return await self.kv.update(key, data, last=entry.revision)
            except KeyWrongLastSequenceError:
                continue

    async def holder(self, site: str, session_id: str) -> Claim | None:
        try:
            entry = await self.kv.get(subjects.kv_key(site, session_id))
        except KeyNotFoundError:
            return None
        return _claim.decode(entry.value)

    async def end(self, site: str, session_id: str) -> None:
        """The handoff ended: the next one's first claim wins again."""
        await self.kv.delete(subjects.kv_key(site, session_id))


BETWEEN_TURNS = ("operator_message", "handoff_ended")  # what `transcript` shows among the turns


async def written_between(store: ConversationStore, site: str, session_id: str) -> list[ev.Envelope]:
    """The conversation's events `transcript` shows between its turns, in the order written."""
    found = await asyncio.gather(*(store.events(site, session_id, kind) for kind in BETWEEN_TURNS))
    return sorted((e for events in found for e in events), key=lambda e: e.ts)


def transcript(state: ConversationState, between: Sequence[ev.Envelope]) -> list[dict]:
    """The conversation's messages in order, with what was written between turns (`between`:
    the operators' messages, role "operator", and the site's notice when nobody could take a
    handoff, role "notice"; any other event is passed over). Written between turns (its `turn`
    is the latest then): after that turn's messages, before the next turn's."""
    items = [(m.turn, 0, {"role": m.role, "content": m.content, "turn": m.turn}) for m in state.messages]
    for m in between:
        if isinstance(m, ev.OperatorMessage):
            items.append((m.turn, 1, {"role": "operator", "content": m.text, "turn": m.turn, "operator": m.operator,
                                      "ts": m.ts}))
        elif isinstance(m, ev.HandoffEnded) and m.message:
            items.append((m.turn, 1, {"role": "notice", "content": m.message, "turn": m.turn, "ts": m.ts}))
    # sorted is stable: within a turn and rank, log order stays.
    return [item for _, _, item in sorted(items, key=lambda i: (i[0], i[1]))]


def frame_of(event: ev.Envelope) -> dict:
    """What the widget gets of a handoff event: never the credential or the ids."""
    match event:
        case ev.OperatorJoined():
            return {"type": "operator_joined", "operator": event.operator}
        case ev.OperatorMessage():
            return {"type": "operator_message", "operator": event.operator, "text": event.text, "ts": event.ts}
        case ev.OperatorLeft():
            return {"type": "operator_left", "operator": event.operator}
        case ev.HandoffEnded():
            return {"type": "handoff_ended", "outcome": event.outcome, "message": event.message, "ts": event.ts}
    raise ValueError(f"not a handoff event: {ev.event_type(event)}")


def last_seq(header: str | None) -> int:
    """The stream sequence the live channel's client last got (`Last-Event-ID`), 0: none."""
    if not header:
        return 0
    if not header.isdigit() or len(header) > 19:
        raise RequestError("last-event-id", f"expected the last frame's id (a number), got {header[:40]!r}",
                           status=400)
    return int(header)


# What the operators' feed frames: the site's handoff steps, and every visitor's message (a
# turn requested), so the inbox shows a new message of a conversation it lists at once.
FEED_EVENTS = ("handoff_requested", *ev.HANDOFF_EVENTS, "turn_requested")


def feed_frame(event: ev.Envelope) -> dict:
    """What an operator's feed says of an event: which conversation and what happened in it,
    no more than the inbox's list shows (no text: the page reads the list again)."""
    frame = {"type": ev.event_type(event), "session_id": event.session_id, "turn": event.turn, "ts": event.ts}
    match event:
        case ev.HandoffRequested():
            frame["reason"] = event.reason
        case ev.OperatorJoined() | ev.OperatorMessage() | ev.OperatorLeft():
            frame["operator"] = event.operator
        case ev.HandoffEnded():
            frame |= {"outcome": event.outcome, "by": event.by}
    return frame


async def log_end(bus: Bus) -> int:
    """The sequence of the log's newest message: where a feed without `Last-Event-ID` starts."""
    return (await bus.js.stream_info(subjects.CONV_STREAM)).state.last_seq


def live(bus: Bus, site: str, session_id: str, after: int) -> AsyncIterator[bytes]:
    """The conversation's handoff events for its visitor (`frame_of`), stored after `after`."""
    return follow(bus, subjects.conv(site, session_id, "*"),
                  [subjects.conv(site, session_id, kind) for kind in ev.HANDOFF_EVENTS], frame_of, after)


async def site_feed(bus: Bus, site: str, after: int) -> AsyncIterator[bytes]:
    """The site's handoff activity for its operators (`feed_frame`), stored after `after`: first
    a `ready` frame whose id is `after` (the client then has an id to resume from, and reads
    the inbox's list once: the feed has what comes after), then the site's `FEED_EVENTS`. Only
    the site's own subjects are read or subscribed to: no other tenant's event can show."""
    yield frames.frame({"type": "ready"}, str(after))
    async for chunk in follow(bus, subjects.conv_of_type("*", site),
                              [subjects.conv_of_type(kind, site) for kind in FEED_EVENTS], feed_frame, after):
        yield chunk


async def follow(bus: Bus, read: str, wanted: Sequence[str], frame: Callable[[ev.Event], dict],
                 after: int) -> AsyncIterator[bytes]:
    """The events stored on `read` after sequence `after` whose subject one of `wanted` names
    (each within `read`), framed by `frame` with its sequence as its id, then each as it is
    stored, until the client goes (the response cancels this). Subscribed to `wanted` (plain
    NATS: wake-ups) before the first read, so nothing stored in between is missed; the reads
    go by sequence, so nothing is sent twice."""
    woken = asyncio.Event()

    async def wake(_msg) -> None:
        woken.set()

    subs = []
    try:
        for subject in wanted:
            subs.append(await bus.nc.subscribe(subject, cb=wake))
        while True:
            woken.clear()
            sent = False
            for pause in (0.0, *RECHECK_S):
                if pause:
                    await asyncio.sleep(pause)
                out = []
                async for seq, subject, data in bus.read_raw(read, after):
                    after = seq
                    if any(subjects.matches(w, subject) for w in wanted) and \
                            (event := stored_event(seq, subject, data)) is not None:
                        out.append(frames.frame(frame(event), str(seq)))
                if out:
                    yield b"".join(out)
                    sent = True
                if sent or not woken.is_set():
                    break
            try:
                await asyncio.wait_for(woken.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
    finally:
        for sub in subs:
            await sub.unsubscribe()
