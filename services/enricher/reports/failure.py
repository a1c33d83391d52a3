"""How a report step's give-up is recorded: an `AccountReportFailed` in the account's log,
and counted."""

from __future__ import annotations

from shared import events as ev
from shared import metrics


def report_failed(event: ev.Envelope, node: str, attempts: int, reason: str, backend: str = "") -> ev.AccountReportFailed:
    metrics.reports.labels("failed", backend or "unknown").inc()
    account_id = event.inputs.account.id if isinstance(event, ev.AccountReportGathered) else getattr(event, "account_id", "")
    return ev.follow(event, ev.AccountReportFailed, node, key="failed", node=node, reason=reason[:2000],
                     attempts=attempts, account_id=account_id, request_id=getattr(event, "request_id", ""),
                     failed_event_id=event.event_id)
