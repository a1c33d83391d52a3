"""The tokenizer the knowledge base hands LightRAG: whitespace-led words, no vocabulary to download."""

from __future__ import annotations

import re
import threading


class WordTokenizer:
    """The tokenizer LightRAG is given. LightRAG counts tokens to fit an LLM prompt's
    budgets (which `query` sets out of reach: the limiter and the answer's prompt do the
    cutting) and records each chunk's count; its default downloads tiktoken's vocabulary,
    which cannot happen offline. A token here is a whitespace-led word (`" the"`,
    `"pricing."`): counting is a regex pass, tens of times faster than running a
    sub-word tokenizer over every rendered context, and `decode(encode(text)) == text`.
    Chunk sizes for the embedding model are measured with the model's own tokenizer
    (`KnowledgeBase.count_tokens`). Ids come from an intern table shared by all threads."""

    PIECE = re.compile(r"\s*\S+|\s+")

    def __init__(self):
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []
        self._lock = threading.Lock()

    def encode(self, content: str) -> list[int]:
        ids = self._ids
        out = []
        for piece in self.PIECE.findall(content):
            index = ids.get(piece)
            if index is None:
                with self._lock:
                    index = ids.get(piece)
                    if index is None:
                        index = ids[piece] = len(self._pieces)
                        self._pieces.append(piece)
            out.append(index)
        return out

    def decode(self, tokens: list[int]) -> str:
        return "".join(self._pieces[i] for i in tokens)

    def __deepcopy__(self, memo):  # LightRAG deep-copies its config; one table per process is right
        return self
