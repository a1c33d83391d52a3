"""A lead brief as a document (pure): its sections, the merge of a focused re-prompt's
answer, its metadata line, and the figures no input holds."""

from __future__ import annotations

import pytest

from services.enricher.briefs import document
from services.enricher.briefs.document import REQUIRED_SECTIONS
from shared.events import BriefInputs, BriefMessage, BriefMetadata, BriefSource, SimilarLead, VisitorProfile

META = BriefMetadata(priority=7, stage="evaluating", estimated_seats=40, confidence=60)
LINE = 'METADATA: {"priority": 7, "stage": "evaluating", "estimated_seats": 40, "confidence": 60}'


def brief(*names: str, metadata: str = LINE) -> str:
    """A brief with these sections, each body saying which section it is."""
    body = "\n\n".join(f"## {name}\n\nAbout {name.lower()}." for name in names)
    return f"# Acme Field Services\n\n{body}\n\n{metadata}\n"


def test_sections_are_found_whatever_the_heading_level_case_colon_or_numbering():
    text = ("# Brief\n\nintro\n\n# executive SUMMARY\n\nShort.\n\n### Situation:\n\nThey grow.\n\n"
            "## **Needs**\n\nScheduling.\n\n## 5. Product fit\n\nGood.\n\n#### Risks\n\nNot a section heading.\n")
    assert document.sections(text) == {
        "Executive summary": "Short.", "Situation": "They grow.", "Needs": "Scheduling.",
        "Product fit": "Good.\n\n#### Risks\n\nNot a section heading.",
    }


def test_other_headings_and_a_repeated_section_stay_in_the_section_above():
    text = "## Needs\n\n### Must haves\n\n- dispatch\n\n## Appendix\n\nmore\n\n## needs\n\nagain\n"
    assert document.sections(text) == {
        "Needs": "### Must haves\n\n- dispatch\n\n## Appendix\n\nmore\n\n## needs\n\nagain"}


def test_the_metadata_line_is_no_part_of_the_last_section():
    assert document.sections(brief("Key question"))["Key question"] == "About key question."
    assert document.missing_sections(f"## Key question\n\n{LINE}") == list(REQUIRED_SECTIONS)


def test_missing_sections_in_canonical_order_an_empty_one_counted():
    text = brief("Risks", "Executive summary", "Needs").replace("About needs.", "  \n")
    assert document.missing_sections(text) == [
        "Situation", "Needs", "Evidence from the conversation", "Product fit", "Next steps", "Key question"]
    assert document.missing_sections(brief(*REQUIRED_SECTIONS)) == []
    assert document.missing_sections("") == list(REQUIRED_SECTIONS)


def test_merge_fills_only_the_missing_sections_in_canonical_order_metadata_last():
    text = brief("Risks", "Executive summary", "Situation", "Needs").replace("About needs.", "")
    addition = ("Here are the missing sections:\n\n## Needs\n\nDispatch.\n\n## Situation\n\nOverwritten?\n\n"
                "## Evidence from the conversation\n\nQuote.\n\n## product fit:\n\nFit.\n\n## Next steps\n\nCall.\n\n"
                "## Key question\n\nWhen?\n\n## Risks\n\nOverwritten?")
    merged = document.merge(text, addition)
    assert merged.startswith("# Acme Field Services\n\n## Executive summary")
    assert merged.endswith(f"## Key question\n\nWhen?\n\n{LINE}")
    assert document.missing_sections(merged) == []
    assert "Overwritten?" not in merged and "Here are" not in merged
    found = document.sections(merged)
    assert list(found) == list(REQUIRED_SECTIONS)
    assert found["Risks"] == "About risks." and found["Needs"] == "Dispatch." and found["Product fit"] == "Fit."
    assert document.split_metadata(merged)[1] == META


def test_merge_keeps_an_existing_section_as_written_and_what_nobody_wrote_missing():
    text = "### situation:\n\nAs written.\n\n### Must haves\n\n- x\n"
    merged = document.merge(text, "## Needs\n\nDispatch.")
    assert merged == "### situation:\n\nAs written.\n\n### Must haves\n\n- x\n\n## Needs\n\nDispatch."
    assert document.missing_sections(merged) == [
        name for name in REQUIRED_SECTIONS if name not in ("Situation", "Needs")]
    assert document.merge(text + f"\n{LINE}", f"## Needs\n\nDispatch.\n\n{LINE.replace('7', '2')}").endswith(LINE)
    assert document.merge("## Needs\n\nDispatch.", f"## Risks\n\nNone.\n\n{LINE}").endswith(f"None.\n\n{LINE}")


@pytest.mark.parametrize("ending", [
    LINE, f"`{LINE}`", f"```\n{LINE}\n```", f"```json\n\n{LINE}\n```", f"METADATA: `{LINE[10:]}`",
    f"{LINE}\n\n   \n", LINE.replace("METADATA", "metadata"),
])
def test_the_metadata_line_decodes_plain_in_backticks_or_in_a_fence(ending):
    body, meta, error = document.split_metadata(f"## Needs\n\nDispatch.\n\n{ending}")
    assert (body, meta, error) == ("## Needs\n\nDispatch.", META, "")


@pytest.mark.parametrize(("line", "why"), [
    (LINE.replace('"priority": 7', '"priority": 11'), "priority"),
    (LINE.replace("evaluating", "curious"), "stage"),
    (LINE.replace('"estimated_seats": 40', '"estimated_seats": -3'), "estimated_seats"),
    (LINE.replace('"confidence": 60', '"confidence": 101'), "confidence"),
    (LINE.replace("}", ', "budget": 5000}'), "budget"),
    (LINE.replace('"confidence": 60', '"confidence": "high"'), "confidence"),
    (LINE.replace(', "confidence": 60', ""), "confidence"),
    ("METADATA: priority 7, evaluating", "invalid METADATA line"),
    ("METADATA:", "invalid METADATA line"),
])
def test_an_invalid_metadata_line_says_why_and_is_still_left_out_of_the_body(line, why):
    body, meta, error = document.split_metadata(f"## Needs\n\nDispatch.\n{line}")
    assert meta is None and error.startswith("invalid METADATA line") and why in error
    assert body == "## Needs\n\nDispatch."


def test_a_missing_or_misplaced_metadata_line_says_which():
    text = "## Needs\n\nDispatch."
    assert document.split_metadata(text) == (text, None, "no METADATA line at the end of the brief")
    late = f"{LINE}\n\n## Needs\n\nDispatch."
    body, meta, error = document.split_metadata(late)
    assert (body, meta) == (late, None) and "not the brief's last" in error
    assert document.split_metadata("")[2] == "no METADATA line at the end of the brief"
    assert document.split_metadata("Metadata: see the CRM.\n\n## Needs\n\nx")[2] == \
        "no METADATA line at the end of the brief"
    fenced_with_more = "```json\nMETADATA: {}\n{}\n```"
    assert document.split_metadata(fenced_with_more)[2] == "the METADATA line is not the brief's last non-empty line"


def test_the_metadata_line_written_for_a_brief_decodes_to_the_same_metadata():
    assert document.metadata_line(META) == \
        'METADATA: {"priority":7,"stage":"evaluating","estimated_seats":40,"confidence":60}'
    assert document.split_metadata(f"## Needs\n\nx\n{document.metadata_line(META)}")[1:] == (META, "")


def inputs(**fields) -> BriefInputs:
    return BriefInputs(site_name="Tidewise", transcript=[
        BriefMessage(role="user", content="We have 1,200 technicians and 40 % of jobs are late.", turn=1),
        BriefMessage(role="assistant", content="The Growth plan costs $59 per technician [1].", turn=1),
    ], **fields)


def test_figures_from_the_transcript_are_grounded_however_written():
    text = f"## Situation\n\n1 200 technicians (1200, 1,200), 40% late, $59 [1], 15 hires planned [2].\n\n{LINE}"
    assert document.ungrounded_numbers(text, inputs()) == ["15"]


def test_each_input_grounds_its_figures():
    text = ("## Situation\n\nTicket 314, score 0.72, 9 vans in Lyon 69002, founded 1998, 25 offices, "
            "99.95% SLA, Pricing 2025, a similar lead at priority 8 with 300 seats, Acme 360, budget 7,500.")
    everything = inputs(
        email="ops-314@acme.example", capture_context="Asked for a demo after 9 vans", interest_score=0.72,
        profile=VisitorProfile(company_description="Founded 1998, 25 offices", company_domain="acme360.example"),
        form_fields={"address": "Lyon 69002", "budget": "7 500"},
        sources=[BriefSource(number=1, title="Pricing 2025", text="An uptime SLA of 99.95%.")],
        similar_leads=[SimilarLead(session_id="s2", stage="evaluating", priority=8, summary="300 seats")],
    )
    assert document.ungrounded_numbers(text, inputs()) == [
        "314", "0.72", "9", "69002", "1998", "25", "99.95%", "2025", "8", "300", "360", "7,500"]
    assert document.ungrounded_numbers(text, everything) == ["360"]  # a domain is no figure: acme360 is a word


def test_the_metadata_line_and_citation_markers_are_not_audited_a_misplaced_metadata_line_is():
    text = f"## Needs\n\nDispatch [2][3, 4].\n\n## Risks\n\n12 competitors.\n\n{LINE.replace('40', '250')}"
    assert document.ungrounded_numbers(text, inputs()) == ["12"]
    assert document.ungrounded_numbers(f"{text}\n\nA closing line with 77.", inputs()) == ["12", "7", "250", "60", "77"]
