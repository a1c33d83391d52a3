"""opportunity_finder: a site's accounts → upsell / negotiation / churn / healthy, each with
a reason, best first, and the best pre-selected for reports (reports/opportunities.py).

Takes `OpportunitiesRequested` work items (session `OPPORTUNITIES_SESSION`) from the BRIEFS
work queue, reads the site's accounts (those named, or all), and stores an
`OpportunitiesCompleted` in the site's opportunities log: one validated model call over
the batch, or without a model the rule over each account's figures. A ranking the model
gets wrong twice, or a model that does not answer, is not used: the rule ranks them, and the
event says so (`backend` data, `model_error`). The day renewals are counted from is the
request's, so a redelivered item ranks the same.
"""

from __future__ import annotations

import datetime
import logging

import msgspec

from services.enricher.reports import opportunities
from shared import events as ev
from shared import subjects
from shared.llm import LLMClient, LLMError
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "opportunity_finder"


def failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.OpportunitiesFailed:
    return ev.follow(event, ev.OpportunitiesFailed, node, node=node, reason=reason[:2000], attempts=attempts,
                     request_id=getattr(event, "request_id", ""), failed_event_id=event.event_id)


def make_node(llm: LLMClient | None) -> Node:
    backend = "llm" if llm is not None else "data"

    async def find(event: ev.OpportunitiesRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        wanted = set(event.accounts)
        batch = [a for a in inputs.accounts if not wanted or a.id in wanted]
        today = datetime.datetime.fromtimestamp(event.ts, datetime.timezone.utc).date().isoformat()
        ranked = opportunities.rank_by_rule(batch, today)
        used, error = backend, ""
        if batch and llm is not None:
            first = {o.account_id for o in ranked[:opportunities.MAX_MODEL_ACCOUNTS]}
            try:
                items = await opportunities.with_llm(llm, inputs.config.name or event.site,
                                                     [a for a in batch if a.id in first], today, ctx.record_llm)
                ranked = items + [o for o in ranked if o.account_id not in first]
            except (opportunities.InvalidOpportunities, msgspec.MsgspecError, LLMError) as exc:
                used, error = "data", f"the model's ranking is not valid: {exc}"
                log.warning("model ranking not valid; ranked by rule", extra={"site": event.site, "error": error})
        return [ctx.follow(ev.OpportunitiesCompleted, request_id=event.request_id, backend=used,
                           items=opportunities.stored(ranked),
                           selected=opportunities.selected(ranked, event.select), accounts=len(batch),
                           model_error=error[:2000])]

    return Node(name=NAME, consumes=("opportunities_requested",), handle=find,
                needs=Needs(config=True, accounts=True), stream=subjects.BRIEFS_STREAM, max_in_flight=1,
                failure=failed)
