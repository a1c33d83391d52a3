"""Which historical deals a report cites as evidence: the `MAX_DEALS` (8) most relevant of the
site's deals, scored deterministically (the same portfolio gives the same deals, in the same
order, on every replica and every redelivery).

A deal scores
- 3 for the account's tier (case-insensitive; neither empty),
- 2 when its summary or lessons name the account's industry,
- 2 when its outcome is the one the account's situation points to (rules.py: upsell →
  expanded, churn → churned, negotiation → won, healthy → expanded), 1 for the other outcome
  of the same side (upsell → won, churn → lost, negotiation → lost, healthy → won),
- 1 for each word of the account's notes (five letters or more) its text shares, at most 2.
Ties go to the newer deal, then the smaller id. For an outcome mix, at most `MAX_PER_OUTCOME`
(4) deals of one outcome are taken before the others are looked at; the rest fill up after.
Deals scoring 0 are taken only to reach `MIN_DEALS` (5).
"""

from __future__ import annotations

import re

from shared import events as ev

MAX_DEALS = 8
MIN_DEALS = 5
MAX_PER_OUTCOME = 4
OUTCOME_FIT = {"upsell": ("expanded", "won"), "churn": ("churned", "lost"), "negotiation": ("won", "lost"),
               "healthy": ("expanded", "won")}
WORD = re.compile(r"[^\W\d_]{5,}")


def score(account: ev.Account, proposition: str, deal: ev.Deal) -> tuple[int, list[str]]:
    points, why = 0, []
    if account.tier and deal.tier and account.tier.casefold() == deal.tier.casefold():
        points, why = points + 3, why + ["same tier"]
    text = f"{deal.summary} {deal.lessons}".casefold()
    if account.industry and account.industry.casefold() in text:
        points, why = points + 2, why + ["same industry"]
    best, next_ = OUTCOME_FIT[proposition]
    if deal.outcome == best:
        points, why = points + 2, why + [f"{deal.outcome}, as a {proposition} account may"]
    elif deal.outcome == next_:
        points, why = points + 1, why + [f"{deal.outcome}, as a {proposition} account may"]
    shared = sorted(set(WORD.findall(account.notes.casefold())) & set(WORD.findall(text)))[:2]
    if shared:
        points, why = points + len(shared), why + [f"mentions {', '.join(shared)}"]
    return points, why


def match(account: ev.Account, proposition: str, deals: list[ev.Deal]) -> list[ev.MatchedDeal]:
    scored = [ev.MatchedDeal(deal=d, score=s, why=w) for d in deals for s, w in [score(account, proposition, d)]]
    scored.sort(key=lambda m: m.deal.id)
    scored.sort(key=lambda m: (m.score, m.deal.date), reverse=True)
    picked: list[ev.MatchedDeal] = []
    per_outcome: dict[str, int] = {}
    for m in scored:
        if m.score > 0 and per_outcome.get(m.deal.outcome, 0) < MAX_PER_OUTCOME and len(picked) < MAX_DEALS:
            picked.append(m)
            per_outcome[m.deal.outcome] = per_outcome.get(m.deal.outcome, 0) + 1
    for m in scored:
        if len(picked) >= MAX_DEALS or (m.score == 0 and len(picked) >= MIN_DEALS):
            break
        if m not in picked:
            picked.append(m)
    return sorted(picked, key=scored.index)
