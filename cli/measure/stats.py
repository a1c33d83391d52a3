"""The one percentile every measurement reports."""

from __future__ import annotations


def percentile(values: list[float], p: float) -> float:
    """The `p`th percentile (0-100), interpolated between the two nearest values; NaN for none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
