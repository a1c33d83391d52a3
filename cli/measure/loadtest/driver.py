"""The load tests' rate driver: arrivals at a fixed rate, open loop, each timed from the
moment it was due.

`open_loop` starts arrival i at `began + i / rate` as a task of its own, whatever became of
the earlier ones: a slow service never holds the next arrival back (no coordinated
omission), and every latency is counted from when the arrival was due, so a generator that
fell behind counts its own lateness against the service rather than hiding it.

`drive` is the bus version: `TurnRequested` (or any event) published at the rate straight
onto the bus, each timed to the event of the service under test that answers it (the
enricher's EnrichmentCompleted, the router's RouteDecided, the retriever's
RetrievalCompleted, the responder's TurnCompleted), and optionally to its first token.
The gateway's load test drives HTTP with `open_loop` and its own arrivals.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable

from shared import events as ev
from shared import subjects
from shared.bus import connect
from shared.config import BusConfig

ANSWER_WAIT_S = 30.0  # after the last arrival, how long the answers still in flight are awaited
COMPLETION = "completion"  # the mark every run has: the arrival answered
FIRST_TOKEN = "first_token"
PREPARE_BATCH = 50


@dataclass
class Recorder:
    """What one run saw: per mark (`completion`, `first_token`), the latency of each arrival that
    reached it, in ms from when the arrival was due; when each answer came; labels counted."""

    total: int
    marks: dict[str, list[float]] = field(default_factory=dict)
    answered_at: list[float] = field(default_factory=list)
    labels: Counter = field(default_factory=Counter)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def mark(self, name: str, due: float, at: float | None = None) -> None:
        at = time.perf_counter() if at is None else at
        self.marks.setdefault(name, []).append((at - due) * 1000)
        if name == COMPLETION:
            self.answered_at.append(at)
            if len(self.answered_at) >= self.total:
                self.done.set()

    def run(self, rate: float) -> "Run":
        answered = len(self.answered_at)
        # Answers per second over the span they came in (plus one arrival interval, so a
        # service that keeps up scores the offered rate however long each answer takes):
        # one that falls behind spreads its answers over a longer span, and lost answers
        # are missing from the count.
        span = (max(self.answered_at) - min(self.answered_at) + 1 / rate) if answered else 0.0
        return Run(offered_per_s=rate, sent=self.total, answered=answered,
                   achieved_per_s=round(answered / span, 1) if span else 0.0,
                   latencies_ms={name: list(values) for name, values in self.marks.items()},
                   labels=dict(self.labels.most_common()))


@dataclass(frozen=True)
class Run:
    offered_per_s: float
    sent: int
    answered: int
    achieved_per_s: float
    latencies_ms: dict[str, list[float]]  # per mark, one per arrival that reached it
    labels: dict[str, int]  # the answers counted by what `labels` said of them, most common first


async def open_loop(rate: float, seconds: float, arrive: Callable[[int, float], Awaitable[None]],
                    recorder: Recorder) -> Run:
    """`arrive(i, due)` for i in 0 … rate × seconds - 1, each started as its own task at its
    due time (`time.perf_counter()` units); then the answers in flight are awaited, at most
    `ANSWER_WAIT_S`."""
    began = time.perf_counter()
    tasks: set[asyncio.Task] = set()
    for i in range(recorder.total):
        due = began + i / rate
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(arrive(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    try:
        await asyncio.wait_for(recorder.done.wait(), ANSWER_WAIT_S)
    except asyncio.TimeoutError:
        pass
    if tasks:  # answered, and finishing (an HTTP stream closing, its outcome counted)
        await asyncio.wait(tasks, timeout=2.0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return recorder.run(rate)


def conversations(tag: str, messages: list[str], sites: tuple[str, ...], turns_per_session: int = 1,
                  ) -> Callable[[int], ev.TurnRequested]:
    """The i-th turn of a run: sessions of `turns_per_session` turns, taking turns among
    `sites`, asking `messages` in order."""

    def turn(i: int) -> ev.TurnRequested:
        session = i // turns_per_session
        return ev.TurnRequested(event_id=ev.new_id(), site=sites[session % len(sites)], session_id=f"{tag}-{session}",
                                turn=i % turns_per_session + 1, ts=ev.now(), producer="loadtest",
                                message=messages[i % len(messages)])

    return turn


async def drive(nats_url: str, rate: float, seconds: float, turn: Callable[[int], ev.Envelope], answer: str,
                site: str = "*", labels: Callable[[ev.Envelope], Iterable[str]] = lambda event: (),
                prepare: Callable[[int], Awaitable[None]] | None = None, first_token: bool = False) -> Run:
    """Publish `turn(0)`, `turn(1)`, ... at `rate` per second for `seconds` and time each to
    its `answer` event of `site` (and to its first token on the token subjects, with
    `first_token`). `prepare(i)` runs for every arrival before the clock starts (what the
    service reads but is not timed on: a turn's earlier events, a visitor's IP in Redis)."""
    bus = await connect(BusConfig(url=nats_url), name="loadtest")
    recorder = Recorder(total=int(rate * seconds))
    due_of: dict[tuple[str, int], float] = {}
    tokened: set[tuple[str, int]] = set()

    async def on_answer(msg):
        event = ev.decode(msg.data)
        due = due_of.pop((event.session_id, event.turn), None)
        if due is not None:
            recorder.mark(COMPLETION, due)
            recorder.labels.update(labels(event))

    async def on_token(msg):
        event = ev.decode(msg.data)
        key = (event.session_id, event.turn)
        # The sources go out on the token subject ahead of the first token: not a token.
        if isinstance(event, ev.TokenChunk) and key in due_of and key not in tokened:
            tokened.add(key)
            recorder.mark(FIRST_TOKEN, due_of[key])

    async def arrive(i: int, due: float) -> None:
        event = turn(i)
        due_of[(event.session_id, event.turn)] = due
        await bus.publish(event)

    subs = [await bus.nc.subscribe(subjects.conv_of_type(answer, site), cb=on_answer)]
    if first_token:
        subs.append(await bus.nc.subscribe(subjects.TOKENS_SUBJECTS, cb=on_token))
    try:
        if prepare is not None:  # in batches: a client's connection pool (Redis's) is not asked for thousands at once
            for start in range(0, recorder.total, PREPARE_BATCH):
                await asyncio.gather(*(prepare(i) for i in range(start, min(start + PREPARE_BATCH, recorder.total))))
        return await open_loop(rate, seconds, arrive, recorder)
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await bus.close()
