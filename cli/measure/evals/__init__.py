"""`concierge eval intent|followups|skills|hack|retrieval|answers|sites|site|briefs|accounts|all`: the router's evals
(services/router/evaluation.py), the retriever's (services/retriever/evaluation.py), the answers' (cli/measure/evals/
answer_eval.py: through a running system, the one `--base-url` names or one it starts), the answers on real
websites' (cli/measure/evals/site_eval.py: real products' docs taken in through the crawler), the lead briefs'
(cli/measure/evals/brief_eval.py) and the account reports' (cli/measure/evals/account_eval.py): `--mock` for the
recorded model replies. `eval site --site S`: a site's own test cases run against the running system
(cli/measure/evals/site_cases.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from cli import options


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="concierge eval")
    parser.add_argument("which", choices=("intent", "followups", "skills", "hack", "retrieval", "answers", "sites",
                                          "site", "briefs", "accounts", "all"))
    parser.add_argument("--dataset", type=Path, help="JSONL file (default: the shipped evaluation set)")
    parser.add_argument("--backend", choices=("local", "llm", "cascade"), default="local",
                        help="intent classifier backend (default: local, the embedded default)")
    parser.add_argument("--base-url", help="answers: a running gateway (default: start a system for the eval)")
    parser.add_argument("--site", action="append",
                        help="answers: the site asked (default: demo); sites: a real site to take in and ask, "
                             "repeatable (default: every site at hand)")
    parser.add_argument("--split", choices=("dev", "test", "all"), default="test",
                        help="sites: the questions asked (default: test; tune on dev)")
    parser.add_argument("--docs", type=Path,
                        help="sites: a directory holding each git-kept site's pages as <site id>/ "
                             "(default: REALSITES_DIR)")
    parser.add_argument("--limit", type=int, help="sites: at most this many questions per site")
    parser.add_argument("--under", help="sites: only each site's pages under this directory (\"cloud/\") and the "
                                         "questions they answer")
    parser.add_argument("--save", type=Path,
                        help="sites: write every turn (answer, route, cited pages, the documents it was given) as JSONL")
    parser.add_argument("--misses", action="store_true",
                        help="sites: say each missed question of the test split too, with its answer (the dev "
                             "split's always; never read the test split's while tuning)")
    parser.add_argument("--again", type=Path,
                        help="sites: score the extractive answerer again on a --save file's turns (no system started)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="answers: conversations at once; briefs: reports at once; accounts: cases at once "
                             "(default: 1)")
    parser.add_argument("--timeout", type=float, default=900.0, help="site: how long to wait for the run (s)")
    parser.add_argument("--metrics", action="append",
                        help="site: a process's /metrics URL (repeatable): the CPU a case took, every process named")
    parser.add_argument("--import", dest="import_file", type=Path,
                        help="site: save this JSONL's rows (the answers eval's format) as the site's cases, not run them")
    options.add_bus(parser)
    parser.add_argument("--mock", action="store_true",
                        help="briefs, accounts: the recorded model replies (deterministic) instead of LLM_BASE_URL")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from services.router import evaluation

    if args.dataset is not None and not args.dataset.is_file():
        parser.error(f"--dataset {args.dataset}: no such file")
    try:
        if args.which == "intent":
            return evaluation.eval_intent(args.dataset or evaluation.EVAL, args.backend)
        if args.which == "followups":
            return evaluation.eval_followups(args.dataset or evaluation.FOLLOWUPS_EVAL, args.backend)
        if args.which == "skills":
            return evaluation.eval_skills(args.dataset or evaluation.SKILLS_EVAL)
        if args.which == "hack":
            return evaluation.eval_hack(args.dataset or evaluation.HACK_EVAL, args.backend)
        if args.which == "retrieval":
            from services.retriever import evaluation as retrieval_eval
            return retrieval_eval.eval_retrieval(args.dataset or retrieval_eval.EVAL)
        if args.which == "briefs":
            from cli.measure.evals import brief_eval
            return brief_eval.eval_briefs(args.dataset or brief_eval.DATASET, args.mock, concurrency=args.concurrency)
        if args.which == "accounts":
            from cli.measure.evals import account_eval
            return account_eval.eval_accounts(args.dataset or account_eval.DATASET, args.mock,
                                              concurrency=args.concurrency)
        if args.which == "answers":
            from cli.measure.evals import answer_eval
            return answer_eval.eval_answers(args.dataset or answer_eval.DATASET, args.base_url, _one_site(args),
                                            args.concurrency)
        if args.which == "site":
            import asyncio

            from cli.measure.evals import site_cases
            if not args.site:
                parser.error("eval site: --site SITE, the site whose cases are run")
            if args.import_file is not None:
                return asyncio.run(site_cases.import_file(options.bus_config(args), _one_site(args), args.import_file))
            return asyncio.run(site_cases.run(options.bus_config(args), _one_site(args), args.timeout,
                                              metrics=args.metrics or []))
        if args.which == "sites":
            from cli.measure.evals import site_eval
            if args.again is not None:
                return site_eval.answer_again(args.again, misses=args.misses)
            return site_eval.eval_sites(args.site, args.split, args.docs, args.base_url, max(args.concurrency, 1),
                                        args.limit, args.save, args.under, args.misses)
    except ValueError as exc:  # a malformed dataset: say where, no traceback
        import sys
        print(f"concierge eval: {exc}", file=sys.stderr)
        return 2
    if args.dataset is not None:
        parser.error("eval all runs the shipped datasets; use eval intent|followups|skills|hack|retrieval --dataset FILE "
                     "for one file")
    from cli.measure.evals import answer_eval
    from services.retriever import evaluation as retrieval_eval

    from cli.measure.evals import site_eval

    skills = evaluation.eval_skills()
    retrieval = retrieval_eval.eval_retrieval()
    intent = evaluation.eval_intent(evaluation.EVAL, args.backend)
    heldout = evaluation.eval_intent(evaluation.HELDOUT, args.backend)  # written fresh; its misses read since
    fresh = evaluation.eval_intent(evaluation.FRESH, args.backend)  # written fresh, only its figures read
    # The real sites at hand (Directus's docs from the npm registry; the others with
    # REALSITES_DIR), their test split.
    sites = site_eval.eval_sites(None, "test", None, args.base_url, max(args.concurrency, 1))
    followups = evaluation.eval_followups(evaluation.FOLLOWUPS_EVAL, args.backend)
    # A system of its own unless --base-url names one; its answer backend is whatever the
    # LLM environment gives (no LLM_BASE_URL: the system's default).
    answers = answer_eval.eval_answers(answer_eval.DATASET, args.base_url, _one_site(args), args.concurrency)
    hack = evaluation.eval_hack(evaluation.HACK_EVAL, args.backend)  # last: its JSON (the two HACK figures) ends the output
    return max(skills, retrieval, intent, heldout, fresh, followups, answers, sites, hack)


def _one_site(args) -> str:
    return (args.site or ["demo"])[-1]
