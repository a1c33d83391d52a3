"""lead_triager: a site's open leads → call first / nurture / disqualify, each with a reason.

Takes `TriageRequested` work items (session `TRIAGE_SESSION`) from the BRIEFS work queue,
reads the latest completed brief of each of the site's leads, and stores a `TriageCompleted`
in the site's triage log: one validated model call over all of them (briefs/triage.py), or
without a model the rule over each brief's metadata. A triage the model gets wrong twice, or
a model that does not answer, is not used: the rule ranks the leads, and the event says so
(`backend` data, `model_error`).
"""

from __future__ import annotations

import logging

import msgspec

from services.enricher.briefs import triage
from services.enricher.briefs.failure import brief_failed
from shared import events as ev
from shared import subjects
from shared.llm import LLMClient, LLMError
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "lead_triager"


def make_node(llm: LLMClient | None) -> Node:
    backend = "llm" if llm is not None else "data"

    async def rank(event: ev.TriageRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        leads = list(inputs.open_briefs)
        items, used, error = [], backend, ""
        if leads and llm is not None:
            try:
                items = await triage.with_llm(llm, inputs.config.name or event.site, leads, ctx.record_llm)
            except (triage.InvalidTriage, msgspec.MsgspecError, LLMError) as exc:
                used, error = "data", f"the model's triage is not valid: {exc}"
                log.warning("model triage not valid; ranked by rule", extra={"site": event.site, "error": error})
        if leads and not items:
            items = [triage.by_rule(brief) for brief in leads]
        return [ctx.follow(ev.TriageCompleted, request_id=event.request_id, backend=used if leads else backend,
                           items=items, leads=len(leads), model_error=error[:2000])]

    return Node(name=NAME, consumes=("triage_requested",), handle=rank, needs=Needs(config=True, open_briefs=True),
                stream=subjects.BRIEFS_STREAM, max_in_flight=1,
                failure=lambda event, node, attempts, reason: brief_failed(event, node, attempts, reason, backend))
