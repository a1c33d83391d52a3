"""The one citation and figure rule (shared/citations.py): what a text cites, the figures it
writes, their values, and which of them no reference supports."""

from __future__ import annotations

import pytest

from shared import citations


def test_a_citation_is_a_marker_naming_numbers():
    assert citations.cited("A [1]. B [2, 3]. C [9]. D [3][1].") == [1, 2, 3, 9]
    assert citations.cited("A [1]. B [2, 3]. C [9].", given=[1, 2, 3]) == [1, 2, 3]
    assert citations.cited("A [1 ,2].") == [1, 2]
    assert citations.cited("A (1), [a], [1-2], [ 1 ], x[1]") == [1]  # only `[n]` and `[n, m]` are markers
    assert citations.cited("nothing cited", given=[1]) == []


def test_without_citations_takes_the_markers_and_the_spaces_before_them():
    assert citations.without_citations("Both directions [1, 2]. Next [3][4]") == "Both directions. Next"
    assert citations.without_citations("No marker.") == "No marker."


@pytest.mark.parametrize(("text", "expected"), [
    ("5,000 apps, 99.95% uptime, TLS 1.3 [2]", ["5,000", "99.95%", "1.3"]),
    ("1 200 seats, 1\u202f200 seats, 1\u2009200 seats, 1\u00a0200,50 €",
     ["1 200", "1\u202f200", "1\u2009200", "1\u00a0200,50"]),
    ("40 % and 40%", ["40 %", "40%"]),
    ("1. Starter\n2) Growth [1, 2][3]\n## 3. Needs", []),
    ("in 2024 300 users, 1 2000 rows, v2 and 3.5.1", ["2024", "300", "1", "2000", "3.5.1"]),
    ("$29, 29 €, €1.500, B2B, 2FA", ["29", "29", "1.500", "2"]),
    ("Book at https://cal.example/team/30min, www.x2.example/45 or ops-314@acme.example.", []),
])
def test_figures_as_written(text, expected):
    assert citations.figures(text) == expected


@pytest.mark.parametrize(("written", "value"), [
    ("1200", "1200"), ("1,200", "1200"), ("1 200", "1200"), ("1\u202f200", "1200"), ("1.200", "1200"),
    ("1,250.50", "1250.5"), ("1.250,50", "1250.5"), ("1\u00a0200,50", "1200.5"), ("1,000,000", "1000000"),
    ("1,5", "1.5"), ("1.50", "1.5"), ("2.0", "2"), ("99,95", "99.95"), ("0,250", "0.25"), ("0.250", "0.25"),
    ("40 %", "40"), ("40%", "40"), ("007", "7"), ("3.5.1", "3.5.1"), ("12,34", "12.34"),
])
def test_a_figure_compares_by_its_value_however_a_language_writes_it(written, value):
    assert citations.value(written) == value


def test_a_figure_is_supported_by_any_reference_holding_its_value():
    sources = [("Starter costs $29 per technician; more than 5,000 apps; a learning budget of €1,500; "
                "most teams go live in two to four weeks; 99.95% SLA")]
    answer = "1. Starter: $29 [1]\n2. 5000 apps, 1.500 € budget, 2-4 weeks, 99,95 % SLA, 45 days, 99.9% uptime"
    assert citations.unsupported(answer, sources) == ["45", "99.9%"]
    assert citations.unsupported("Yes, 12 technicians.", ["How about 12 technicians?"]) == []
    assert citations.unsupported("Costs 45, then 45 again, 45.0 and 45 %", []) == ["45"]  # each value once
    assert citations.unsupported("5,000 or 5.000 or 5 000", ["5000"]) == []
    assert citations.unsupported("5,000", ["5"]) == ["5,000"]  # a thousands group is no decimal
    assert citations.unsupported("1.5 million", ["1,500"]) == ["1.5"]
    assert citations.unsupported("anything", []) == [] and citations.unsupported("7 [1]", []) == ["7"]


def test_number_words_up_to_twenty_support_their_figures():
    assert citations.unsupported("2-4 weeks, 16 weeks, 21 days", ["two to four weeks; Sixteen weeks"]) == ["21"]
    assert citations.unsupported("10 minutes", ["often, every ten minutes"]) == []
    assert citations.unsupported("10 minutes", ["often"]) == ["10"]  # a word, not part of one


def test_a_reference_holds_the_figures_of_its_links_and_the_checked_text_is_not_asked_for_its_own():
    assert citations.unsupported("Ticket 314", ["ops-314@acme.example"]) == []
    assert citations.unsupported("See https://x.example/page/2024.", []) == []
    assert citations.unsupported("Ticket 314 [1]", ["Ticket [314]"]) == ["314"]  # a marker holds no figure
