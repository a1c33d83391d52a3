"""`concierge bench --against REV`: this tree and REV measured alternately by the same
bench. The pairing and the ratios on made-up figures; then two pairs against HEAD at a tiny
load, stopped by SIGTERM as the second begins (two benches and the start of a third, about
a minute): the run under way stops its system (a bench takes SIGTERM as Ctrl-C), REV's
worktree is gone after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cli.harness.supervisor import ROOT
from cli.measure.bench import alternate, without_options


def figures(cpu: float, answer: float, redirect: float) -> dict:
    return {"cpu_ms_per_turn": {"nats": cpu / 4, "redis": 0.0, "router": cpu * 3 / 4},
            "ttft_overhead_ms_by_route": {"ANSWER": {"p50": answer, "p99": answer * 3},
                                          "REDIRECT": {"p50": redirect, "p99": redirect * 2}},
            "ttft_overhead_ms_p99": answer * 3, "turns_per_s": 15.0}


def test_the_runs_take_the_other_options_as_given():
    argv = ["--turns", "40", "--against", "HEAD~3", "--pairs=2", "--pace-ms", "3000", "--against=x", "--pairs", "4"]
    assert without_options(argv, ("--against", "--pairs")) == ["--turns", "40", "--pace-ms", "3000"]


def test_the_order_switches_from_pair_to_pair():
    assert [alternate.order(pair) for pair in range(3)] == [
        ("this", "against"), ("against", "this"), ("this", "against")]


def test_a_pair_reads_as_revs_figure_over_this_trees():
    assert alternate.headline(figures(40.0, 30.0, 25.0)) == {
        "cpu_ms_per_turn": 40.0, "services_cpu_ms_per_turn": 30.0, "ANSWER_p50_ms": 30.0, "REDIRECT_p50_ms": 25.0,
        "ANSWER_p99_ms": 90.0, "turns_per_s": 15.0}
    assert alternate.ratios(figures(40.0, 30.0, 25.0), figures(80.0, 60.0, 25.0)) == {
        "cpu_ms_per_turn": 2.0, "services_cpu_ms_per_turn": 2.0, "ANSWER_p50_ms": 2.0, "REDIRECT_p50_ms": 1.0,
        "ANSWER_p99_ms": 2.0}


def test_a_revision_git_does_not_know_is_a_clear_error_and_no_run():
    out = subprocess.run([sys.executable, "-m", "cli", "bench", "--against", "no-such-revision", "--pairs", "1"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "no-such-revision" in out.stderr and "== pair" not in out.stdout


def test_options_that_do_not_go_together_are_refused():
    for argv in (["--pairs", "2"], ["--against", "HEAD", "--profile", "/tmp/x"], ["--against", "HEAD", "--pairs", "0"]):
        out = subprocess.run([sys.executable, "-m", "cli", "bench", *argv], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "error:" in out.stderr and "== pair" not in out.stdout, (argv, out.stderr)


def test_a_revision_older_than_the_bench_is_a_clear_error_and_leaves_no_worktree():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    if shallow != "false":
        pytest.skip("a shallow clone's first commit is not the project's first")
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()[0]  # the first commit: no `concierge bench` yet
    before = worktrees()
    out = subprocess.run([sys.executable, "-m", "cli", "bench", "--against", first, "--pairs", "1"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "older than `concierge bench`" in out.stderr, out.stderr
    assert worktrees() == before


def worktrees() -> set[str]:
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return {line.split(" ", 1)[1] for line in listed.stdout.splitlines() if line.startswith("worktree ")}


def bench_processes(root: int) -> dict[int, str]:
    """The processes a bench started under `root` (its nats-server storing in a
    `concierge-bench-` directory, its scripted LLM), by pid: its descendants only, as other
    tests run theirs side by side."""
    listed = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in listed.splitlines():
        pid, ppid, *args = line.split(None, 2)
        children.setdefault(int(ppid), []).append((int(pid), args[0] if args else ""))
    found, todo = {}, [root]
    while todo:
        for pid, args in children.get(todo.pop(), []):
            todo.append(pid)
            if "concierge-bench-" in args or "cli scripted-llm --port" in args:
                found[pid] = args
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return not stat.read().rsplit(") ", 1)[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.timeout(300)
def test_pairs_against_head_measure_both_codes_and_a_sigterm_stops_the_run_and_leaves_nothing_behind():
    """One pair measured, then SIGTERM during the next: the run under way stops its system (a
    bench takes SIGTERM as Ctrl-C), the figures so far are printed, no worktree is left. The
    signal comes once that run's nats-server and scripted LLM are running, while it ingests
    the knowledge base, not once its services are up too: what a stop must end is there, and
    the third bench's set-up (a system's start, the test's longest part) is not waited for."""
    before = worktrees()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "bench", "--against", "HEAD", "--pairs", "2", "--turns", "4",
                             "--concurrency", "2", "--think-ms", "0", "--replay-rounds", "0"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    try:
        for line in proc.stdout:  # the second pair's first run begins
            out.append(line)
            if line.startswith("== pair 2 of 2"):
                break
        deadline = time.monotonic() + 120
        while len(running := bench_processes(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # until its nats-server and scripted LLM run (the first pair's have ended)
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout = "".join(out) + rest
    report = f"{stdout[-3000:]}\n{err[-2000:]}"
    assert len(running) == 2, report  # the run's nats-server and scripted LLM
    assert proc.returncode == 130 and "stopped before the end" in err, report
    assert not [pid for pid in running if alive(pid)] and worktrees() == before, report
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["against"] == "HEAD" and result["against_commit"] and result["error"], report
    assert [r["code"] for r in result["runs"]][:2] == ["this", "against"], report
    for run in result["runs"][:2]:
        assert run["figures"]["completed"] == 4 and run["figures"]["exit"] == 0, report
        assert run["figures"]["machine_gauge_ms"]["before"] > 0, report
    assert result["ratios"][0]["cpu_ms_per_turn"] > 0 and "1 pair:" in stdout, report
