"""Where an ingest's time goes: wall-clock seconds per stage (extract, embed, write, ...).

A stage running in several tasks at once (LightRAG embeds its three stores' texts
together) counts its wall time once, from the first to start to the last to end, so a
stage's seconds are never more than the time that passed. Stages may nest (the embedding
runs inside the write) or overlap one another; the reader decides what to subtract.
Used from one event loop's thread only.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter


class StageClock:
    def __init__(self):
        self.seconds: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self._since: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        if not self._running[stage]:
            self._since[stage] = time.perf_counter()
        self._running[stage] += 1
        try:
            yield
        finally:
            self._running[stage] -= 1
            if not self._running[stage]:
                self.seconds[stage] += time.perf_counter() - self._since.pop(stage)
