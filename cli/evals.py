"""`concierge eval intent|skills|hack|retrieval|all`: the router's evals (services/router/evaluation.py) and the
retriever's (services/retriever/evaluation.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="concierge eval")
    parser.add_argument("which", choices=("intent", "skills", "hack", "retrieval", "all"))
    parser.add_argument("--dataset", type=Path, help="JSONL file (default: the shipped evaluation set)")
    parser.add_argument("--backend", choices=("local", "llm", "cascade"), default="local",
                        help="intent classifier backend (default: local, the embedded default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from services.router import evaluation

    if args.dataset is not None and not args.dataset.is_file():
        parser.error(f"--dataset {args.dataset}: no such file")
    try:
        if args.which == "intent":
            return evaluation.eval_intent(args.dataset or evaluation.EVAL, args.backend)
        if args.which == "skills":
            return evaluation.eval_skills(args.dataset or evaluation.SKILLS_EVAL)
        if args.which == "hack":
            return evaluation.eval_hack(args.dataset or evaluation.HACK_EVAL, args.backend)
        if args.which == "retrieval":
            from services.retriever import evaluation as retrieval_eval
            return retrieval_eval.eval_retrieval(args.dataset or retrieval_eval.EVAL)
    except ValueError as exc:  # a malformed dataset: say where, no traceback
        import sys
        print(f"concierge eval: {exc}", file=sys.stderr)
        return 2
    if args.dataset is not None:
        parser.error("eval all runs the shipped datasets; use eval intent|skills|hack|retrieval --dataset FILE for one file")
    from services.retriever import evaluation as retrieval_eval

    skills = evaluation.eval_skills()
    retrieval = retrieval_eval.eval_retrieval()
    intent = evaluation.eval_intent(evaluation.EVAL, args.backend)
    hack = evaluation.eval_hack(evaluation.HACK_EVAL, args.backend)  # last: its JSON (the two HACK figures) ends the output
    return max(skills, retrieval, intent, hack)
