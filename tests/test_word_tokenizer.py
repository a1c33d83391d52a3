"""The knowledge base's tokenizer for LightRAG (services/retriever/word_tokenizer.py)."""

from __future__ import annotations

import pytest
from lightrag.utils import Tokenizer, truncate_list_by_token_size

from services.retriever.word_tokenizer import Pieces, WordTokenizer

TEXTS = ["", "   ", "pricing.", " Acme Sync costs $19 per user.\n\n## Plans\n", "a  b\tc\n", "trailing space "]


@pytest.mark.parametrize("text", TEXTS)
def test_decoding_what_was_encoded_gives_the_text_back(text):
    words = WordTokenizer()
    assert words.decode(words.encode(text)) == text


def test_a_token_is_a_whitespace_led_word():
    assert WordTokenizer().encode(" Acme Sync  costs $19.\n") == [" Acme", " Sync", "  costs", " $19.", "\n"]


def test_lightrag_counts_and_cuts_by_it():
    tokenizer = Tokenizer("words", WordTokenizer())
    text = "one two three four five six"
    assert len(tokenizer.encode(text)) == 6
    span = tokenizer.truncate_by_token_limit(text, 4)
    assert text[span.start:span.end] == "one two three four"
    items = [{"t": "alpha beta"}, {"t": "gamma delta"}, {"t": "epsilon zeta"}]
    kept = truncate_list_by_token_size(items, key=lambda item: item["t"], separator="\n", max_token_size=4,
                                       tokenizer=tokenizer)
    assert kept == items[:2]


SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\x1c", "\x0b"]


@pytest.mark.parametrize("seed", range(5))
def test_a_count_without_listing_is_the_number_of_pieces(seed):
    """`len` counts with str.split; the pieces are the regex's: the two must agree for any
    text, Unicode spaces included, and counting must not list them."""
    import random
    rng = random.Random(seed)
    words = ["Acme", "$19.", "é", "naïve", "—", "x", "{\"a\":", "1}"]
    for _ in range(300):
        text = "".join(rng.choice(words + SPACES) for _ in range(rng.randint(0, 12)))
        pieces = WordTokenizer().encode(text)
        assert len(pieces) == len(Pieces.PIECE.findall(text))
        assert pieces._pieces is None  # counted, not listed
        assert list(pieces) == Pieces.PIECE.findall(text) and pieces[:3] == Pieces.PIECE.findall(text)[:3]
        assert WordTokenizer().decode(pieces) == text
        assert WordTokenizer().decode(pieces[:2]) == "".join(Pieces.PIECE.findall(text)[:2])
