"""An account report without a language model (the no-key default, `BRIEFS_BACKEND=data`):
the nine sections and a sales script written from the account's figures and its matched
deals only, labelled as such. It states figures as they are in the data and derives none
(no percentage of a limit, no day count): every number in it is an input's. The
proposition, success and priority follow the rules of rules.py. Templates in templates/.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from services.enricher.reports import rules
from services.enricher.reports.document import number
from shared import events as ev

TEMPLATES = Path(__file__).parent / "templates"
PHRASE = {"upsell": "an upsell opportunity: usage is close to what the plan allows",
          "churn": "a churn risk: the renewal is near and the product is little used",
          "negotiation": "a renewal to negotiate: the contract date is near",
          "healthy": "a healthy account: nothing in the figures asks for action"}


def _template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text(encoding="utf-8"))


def _metric_row(metric: ev.Metric) -> str:
    limit = number(metric.limit) if metric.limit is not None else "none"
    return f"| {metric.metric} | {number(metric.current)} | {limit} | {metric.unit or '-'} |"


def _figure(metric: ev.Metric) -> str:
    limit = f" of {number(metric.limit)}" if metric.limit is not None else ""
    return f"{metric.metric}: {number(metric.current)}{limit}{(' ' + metric.unit) if metric.unit else ''}"


def _deal_line(matched: ev.MatchedDeal) -> str:
    deal = matched.deal
    when = f", {deal.date}" if deal.date else ""
    lesson = f" Lesson: {deal.lessons}" if deal.lessons else ""
    return (f"- {deal.account} ({deal.tier or 'tier unknown'}{when}): {deal.outcome}, "
            f"{number(deal.value)} {deal.currency}. {deal.summary}{lesson}").rstrip()


def report(inputs: ev.ReportInputs) -> tuple[str, ev.ReportMetadata]:
    account, deals = inputs.account, inputs.deals
    reading = rules.read(account, inputs.today)
    meta = rules.metadata(reading, deals)
    kind = meta.proposition
    near = ", ".join(reading.near_limit)
    renewal = f", renewing on {account.renewal_date}" if account.renewal_date else ", renewal date unknown"
    about = [f"- Industry: {account.industry}" if account.industry else "",
             f"- Employees: {number(account.employees)}" if account.employees is not None else "",
             f"- Account manager: {account.owner}" if account.owner else "",
             f"- Notes: {account.notes}" if account.notes else ""]
    situation = "\n".join([*(line for line in about if line),
                           *(f"- {_figure(m)}" for m in account.usage)]) or "- No usage figures on record."
    complication = {
        "churn": f"The renewal on {account.renewal_date} is near and every metric with a limit is used far below it.",
        "upsell": f"Usage is at or near the plan's limit for: {near}.",
        "negotiation": f"The renewal on {account.renewal_date} is near"
                       f"{' (the date has passed)' if reading.overdue else ''}; the terms will be discussed.",
        "healthy": "Nothing in the figures: usage is within the plan and no renewal is near.",
    }[kind]
    resolution = {
        "churn": "- Review with the customer what they use and what they expected, before the renewal.",
        "upsell": f"- Propose the next plan or more capacity for {near}.",
        "negotiation": "- Prepare the renewal terms, with the usage figures above as the basis.",
        "healthy": "- Keep the regular check-ins; look for other teams who could use the product.",
    }[kind]
    risks = [f"- Past its limit: {', '.join(reading.over_limit)}." if reading.over_limit else "",
             f"- The renewal date {account.renewal_date} has passed." if reading.overdue else "",
             "- Low usage against the plan's limits." if reading.low_usage else "",
             "- No renewal date on record." if not account.renewal_date else "",
             "- No usage figures on record." if not account.usage else "",
             *[f"- A comparable account {m.deal.outcome}: {m.deal.account}." for m in deals
               if m.deal.outcome in ("churned", "lost")][:2]]
    questions = ["- Which teams use the product today, and which do not yet?",
                 "- What would make the renewal an easy decision?" if account.renewal_date else
                 "- When is the contract up for renewal?",
                 f"- Will {near} keep growing?" if reading.near_limit else "- What do they plan for the coming year?"]
    text = _template("plain_report.md").substitute(
        name=account.name, tier=account.tier or "tier unknown", arr=number(account.arr), currency=account.currency,
        renewal=renewal, proposition_phrase=PHRASE[kind], situation=situation, complication=complication,
        resolution=resolution, metrics="\n".join(_metric_row(m) for m in account.usage) or "| none | - | - | - |",
        evidence="\n".join(_deal_line(m) for m in deals) or "- No comparable historical deal on record.",
        risks="\n".join(line for line in risks if line) or "- None visible in the figures.",
        next_steps=resolution + (f"\n- {account.owner} to meet the customer before {account.renewal_date}."
                                 if account.renewal_date and account.owner else ""),
        questions="\n".join(questions))
    return f"{text.strip()}\n", meta


def sales_script(inputs: ev.ReportInputs, meta: ev.ReportMetadata) -> str:
    account = inputs.account
    reading = rules.read(account, inputs.today)
    headline = "; ".join(_figure(m) for m in account.usage[:3]) or "no usage figures on record"
    tracks = {
        "upsell": f"- They are close to the limit on {', '.join(reading.near_limit)}: ask how growth looks.\n"
                  "- Present the next plan as room to grow, not as a price rise.",
        "churn": "- Ask what they hoped to achieve when they signed, and what stands in the way.\n"
                 "- Offer help to get more teams using it before the renewal.",
        "negotiation": "- Review the year together: what they use, what they value.\n"
                       "- Agree on what the renewal should cover.",
        "healthy": "- Thank them and ask what is going well.\n- Ask who else in the company could use it.",
    }[meta.proposition]
    wins = [m.deal for m in inputs.deals if m.deal.outcome in ("won", "expanded")][:1]
    proof = f" {wins[0].account} went the same way: {wins[0].summary}" if wins and wins[0].summary else ""
    objections = "\n".join([
        f"- \"It is too expensive\": go through what they use today ({headline}).{proof}",
        "- \"We are not using it enough\": offer an onboarding session for the teams that do not use it yet.",
        "- \"Not now\": agree on a date to look at it again before the renewal."])
    closing = {"upsell": "Ask for a meeting with the budget holder to size the next plan.",
               "churn": "Ask for a review meeting with the team that uses it, before the renewal.",
               "negotiation": "Ask for a date to go through the renewal proposal.",
               "healthy": "Ask for an introduction to another team."}[meta.proposition]
    return _template("plain_sales_script.md").substitute(name=account.name, headline=headline, tracks=tracks,
                                                        objections=objections, closing=closing).strip()
