"""lead_briefer: a lead's gathered data → a validated brief and a call script.

With a model (`BRIEFS_BACKEND=llm`, the `briefs` LLM role), the passes of briefs/writer.py,
each step stored as it happens: `BriefDrafted` (sections repaired, metadata and how it was
obtained, numbers found in no input), `BriefEvaluated` (pass / marginal / fail); a failed
draft is written once more with the evaluator's issues as feedback; then the call script,
and `BriefCompleted`. A draft whose metadata neither validates nor can be extracted ends in
`BriefFailed`: a brief is never completed with made-up metadata.

Without one (`BRIEFS_BACKEND=data`): briefs/plain.py, labelled, from the data only.

The model calls are limited deployment-wide: this node's durable hands out at most
`BRIEFS_CONCURRENCY` gathered leads at a time across all replicas (its max ack pending);
each call retries with backoff on rate limits and timeouts (shared/llm.py).
"""

from __future__ import annotations

import time

from services.enricher.briefs import plain, writer
from services.enricher.briefs.document import sections
from services.enricher.briefs.failure import brief_failed
from shared import events as ev
from shared import briefs, metrics
from shared.llm import LLMClient
from shared.node import Context, Inputs, Needs, Node
from shared.privacy import EMAIL_RE, REDACTED

NAME = "lead_briefer"


def summary(inputs: ev.BriefInputs, text: str, meta: ev.BriefMetadata) -> str:
    """One line for a triage and for other leads' briefs (similar leads): the company, the
    metadata and the executive summary's first sentence; no e-mail address, so what other
    conversations are told of a lead holds none to erase."""
    lead = " ".join(sections(text).get("Executive summary", "").split()).split(". ")[0][:240]
    return EMAIL_RE.sub("the lead", f"{plain.company(inputs)}: priority {meta.priority}, {meta.stage}, "
                                    f"{meta.estimated_seats} seats, confidence {meta.confidence}. {lead}").strip()


def drafted(ctx: Context, attempt: int, draft: writer.Draft) -> ev.BriefDrafted:
    # Keyed by the delivery too: a redelivered item writes its drafts anew, and its stored
    # steps must be those of the brief it completes.
    return ctx.follow(ev.BriefDrafted, key=f"drafted-{ctx.attempt}-{attempt}", attempt=attempt, text=draft.text,
                      repaired_sections=draft.repaired_sections, missing_sections=draft.missing_sections,
                      metadata=draft.metadata, metadata_method=draft.metadata_method,
                      metadata_error=draft.metadata_error, ungrounded_numbers=draft.ungrounded_numbers)


def make_node(llm: LLMClient | None, concurrency: int = 2) -> Node:
    backend = "llm" if llm is not None else "data"

    async def write(number: int, data: ev.BriefInputs, ctx: Context, feedback: list[str] | None = None
                    ) -> tuple[writer.Draft, writer.Review | None]:
        """One draft and its review, each stored as it is made; no review for a draft
        without valid metadata (the brief fails)."""
        draft = await writer.draft(llm, data, ctx.record_llm, feedback=feedback)
        await ctx.emit(drafted(ctx, number, draft))
        if draft.metadata is None:
            return draft, None
        review = await writer.review(llm, data, draft, ctx.record_llm)
        await ctx.emit(ctx.follow(ev.BriefEvaluated, key=f"evaluated-{ctx.attempt}-{number}", attempt=number,
                                  verdict=review.verdict, issues=review.issues))
        return draft, review

    async def brief(event: ev.BriefGathered, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        if event.inputs.email == REDACTED or briefs.has_step_in(inputs.log, event.request_id):
            return []  # an erase stored the log again: the brief was written (or the lead forgotten)
        started, data = time.monotonic(), event.inputs
        if llm is None:
            text, meta = plain.brief(data)
            return [completed(event, ctx, started, backend=backend, brief=text, metadata=meta,
                              call_script=plain.call_script(data), summary=summary(data, text, meta))]
        attempts = 1
        draft, review = await write(attempts, data, ctx)
        if review is not None and review.verdict == "fail":
            metrics.briefs.labels("retried", backend).inc()
            attempts = 2
            draft, review = await write(attempts, data, ctx, feedback=review.issues)
        if review is None:
            return [brief_failed(event, NAME, attempts,
                                 f"the brief's metadata is not valid (draft {attempts}): {draft.metadata_error}", backend)]
        script = await writer.call_script(llm, data, draft, ctx.record_llm)
        return [completed(event, ctx, started, backend=backend, brief=draft.text, metadata=draft.metadata,
                          call_script=script, summary=summary(data, draft.text, draft.metadata),
                          verdict=review.verdict, issues=review.issues, ungrounded_numbers=draft.ungrounded_numbers,
                          missing_sections=draft.missing_sections, attempts=attempts)]

    return Node(name=NAME, consumes=("brief_gathered",), handle=brief, max_in_flight=concurrency,
                needs=Needs(log=briefs.OUTCOMES),
                failure=lambda event, node, attempts, reason: brief_failed(event, node, attempts, reason, backend))


def completed(event: ev.BriefGathered, ctx: Context, started: float, backend: str, **fields) -> ev.BriefCompleted:
    duration = time.monotonic() - started
    metrics.briefs.labels("generated", backend).inc()
    metrics.brief_seconds.labels(backend).observe(duration)
    return ctx.follow(ev.BriefCompleted, request_id=event.request_id, backend=backend,
                      duration_s=round(duration, 3), **fields)
