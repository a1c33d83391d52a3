"""`concierge COMMAND [ARGS]`: every command is one row of `COMMANDS`, and the help is made from them.

A command's module is imported only when it runs, so `concierge sites check` does not load
LightRAG or the models. Three kinds of module live under cli/: the operator commands here
(run, ingest, replay, erase, briefs, sources, accounts, sites, insight), the measurements in cli/measure/, and the system harness
that `run`, the measurements and the tests share in cli/harness/.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    usage: tuple[tuple[str, str], ...]  # (synopsis, what it does), one help line each
    function: str = "main"  # main(argv) -> exit status


COMMANDS = (
    Command("run", "cli.run", (("run", "start the whole system on this machine (make run)"),)),
    Command("check", "cli.preflight", (("check", "check every process's settings in this environment, all problems at once"),)),
    Command("prepare", "cli.prepare", (("prepare", "build the embedding model's ONNX export and the intent model in the cache, once (make test does)"),)),
    Command("ingest", "cli.ingest", (("ingest --site SITE PATH...", "add files (md, txt, html, pdf) to a site's knowledge base"),)),
    Command("docs", "cli.ingest", (("docs list|delete|prune --site SITE", "a site's documents"),), function="docs_main"),
    Command("replay", "cli.replay", (
        ("replay [timeline] SITE SESSION", "a conversation's timeline and its state after each turn"),
        ("replay state SITE SESSION --at SEQ", "the folded state at any event"),
        ("replay rerun|diff SITE SESSION [--turn N] [--node NAME]", "run it again with the current code, in a sandbox"),
        ("replay fork SITE SESSION --at SEQ --message TEXT", "the conversation up to an event, then a new message"),
        ("replay verify --site SITE [--since 24h] [--limit N]", "rerun many; exit 1 when any diverges"),
        ("replay serve", "answer the operator UI's reruns, diffs, forks and verifies (/admin)"))),
    Command("erase-visitor", "cli.erase", (("erase-visitor", "forget a visitor: redact their events, delete their cached data"),)),
    Command("briefs", "cli.briefs", (
        ("briefs generate --site SITE [--lead S...] [--wait]", "queue briefs for the site's leads"),
        ("briefs show --site SITE [--lead S]", "a lead's brief and call script, or the site's leads"),
        ("briefs triage --site SITE", "rank the site's open leads: whom to call first"))),
    Command("sources", "cli.sources", (
        ("sources add --site SITE --url URL [--every 24h]", "a website (start page or sitemap) kept in the knowledge base"),
        ("sources upload --site SITE FILE...", "files (pdf, docx, pptx, html, md, txt) as sources"),
        ("sources list --site SITE", "the site's sources and how their last runs went"),
        ("sources sync --site SITE [--wait]", "sync the sources now (--wait: until done; 1 if one failed)"))),
    Command("accounts", "cli.accounts", (
        ("accounts import --site SITE FILE", "accounts, usage metrics and deals from a JSON or CSV file"),
        ("accounts list --site SITE [--json]", "the site's accounts: ARR, renewal, metrics near their limit"),
        ("accounts pull --site SITE [--force]", "fetch the accounts from the site's pull connector (its CRM)"),
        ("accounts report --site SITE --account ID [--account ID ...]", "queue a report per account"),
        ("accounts report show --site SITE --account ID [--json]", "an account's latest report and sales script"))),
    Command("sites", "cli.sites", (
        ("sites add --site SITE --name NAME [--origin URL...]", "create a site in the bus"),
        ("sites set --site SITE KEY=VALUE... [--file PATCH.toml]", "change a site's settings (widget.title=Hi)"),
        ("sites show --site SITE [--versions]", "a site's config, or its versions and who made them"),
        ("sites export --site SITE", "a site's config as a sites/SITE.toml file"),
        ("sites delete --site SITE", "delete a site (its log and history stay)"),
        ("sites check [DIR]", "validate the site config files (default: sites/)"),
        ("sites key --site SITE", "make an operator API key for one site (its hash goes in the site file)"),
        ("sites webhook-secret --site SITE", "print the secret SITE's lead webhooks are signed with"))),
    Command("insight", "cli.insight", (
        ("insight --site SITE [--since 7d] [--language L] [--route R]",
         "does it work? conversations, answers, not found, leads, feedback, resolution rate, knowledge gaps"),
        ("insight rebuild --site SITE", "make the site's insight records again from the log"))),
    Command("bench", "cli.measure.bench", (
        ("bench", "drive a fresh system with the scripted LLM and print figures (make bench)"),)),
    Command("loadtest", "cli.measure.loadtest", (
        ("loadtest SERVICE|all", "one service alone over rising rates: capacity per replica, CPU ms per event (make loadtest)"),
        ("loadtest ingest [--sites N --docs N]", "chunks/s of the offline ingest on a generated corpus, and where its time goes"))),
    Command("eval", "cli.measure.evals", (
        ("eval intent|followups|skills|hack|retrieval|all", "the router's and retriever's evals on labeled JSONL (make eval)"),
        ("eval answers [--base-url URL]", "ask the dataset's questions through a running system (or one it starts)"),
        ("eval sites [--site ID] [--split dev|test|all]", "real products' docs served locally, taken in by the crawler, asked"),
        ("eval site --site ID", "run a site's own test cases against the running system (the console's Tests)"),
        ("eval briefs [--mock]", "lead briefs and a triage on the contract cases (--mock: recorded model replies)"),
        ("eval accounts [--mock]", "account reports, sales scripts, opportunities and edits on the contract cases (--mock: recorded model replies)"))),
    Command("cluster-rehearsal", "cli.measure.rehearsal.cluster_rehearsal", (
        ("cluster-rehearsal [--sessions N] [--bounded]",
         "3 clustered nats-servers, 2 replicas of each service, load; kill one of each in turn"),)),
    Command("chaos", "cli.measure.rehearsal.chaos", (
        ("chaos [--replicas 1|2] [--bounded]",
         "under load: kill each service, restart NATS, stop Redis, duplicate events; audit the logs"),)),
    Command("first-run", "cli.measure.bench.first_run", (("first-run", "time a fresh clone's `make run` to its first answer"),)),
    Command("llm-bench", "cli.measure.bench.llm_bench", (
        ("llm-bench", "time to first token and tokens/s of the embedded model (or --base-url)"),)),
    Command("scripted-llm", "cli.harness.scripted_llm", (
        ("scripted-llm", "serve the scripted OpenAI-compatible LLM used by tests and bench"),)),
)
BY_NAME = {command.name: command for command in COMMANDS}


def usage() -> str:
    lines = [line for command in COMMANDS for line in command.usage]
    width = max(len(synopsis) for synopsis, _ in lines) + 2
    return "usage: concierge COMMAND [ARGS]\n\ncommands:\n" + "\n".join(
        f"  {synopsis:<{width}}{what}" for synopsis, what in lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command = BY_NAME.get(argv[0])
    if command is None:
        print(f"unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return getattr(importlib.import_module(command.module), command.function)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
