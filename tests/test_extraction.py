"""Offline extraction's rules for names (services/retriever/extraction.py `names_in`): a
word capitalised only because it opens a sentence is no name unless the document uses it
as one elsewhere."""

from __future__ import annotations

from services.retriever import extraction
from services.retriever.documents import SourceDocument


def test_a_sentences_opening_words_are_a_name_only_if_used_as_one_elsewhere():
    known = {"Salesforce", "SOC 2"}
    assert extraction.names_in("Office users are free.", known) == []
    assert extraction.names_in("Teams of 50 people use Harbor Desk with Salesforce.", known) == \
        ["Harbor Desk", "Salesforce"]
    assert extraction.names_in("Salesforce syncs every hour.", known) == ["Salesforce"]
    assert extraction.names_in("SOC 2 reports are available.", known) == ["SOC 2"]
    # Two capitalised words are a name wherever they stand; so is any name mid-sentence.
    assert extraction.names_in("Harbor Desk keeps 90 days.", known) == ["Harbor Desk"]
    assert extraction.names_in("It is used by Teams of 50.", known) == ["Teams of 50"]


def test_a_documents_entities_leave_out_sentence_openings():
    doc = SourceDocument(doc_id="d", title="Harbor Desk", source="a.md", path="a.md", content_hash="h", sections=[
        ("Regions", "Teams of 50 people use Harbor Desk with Salesforce. Data of 50 teams is hosted in Frankfurt.")])
    chunks = extraction.chunk(doc, lambda t: len(t.split()))
    assert set(extraction.extract(doc, chunks).entities) == {"Regions", "Harbor Desk", "Salesforce", "Frankfurt"}
