"""What both suggesters keep of the `suggestions` role's answer."""

from __future__ import annotations

from services.responder.suggestions import clean


def test_suggestions_are_cleaned_deduplicated_and_capped():
    assert clean(["  What   does it cost? ", "what does it cost?", "", "SSO?", "Trial?", "Fourth?"]) == [
        "What does it cost?", "SSO?", "Trial?"]
    assert len(clean(["x" * 500])[0]) == 120
