"""How fast this machine runs Python right now: a fixed piece of work, timed.

The machine the figures in docs/benchmarks.md come from changes speed with the host it
shares, within seconds and from hour to hour: on 2026-11-24 one process timed this work
at 37 to 68 ms over twenty seconds, the same pure-Python loop took 0.88 s at 15:35 and
1.50 s at 15:37, and `make bench`'s CPU per turn and latencies moved with it. A figure read
without the speed it was measured at cannot be compared with a later run, so every
`concierge bench` and `concierge loadtest` reports this gauge next to its figures:
milliseconds for the same work, the median of a few tries (the speed right then, not the
best moment), higher is slower.

The work is the kind the services spend their CPU on: interpreted loops, dict and string
handling, JSON in and out.
"""

from __future__ import annotations

import json
import statistics
import time

RECORD = {"type": "token_chunk", "site": "bench", "session_id": "s-0123456789abcdef", "turn": 3,
          "content": "The scheduling engine plans shifts from the rules you set.", "seq": 12,
          "metadata": {"route": "ANSWER", "sources": [1, 2, 3], "latency_ms": 12.5}}


def work() -> int:
    """The fixed work: about 37 ms on this machine at its fastest."""
    total = 0
    for i in range(150_000):
        total += i % 7
    for i in range(3_000):
        record = dict(RECORD, seq=i)
        text = json.dumps(record)
        total += len(json.loads(text)["content"].split())
    return total


def gauge_ms(tries: int = 7) -> float:
    """Milliseconds `work` takes, the median of `tries`."""
    times = []
    for _ in range(tries):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)
