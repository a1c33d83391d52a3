"""`concierge chaos`'s handoff conversations (issue 42): visitors who ask for a person while
the faults go on, one operator who serves them through the operator API, each visitor's live
channel; and the audit of what they did against the log.

`--handoffs` visitors (besides the `--sessions` ones) go through handoffs until the last
fault strikes (at least one each), then end the one under way. A handoff:

- the visitor asks "Can I talk to a human?": the turn ends `complete`, route HANDOFF;
- the operator finds the conversation waiting in the inbox (`GET …/handoffs`) and claims it;
- the operator writes (a message every `WRITE_PAUSE_S`) while the visitor writes `HELD`
  messages, at the other visitors' pace (each turn ends HANDOFF, with no AI answer);
- the operator releases the conversation or closes it (in turn, each conversation starting
  with the other), and the visitor asks a product question, which the AI answers again.

The operator's requests go to gateway `a` first (the one the `handoff` scenario kills) and,
after a failed try (no answer, or a 5xx), to the next, after the widget's pauses (30 s in
all). A message is sent again with its `client_message_id`; one in `AGAIN` is also sent
again after its 2xx, as a client whose answer was lost would. Claims, releases and closes
need no id (the gateway derives theirs): a release or close answered 404 after a failed try
was done by that try. Each visitor listens on its live channel from its first handoff on,
connected to gateway `a` first; a connection cut is opened again (on `a`, else the next)
with `Last-Event-ID`, as the widget does.

The audit (pure functions of one conversation's records, in stream order, and what the
clients saw):

- `operator_messages`: every message the operator got a 2xx for is in the log exactly once
  (lost, doubled);
- `visitor_messages`: every message whose turn the gateway named (its `start` frame) is in the
  log exactly once, by its `client_message_id` (lost, doubled); for every visitor of the run;
- `ai_answers_in_handoffs`: no turn routed HANDOFF has an AI answer (a non-empty
  `ResponseCompleted` from another node than `handoff_handler`), nor a HELD turn any text;
- `live_frames`: the live channel's client, across its connections, got every handoff event
  of the log exactly once (missed, doubled);
- `handoff_states`: the handoffs ended as the operator ended them, in order; none is left
  waiting or held; every message written while held ended HANDOFF for the visitor, and every
  question after an end was answered by the AI.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from cli.harness.sse import ChatResult, read_stream
from cli.harness.visitor import RETRY_PAUSES_S, Turn, Visitor, ask
from cli.measure.bench import QUESTIONS
from shared import events as ev
from shared.state import Record, fold

OPERATOR = "Ada"
ASK = "Can I talk to a human?"
HELD = 2  # a visitor's messages per handoff while held
AGAIN = 3  # one operator message in AGAIN is sent again after its 2xx
WRITE_PAUSE_S = 0.5  # between an operator's messages
LIVE_PAUSE_S = 0.5  # before a live channel is opened again
LIVE_TIMEOUT = httpx.Timeout(40.0, connect=2.0)  # the channel sends a keep-alive every 15 s
LIVE_DRAIN_S = 10.0  # at the end, how long a live channel may take to show the last handoff's end
HANDLER = "handoff_handler"
FIGURES = ("handoffs", "released", "closed", "operator_messages", "sent_again", "operator_messages_in_log",
           "operator_messages_lost", "operator_messages_doubled", "operator_retries", "held_turns", "live_connections",
           "live_resumed", "live_frames", "live_missed", "live_doubled", "wrong_states", "operator_refused")


@dataclass
class Sent:
    """An operator message and how its POST went."""

    message_id: str
    text: str
    status: int | None = None  # the last try's (None: no answer)
    tries: int = 0
    again: bool = False  # sent again after its 2xx

    @property
    def acked(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass
class Talk:
    """One handoff conversation, as the visitor and the operator went through it."""

    visitor: Visitor
    claims: int = 0
    sent: list[Sent] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)  # the operator's ends, in order: released / closed
    held: list[Turn] = field(default_factory=list)  # the visitor's messages while held
    afters: list[Turn] = field(default_factory=list)  # the visitor's question after each end
    refused: list[str] = field(default_factory=list)  # operator steps the API refused or never answered
    retries: int = 0  # operator requests tried again after a failed try (no answer, or a 5xx)
    frames: list[tuple[int, dict]] = field(default_factory=list)  # the live channel's (id, payload)
    connections: int = 0  # live channel connections opened
    resumed: int = 0  # of those, with Last-Event-ID
    open: bool = False  # a live channel connection is open now


# --- the audit (pure) ------------------------------------------------------------------------

def operator_messages(records: Sequence[Record], sent: Sequence[Sent]) -> tuple[list[str], list[str]]:
    """Messages the operator got a 2xx for that the log lacks, and messages the log holds more
    than once (by text: the harness's are unique). One never acknowledged may be there once:
    stored, and its answer lost."""
    in_log = Counter(r.event.text for r in records if isinstance(r.event, ev.OperatorMessage))
    lost = [m.text for m in sent if m.acked and not in_log[m.text]]
    doubled = [f"{text!r} stored {n} times" for text, n in in_log.items() if n > 1]
    return lost, doubled


def visitor_messages(records: Sequence[Record], turns: Sequence[Turn]) -> tuple[list[str], list[str]]:
    """Messages whose turn the gateway named (a `start` frame) that the log lacks, and messages
    the log holds as more than one turn (by `client_message_id`)."""
    ids = Counter(r.event.client_message_id for r in records
                  if isinstance(r.event, (ev.TurnRequested, ev.TurnBlocked)) and r.event.client_message_id)
    lost = [f"turn {t.turn} ({t.message_id})" for t in turns if t.turn is not None and not ids[t.message_id]]
    doubled = [f"{message_id} stored as {n} turns" for message_id, n in ids.items() if n > 1]
    return lost, doubled


def ai_answers_in_handoffs(records: Sequence[Record]) -> list[str]:
    """Turns routed HANDOFF that an answer node answered, and HELD turns given any text."""
    routes = {r.event.turn: r.event for r in records if isinstance(r.event, ev.RouteDecided)}
    problems = []
    for record in records:
        answer = record.event
        if not isinstance(answer, ev.ResponseCompleted) or not answer.text:
            continue
        decided = routes.get(answer.turn)
        if decided is not None and decided.route == "HANDOFF" and (answer.node != HANDLER or decided.branch == "HELD"):
            problems.append(f"turn {answer.turn} routed HANDOFF/{decided.branch}: {answer.node} answered "
                            f"(seq {record.seq})")
    return problems


def live_frames(records: Sequence[Record], frames: Sequence[tuple[int, dict]]) -> tuple[list[str], list[str]]:
    """The handoff events of the log a live channel's client never got, and the frames it got
    more than once (by id: the event's stream sequence)."""
    got = Counter(frame_id for frame_id, _ in frames)
    missed = [f"seq {r.seq} {ev.event_type(r.event)}" for r in records
              if ev.event_type(r.event) in ev.HANDOFF_EVENTS and not got[r.seq]]
    doubled = [f"seq {frame_id} {n} times" for frame_id, n in got.items() if n > 1]
    return missed, doubled


def handoff_states(records: Sequence[Record], talk: Talk) -> list[str]:
    """Where the conversation's handoffs went against what the operator did: ended as the
    operator ended them, none left open, the visitor's messages while held kept from the AI
    and its questions after an end answered by it."""
    problems = []
    ended = [r.event.outcome for r in records if isinstance(r.event, ev.HandoffEnded)]
    if ended != talk.ends:
        problems.append(f"handoffs ended {ended} in the log, by the operator {talk.ends}")
    if status := fold(records).handoff.status:
        problems.append(f"the last handoff left {status}")
    answered = {r.event.turn for r in records
                if isinstance(r.event, ev.ResponseCompleted) and r.event.text and r.event.node != HANDLER}
    problems += [f"turn {t.turn} written while held ended {t.route}" for t in talk.held
                 if t.outcome == "complete" and t.route != "HANDOFF"]
    problems += [f"turn {t.turn} after the handoff ended: {t.route or 'no route'}, "
                 f"{'answered' if t.turn in answered else 'no AI answer'}" for t in talk.afters
                 if t.outcome == "complete" and (t.route == "HANDOFF" or t.turn not in answered)]
    return problems


def figures(talks: Sequence[Talk], conversations: dict[str, list[Record]]) -> dict:
    """The handoff counts of the run, and the first problems found."""
    counts: Counter = Counter()
    problems: list[str] = []
    for talk in talks:
        session = talk.visitor.session_id or f"(visitor {talk.visitor.index}: no conversation)"
        records = conversations.get(talk.visitor.session_id or "", [])
        lost, doubled = operator_messages(records, talk.sent)
        missed, twice = live_frames(records, talk.frames)
        wrong = handoff_states(records, talk)
        counts.update({
            "handoffs": talk.claims, "released": talk.ends.count("released"), "closed": talk.ends.count("closed"),
            "operator_messages": sum(m.acked for m in talk.sent), "sent_again": sum(m.again for m in talk.sent),
            "operator_messages_in_log": sum(isinstance(r.event, ev.OperatorMessage) for r in records),
            "operator_messages_lost": len(lost), "operator_messages_doubled": len(doubled),
            "operator_retries": talk.retries, "held_turns": len(talk.held),
            "live_connections": talk.connections, "live_resumed": talk.resumed, "live_frames": len(talk.frames),
            "live_missed": len(missed), "live_doubled": len(twice),
            "wrong_states": len(wrong), "operator_refused": len(talk.refused)})
        problems += [f"{session}: {p}" for p in
                     [*(f"operator message lost: {t}" for t in lost), *doubled,
                      *(f"live channel missed {m}" for m in missed), *(f"live channel got {t}" for t in twice),
                      *wrong, *(f"operator: {r}" for r in talk.refused)]]
    return {"conversations": len(talks), **{key: counts[key] for key in FIGURES}, "problems": problems[:20]}


# --- the clients -----------------------------------------------------------------------------

class Operator:
    """One operator, through the operator API (ADMIN_TOKEN)."""

    def __init__(self, client: httpx.AsyncClient, gateways: list[str], site: str, token: str):
        self.client, self.gateways, self.site = client, gateways, site
        self.headers = {"Authorization": f"Bearer {token}"}
        self.writing = asyncio.Event()  # set as a message's POST goes to gateway `a`
        self.written = 0

    def path(self, session_id: str = "", action: str = "") -> str:
        return f"/v1/admin/sites/{self.site}/handoffs" + (f"/{session_id}/{action}" if session_id else "")

    async def call(self, talk: Talk, method: str, path: str, body: dict | None = None) -> tuple[httpx.Response | None,
                                                                                            int]:
        """The request to gateway `a`, then to the next after each failed try (no answer, or a
        5xx) and a pause: the last answer (None: none) and the tries made."""
        gateway, pauses, tries = 0, iter(RETRY_PAUSES_S), 0
        while True:
            tries += 1
            if gateway == 0 and path.endswith("/messages"):
                self.writing.set()
            response = None
            try:
                response = await self.client.request(method, self.gateways[gateway] + path, json=body,
                                                     headers=self.headers)
                if response.status_code < 500:
                    return response, tries
            except httpx.TransportError:
                pass
            pause = next(pauses, None)
            if pause is None:
                return response, tries
            talk.retries += 1
            gateway = (gateway + 1) % len(self.gateways)
            await asyncio.sleep(pause)

    async def busy(self, timeout: float) -> bool:
        """Until a message's POST goes to gateway `a`; False when none did within `timeout`."""
        self.writing.clear()
        try:
            await asyncio.wait_for(self.writing.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def listed(self, talk: Talk, tries: int = 10) -> bool:
        """Whether the conversation shows in the inbox, waiting (polled a few times)."""
        for _ in range(tries):
            response, _ = await self.call(talk, "GET", self.path())
            if response is not None and response.status_code == 200 and any(
                    row["session_id"] == talk.visitor.session_id and row["status"] == "waiting"
                    for row in response.json()["handoffs"]):
                return True
            await asyncio.sleep(0.3)
        return False

    async def claim(self, talk: Talk, asked: bool) -> bool:
        """Claim the conversation's handoff; `asked`: the visitor was shown its request's turn
        complete (else a 404, no handoff waiting, is no refusal: the turn may not have got there)."""
        if asked and not await self.listed(talk):
            talk.refused.append("the handoff never showed waiting in the inbox")
        response, _ = await self.call(talk, "POST", self.path(talk.visitor.session_id, "claim"),
                                      {"operator": OPERATOR})
        if response is not None and response.status_code in (200, 201):
            talk.claims += 1
            return True
        if asked or response is None or response.status_code != 404:
            talk.refused.append(f"claim: {_status(response)}")
        return False

    async def write(self, talk: Talk, label: str, over: asyncio.Event, visitor_done: asyncio.Event) -> None:
        """Messages, one every WRITE_PAUSE_S, for as long as the visitor writes too (at least one;
        once the faults are over, no more)."""
        k = 0
        while k == 0 or not (visitor_done.is_set() or over.is_set()):
            message_id = uuid.uuid4().hex
            sent = Sent(message_id, f"Operator message {label}.{k} ({message_id[:8]})")
            body = {"operator": OPERATOR, "text": sent.text, "client_message_id": message_id}
            path = self.path(talk.visitor.session_id, "messages")
            response, sent.tries = await self.call(talk, "POST", path, body)
            sent.status = response.status_code if response is not None else None
            talk.sent.append(sent)
            if not sent.acked:
                talk.refused.append(f"message {sent.text!r}: {_status(response)}")
            else:
                self.written += 1
                if self.written % AGAIN == 0:  # its answer lost, as far as this client knows
                    sent.again = True
                    await self.call(talk, "POST", path, body)
            k += 1
            await asyncio.sleep(WRITE_PAUSE_S)

    async def end(self, talk: Talk, outcome: str) -> bool:
        action = "release" if outcome == "released" else "close"
        response, tries = await self.call(talk, "POST", self.path(talk.visitor.session_id, action),
                                          {"operator": OPERATOR})
        status = response.status_code if response is not None else None
        if status == 200 or (status == 404 and tries > 1):  # a 404 after a failed try: that try ended it
            talk.ends.append(outcome)
            return True
        talk.refused.append(f"{action}: {_status(response)}")
        return False


def _status(response: httpx.Response | None) -> str:
    return "no answer" if response is None else f"{response.status_code} {response.text[:120]}"


class Handoffs:
    """The handoff conversations of a run: `run` goes through handoffs until `over` is set."""

    def __init__(self, count: int, first_index: int, site: str, gateways: list[str], token: str, think_s: float,
                 hang_s: float):
        self.count, self.first_index, self.site, self.gateways = count, first_index, site, gateways
        self.token, self.think_s, self.hang_s = token, think_s, hang_s
        self.operator: Operator | None = None
        self.ready = asyncio.Event()  # the operator exists (busy() waits on it)

    async def busy(self, timeout: float) -> bool:
        """Until the operator sends a message to gateway `a`; False when it did not within `timeout`."""
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return await self.operator.busy(max(0.0, timeout - (time.monotonic() - started)))

    async def run(self, over: asyncio.Event) -> list[Talk]:
        talks = [Talk(Visitor(self.first_index + i)) for i in range(self.count)]
        limits = httpx.Limits(max_connections=self.count * 4 + 4, max_keepalive_connections=0)
        timeout = httpx.Timeout(self.hang_s, connect=2.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            self.operator = Operator(client, self.gateways, self.site, self.token)
            self.ready.set()
            await asyncio.gather(*(self.converse(client, talk, over) for talk in talks))
        return talks

    async def converse(self, client: httpx.AsyncClient, talk: Talk, over: asyncio.Event) -> None:
        await asyncio.sleep(self.think_s * (talk.visitor.index - self.first_index) / max(1, self.count))
        listening: asyncio.Task | None = None
        n = 0
        try:
            while n == 0 or not over.is_set():
                asked = await self.say(client, talk, ASK)
                if listening is None and talk.visitor.session_id:
                    listening = asyncio.create_task(self.listen(client, talk))
                if talk.visitor.session_id and await self.operator.claim(talk, asked.outcome == "complete"):
                    label, visitor_done = f"{talk.visitor.index}.{n}", asyncio.Event()
                    await asyncio.gather(self.operator.write(talk, label, over, visitor_done),
                                         self.write(client, talk, label, over, visitor_done))
                    if await self.operator.end(talk, "released" if (n + talk.visitor.index) % 2 == 0 else "closed"):
                        await asyncio.sleep(self.think_s)
                        talk.afters.append(await self.say(client, talk, QUESTIONS[n % len(QUESTIONS)]))
                n += 1
                await asyncio.sleep(self.think_s)
        finally:
            if listening is not None:
                await self.drained(talk)
                listening.cancel()
                try:
                    await listening
                except asyncio.CancelledError:
                    pass

    async def say(self, client: httpx.AsyncClient, talk: Talk, message: str) -> Turn:
        visitor = talk.visitor
        turn = Turn(visitor.index, message)
        visitor.turns.append(turn)
        await ask(client, self.site, self.gateways, len(visitor.turns) % len(self.gateways), visitor, turn,
                  self.hang_s)
        return turn

    async def write(self, client: httpx.AsyncClient, talk: Talk, label: str, over: asyncio.Event,
                    done: asyncio.Event) -> None:
        """The visitor's messages while the operator holds the conversation, at the other
        visitors' pace (a think pause before each)."""
        try:
            for k in range(HELD):
                if k and over.is_set():
                    break
                await asyncio.sleep(self.think_s)
                talk.held.append(await self.say(client, talk, f"I am still here, {label}.{k}"))
        finally:
            done.set()

    async def listen(self, client: httpx.AsyncClient, talk: Talk) -> None:
        """The visitor's live channel, on gateway `a` first, opened again after a cut with
        `Last-Event-ID`, until cancelled."""
        visitor = talk.visitor
        path = f"/v1/sites/{self.site}/conversations/{visitor.session_id}/live"
        gateway, last = 0, None
        while True:
            headers = {"X-Session-Token": visitor.session_token, **({"Last-Event-ID": last} if last else {})}
            read = ChatResult()

            async def got(frame: dict, read: ChatResult = read) -> None:
                talk.frames.append((int(read.last_event_id), frame))

            try:
                async with client.stream("GET", self.gateways[gateway] + path, headers=headers,
                                         timeout=LIVE_TIMEOUT) as response:
                    if response.status_code == 200:
                        talk.connections += 1
                        talk.resumed += last is not None
                        talk.open = True
                    await read_stream(response, got, into=read)
            except (httpx.TransportError, ValueError):  # cut, or an error body that is not JSON
                pass
            finally:
                talk.open = False
            if read.status == 200:
                gateway = 0  # cut: the load balancer's first choice again
            else:
                gateway = (gateway + 1) % len(self.gateways)
            last = str(talk.frames[-1][0]) if talk.frames else last
            await asyncio.sleep(LIVE_PAUSE_S)

    async def drained(self, talk: Talk) -> None:
        """Until the live channel is open (opened again, when a fault cut it) and has shown the
        end of every handoff the operator ended (its frames come in log order: then it has
        shown all before), or LIVE_DRAIN_S."""
        deadline = time.monotonic() + LIVE_DRAIN_S
        while not talk.open or sum(f["type"] == "handoff_ended" for _, f in talk.frames) < len(talk.ends):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.1)
