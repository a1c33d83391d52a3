"""`concierge` command: run, replay, bench, scripted-llm."""

from __future__ import annotations

import sys

USAGE = """usage: concierge COMMAND [ARGS]

commands:
  run                    start the whole system on this machine (make run)
  replay SITE SESSION    print a conversation's timeline and its state after each turn
  bench                  drive a fresh system with the scripted LLM and print figures (make bench)
  scripted-llm           serve the scripted OpenAI-compatible LLM used by tests and bench
  llm-bench              time to first token and tokens/s of the embedded model (or --base-url)
  first-run              time a fresh clone's `make run` to its first answer
  erase-visitor          forget a visitor: redact their events, delete their cached data
  loadtest SERVICE       one service alone under a set rate (enricher, router, retriever)
  eval intent|skills|hack|retrieval|all   the router's and retriever's evals on labeled JSONL (make eval)
  eval answers [--base-url URL]   ask the dataset's questions through a running system (or one it starts)
  sites check [DIR]      validate the site config files (default: sites/)
  sites key --site SITE  make an operator API key for one site (its hash goes in the site file)
  sites webhook-secret --site SITE   print the secret SITE's lead webhooks are signed with
  ingest --site SITE PATH...      add files (md, txt, html, pdf) to a site's knowledge base
  docs list|delete --site SITE    a site's documents
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from cli import run
        return run.main(rest)
    if command == "replay":
        from cli import replay
        return replay.main(rest)
    if command == "bench":
        from cli import bench
        return bench.main(rest)
    if command == "loadtest":
        from cli import loadtest
        return loadtest.main(rest)
    if command == "eval":
        from cli import evals
        return evals.main(rest)
    if command == "sites":
        from cli import sites
        return sites.main(rest)
    if command == "ingest":
        from cli import ingest
        return ingest.main(rest)
    if command == "docs":
        from cli import ingest
        return ingest.docs_main(rest)
    if command == "erase-visitor":
        from cli import erase
        return erase.main(rest)
    if command == "first-run":
        from cli import first_run
        return first_run.main(rest)
    if command == "llm-bench":
        from cli import llm_bench
        return llm_bench.main(rest)
    if command == "scripted-llm":
        from cli import scripted_llm
        scripted_llm.main(rest)
        return 0
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
