"""The lead-brief eval data: the cases are valid contract inputs, and the recorded replies
answer every request the pipeline makes for them, repair paths included."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from cli.harness.scripted_llm import Script, read_recording
from shared.events import BRIEF_STAGES, TRIAGE_CLASSES, BriefInputs, BriefMetadata, TriageItem, Verdict

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "services" / "enricher" / "data"
KB = ROOT / "knowledge" / "demo"
CASES = json.loads((DATA / "briefs_eval.json").read_text())["cases"]
SCRIPT = Script(recorded=read_recording(DATA / "briefs_recorded.json"))
SECTIONS = ["Executive summary", "Situation", "Needs", "Evidence from the conversation", "Product fit",
            "Risks", "Next steps", "Key question"]
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
PAGES = {re.search(r"^url: (.+)$", text, re.M).group(1): text for text in (p.read_text() for p in KB.glob("*.md"))}


class Review(msgspec.Struct, forbid_unknown_fields=True):
    verdict: Verdict
    issues: list[str]


class Triage(msgspec.Struct, forbid_unknown_fields=True):
    items: list[TriageItem]


def reply(system: str, case: dict, *context: str) -> str:
    """What the recording answers a request of this kind for this lead (None: nothing does)."""
    user = "\n\n".join([f"Lead: {case['inputs']['email']}", json.dumps(case["inputs"], ensure_ascii=False), *context])
    return SCRIPT.recorded_reply([{"role": "system", "content": f"{system}. Follow the rules."},
                                  {"role": "user", "content": user}])


def pass1(case: dict) -> str:
    return reply("You write an account brief", case)


def headings(brief: str) -> list[str]:
    return [line[3:].strip() for line in brief.splitlines() if line.startswith("## ")]


def metadata_line(brief: str) -> str:
    last = brief.rstrip().splitlines()[-1]
    assert last.startswith("METADATA: ")
    return last.removeprefix("METADATA: ")


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def input_numbers(case: dict) -> set[str]:
    return numbers(" ".join(strings(case["inputs"])))


def brief_numbers(brief: str) -> set[str]:
    body = "\n".join(line for line in brief.splitlines() if not line.startswith("METADATA: "))
    return numbers(re.sub(r"\[\d+\]", "", body))


def by_id(case_id: str) -> dict:
    return next(c for c in CASES if c["id"] == case_id)


def test_there_are_enough_cases_with_unique_ids_sessions_and_addresses():
    assert len(CASES) >= 12
    for key in ("id", "session_id"):
        assert len({c[key] for c in CASES}) == len(CASES)
    emails = [c["inputs"]["email"] for c in CASES]
    # A recorded reply is chosen by the address it contains: none may contain another's.
    assert not [(a, b) for a in emails for b in emails if a != b and a in b]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_a_case_decodes_into_the_contract_and_expects_valid_values(case):
    inputs = msgspec.convert(case["inputs"], BriefInputs)
    assert msgspec.to_builtins(inputs) == case["inputs"]  # no field the contract does not know
    assert inputs.email and inputs.transcript and inputs.sources
    assert case["expect"]["triage"] in TRIAGE_CLASSES and case["expect"]["stage"] in BRIEF_STAGES
    for figure in case["expect"]["numbers"]:
        assert figure in " ".join(strings(case["inputs"])), figure


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_sources_quote_the_demo_knowledge_base(case):
    for source in case["inputs"]["sources"]:
        assert source["text"] in PAGES[source["url"]], source["title"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_every_step_of_a_case_has_a_recorded_reply(case):
    brief = pass1(case)
    assert brief is not None
    msgspec.json.decode(reply("You review an account brief", case, brief), type=Review)
    script = reply("You write a call script", case, brief)
    assert headings(script) == ["Talk track", "Objection handlers", "Close"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_the_first_drafts_have_every_section_but_the_one_left_for_repair(case):
    present = headings(pass1(case))
    missing = [s for s in SECTIONS if s not in present]
    if case["id"] != "competitor-jobber":
        assert present == SECTIONS
        return
    assert missing == ["Risks", "Key question"]
    repaired = reply("You add missing sections", case, pass1(case), f"Missing: {', '.join(missing)}")
    assert headings(repaired) == missing


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_metadata_is_valid_on_the_line_or_from_the_structured_fallback(case):
    line = metadata_line(pass1(case))
    if case["id"] == "small-team-ready":
        with pytest.raises(msgspec.ValidationError, match="priority"):
            msgspec.json.decode(line, type=BriefMetadata)
        line = reply("You extract the brief's metadata", case, pass1(case))
    metadata = msgspec.json.decode(line, type=BriefMetadata)
    assert metadata.stage == case["expect"]["stage"]


def test_a_failed_review_is_followed_by_a_retry_that_passes():
    failed = [c for c in CASES
              if json.loads(reply("You review an account brief", c, pass1(c)))["verdict"] == "fail"]
    assert [c["id"] for c in failed] == ["hot-large-team"]
    case = failed[0]
    first = pass1(case)
    issues = json.loads(reply("You review an account brief", case, first))["issues"]
    retry = reply("You write an account brief", case, first, "Reviewer feedback:\n" + "\n".join(issues))
    assert retry != first and headings(retry) == SECTIONS
    msgspec.json.decode(metadata_line(retry), type=BriefMetadata)
    assert json.loads(reply("You review an account brief", case, retry))["verdict"] == "pass"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_numbers_in_the_briefs_come_from_the_inputs_but_the_one_invented(case):
    known = input_numbers(case)
    invented = {n.rstrip("%") for n in case["expect"].get("ungrounded", [])}
    assert not invented & known
    first = pass1(case)
    retry = reply("You write an account brief", case, first, "Reviewer feedback: none")
    for brief in {first, retry}:
        assert brief_numbers(brief) - known == invented
        for figure in case["expect"]["numbers"]:
            assert figure in brief, figure


def test_exactly_one_case_has_an_invented_number():
    assert [c["id"] for c in CASES if c["expect"].get("ungrounded")] == ["agency-reseller"]


def test_the_triage_reply_classifies_every_case_and_misses_one():
    leads = "\n".join(f"{c['session_id']}: {c['description']}" for c in CASES)
    answer = SCRIPT.recorded_reply([{"role": "system", "content": "You triage a site's open leads."},
                                    {"role": "user", "content": leads}])
    items = msgspec.json.decode(answer, type=Triage).items
    assert sorted(i.session_id for i in items) == sorted(c["session_id"] for c in CASES)
    expected = {c["session_id"]: c["expect"]["triage"] for c in CASES}
    assert [i.session_id for i in items if i.classification != expected[i.session_id]] == ["eval-small-team-ready"]
