"""`concierge eval answers`: its scoring (pure), its shipped dataset, one run of the command
against a running system whose answer LLM is scripted, and the shipped dataset through a
system with no model, where the eval must score every answer as the server's audit did."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cli.measure.evals import answer_eval as ae
from cli.harness.supervisor import free_port, make_system
from tests.servers import ROOT, scripted_llm

KB = ROOT / "knowledge" / "demo"


def q(facts=(), forbidden=(), messages=("Which accounting tools?",)) -> ae.Question:
    return ae.Question(id="q", lang="en", messages=list(messages), facts=[list(f) for f in facts],
                       forbidden=list(forbidden))


def test_a_fact_matches_any_spelling_ignoring_case_spaces_and_bold():
    assert ae.has_fact("Synced every **ten   Minutes** [1].", ["10 minutes", "ten minutes"])
    assert ae.has_fact("QUICKBOOKS Online", ["QuickBooks"])
    assert ae.has_fact("from 7\u00a0am", ["7 am"])  # a no-break space is a space
    assert not ae.has_fact("Synced hourly.", ["10 minutes", "ten minutes"])


def test_a_number_fact_does_not_match_inside_a_longer_number():
    assert ae.has_fact("$29 per technician", ["29"]) and ae.has_fact("29.", ["29"])
    assert not ae.has_fact("$290 per technician", ["29"]) and not ae.has_fact("1290", ["29"])


def test_missing_facts_lists_each_fact_not_found():
    facts = [["QuickBooks"], ["Xero"], ["10 minutes", "ten minutes"]]
    assert ae.missing_facts("QuickBooks and Xero, every 10 minutes", facts) == []
    assert ae.missing_facts("QuickBooks only", facts) == [["Xero"], ["10 minutes", "ten minutes"]]


def test_forbidden_statements_are_found_but_their_negation_is_not():
    forbidden = ["a credit card is required", "does not integrate with QuickBooks"]
    assert ae.forbidden_found("Yes, 14 days; a Credit Card is  required.", forbidden) == ["a credit card is required"]
    assert ae.forbidden_found("No credit card is required.", forbidden) == []


def test_a_citation_counts_only_when_it_names_a_source_the_turn_sent():
    def cited(text, sources):
        return ae.score(q(), text, sources, []).cited

    sources = [{"n": 1}, {"n": 2}]
    assert cited("Xero [2].", sources) == [2] and cited("Xero [1, 2].", sources) == [1, 2]
    assert cited("Xero [3].", sources) == []
    assert cited("Xero [1].", []) == []
    assert cited("Xero (1).", sources) == []


def test_numbers_are_supported_by_the_sources_the_question_or_the_sites_words():
    grounding = ["Starter costs $29 per technician; more than 5,000 apps; most teams go live in two to four weeks"]
    scored = ae.score(q(messages=["We have 12 technicians."]),
                      "1. Starter: $29 [1] for 12 technicians\n2. 5000 apps, 2-4 weeks, 45 days", [{"n": 1}], grounding)
    assert scored.unsupported == ["45"]
    metadata = {"cta": {"label": "Book a 30-minute demo", "url": "https://x.example/book"},
                "skill_selection_state": {"qualification_question": "More than 10 technicians?"}}
    assert ae.site_words(metadata) == ["Book a 30-minute demo", "More than 10 technicians?"]
    assert ae.site_words({"cta": None, "skill_selection_state": {"qualification_question": None}}) == []


def test_an_answer_disagreeing_with_the_servers_audit_is_a_miss_and_counted():
    agreed = ae.score(q(), "Xero [1], 45 days", [{"n": 1}], [], server=ae.Audit(cited=[1], unsupported=["45"]))
    differs = ae.score(q(), "Xero [1], 45 days", [{"n": 1}], [], server=ae.Audit(cited=[1], unsupported=[]))
    assert not agreed.disagrees and differs.disagrees
    assert ae.figures([agreed, differs])["audit_disagreements"] == 1
    assert "the server's audit differs: cited [1], unsupported []" in " ".join(ae.miss_lines(differs))
    assert ae.figures([agreed, ae.score(q(), "Xero [1]", [{"n": 1}], [])])["audit_disagreements"] is None


def test_figures_and_the_targets():
    right = ae.score(q([["Xero"]]), "Xero [1]", [{"n": 1}], ["Xero"], ttft_ms=100)
    wrong = ae.score(q([["Xero"]], ["no accounting integration"]), "There is no accounting integration, and 7 more", [{"n": 1}], [], ttft_ms=300)
    f = ae.figures([right, wrong])
    assert (f["answers"], f["all_facts_rate"], f["citation_rate"], f["forbidden"], f["unsupported_numbers"]) == \
        (2, 0.5, 0.5, 1, 1)
    assert f["ttft_ms_p50"] == 200.0 and f["passed"] is False
    assert ae.figures([right] * 9)["passed"] is True
    # One answer in ten without a citation still passes (0.9); one forbidden statement never does.
    uncited = ae.score(q([["Xero"]]), "Xero", [{"n": 1}], [])
    assert ae.figures([right] * 9 + [uncited])["passed"] is True
    assert ae.figures([right] * 8 + [uncited] * 2)["passed"] is False
    assert ae.figures([right] * 20 + [wrong])["forbidden"] == 1 and ae.figures([right] * 20 + [wrong])["passed"] is False


def test_the_shipped_dataset_is_written_from_the_demo_knowledge_base():
    questions = ae.read_dataset(ae.DATASET)
    assert len(questions) >= 40 and len({x.id for x in questions}) == len(questions)
    assert {"en", "fr", "de", "es"} <= {x.lang for x in questions}
    assert sum(1 for x in questions if len(x.messages) > 1) >= 5
    kb = ae.normalize(" ".join(p.read_text() for p in KB.glob("*.md")))
    for question in questions:
        assert question.facts, question.id
        # Every English fact has a spelling that is in the knowledge base: the set asks what it says.
        if question.lang == "en":
            for fact in question.facts:
                assert any(ae.normalize(s) in kb for s in fact), (question.id, fact)


def test_a_malformed_row_names_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "messages": ["hi"], "facts": [["x"]]}\n{"id": "b", "messages": [], "facts": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        ae.read_dataset(path)


@pytest.fixture(scope="module")
def scripted_system():
    """A running system: the answer role on its own scripted LLM, every other role on another."""
    with scripted_llm() as answers, scripted_llm() as others, \
            tempfile.TemporaryDirectory(prefix="concierge-answer-eval-test-") as data:
        system = make_system(Path(data), free_port(), free_port(), {
            "LLM_BASE_URL": others.base_url, "LLM_ANSWER_BASE_URL": answers.base_url, "BRIEFS_BACKEND": "data",
            "RATE_LIMIT_PER_IP_PER_MIN": "0", "ANSWER_WAIT_S": "5", "ANSWER_RETRIEVAL_WAIT_S": "5"})
        try:
            system.ingest("demo", KB)
            system.start_all()
            yield system, answers
        finally:
            system.stop()


def run_command(system, dataset: Path) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ADMIN_TOKEN": system.env["ADMIN_TOKEN"]}
    done = subprocess.run([sys.executable, "-m", "cli", "eval", "answers", "--dataset", str(dataset),
                           "--base-url", system.gateway_url], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    last = done.stdout.strip().splitlines()[-1]
    return done.returncode, json.loads(last), done.stdout + done.stderr


def test_the_command_scores_a_right_and_a_wrong_answer_and_fails(scripted_system, tmp_path):
    system, answers = scripted_system
    dataset = tmp_path / "two.jsonl"
    dataset.write_text("\n".join(json.dumps(row) for row in [
        {"id": "right", "lang": "en", "messages": ["Which accounting software do you integrate with?"],
         "facts": [["QuickBooks"], ["Xero"], ["10 minutes", "ten minutes"]],
         "forbidden": ["does not integrate with QuickBooks"]},
        {"id": "wrong", "lang": "en", "messages": ["Do you integrate with QuickBooks?", "And Xero?"],
         "facts": [["Xero"], ["10 minutes"]], "forbidden": ["does not integrate with Xero"]},
    ]) + "\n")
    answers.clear()
    answers.fail_next(
        {"reply": "Tidewise syncs with **QuickBooks** Online and Xero every 10 minutes [1]."},
        {"reply": "Yes, with QuickBooks [1]."},  # the follow-up's first turn, not scored
        {"reply": "Tidewise does not integrate with Xero; ask again in 45 days."},
    )
    status, figures, output = run_command(system, dataset)
    assert status == 1, output
    assert figures["answers"] == 2 and figures["failed_turns"] == 0, output
    assert figures["all_facts_rate"] == 0.5 and figures["citation_rate"] == 0.5, output
    assert figures["forbidden"] == 1 and figures["unsupported_numbers"] == 1, output
    assert figures["grounding"] == "documents" and figures["ttft_ms_p50"] > 0, output
    assert figures["audit_disagreements"] == 0, output  # the server flagged the 45 too
    assert "wrong [en, ANSWER] 'And Xero?'" in output and "FORBIDDEN 'does not integrate with Xero'" in output
    assert "unsupported numbers 45" in output and "right [en" not in output
    # The follow-up reached the answer with its previous turn.
    sent = [r["messages"] for r in answers.requests()]
    assert [m["content"] for m in sent[-1] if m["role"] == "user"] == ["Do you integrate with QuickBooks?", "And Xero?"]


def test_the_command_passes_when_every_answer_is_right(scripted_system, tmp_path):
    system, answers = scripted_system
    dataset = tmp_path / "one.jsonl"
    dataset.write_text(json.dumps({"id": "trial", "lang": "en", "messages": ["Is there a free trial?"],
                                   "facts": [["14 days"]], "forbidden": ["a credit card is required"]}) + "\n")
    answers.clear()
    answers.fail_next({"reply": "Yes: every plan can be tried free for 14 days, no credit card required [1]."})
    status, figures, output = run_command(system, dataset)
    assert status == 0, output
    assert (figures["all_facts_rate"], figures["citation_rate"], figures["forbidden"],
            figures["unsupported_numbers"]) == (1.0, 1.0, 0, 0), output


def test_on_every_shipped_answer_the_eval_finds_what_the_servers_audit_found(tmp_path):
    """The shipped dataset as `make eval` asks it (no model: extractive answers): per answer,
    the sources cited and the unsupported figures, by the eval and by the server's audit
    (the `complete` metadata's `cited` flags, `ResponseCompleted.unsupported_numbers`)."""
    questions = ae.read_dataset(ae.DATASET)
    system = make_system(tmp_path, free_port(), free_port(), {
        "RATE_LIMIT_PER_IP_PER_MIN": "0", "LLM_BASE_URL": "", "ANSWER_BACKEND": "extractive"})
    try:
        system.ingest("demo", KB)
        system.start_all()
        scored = asyncio.run(ae.ask_all(system.gateway_url, "demo", questions, system.env["ADMIN_TOKEN"]))
    finally:
        system.stop()
    assert [s.question.id for s in scored if s.error or s.server is None] == []
    # The metadata lists the sources in their order, the eval in the order the answer cites them.
    assert [(s.question.id, sorted(s.cited), s.unsupported) for s in scored] == \
        [(s.question.id, s.server.cited, s.server.unsupported) for s in scored]
    assert sum(1 for s in scored if s.cited) >= 0.9 * len(scored)  # not a vacuous agreement
    assert ae.figures(scored)["audit_disagreements"] == 0
