"""Type-based limiter: keep `budget` documents across the three document types, split by
the retrieval mode, so no type crowds out the others when there is no reranker.

| mode            | chunks | entities | relationships |
|-----------------|--------|----------|---------------|
| global          | 30 %   | 35 %     | 35 %          |
| local           | 60 %   | 20 %     | 20 %          |
| hybrid, mix     | 30 %   | 30 %     | 40 %          |
| naive           | 100 %  | –        | –             |

A type with fewer documents than its share gives the unused places to the others, in
proportion to their shares, until the budget is spent or every document is kept. Within a
type, LightRAG's order (best first) is kept.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")

TYPES = ("chunk", "entity", "relationship")
SHARES: dict[str, tuple[float, float, float]] = {
    "global": (0.30, 0.35, 0.35),
    "local": (0.60, 0.20, 0.20),
    "hybrid": (0.30, 0.30, 0.40),
    "mix": (0.30, 0.30, 0.40),
    "naive": (1.0, 0.0, 0.0),
}


def allocate(mode: str, budget: int, available: dict[str, int]) -> dict[str, int]:
    """How many documents of each type to keep."""
    shares = dict(zip(TYPES, SHARES[mode]))
    quota = _split(budget, {t: s for t, s in shares.items() if s > 0})
    take = {t: min(quota.get(t, 0), available.get(t, 0)) for t in TYPES}
    while True:
        left = budget - sum(take.values())
        hungry = {t: shares[t] or 1e-9 for t in TYPES if available.get(t, 0) > take[t]}
        if left <= 0 or not hungry:
            return take
        extra = _split(left, hungry)
        for t, n in extra.items():
            take[t] = min(available[t], take[t] + n)


def _split(n: int, weights: dict[str, float]) -> dict[str, int]:
    """n places in proportion to weights; remainders to the largest fractions (ties: TYPES
    order), so the parts always add up to n."""
    total = sum(weights.values())
    exact = {t: n * w / total for t, w in weights.items()}
    parts = {t: int(v) for t, v in exact.items()}
    rest = n - sum(parts.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - parts[t]), TYPES.index(t)))[:rest]:
        parts[t] += 1
    return parts


def limit(mode: str, budget: int, by_type: dict[str, Sequence[T]]) -> dict[str, list[T]]:
    take = allocate(mode, budget, {t: len(docs) for t, docs in by_type.items()})
    return {t: list(by_type.get(t, ()))[: take[t]] for t in TYPES}
