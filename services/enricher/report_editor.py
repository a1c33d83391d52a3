"""report_editor: an edit of an account report → its next version (`AccountReportRevised`).

Takes `AccountReportEditRequested` work items from the BRIEFS work queue, one at a time
across every replica (its durable's max ack pending is 1), so each edit reads the version
the one before it wrote and no two edits write the same version. Reads the account's log:
the report (`AccountReportCompleted`, its sections split), its revisions, the inputs it was
written from (the account as gathered, for the facts an edit may add).

- By hand (`how` hand): the section's new text, as written. Written on an older version
  than the latest, and the section changed since: refused (the edit would undo another's).
  The section is a hand edit from then on: an asked-for change and a new report keep it.
- Asked for in words (`how` asked): reports/edits.py, with the model (`update_report`) or,
  without one or when it fails, the rule editor. Hand-edited sections change only when the
  instruction names them.

Nothing to change, an unknown report, or an instruction that cannot be done ends in an
`AccountReportEditFailed` naming why; the report is unchanged. An edit stored already (its
`edit_id` in the log) is not made twice.
"""

from __future__ import annotations

import logging

import msgspec

from services.enricher.reports import edits, writer
from shared import account_reports
from shared import events as ev
from shared import subjects
from shared.llm import LLMClient, LLMError
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "report_editor"
READS = ("account_report_gathered", "account_report_completed", *account_reports.EDIT_OUTCOMES)


class Refused(Exception):
    """The edit cannot be made as asked: an `AccountReportEditFailed` says why (no retry:
    the operator's to change, not the deployment's)."""


def failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.AccountReportEditFailed:
    return ev.follow(event, ev.AccountReportEditFailed, node, key="failed", account_id=getattr(event, "account_id", ""),
                     request_id=getattr(event, "request_id", ""), edit_id=getattr(event, "edit_id", ""), node=node,
                     reason=reason[:2000], attempts=attempts, failed_event_id=event.event_id)


def by_hand(event: ev.AccountReportEditRequested, history: list[account_reports.Version]) -> dict[str, str]:
    latest = history[-1]
    text = event.text.strip()
    if text == latest.sections.get(event.section, "").strip():
        raise Refused(f"the {event.section} section already reads so: nothing to change")
    if event.base_version > latest.version:
        raise Refused(f"the report has no version {event.base_version} (its latest is {latest.version})")
    if event.base_version and event.base_version < latest.version:
        since = [v for v in history if v.version > event.base_version and event.section in v.changed]
        if since:
            raise Refused(f"the {event.section} section was changed after version {event.base_version} "
                          f"(version {since[-1].version}, by {since[-1].actor}): reload it and edit again")
    return {event.section: text}


def make_node(llm: LLMClient | None) -> Node:

    async def asked(event: ev.AccountReportEditRequested, latest: account_reports.Version,
                    inputs: ev.ReportInputs | None, site_name: str, ctx: Context) -> tuple[dict[str, str], str]:
        model = ""
        if llm is not None:
            try:
                changes = await edits.with_llm(llm, site_name, writer.render(inputs) if inputs else "unknown",
                                               latest.sections, latest.hand_edited, event.instruction, ctx.record_llm)
                return changes, "llm"
            except (edits.EditRefused, msgspec.MsgspecError, LLMError) as exc:
                model = f"the model's edit failed ({str(exc)[:300]}); "
                log.warning("model edit failed; the rule editor tries", extra={"site": event.site, "error": str(exc)})
        if inputs is None:
            raise Refused(f"{model}the report's inputs are not in the log: only a hand edit can change it")
        try:
            return edits.by_rule(latest.sections, event.instruction, inputs), "data"
        except edits.EditRefused as exc:
            raise Refused(f"{model}{exc}") from None

    async def edit(event: ev.AccountReportEditRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        try:
            return await revise(event, inputs, ctx)
        except Refused as exc:
            return [failed(event, NAME, ctx.attempt, str(exc))]

    async def revise(event: ev.AccountReportEditRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        if any(e.edit_id == event.edit_id and e.request_id == event.request_id
               for kind in account_reports.EDIT_OUTCOMES for e in inputs.log[kind]):
            return []  # made (or refused) already: redelivered
        completed = next((c for c in inputs.log["account_report_completed"] if c.request_id == event.request_id), None)
        if completed is None:
            raise Refused(f"no completed report {event.request_id!r} for account {event.account_id!r}")
        if not completed.sections:
            raise Refused("this report was written before reports stored their sections: "
                          "generate a new one to edit it")
        history = account_reports.versions(completed, inputs.log["account_report_revised"])
        latest = history[-1]
        gathered = next((g.inputs for g in inputs.log["account_report_gathered"]
                         if g.request_id == event.request_id), None)
        ignored: list[str] = []
        if event.how == "hand":
            if account_reports.canonical(event.section) != event.section:
                raise Refused(f"{event.section!r} is not a section of the report")
            changes, used = by_hand(event, history), ""
            hand = [*dict.fromkeys([*latest.hand_edited, event.section])]
        else:
            changes, used = await asked(event, latest, gathered, inputs.config.name or event.site, ctx)
            # A section given back as it was is no change (nor a hand edit the model touched).
            changes = {name: text for name, text in changes.items() if text != latest.sections.get(name)}
            changes, ignored = edits.keep_hand_edits(changes, latest.hand_edited, event.instruction)
            if not changes:
                kept = f" (hand-edited, kept: {', '.join(ignored)})" if ignored else ""
                raise Refused(f"the change asked for leaves the report as it is{kept}")
            # A section the instruction rewrote is the writer's again, not a hand edit.
            hand = [name for name in latest.hand_edited if name not in changes]
        return [ctx.follow(ev.AccountReportRevised, key=f"revised-{event.edit_id}", account_id=event.account_id,
                           request_id=event.request_id, edit_id=event.edit_id, version=latest.version + 1,
                           how=event.how, actor=event.actor, instruction=event.instruction, backend=used,
                           changes=[ev.ReportSection(name=n, text=changes[n]) for n in account_reports.SECTIONS
                                    if n in changes],
                           hand_edited=[n for n in account_reports.SECTIONS if n in hand], ignored=ignored)]

    return Node(name=NAME, consumes=("account_report_edit_requested",), handle=edit, max_in_flight=1,
                needs=Needs(config=True, log=READS), stream=subjects.BRIEFS_STREAM,
                failure=failed)
