"""The tokenizer the knowledge base hands LightRAG: whitespace-led words, no vocabulary to download."""

from __future__ import annotations

import re
from collections.abc import Sequence


class WordTokenizer:
    """The tokenizer LightRAG is given. LightRAG counts tokens to fit an LLM prompt's
    budgets (which `query` sets out of reach: the limiter and the answer's prompt do the
    cutting) and records each chunk's count; its default downloads tiktoken's vocabulary,
    which cannot happen offline. A token here is a whitespace-led word (`" the"`,
    `"pricing."`), and it is its own id, and `decode(encode(text)) == text`. (Interning
    each word to an integer would cost more than the pass itself, and counting is on every
    query's path.) LightRAG only counts tokens, slices them and hands them back to
    `decode`; nearly every call only counts, so `encode` hands back `Pieces`, which counts
    without cutting the text (`str.split`, in C, far cheaper than the regex pass that lists
    the pieces) and lists them only when sliced or iterated.
    Chunk sizes for the embedding model are measured with the model's own tokenizer
    (`KnowledgeBase.count_tokens`)."""

    def encode(self, content: str) -> "Pieces":
        return Pieces(content)

    def decode(self, tokens) -> str:
        return "".join(tokens)


class Pieces(Sequence):
    """A text's whitespace-led words, as a sequence. Its length is the number of pieces
    `PIECE` finds: one per run of non-space characters (with the space before it), and one
    more for space at the end of the text (or a text of space only)."""

    PIECE = re.compile(r"\s*\S+|\s+")
    __slots__ = ("text", "_count", "_pieces")

    def __init__(self, text: str):
        self.text = text
        self._count: int | None = None
        self._pieces: list[str] | None = None

    def __len__(self) -> int:
        if self._count is None:
            text = self.text
            self._count = len(text.split()) + (1 if text and text[-1].isspace() else 0)
        return self._count

    def _listed(self) -> list[str]:
        if self._pieces is None:
            self._pieces = self.PIECE.findall(self.text)
        return self._pieces

    def __getitem__(self, index):
        return self._listed()[index]

    def __iter__(self):
        return iter(self._listed())

    def __eq__(self, other) -> bool:
        if isinstance(other, Pieces):
            return self.text == other.text
        return isinstance(other, (list, tuple)) and self._listed() == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Pieces({self._listed()!r})"
