"""account_reporter: an account's gathered data → a validated report and a sales script.

With a model (`BRIEFS_BACKEND=llm`, the `briefs` LLM role), the passes of reports/writer.py,
each step stored in the account's log as it happens: `AccountReportDrafted` (sections
repaired, metadata and how it was obtained, the input figures it leaves out and whether
that is more than half), `AccountReportEvaluated` (pass / marginal / fail); a failed draft is
written once more with the evaluator's issues as feedback; then the sales script, and
`AccountReportCompleted`. A draft whose metadata neither validates nor can be extracted
ends in `AccountReportFailed`: a report is never completed with made-up metadata.

Without one (`BRIEFS_BACKEND=data`, the default without a key): reports/plain.py, labelled
as data-only, every number in it from the account data.

Either way, the sections the account manager wrote by hand in the account's previous report
(`ReportInputs.kept_sections`) replace the written ones, and the completed report stores its
sections split (`preamble`, `sections`): what its edits apply to (report_editor.py).

The model calls are limited deployment-wide: this node's durable hands out at most
`REPORTS_CONCURRENCY` gathered accounts at a time across all replicas (its max ack
pending); each call retries with backoff on rate limits and timeouts (shared/llm.py).
"""

from __future__ import annotations

import logging
import time

from services.enricher.reports import document, plain, writer
from services.enricher.reports.failure import report_failed
from shared import account_reports, metrics
from shared import events as ev
from shared.briefs import has_step_in
from shared.llm import LLMClient
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "account_reporter"


def drafted(ctx: Context, attempt: int, draft: writer.Draft) -> ev.AccountReportDrafted:
    # Keyed by the delivery too: a redelivered item writes its drafts anew, and its stored
    # steps must be those of the report it completes.
    return ctx.follow(ev.AccountReportDrafted, key=f"drafted-{ctx.attempt}-{attempt}", attempt=attempt,
                      text=draft.text, repaired_sections=draft.repaired_sections,
                      missing_sections=draft.missing_sections, metadata=draft.metadata,
                      metadata_method=draft.metadata_method, metadata_error=draft.metadata_error,
                      missing_numbers=draft.missing_numbers, numbers_warning=draft.numbers_warning)


def make_node(llm: LLMClient | None, concurrency: int = 2) -> Node:
    backend = "llm" if llm is not None else "data"

    async def write(number: int, data: ev.ReportInputs, ctx: Context, feedback: list[str] | None = None
                    ) -> tuple[writer.Draft, writer.Review | None]:
        draft = await writer.draft(llm, data, ctx.record_llm, feedback=feedback)
        if draft.numbers_warning:
            log.warning("the report leaves out more than half of the account's figures",
                        extra={"site": ctx.cause.site, "account": data.account.id, "missing": draft.missing_numbers})
        await ctx.emit(drafted(ctx, number, draft))
        if draft.metadata is None:
            return draft, None
        review = await writer.review(llm, data, draft, ctx.record_llm)
        await ctx.emit(ctx.follow(ev.AccountReportEvaluated, key=f"evaluated-{ctx.attempt}-{number}", attempt=number,
                                  verdict=review.verdict, issues=review.issues))
        return draft, review

    async def report(event: ev.AccountReportGathered, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        if has_step_in(inputs.log, event.request_id):
            return []  # stored again (or redelivered after its outcome): written already
        started, data = time.monotonic(), event.inputs
        deals = [m.deal.id for m in data.deals]
        if llm is None:
            text, meta = plain.report(data)
            text = document.keep(text, data.kept_sections)
            return [completed(event, ctx, started, backend=backend, report=text, metadata=meta,
                              sales_script=plain.sales_script(data, meta), deals=deals)]
        attempts = 1
        draft, review = await write(attempts, data, ctx)
        if review is not None and review.verdict == "fail":
            metrics.reports.labels("retried", backend).inc()
            attempts = 2
            draft, review = await write(attempts, data, ctx, feedback=review.issues)
        if review is None:
            return [report_failed(event, NAME, attempts,
                                  f"the report's metadata is not valid (draft {attempts}): {draft.metadata_error}",
                                  backend)]
        script = await writer.sales_script(llm, data, draft, ctx.record_llm)
        return [completed(event, ctx, started, backend=backend, report=draft.text, metadata=draft.metadata,
                          sales_script=script, deals=deals, verdict=review.verdict, issues=review.issues,
                          missing_numbers=draft.missing_numbers, numbers_warning=draft.numbers_warning,
                          missing_sections=draft.missing_sections, attempts=attempts)]

    return Node(name=NAME, consumes=("account_report_gathered",), handle=report, max_in_flight=concurrency,
                needs=Needs(log=account_reports.OUTCOMES),
                failure=lambda event, node, attempts, reason: report_failed(event, node, attempts, reason, backend))


def completed(event: ev.AccountReportGathered, ctx: Context, started: float, backend: str, **fields
              ) -> ev.AccountReportCompleted:
    duration = time.monotonic() - started
    metrics.reports.labels("generated", backend).inc()
    preamble, sections = document.split(fields["report"])
    return ctx.follow(ev.AccountReportCompleted, request_id=event.request_id, account_id=event.inputs.account.id,
                      backend=backend, duration_s=round(duration, 3), preamble=preamble, sections=sections,
                      hand_edited=[kept.name for kept in event.inputs.kept_sections], **fields)
