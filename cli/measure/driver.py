"""The load tests' rate driver: publish `TurnRequested` events at a set rate straight onto
the bus, and time each one to the event of the service under test that answers it (the
enricher's EnrichmentCompleted, the router's RouteDecided, the retriever's
RetrievalCompleted)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from cli.measure.stats import percentile
from shared import events as ev
from shared import subjects
from shared.bus import connect
from shared.config import BusConfig

ANSWER_WAIT_S = 30.0  # after the last publish, how long the answers still in flight are awaited


@dataclass(frozen=True)
class Run:
    offered_per_s: float
    sent: int
    answered: int
    answered_per_s: float
    p50_ms: float
    p99_ms: float
    labels: dict[str, int]  # the answers counted by what `labels` said of them, most common first


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


async def drive(nats_url: str, rate: float, seconds: float, turn: Callable[[int], ev.TurnRequested], answer: str,
                site: str = "*", labels: Callable[[ev.Envelope], Iterable[str]] = lambda event: (),
                before: Callable[[ev.TurnRequested], Awaitable[None]] | None = None) -> Run:
    """Publish `turn(0)`, `turn(1)`, ... at `rate` per second for `seconds` (`before` runs
    ahead of each publish, untimed) and time each to its `answer` event of `site`."""
    bus = await connect(BusConfig(url=nats_url), name="loadtest")
    sent: dict[tuple[str, int], float] = {}
    latencies: list[float] = []
    counts: Counter = Counter()
    done = asyncio.Event()
    total = int(rate * seconds)
    last_done = 0.0

    async def on_answer(msg):
        nonlocal last_done
        event = ev.decode(msg.data)
        started = sent.pop((event.session_id, event.turn), None)
        if started is not None:
            latencies.append((time.perf_counter() - started) * 1000)
            counts.update(labels(event))
            last_done = time.perf_counter()
            if len(latencies) >= total:
                done.set()

    sub = await bus.nc.subscribe(subjects.conv_of_type(answer, site), cb=on_answer)
    began = time.perf_counter()
    try:
        for i in range(total):
            delay = began + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            request = turn(i)
            if before is not None:
                await before(request)
            sent[(request.session_id, request.turn)] = time.perf_counter()
            await bus.publish(request)
        try:
            await asyncio.wait_for(done.wait(), ANSWER_WAIT_S)
        except asyncio.TimeoutError:
            pass
    finally:
        await sub.unsubscribe()
        await bus.close()
    elapsed = (last_done or time.perf_counter()) - began
    return Run(offered_per_s=rate, sent=total, answered=len(latencies),
               answered_per_s=round(len(latencies) / elapsed, 1) if elapsed > 0 else 0.0,
               p50_ms=round(percentile(latencies, 50), 2), p99_ms=round(percentile(latencies, 99), 2),
               labels=dict(counts.most_common()))
