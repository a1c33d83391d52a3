"""The local intent model: no network, no LLM, cheap enough for every message.

Features: the all-MiniLM-L6-v2 sentence embedding of the message (what it means) next to
character n-gram TF-IDF (how it is written: multilingual keywords MiniLM, an English
model, only half understands). A short message (at most FOLLOW_UP_WORDS words) that follows
an assistant's turn is read with that turn: the embedding of the turn's last sentence, what
the message answers or follows up on, is a third block of features, zero otherwise. "Une
vingtaine." means nothing alone; after "How many technicians do you have?" it is the
visitor telling about their business (CONTEXT), and "And for 50 users?" after a price is a
product question (LEARN). Longer messages stand on their own, as they did before.

A multinomial logistic regression on the three blocks, trained from
`data/intents_train.jsonl` at start-up, its classes weighted inversely to their share of the
examples: the file holds more HACK and LEARN examples than the others (edgy-but-legitimate
questions and injections in more languages), and unweighted, those extra examples alone
would pull borderline messages toward them. The trained model is cached on disk keyed by the
training file's hash, so a restart does not retrain; changing the file retrains.

The settings (embedding weight 0.5, C=16, n-grams 2..5) come from a small sweep, the turn's
weight (0.25) from cross-validation on the training data; see
docs/benchmarks.md for the figures on the held-out evaluation sets.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import pickle
import re
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
REPLY_WEIGHT = 0.25  # the assistant's turn before a short message
FOLLOW_UP_WORDS = 8  # a message of at most this many words is read with the turn before it
C = 16.0
MODEL_VERSION = "4"  # bump when the features or the training change
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")


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


def last_reply(history: list[dict] | None) -> str:
    """The assistant's last message in a conversation's earlier turns ("" when none)."""
    for message in reversed(history or []):
        if message.get("role") == "assistant":
            return str(message.get("content", ""))
    return ""


def replied_to(message: str, reply: str) -> str:
    """What of the assistant's turn `reply` the model reads with `message`: its last
    sentence, the question the message answers or the statement it follows up on; "" when
    the message is long enough to stand alone or there is no such turn."""
    if not reply.strip() or len(message.split()) > FOLLOW_UP_WORDS:
        return ""
    sentences = [s for s in SENTENCE_END.split(reply.strip()) if s.strip()]
    return " ".join(sentences[-1].split()) if sentences else ""


class LocalIntentModel:
    """Two stages: an n-gram-only classifier first (no embedding: the cheap stage); when it
    is sure (`fast_probabilities` ≥ the fast-path threshold) its answer stands, otherwise
    the sentence embedding is computed and the full classifier decides. A message read with
    the assistant's turn skips the first stage: the n-grams are the message's alone."""

    def __init__(self, embedder: Embedder, vectorizer, classifier, fast_classifier, reply_mean: np.ndarray,
                 version: str = ""):
        self.embedder = embedder
        # The training data's hash with MODEL_VERSION and the embedding model: what the
        # classifications record (`IntentClassified.classifier_version`). Empty: trained ad hoc.
        self.version = version
        self.vectorizer = vectorizer
        self.classifier = classifier
        self.fast_classifier = fast_classifier
        self.reply_mean = reply_mean
        self._fast_coef_t = np.ascontiguousarray(fast_classifier.coef_.T)
        self._fast_intercept = fast_classifier.intercept_.copy()
        self.classes: list[str] = [str(c) for c in classifier.classes_]  # numpy.str_ does not encode
        self._coef_t = np.ascontiguousarray(classifier.coef_.T)
        self._intercept = classifier.intercept_.copy()

    @staticmethod
    def cache_path(embedder: Embedder, train: Path = TRAIN) -> Path:
        """Where the model trained from `train` with `embedder` is kept (keyed by both)."""
        digest = hashlib.sha256(train.read_bytes() + f"|{MODEL_VERSION}|{embedder.name}".encode()).hexdigest()[:16]
        return Path(embedder.settings.cache_dir) / "router" / f"intent-{digest}.pkl"

    @classmethod
    def load_or_train(cls, embedder: Embedder, train: Path = TRAIN) -> "LocalIntentModel":
        cached = cls.cache_path(embedder, train)
        digest = cached.stem.removeprefix("intent-")
        cached.parent.mkdir(parents=True, exist_ok=True)
        # Under a file lock: routers starting together on a cold cache train once, and none
        # reads a file another is still writing.
        with open(cached.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if cached.exists():
                try:
                    with open(cached, "rb") as f:
                        vectorizer, classifier, fast_classifier, reply_mean = pickle.load(f)
                    return cls(embedder, vectorizer, classifier, fast_classifier, reply_mean, version=digest)
                except Exception:  # noqa: BLE001 - a stale or broken cache: retrain
                    log.warning("intent model cache unreadable; retraining", extra={"path": str(cached)})
            model = cls.train(embedder, read_jsonl(train))
            model.version = digest
            tmp = cached.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                pickle.dump((model.vectorizer, model.classifier, model.fast_classifier, model.reply_mean), f)
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
        replies = [replied_to(r["message"], last_reply(r.get("history"))) for r in rows]
        read_with = [i for i, r in enumerate(replies) if r]
        embedded = embedder.embed_many([replies[i] for i in read_with])
        reply_mean = embedded.mean(axis=0) if read_with else np.zeros(embedder.dim, dtype=np.float32)
        reply_features = np.zeros((len(rows), embedder.dim + 1), dtype=np.float32)
        for i, vector in zip(read_with, embedded):
            reply_features[i] = _reply_features(vector, reply_mean)
        features = hstack([csr_matrix(vectors * EMBEDDING_WEIGHT), ngrams, csr_matrix(reply_features)]).tocsr()
        classifier = LogisticRegression(C=C, max_iter=3000, class_weight="balanced")
        classifier.fit(features, labels)
        fast_classifier = LogisticRegression(C=C, max_iter=3000, class_weight="balanced")
        fast_classifier.fit(ngrams, labels)
        log.info("intent model trained", extra={"examples": len(rows), "seconds": round(time.monotonic() - started, 2)})
        return cls(embedder, vectorizer, classifier, fast_classifier, reply_mean)

    def ngrams(self, text: str):
        return self.vectorizer.transform([text])

    def fast_probabilities(self, ngrams) -> dict[str, float]:
        return self._softmax(np.asarray(ngrams @ self._fast_coef_t).ravel() + self._fast_intercept)

    def probabilities(self, text: str, vector: np.ndarray, ngrams=None,
                      reply_vector: np.ndarray | None = None) -> dict[str, float]:
        """`reply_vector`: the embedding of `replied_to(text, ...)`, None when that is ""."""
        ngrams = self.ngrams(text) if ngrams is None else ngrams
        reply = (np.zeros(self.embedder.dim + 1, dtype=np.float32) if reply_vector is None
                 else _reply_features(reply_vector, self.reply_mean))
        features = hstack([csr_matrix(vector.reshape(1, -1) * EMBEDDING_WEIGHT), ngrams,
                           csr_matrix(reply.reshape(1, -1))]).tocsr()
        return self._softmax(np.asarray(features @ self._coef_t).ravel() + self._intercept)

    def _softmax(self, logits: np.ndarray) -> dict[str, float]:
        """Computed directly: sklearn's predict_proba validates its input on every call,
        which costs more than the arithmetic for one message."""
        logits = logits - logits.max()
        probs = np.exp(logits)
        probs /= probs.sum()
        return {label: float(p) for label, p in zip(self.classes, probs)}


def _reply_features(vector: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """The features of the turn a message is read with (a message read alone has zeros): 1,
    that the message is read with a turn at all, then the turn's embedding less the mean of
    the training's turns. How likely each intent is after any turn is then the first
    feature's weight, and the embedding's weights say only how this turn differs from an
    average one (every STOP_BOOKING example follows a turn, most BOOKING requests do not)."""
    return np.concatenate(([1.0], vector - mean)).astype(np.float32) * REPLY_WEIGHT
