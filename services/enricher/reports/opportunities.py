"""Opportunities across a batch of accounts: which to propose an upsell to, which contract
to renegotiate, which customer may churn, each with a reason, best first; the best few
pre-selected for reports.

With a model (the `briefs` role): one call over every account's one-line summary
(`summary_line`: tier, ARR, renewal and its days left, each metric's current / limit and
share), validated: every account exactly once and no other, a proposition of the four, a
reason that is not empty. A reply that is not gets one repair round naming the problems;
still not (or no answer): the rule ranks them, and the stored search says why
(`OpportunitiesCompleted.model_error`). At most `MAX_MODEL_ACCOUNTS` accounts go to the
model, the rule's best; the rest follow in the rule's order.

The rule (no model, or its fallback): each account's proposition by reports/rules.py, its
reason the figures behind it; ranked by the revenue at stake weighted by urgency: the ARR
times the proposition's priority as a report's metadata computes it (churn 9, upsell 7,
negotiation 6; one more for a metric over its limit or an overdue renewal), highest first,
then by name; the healthy accounts (nothing to propose) after all the others, by ARR.

Pre-selected (`selected`): the first `select` accounts with something to propose (not
healthy), in ranking order. ARR is compared as a number whatever its currency: a portfolio
in several currencies is ranked as if they were one. A search stores its first
`MAX_STORED` accounts (the count of all it ranked beside them), each reason cut at
`MAX_REASON` characters.
"""

from __future__ import annotations

import msgspec

from services.enricher.briefs.writer import coverage, system, validated
from services.enricher.reports import rules
from services.enricher.reports.document import number
from shared import events as ev
from shared.llm import LLMClient, Recorder

MAX_MODEL_ACCOUNTS = 100
MAX_STORED = 500  # the ranking's first accounts stored (an event stays far below the bus's 1 MiB)
MAX_REASON = 300  # a reason's characters, as stored
REASON_METRICS = 2  # the metrics a rule's reason names at most


class OpportunitiesReply(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: list[ev.Opportunity]


class InvalidOpportunities(Exception):
    """The model's ranking did not cover the accounts exactly, even after a repair round."""


def _usage(metric: ev.Metric) -> str:
    unit = f" {metric.unit}" if metric.unit else ""
    if metric.limit is None:
        return f"{metric.metric} {number(metric.current)}{unit} (no limit)"
    share = f" ({round(100 * metric.current / metric.limit)} %)" if metric.limit else ""  # a limit of 0: no share
    return f"{metric.metric} {number(metric.current)} of {number(metric.limit)}{unit}{share}"


def _renewal(account: ev.Account, reading: rules.Reading) -> str:
    days = reading.days_to_renewal
    if days is None:
        return f"renews {account.renewal_date}" if account.renewal_date else "renewal unknown"
    if days < 0:
        return f"renewal overdue since {account.renewal_date} ({-days} days)"
    return f"renews {account.renewal_date} (in {days} days)"


def summary_line(account: ev.Account, today: str) -> str:
    """The account as the model reads it in a batch."""
    reading = rules.read(account, today)
    usage = "; ".join(_usage(m) for m in account.usage) or "no usage figures"
    return (f"{account.id}: {account.name}, tier {account.tier or 'unknown'}, ARR {number(account.arr)} "
            f"{account.currency}, {_renewal(account, reading)}, usage: {usage}")


def by_rule(account: ev.Account, today: str) -> ev.Opportunity:
    reading = rules.read(account, today)
    kind = rules.proposition(reading)
    by_name = {m.metric: m for m in account.usage}
    limited = sorted((m for m in account.usage if m.limit), key=lambda m: m.current / m.limit)
    match kind:
        case "upsell":
            near = sorted((by_name[n] for n in reading.near_limit), key=lambda m: -m.current / m.limit)
            why = "outgrowing the plan: " + ", ".join(_usage(m) for m in near[:REASON_METRICS])
        case "churn":
            why = (f"{_renewal(account, reading)} and uses under half of the plan: "
                   + ", ".join(_usage(m) for m in limited[:REASON_METRICS]))
        case "negotiation":
            why = f"{_renewal(account, reading)}; usage in between: " + (
                ", ".join(_usage(m) for m in limited[-REASON_METRICS:]) or "no limits to compare")
        case _:
            why = "nothing to propose now: no metric near its limit, no renewal within " \
                  f"{rules.RENEWAL_SOON_DAYS} days"
    return ev.Opportunity(account_id=account.id, proposition=kind,
                          reason=f"{why}; ARR {number(account.arr)} {account.currency} (by rule)")


def _at_stake(account: ev.Account, today: str) -> tuple:
    meta = rules.metadata(rules.read(account, today), [])
    healthy = meta.proposition == "healthy"
    return healthy, -account.arr if healthy else -account.arr * meta.priority, account.name.casefold(), account.id


def rank_by_rule(accounts: list[ev.Account], today: str) -> list[ev.Opportunity]:
    return [by_rule(a, today) for a in sorted(accounts, key=lambda a: _at_stake(a, today))]


def problems(reply: OpportunitiesReply, ids: list[str]) -> list[str]:
    """What keeps a ranking from being accepted: accounts missing, unknown or repeated, reasons empty."""
    return coverage([i.account_id for i in reply.items], [i.reason for i in reply.items], ids, "account", "ranked")


async def with_llm(llm: LLMClient, site_name: str, accounts: list[ev.Account], today: str,
                   record: Recorder) -> list[ev.Opportunity]:
    """The model's ranking of `accounts` (all of them, validated), or InvalidOpportunities."""
    ids = [a.id for a in accounts]
    messages = [system("opportunities", site_name),
                {"role": "user", "content": f"Today: {today}\nAccounts:\n"
                                            + "\n".join(summary_line(a, today) for a in accounts)}]
    reply = await validated(llm, record, messages, OpportunitiesReply, lambda r: problems(r, ids), "ranking",
                            "Rank every account above exactly once.", InvalidOpportunities)
    return reply.items


def stored(items: list[ev.Opportunity]) -> list[ev.Opportunity]:
    return [msgspec.structs.replace(o, reason=o.reason[:MAX_REASON]) for o in items[:MAX_STORED]]


def selected(items: list[ev.Opportunity], count: int) -> list[str]:
    return [item.account_id for item in items if item.proposition != "healthy"][:max(0, count)]
