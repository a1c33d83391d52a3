"""A circuit breaker per remote source: after `threshold` failures in a row the source is
skipped for `reset_after_s`, then one trial call decides whether it closes again.

Small enough to own: the maintained async breakers on PyPI are heavier than this rule."""

from __future__ import annotations

import time


class CircuitBreaker:
    def __init__(self, threshold: int = 3, reset_after_s: float = 30.0, clock=time.monotonic):
        self.threshold = threshold
        self.reset_after_s = reset_after_s
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.reset_after_s else "open"

    def allow(self) -> bool:
        return self.state != "open"

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None

    def failure(self) -> None:
        self.failures += 1
        if self.state == "half-open" or self.failures >= self.threshold:
            self.opened_at = self.clock()
