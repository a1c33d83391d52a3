"""`concierge eval accounts --mock`: the account-report contract cases through the enricher's
own nodes (`account_reporter`, `opportunity_finder`, `report_editor`), the recorded model
replies served by the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.measure.evals import account_eval
from services.enricher.reports import edits, opportunities, rules
from shared import events as ev

ROOT = Path(__file__).resolve().parents[1]


def concierge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "LLM_BASE_URL": ""})


def of_kind(kind: type) -> list:
    return [c for c in account_eval.load(account_eval.DATASET) if isinstance(c, kind)]


def test_the_mock_eval_passes_and_ends_with_its_figures():
    done = concierge("eval", "accounts", "--mock")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    kinds = result["kinds"]
    assert kinds["report"] >= 13 and kinds["opportunities"] >= 3 and kinds["edit"] >= 3
    assert result["cases"] == sum(kinds.values()) >= 21 and result["passed"] is True
    for rate in ("sections_complete_rate", "metadata_valid_rate", "proposition_accuracy", "numbers_kept_rate",
                 "numbers_warning_accuracy", "sales_scripts_complete_rate"):
        assert result[rate] == 1.0, rate
    assert result["fallback_cases_ok"] == 2 and result["sections_repaired"] == 1 and result["retried"] == 1
    assert result["failures_as_expected"] == 1, "the report whose metadata validates neither way fails, as it should"
    assert result["path_misses"] == 0
    assert result["verdicts"]["marginal"] == 1, "the report that leaves out most figures"
    for rate in ("opportunities_accuracy", "opportunities_top_accuracy", "opportunities_selected_accuracy"):
        assert result[rate] == 1.0, rate
    assert result["opportunities_repaired"] == 1 and result["opportunities_by_rule"] == 1
    assert result["opportunities_path_misses"] == 0
    assert result["edits_ok"] == kinds["edit"]
    # Of the model's two edits of a report with a hand edit it was not asked to change, one
    # rewrote it (the recorded Risks, kept by the node): the model's behaviour, not the node's.
    assert result["hand_edits_kept_rate"] == 0.5
    assert result["edit_ungrounded_numbers"] == 0 and result["edits_path_misses"] == 0
    assert result["edits_repaired"] == 1 and result["edits_by_rule"] == 1
    assert result["edits_ignored"] == 1, "the hand-edited Risks the model rewrote unasked, kept"
    assert "miss:" not in done.stdout


def test_the_shipped_cases_cover_every_proposition_and_repair_path():
    cases = of_kind(account_eval.ReportCase)
    assert {c.expect.proposition for c in cases} == {"upsell", "negotiation", "churn", "healthy"}
    for case in cases:  # the proposition expected is the one the documented rules read from the figures
        assert rules.proposition(rules.read(case.inputs.account, case.inputs.today)) == case.expect.proposition, case.id
    paths = [c.recorded for c in cases]
    assert sum(bool(p.repaired) for p in paths) == 1 and sum(p.metadata == "structured" for p in paths) == 2
    assert sum(p.attempts == 2 for p in paths) == 1 and sum(p.fails for p in paths) == 1
    assert sum(p.numbers_warning for p in paths) == 1
    assert account_eval.SCRIPT_SECTIONS == ("Talk tracks", "Objection handlers", "Closing")


def test_the_opportunities_cases_expect_what_the_rule_reads_and_cover_every_path():
    """The fallback case expects the rule's ranking, so every case's expectations are the
    rule's: each account's proposition, how its ranking begins, its pre-selection."""
    cases = of_kind(account_eval.OpportunitiesCase)
    for case in cases:
        assert 3 <= len(case.accounts) <= 8, case.id
        ranked = opportunities.rank_by_rule(case.accounts, case.today)
        assert case.expect.propositions == {o.account_id: o.proposition for o in ranked}, case.id
        assert [o.account_id for o in ranked][:len(case.expect.first)] == case.expect.first and case.expect.first
        assert set(case.expect.selected) == set(opportunities.selected(ranked, case.select)), case.id
    assert {p for c in cases for p in c.expect.propositions.values()} == {"upsell", "negotiation", "churn", "healthy"}
    assert sorted(c.recorded.path for c in cases) == ["model", "model", "repaired", "rule"]


def test_the_edit_cases_keep_every_unnamed_hand_edit_and_cover_every_path():
    cases = of_kind(account_eval.EditCase)
    for case in cases:  # a hand-edited section changes only when the instruction names it
        named = edits.named(case.instruction)
        assert all(s.name in named for s in case.hand if s.name in case.expect.changed), case.id
        assert set(case.expect.shorter) <= set(case.expect.changed) and set(case.recorded.ignored) <= {
            s.name for s in case.hand}, case.id
    survives = next(c for c in cases if c.id == "edit-hand-risks-survive-shorter-summary")
    assert [s.name for s in survives.hand] == ["Risks"] and survives.instruction == "make the executive summary shorter"
    assert survives.expect.changed == ["Executive Summary"] and survives.recorded.ignored == ["Risks"]
    assert sorted(c.recorded.path for c in cases) == ["model", "model", "model", "repaired", "rule"]


@pytest.mark.parametrize("kind, repair, miss", [
    ("opportunities", ["That ranking is not valid", "brackenridge-mechanical"],
     "miss: opportunities-missing-account-repaired: path rule, recorded repaired (the model's ranking is not valid: "
     "account lantern-solar is not ranked)"),
    ("edit", ["That edit is not valid", "Account: Seabright Facility Care"],
     "miss: edit-invalid-reply-repaired: path rule, recorded repaired"),
])
def test_the_eval_fails_when_a_new_kinds_repair_round_breaks(tmp_path, capsys, kind, repair, miss):
    """Without the recorded answer to the repair round, the model's first answer comes again,
    still not valid: the rule ranks (or edits) instead, off the recorded path, and the eval fails."""
    dataset = json.loads(account_eval.DATASET.read_text())
    dataset["cases"] = [c for c in dataset["cases"] if c["kind"] == kind]
    recording = json.loads(account_eval.RECORDED.read_text())
    recording["replies"] = [r for r in recording["replies"] if not set(repair) <= set(r["when"])]
    (tmp_path / "cases.json").write_text(json.dumps(dataset))
    (tmp_path / "recorded.json").write_text(json.dumps(recording))
    assert account_eval.eval_accounts(tmp_path / "cases.json", mock=True, recording=tmp_path / "recorded.json") == 1
    out = capsys.readouterr().out
    assert miss in out
    assert json.loads(out.strip().splitlines()[-1])["passed"] is False


def test_the_eval_fails_when_a_repair_path_breaks(tmp_path, capsys):
    """Without the recorded section re-prompt, the report that lacks two sections gets the
    scripted server's echo instead: the sections stay missing, and the eval fails."""
    recording = json.loads(account_eval.RECORDED.read_text())
    recording["replies"] = [r for r in recording["replies"] if "You add missing sections" not in r["when"][0]]
    broken = tmp_path / "recorded.json"
    broken.write_text(json.dumps(recording))
    assert account_eval.eval_accounts(mock=True, recording=broken) == 1
    out = capsys.readouterr().out
    assert "miss: sections-missing-repaired: sections missing: Evidence, Next Steps" in out
    assert json.loads(out.strip().splitlines()[-1])["passed"] is False


def test_without_a_model_or_mock_it_says_what_to_set():
    done = concierge("eval", "accounts")
    assert done.returncode == 2 and "--mock" in done.stderr


def test_a_figure_only_inside_an_iso_date_is_not_kept():
    """A renewal on 2027-02-10 states neither 2027, 2 nor 10: a report must state the figure itself."""
    assert not account_eval.kept("It renews on 2027-02-10.", "10")
    assert not account_eval.kept("It renews on 2027-02-10.", "2")
    assert account_eval.kept("Storage: 3.9 of 10 GB; it renews on 2027-02-10.", "10")
    assert account_eval.kept("Renewal in 75 days, on 2027-02-10.", "75")


def revision(case: account_eval.EditCase, changes: dict[str, str], ignored: list[str]) -> ev.AccountReportRevised:
    return ev.AccountReportRevised(event_id="e", site="eval", session_id="s", turn=0, ts=0.0, account_id="a",
                                   request_id=case.id, edit_id="x", version=3, how="asked", actor="eval",
                                   changes=[ev.ReportSection(name=n, text=t) for n, t in changes.items()],
                                   ignored=ignored)


def test_live_a_hand_edit_the_model_rewrote_unasked_is_a_miss_although_the_node_kept_it():
    case = next(c for c in of_kind(account_eval.EditCase) if c.id == "edit-hand-risks-survive-shorter-summary")
    _, _, before = account_eval.edit_log(case)
    shorter = {"Executive Summary": "Renewal on track."}
    rewrote = revision(case, shorter, ignored=["Risks"])
    assert account_eval.edit_misses(case, revision(case, shorter, ignored=[]), before, mock=False) == []
    assert account_eval.edit_misses(case, rewrote, before, mock=False) == [
        "the model rewrote hand-edited sections the instruction does not name: Risks (the node kept them as written)"]
    assert account_eval.edit_misses(case, rewrote, before, mock=True) == []  # compared to the recording instead
    # The node's own guarantee, checked apart: an unnamed hand edit in the changes applied.
    overwritten = revision(case, {**shorter, "Risks": "None."}, ignored=[])
    assert "hand-edited and not to change, overwritten: Risks" in account_eval.edit_misses(
        case, overwritten, before, mock=True)


def test_a_recorded_model_that_rewrites_an_unnamed_hand_edit_passes_only_when_the_case_expects_it(tmp_path, capsys):
    """The recorded model rewrites the hand-edited Risks asked only to shorten the summary;
    a case that does not record it as `ignored` fails."""
    dataset = json.loads(account_eval.DATASET.read_text())
    dataset["cases"] = [c for c in dataset["cases"] if c["kind"] == "edit"]
    survives = next(c for c in dataset["cases"] if c["id"] == "edit-hand-risks-survive-shorter-summary")
    survives["recorded"]["ignored"] = []
    (tmp_path / "cases.json").write_text(json.dumps(dataset))
    assert account_eval.eval_accounts(tmp_path / "cases.json", mock=True) == 1
    out = capsys.readouterr().out
    assert "miss: edit-hand-risks-survive-shorter-summary: ignored ['Risks'], recorded []" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["passed"] is False and result["hand_edits_kept_rate"] == 0.5
