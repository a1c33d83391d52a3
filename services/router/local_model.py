"""The local intent model: no network, no LLM, cheap enough for every message.

Features: the all-MiniLM-L6-v2 sentence embedding of the message (what it means) next to
character n-gram TF-IDF (how it is written: multilingual keywords MiniLM, an English
model, only half understands). A multinomial logistic regression on both, trained from
`data/intents_train.jsonl` at start-up, its classes weighted inversely to their share of the
examples: the file holds more HACK and LEARN examples than the others (edgy-but-legitimate
questions and injections in more languages), and unweighted, those extra examples alone
would pull borderline messages toward them. The trained model is cached on disk keyed by the
training file's hash, so a restart does not retrain; changing the file retrains.

The settings (embedding weight 0.5, C=16, n-grams 2..5) come from a small sweep; see
docs/benchmarks.md for the figures on the held-out evaluation set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import time
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix, hstack

from shared.embeddings import Embedder

log = logging.getLogger(__name__)

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "intents_train.jsonl"
EVAL = DATA / "intents_eval.jsonl"
INTENTS = ("LEARN", "CONTEXT", "SUPPORT", "OFFTOPIC", "OTHER", "BOOKING", "STOP_BOOKING", "HACK")
EMBEDDING_WEIGHT = 0.5
C = 16.0
MODEL_VERSION = "3"  # bump when the features or the training change


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(row, dict) or not isinstance(row.get("message"), str):
                raise ValueError(f"{path}:{number}: each line needs a string 'message'")
            rows.append(row)
    return rows


class LocalIntentModel:
    """Two stages: an n-gram-only classifier first (no embedding: the cheap stage); when it
    is sure (`fast_probabilities` ≥ the fast-path threshold) its answer stands, otherwise
    the sentence embedding is computed and the full classifier decides."""

    def __init__(self, embedder: Embedder, vectorizer, classifier, fast_classifier, version: str = ""):
        self.embedder = embedder
        # The training data's hash with MODEL_VERSION and the embedding model: what the
        # classifications record (`IntentClassified.classifier_version`). Empty: trained ad hoc.
        self.version = version
        self.vectorizer = vectorizer
        self.classifier = classifier
        self.fast_classifier = fast_classifier
        self._fast_coef_t = np.ascontiguousarray(fast_classifier.coef_.T)
        self._fast_intercept = fast_classifier.intercept_.copy()
        self.classes: list[str] = [str(c) for c in classifier.classes_]  # numpy.str_ does not encode
        self._coef_t = np.ascontiguousarray(classifier.coef_.T)
        self._intercept = classifier.intercept_.copy()

    @classmethod
    def load_or_train(cls, embedder: Embedder, train: Path = TRAIN) -> "LocalIntentModel":
        digest = hashlib.sha256(train.read_bytes() + f"|{MODEL_VERSION}|{embedder.name}".encode()).hexdigest()[:16]
        cached = embedder.settings.cache() / "router" / f"intent-{digest}.pkl"
        if cached.exists():
            try:
                with open(cached, "rb") as f:
                    vectorizer, classifier, fast_classifier = pickle.load(f)
                return cls(embedder, vectorizer, classifier, fast_classifier, version=digest)
            except Exception:  # noqa: BLE001 - a stale or broken cache: retrain
                log.warning("intent model cache unreadable; retraining", extra={"path": str(cached)})
        model = cls.train(embedder, read_jsonl(train))
        model.version = digest
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump((model.vectorizer, model.classifier, model.fast_classifier), f)
        tmp.replace(cached)
        return model

    @classmethod
    def train(cls, embedder: Embedder, rows: list[dict]) -> "LocalIntentModel":
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        started = time.monotonic()
        unknown = {r.get("intent") for r in rows} - set(INTENTS)
        if unknown:
            raise ValueError(f"training data has unknown intents: {sorted(map(str, unknown))}")
        texts = [r["message"] for r in rows]
        labels = [r["intent"] for r in rows]
        vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, lowercase=True)
        ngrams = vectorizer.fit_transform(texts)
        vectors = embedder.embed_many(texts)
        features = hstack([csr_matrix(vectors * EMBEDDING_WEIGHT), ngrams]).tocsr()
        classifier = LogisticRegression(C=C, max_iter=3000, class_weight="balanced")
        classifier.fit(features, labels)
        fast_classifier = LogisticRegression(C=C, max_iter=3000, class_weight="balanced")
        fast_classifier.fit(ngrams, labels)
        log.info("intent model trained", extra={"examples": len(rows), "seconds": round(time.monotonic() - started, 2)})
        return cls(embedder, vectorizer, classifier, fast_classifier)

    def ngrams(self, text: str):
        return self.vectorizer.transform([text])

    def fast_probabilities(self, ngrams) -> dict[str, float]:
        return self._softmax(np.asarray(ngrams @ self._fast_coef_t).ravel() + self._fast_intercept)

    def probabilities(self, text: str, vector: np.ndarray, ngrams=None) -> dict[str, float]:
        ngrams = self.ngrams(text) if ngrams is None else ngrams
        features = hstack([csr_matrix(vector.reshape(1, -1) * EMBEDDING_WEIGHT), ngrams]).tocsr()
        return self._softmax(np.asarray(features @ self._coef_t).ravel() + self._intercept)

    def _softmax(self, logits: np.ndarray) -> dict[str, float]:
        """Computed directly: sklearn's predict_proba validates its input on every call,
        which costs more than the arithmetic for one message."""
        logits = logits - logits.max()
        probs = np.exp(logits)
        probs /= probs.sum()
        return {label: float(p) for label, p in zip(self.classes, probs)}
