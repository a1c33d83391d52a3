"""`concierge eval briefs --mock`: the lead-brief contract cases through the enricher's own
nodes, the recorded model replies served by the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli.measure.evals import brief_eval

ROOT = Path(__file__).resolve().parents[1]


def concierge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "LLM_BASE_URL": ""})


def test_the_mock_eval_passes_and_ends_with_its_figures():
    done = concierge("eval", "briefs", "--mock")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cases"] >= 12 and result["passed"] is True
    assert result["sections_complete_rate"] == 1.0 and result["metadata_valid_rate"] == 1.0
    assert result["ungrounded_numbers"] == 1 and result["audit_misses"] == 0, "the one invented figure is caught"
    assert result["retried"] == 1 and result["triage_accuracy"] >= 0.8
    assert "miss: small-team-ready: triage nurture, expected call_first" in done.stdout


def test_the_eval_fails_when_a_repair_path_breaks(tmp_path):
    """Without the recorded section re-prompt, the case whose brief lacks two sections gets
    the scripted server's echo instead: the sections stay missing, and the eval fails."""
    recording = json.loads(brief_eval.RECORDED.read_text())
    recording["replies"] = [r for r in recording["replies"] if "You add missing sections" not in r["when"]]
    broken = tmp_path / "recorded.json"
    broken.write_text(json.dumps(recording))
    assert brief_eval.eval_briefs(mock=True, recording=broken) == 1


def test_without_a_model_or_mock_it_says_what_to_set():
    done = concierge("eval", "briefs")
    assert done.returncode == 2 and "--mock" in done.stderr
