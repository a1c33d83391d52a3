"""The tokenizer the knowledge base hands LightRAG: whitespace-led words, no vocabulary to download."""

from __future__ import annotations

import re


class WordTokenizer:
    """The tokenizer LightRAG is given. LightRAG counts tokens to fit an LLM prompt's
    budgets (which `query` sets out of reach: the limiter and the answer's prompt do the
    cutting) and records each chunk's count; its default downloads tiktoken's vocabulary,
    which cannot happen offline. A token here is a whitespace-led word (`" the"`,
    `"pricing."`), and it is its own id: `encode` is one regex pass in C, tens of times
    faster than a sub-word tokenizer over every rendered context, and `decode(encode(text))
    == text`. (Interning each word to an integer cost more than the pass itself: counting
    was most of a query's CPU, measured with pyinstrument.) LightRAG only counts tokens,
    slices them and hands them back to `decode`. Chunk sizes for the embedding model are
    measured with the model's own tokenizer (`KnowledgeBase.count_tokens`)."""

    PIECE = re.compile(r"\s*\S+|\s+")

    def encode(self, content: str) -> list[str]:
        return self.PIECE.findall(content)

    def decode(self, tokens: list[str]) -> str:
        return "".join(tokens)
