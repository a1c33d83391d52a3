"""`concierge bench --against REV [--pairs N] [ARGS]`: this tree's code and REV's, measured
by the same bench, alternately.

On this machine only runs made side by side compare: figures swing by half between
identical runs hours apart and the speed moves within seconds (docs/benchmarks-history.md,
cli/measure/machine.py). So a before/after figure is N pairs of runs, one of each code
per pair, the order switching from pair to pair (this tree first in the first pair, REV
first in the second, ...): with an even N, a machine slowing down or speeding up through
the runs favours neither.

REV's code is checked out into a temporary git worktree (removed at the end), and this
tree's load generator, scripted LLM and measuring modules (`SAME_ON_BOTH_SIDES`) are copied
over it: both sides are driven and measured the same way; the system under test and the
supervisor that starts it are REV's. Both run on this tree's virtualenv (REV's pins are not
installed). Each run is its own `concierge bench ARGS`; its output is shown as it comes,
then each pair's figures side by side, and last one JSON line with every run's figures and
REV's over this tree's (`ratios`). A run that fails stops the comparison; the line then
holds the runs made so far and the error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from cli.harness.supervisor import ROOT

# What drives and measures a bench run (paths in the project): the same on both sides.
SAME_ON_BOTH_SIDES = tuple(f"cli/measure/{name}" for name in (
    "bench/__init__.py", "bench/critical_path.py", "bench/pprof_summary.py", "machine.py", "process_usage.py",
    "stats.py",
)) + ("cli/harness/sse.py", "cli/harness/scripted_llm.py")
# Where `concierge bench` lived: a revision with neither is older than the command. An older
# one (cli/measure/bench.py) is measured with this tree's cli/measure/bench/ beside it, the
# package that `import cli.measure.bench` finds first.
BENCH = ("cli/measure/bench/__init__.py", "cli/measure/bench.py")
STOP_S = 60  # how long a stopped run may take to stop its system


class AgainstError(Exception):
    """REV cannot be checked out or measured, or one of its runs printed no figures."""


def git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise AgainstError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def describe_this() -> str:
    """This tree's commit, and whether its files differ from it (they are what is measured):
    tracked files changed, or Python files git does not know yet."""
    commit = git("rev-parse", "--short", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no") or git(
        "ls-files", "--others", "--exclude-standard", "--", "*.py")
    return f"{commit} with uncommitted changes" if changed else commit


def checkout(rev: str, into: Path) -> str:
    """REV's code in a worktree at `into`, this tree's `SAME_ON_BOTH_SIDES` over it; its commit."""
    commit = git("rev-parse", "--verify", "--short", f"{rev}^{{commit}}")
    git("worktree", "add", "--detach", "--force", str(into), commit)
    if not any((into / path).exists() for path in BENCH):
        raise AgainstError(f"{rev} ({commit}) has no {' or '.join(BENCH)}: older than `concierge bench`")
    for path in SAME_ON_BOTH_SIDES:
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, into / path)
    # What the bench imports from REV's code (its supervisor, events, bus) must be there:
    # found out now, not after this tree's first run.
    check = subprocess.run([sys.executable, "-c", "import cli.measure.bench"], cwd=into,
                           env={**os.environ, "PYTHONPATH": str(into)}, capture_output=True, text=True)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        raise AgainstError(f"this tree's bench cannot drive {rev} ({commit}): {last}")
    return commit


def remove_worktree(tree: Path) -> None:
    """The worktree gone, and git's record of it (a no-op when it was never added)."""
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


def run_bench(tree: Path, args: list[str]) -> dict:
    """One `concierge bench ARGS` on the code in `tree`, its output passed through; its
    figures. Stopped early (Ctrl-C, SIGTERM), the run gets SIGTERM, which a bench takes as
    Ctrl-C: it stops the system it started; it is waited for."""
    proc = subprocess.Popen([sys.executable, "-m", "cli", "bench", *args], cwd=tree,
                            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # no Ctrl-C but ours
    last = ""
    try:
        for line in proc.stdout:
            print(f"  {line}", end="", flush=True)
            last = line if line.strip() else last
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    try:
        figures = json.loads(last)
    except json.JSONDecodeError:
        raise AgainstError(f"the bench on {tree} ended (exit {proc.returncode}) without its JSON line") from None
    figures["exit"] = proc.returncode
    return figures


def order(pair: int) -> tuple[str, str]:
    """Which code runs first in pair `pair` (from 0): this tree, then REV, then the other way."""
    return ("this", "against") if pair % 2 == 0 else ("against", "this")


def headline(figures: dict) -> dict:
    """The figures a pair is read by."""
    cpu = figures.get("cpu_ms_per_turn", {})
    routes = figures.get("ttft_overhead_ms_by_route", {})
    return {
        "cpu_ms_per_turn": round(sum(cpu.values()), 1),
        "services_cpu_ms_per_turn": round(sum(v for k, v in cpu.items() if k not in ("nats", "redis")), 1),
        **{f"{route}_p50_ms": routes[route]["p50"] for route in ("ANSWER", "REDIRECT", "BOOKING") if route in routes},
        "ANSWER_p99_ms": figures.get("ttft_overhead_ms_p99"),
        "turns_per_s": figures.get("turns_per_s"),
    }


def ratios(this: dict, against: dict) -> dict:
    """REV's headline figures over this tree's (below 1: REV's is lower)."""
    mine, theirs = headline(this), headline(against)
    return {key: round(theirs[key] / value, 2) for key, value in mine.items()
            if key != "turns_per_s" and value and theirs.get(key) is not None}


def run(rev: str, pairs: int, bench_args: list[str]) -> int:
    try:
        this_code = describe_this()
    except AgainstError as exc:
        print(f"concierge bench --against {rev}: {exc}", file=sys.stderr)
        return 2
    runs: list[dict] = []
    error, stopped = None, False
    with tempfile.TemporaryDirectory(prefix="concierge-against-") as tmp:
        tree = Path(tmp) / "code"
        try:
            commit = checkout(rev, tree)
            for pair in range(pairs):
                for side in order(pair):
                    label = f"this tree ({this_code})" if side == "this" else f"{rev} ({commit})"
                    print(f"== pair {pair + 1} of {pairs}: {label}", flush=True)
                    runs.append({"pair": pair + 1, "code": side,
                                 "figures": run_bench(ROOT if side == "this" else tree, bench_args)})
        except (AgainstError, KeyboardInterrupt) as exc:
            stopped = isinstance(exc, KeyboardInterrupt)
            error = "stopped before the end (Ctrl-C or SIGTERM)" if stopped else str(exc)
            print(f"concierge bench --against {rev}: {error}", file=sys.stderr)
            if not runs:
                return 130 if stopped else 2
        finally:
            remove_worktree(tree)
    by_pair: dict[int, dict] = {}
    for r in runs:
        by_pair.setdefault(r["pair"], {})[r["code"]] = r["figures"]
    complete = {pair: both for pair, both in by_pair.items() if len(both) == 2}  # a stopped pair has one run
    pair_ratios = [ratios(both["this"], both["against"]) for both in complete.values()]
    print(f"this tree ({this_code}) and {rev} ({commit}), {len(complete)} pair{'s' * (len(complete) != 1)}:")
    for (pair, both), their_over_mine in zip(complete.items(), pair_ratios):
        mine, theirs = headline(both["this"]), headline(both["against"])
        print(f"  pair {pair}: " + ", ".join(f"{key} this {mine[key]} / {rev} {theirs.get(key)}" for key in mine)
              + f"; {rev} over this: {their_over_mine}")
    print(json.dumps({"against": rev, "against_commit": commit, "this": this_code, "pairs": pairs, "runs": runs,
                      "ratios": pair_ratios, **({"error": error} if error else {})}))
    if stopped:
        return 130
    return 0 if error is None and all(r["figures"]["exit"] == 0 for r in runs) else 1
