"""The account's situation read from its figures alone: what the data-only report says, and
what deal matching and the metadata follow when no model reads the account.

| reading | rule |
|---|---|
| usage | a metric's current value over its limit (metrics without a limit left out) |
| near limit | a metric at `NEAR_LIMIT` (85 %) of its limit or more |
| low usage | every metric with a limit below `LOW_USAGE` (50 %) of it |
| renewal soon | the renewal date within `RENEWAL_SOON_DAYS` (90) days of the report's day |
| overdue | the renewal date before the report's day |

The proposition, the first rule that holds:

1. churn: renewal soon (or overdue) and low usage: a customer about to renew who uses
   little of what they pay for;
2. upsell: a metric near its limit: they are outgrowing their plan;
3. negotiation: renewal soon or overdue, usage in between: the contract is on the table;
4. healthy: none of these (or nothing to tell from).

Success percent: with matched deals, the share of them that went well for the proposition
(upsell: expanded or won; churn: not churned nor lost; negotiation and healthy: won or
expanded), else the proposition's baseline (`BASELINE`). Priority: the proposition's
(`PRIORITY`), one more for a metric over its limit or an overdue renewal (at most 10).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from shared import events as ev

NEAR_LIMIT = 0.85
LOW_USAGE = 0.5
RENEWAL_SOON_DAYS = 90
BASELINE = {"upsell": 60, "negotiation": 50, "churn": 30, "healthy": 70}
PRIORITY = {"churn": 9, "upsell": 7, "negotiation": 6, "healthy": 3}
GOOD = {"upsell": ("expanded", "won"), "churn": ("won", "expanded"), "negotiation": ("won", "expanded"),
        "healthy": ("won", "expanded")}


@dataclass(frozen=True)
class Reading:
    near_limit: list[str]  # metrics at NEAR_LIMIT of their limit or more
    over_limit: list[str]  # metrics past their limit
    low_usage: bool  # every metric with a limit below LOW_USAGE of it (False: none has a limit)
    days_to_renewal: int | None  # None: no renewal date (or no day to count from)

    @property
    def renewal_soon(self) -> bool:
        return self.days_to_renewal is not None and self.days_to_renewal <= RENEWAL_SOON_DAYS

    @property
    def overdue(self) -> bool:
        return self.days_to_renewal is not None and self.days_to_renewal < 0


def _date(text: str) -> datetime.date | None:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return None


def read(account: ev.Account, today: str) -> Reading:
    limited = [m for m in account.usage if m.limit]
    ratios = {m.metric: m.current / m.limit for m in limited}
    renewal, day = _date(account.renewal_date), _date(today)
    return Reading(near_limit=[name for name, r in ratios.items() if r >= NEAR_LIMIT],
                   over_limit=[name for name, r in ratios.items() if r > 1],
                   low_usage=bool(ratios) and all(r < LOW_USAGE for r in ratios.values()),
                   days_to_renewal=(renewal - day).days if renewal and day else None)


def proposition(reading: Reading) -> ev.Proposition:
    if reading.renewal_soon and reading.low_usage:
        return "churn"
    if reading.near_limit:
        return "upsell"
    if reading.renewal_soon:
        return "negotiation"
    return "healthy"


def metadata(reading: Reading, deals: list[ev.MatchedDeal]) -> ev.ReportMetadata:
    kind = proposition(reading)
    good = sum(m.deal.outcome in GOOD[kind] for m in deals)
    success = round(100 * good / len(deals)) if deals else BASELINE[kind]
    priority = min(10, PRIORITY[kind] + (1 if reading.over_limit or reading.overdue else 0))
    return ev.ReportMetadata(proposition=kind, success_percent=success, priority=priority)
