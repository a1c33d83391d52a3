"""Evals of the router's classifiers on labeled JSONL files.

    concierge eval intent [--dataset FILE] [--backend local|llm|cascade]
    concierge eval skills [--dataset FILE]
    concierge eval all

Intent rows: {"message": str, "history": [{"role", "content"}...] (optional), "intent": str}.
Skill rows:  {"message": str, "history": [...] (optional), "skills": [str...],
              "score_before": float (optional), "email_known": bool (optional)}.

Each eval prints its report and, as its last line, one JSON object of figures; it exits
non-zero when a target is missed (intents: macro-F1 < 0.80 or any class F1 < 0.60;
skills: multi-label recall < 0.90).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from services.router import signals as sig
from shared import skills as sk
from services.router.classifiers import IntentClassifier, has_words
from services.router.local_model import EVAL, INTENTS, LocalIntentModel, read_jsonl
from shared.embeddings import shared_embedder
from shared.llm import LLMClient
from shared.site_config import SiteConfig
from shared.state import ConversationState, InterestSignalsState, Message

SKILLS_EVAL = Path(__file__).parent / "data" / "skills_eval.jsonl"
MIN_MACRO_F1 = 0.80
MIN_CLASS_F1 = 0.60
MIN_SKILL_RECALL = 0.90


def _classifier(backend: str) -> IntentClassifier:
    model = LocalIntentModel.load_or_train(shared_embedder().load()) if backend != "llm" else None
    llm = LLMClient.from_env(("classifier",))
    return IntentClassifier(model, llm if llm.configured("classifier") else None, backend=backend)


async def _classify_all(classifier: IntentClassifier, rows: list[dict]) -> tuple[list[str], list[float], int]:
    predicted, latencies, llm_calls = [], [], 0
    config = SiteConfig()
    for row in rows:
        started = time.perf_counter()
        result = await classifier.classify("eval", config, row["message"], row.get("history") or [])
        latencies.append((time.perf_counter() - started) * 1000)
        predicted.append(result.intent)
        llm_calls += result.llm_calls
    return predicted, latencies, llm_calls


def intent_report(expected: list[str], predicted: list[str]) -> tuple[str, dict]:
    from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score

    labels = [i for i in INTENTS if i in set(expected) | set(predicted)]
    text = classification_report(expected, predicted, labels=labels, digits=3, zero_division=0)
    matrix = confusion_matrix(expected, predicted, labels=labels)
    width = max(len(label) for label in labels)
    short = [label[:6] for label in labels]
    lines = ["confusion matrix (rows: expected, columns: predicted)",
             " " * (width + 1) + " ".join(f"{s:>6}" for s in short)]
    for label, row in zip(labels, matrix):
        lines.append(f"{label:<{width}} " + " ".join(f"{n:>6}" for n in row))
    per_class = f1_score(expected, predicted, labels=labels, average=None, zero_division=0)
    figures = {
        "accuracy": round(float(accuracy_score(expected, predicted)), 4),
        "macro_f1": round(float(f1_score(expected, predicted, labels=labels, average="macro", zero_division=0)), 4),
        "weighted_f1": round(float(f1_score(expected, predicted, labels=labels, average="weighted", zero_division=0)), 4),
        "min_class_f1": round(float(min(per_class)), 4),
        "class_f1": {label: round(float(f), 4) for label, f in zip(labels, per_class)},
    }
    return text + "\n" + "\n".join(lines), figures


def eval_intent(dataset: Path = EVAL, backend: str = "local", out=sys.stdout) -> int:
    rows = read_jsonl(dataset)
    bad = [i for i, r in enumerate(rows, 1) if r.get("intent") not in INTENTS]
    if bad:
        print(f"{dataset}: line {bad[0]} has no known 'intent' (one of {', '.join(INTENTS)})", file=sys.stderr)
        return 2
    classifier = _classifier(backend)
    predicted, latencies, llm_calls = asyncio.run(_classify_all(classifier, rows))
    expected = [r["intent"] for r in rows]
    text, figures = intent_report(expected, predicted)
    latencies.sort()
    figures.update({
        "dataset": str(dataset), "messages": len(rows), "backend": backend,
        "llm_calls_per_message": round(llm_calls / len(rows), 4),
        "mean_latency_ms": round(sum(latencies) / len(latencies), 3),
        "p50_latency_ms": round(latencies[len(latencies) // 2], 3),
        "p99_latency_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
    })
    passed = figures["macro_f1"] >= MIN_MACRO_F1 and figures["min_class_f1"] >= MIN_CLASS_F1
    figures["passed"] = passed
    print(f"intent eval: {dataset} ({len(rows)} messages, backend {backend})", file=out)
    print(text, file=out)
    print(f"accuracy {figures['accuracy']:.3f}  macro-F1 {figures['macro_f1']:.3f} (target ≥ {MIN_MACRO_F1})  "
          f"min class F1 {figures['min_class_f1']:.3f} (target ≥ {MIN_CLASS_F1})  "
          f"mean latency {figures['mean_latency_ms']:.2f} ms", file=out)
    print(json.dumps(figures), file=out)
    return 0 if passed else 1


def _state_for(row: dict) -> ConversationState:
    state = ConversationState()
    turn = 0
    for message in row.get("history") or []:
        if message.get("role") == "user":
            turn += 1
        state.messages.append(Message(role=message.get("role", "user"), content=message.get("content", ""), turn=turn))
    state.messages.append(Message(role="user", content=row["message"], turn=turn + 1))
    state.turn = turn + 1
    state.interest = InterestSignalsState(score=float(row.get("score_before", 0.0)), turn=turn)
    if row.get("email_known"):
        state.form.values["email"] = "visitor@example.com"
    return state


def eval_skills(dataset: Path = SKILLS_EVAL, out=sys.stdout) -> int:
    rows = read_jsonl(dataset)
    model = LocalIntentModel.load_or_train(shared_embedder().load())
    classifier = IntentClassifier(model, None, backend="local")
    rules = sig.SignalRules.load()
    config = SiteConfig()

    async def run():
        results = []
        for row in rows:
            state = _state_for(row)
            message = row["message"]
            intent, scores = "OFFTOPIC", {}
            if has_words(message):
                local = await classifier.local(message)
                intent, scores = local.intent, local.scores
            visitor_messages = sum(1 for m in state.messages if m.role == "user")
            found = sig.detect(rules, message, visitor_messages, scores)
            score = sig.cumulative(state.interest.score, sig.turn_score(rules, found))
            results.append((sk.select(intent, found, score, state, config), intent))
        return results

    results = asyncio.run(run())
    recalls, precisions, misses = [], [], []
    for row, (predicted, intent) in zip(rows, results):
        expected = set(row["skills"])
        got = set(predicted)
        recall = len(expected & got) / len(expected) if expected else 1.0
        recalls.append(recall)
        precisions.append(len(expected & got) / len(got) if got else 1.0)
        if recall < 1.0:
            misses.append(f"  {row['message']!r}: expected {sorted(expected)}, got {sorted(got)} (intent {intent})")
    figures = {
        "dataset": str(dataset), "rows": len(rows),
        "skill_recall": round(sum(recalls) / len(recalls), 4),
        "skill_precision": round(sum(precisions) / len(precisions), 4),
        "exact_rows": sum(1 for r in recalls if r == 1.0),
    }
    figures["passed"] = figures["skill_recall"] >= MIN_SKILL_RECALL
    print(f"skill eval: {dataset} ({len(rows)} rows, local selector)", file=out)
    if misses:
        print("rows with a missed skill:\n" + "\n".join(misses), file=out)
    print(f"multi-label recall {figures['skill_recall']:.3f} (target ≥ {MIN_SKILL_RECALL})  "
          f"precision {figures['skill_precision']:.3f}", file=out)
    print(json.dumps(figures), file=out)
    return 0 if figures["passed"] else 1
