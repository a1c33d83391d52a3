"""`concierge eval accounts --mock`: the account-report contract cases through the enricher's
own `account_reporter` node, the recorded model replies served by the scripted
OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli.measure.evals import account_eval
from services.enricher.reports import rules

ROOT = Path(__file__).resolve().parents[1]


def concierge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "LLM_BASE_URL": ""})


def test_the_mock_eval_passes_and_ends_with_its_figures():
    done = concierge("eval", "accounts", "--mock")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cases"] >= 13 and result["kinds"]["report"] >= 13 and result["passed"] is True
    for rate in ("sections_complete_rate", "metadata_valid_rate", "proposition_accuracy", "numbers_kept_rate",
                 "numbers_warning_accuracy", "sales_scripts_complete_rate"):
        assert result[rate] == 1.0, rate
    assert result["fallback_cases_ok"] == 2 and result["sections_repaired"] == 1 and result["retried"] == 1
    assert result["failures_as_expected"] == 1, "the report whose metadata validates neither way fails, as it should"
    assert result["path_misses"] == 0
    assert result["verdicts"]["marginal"] == 1, "the report that leaves out most figures"
    assert "miss:" not in done.stdout


def test_the_shipped_cases_cover_every_proposition_and_repair_path():
    cases = [c for c in account_eval.load(account_eval.DATASET) if isinstance(c, account_eval.ReportCase)]
    assert {c.expect.proposition for c in cases} == {"upsell", "negotiation", "churn", "healthy"}
    for case in cases:  # the proposition expected is the one the documented rules read from the figures
        assert rules.proposition(rules.read(case.inputs.account, case.inputs.today)) == case.expect.proposition, case.id
    paths = [c.recorded for c in cases]
    assert sum(bool(p.repaired) for p in paths) == 1 and sum(p.metadata == "structured" for p in paths) == 2
    assert sum(p.attempts == 2 for p in paths) == 1 and sum(p.fails for p in paths) == 1
    assert sum(p.numbers_warning for p in paths) == 1
    assert account_eval.SCRIPT_SECTIONS == ("Talk tracks", "Objection handlers", "Closing")


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
