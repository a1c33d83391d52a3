"""`concierge bench` (what `make bench` calls): figures for the whole turn path.

Starts a fresh system (its own nats-server and the five services, as `make run` does)
and the scripted LLM with a fixed time to first token, drives `--turns` chat turns
from `--concurrency` concurrent sessions through HTTP SSE (each session waits
`--think-ms` between its turns, like a visitor reading the answer; or, with `--pace-ms`,
sends one every PACE ms), and measures:

- ttft_overhead_ms: request sent → first SSE token, minus the scripted LLM's configured
  first-token delay (what Concierge adds; the scripted server's own scheduling slack
  counts against us), for ANSWER turns (product questions), and per route: two in three
  sessions ask product questions (ANSWER), one in six writes support requests (REDIRECT),
  one in six asks for a demo and then answers the booking questions (BOOKING); the bench
  site holds the demo knowledge base, so ANSWER turns wait for a real retrieval;
- `--answer-backend extractive`: the answer role gets no LLM (ANSWER_BACKEND=extractive,
  answers composed from the sources' sentences); the other roles keep the scripted LLM.
  ANSWER turns then call no model, so their TTFT overhead is the whole time to first
  token (nothing is subtracted): the figure to compare with the LLM path's overhead, at
  the same `--pace-ms`. (With `--think-ms` a session's next turn waits for the whole
  answer: the LLM's streams for about a second, an extractive answer's at once, so the
  extractive run offers more turns a second to the same two cores and queues longer.)
- replay_events_per_s: conversation logs read from JetStream and folded into state,
  from the first event (no snapshots), events per second.
- machine_gauge_ms: a fixed piece of Python work, timed before and after the run
  (cli/measure/machine.py): this machine's speed moves, and the figures with it.

`--against REV` measures this tree and git revision REV alternately, the same bench with
the other arguments, `--pairs` times each (cli/measure/bench/alternate.py): the way to compare
code here, where only runs made side by side compare.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import httpx

from cli.harness.sse import Conversation
from cli.harness.supervisor import ROOT, free_port, make_system, wait_http
from cli.measure import machine, process_usage
from cli.measure.bench import critical_path, pprof_summary
from cli.measure.stats import percentile
from shared import events as ev
from shared import subjects
from shared.bus import connect
from shared.config import LLM_ROLES, BusConfig
from shared.state import fold


QUESTIONS = ["What integrations do you offer?", "How does the scheduling engine work?", "Do you integrate with Salesforce?",
             "Is there an API I can use?", "Does the mobile app work offline?", "Where is my data hosted?",
             "Can I export my data to CSV?", "How long does onboarding take?", "Do you support single sign-on?",
             "What kind of reports can I build?"]
SUPPORT = ["I can't log in to my account", "The HubSpot sync stopped working", "My invoice shows the wrong seats",
           "The app crashes when I open the calendar", "Password reset emails never arrive"]
BOOKING = ["I'd like to book a demo", "visitor{i}@example.com", "Company {i}", "Does the mobile app work offline?",
           "What integrations do you offer?"]
SCRIPTS = [QUESTIONS, QUESTIONS[3:] + QUESTIONS[:3], QUESTIONS[6:] + QUESTIONS[:6], QUESTIONS[::-1], SUPPORT, BOOKING]
# `--only answer`: every session asks product questions (the CPU target is per ANSWER turn).
ANSWER_SCRIPTS = SCRIPTS[:4]


async def drive(base_url: str, site: str, turns: int, concurrency: int, think_s: float = 0.0,
                sessions_total: int | None = None, pace_s: float = 0.0,
                scripts: list[list[str]] = SCRIPTS) -> tuple[list[dict], list[str]]:
    """`sessions_total` conversations (default: `concurrency`), at most `concurrency` at once,
    `turns` turns in all. Each session waits `think_s` after a turn's answer, or, with
    `pace_s`, sends a turn every `pace_s` (right after the previous one's answer when that
    came later): the same offered load whatever the answers' length."""
    sessions_total = sessions_total or concurrency
    per_session = max(1, turns // sessions_total)
    results: list[dict] = []
    sessions: list[str] = []
    slots = asyncio.Semaphore(concurrency)
    # Idle connections are dropped before the gateway (uvicorn: 5 s) closes them under a request.
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2,
                          keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def conversation(i: int) -> None:
            visitor = Conversation(client, base_url, site)
            # Sessions start spread over one think time, as visitors do not all type at once.
            await asyncio.sleep((pace_s or think_s) * (i % concurrency) / concurrency)
            script = scripts[i % len(scripts)]
            async with slots:
                began = time.monotonic()
                for t in range(per_session):
                    if t and pace_s:
                        await asyncio.sleep(max(0.0, began + t * pace_s - time.monotonic()))
                    elif t:
                        await asyncio.sleep(think_s)
                    sent_at = time.time()
                    r = await visitor.say(script[t % len(script)].format(i=i, t=t))
                    if t == 0 and visitor.session_id:
                        sessions.append(visitor.session_id)
                    final = r.final or {}
                    results.append({"status": r.status, "final": final.get("type"),
                                    "route": (final.get("metadata") or {}).get("route"),
                                    "first_token_s": r.first_token_s, "total_s": r.total_s,
                                    "session": visitor.session_id, "turn": (r.start or {}).get("turn"),
                                    "sent_at": sent_at,
                                    "first_read_at": sent_at + r.first_token_s if r.first_token_s else None})

        await asyncio.gather(*(conversation(i) for i in range(sessions_total)))
    return results, sessions


async def replay_rate(nats_url: str, site: str, sessions: list[str], rounds: int) -> tuple[float, int]:
    bus = await connect(BusConfig(url=nats_url), name="bench-replay")
    try:
        events = 0
        started = time.perf_counter()
        for _ in range(rounds):
            for session in sessions:
                records = await bus.read(subjects.conversation(site, session))
                fold(records)
                events += len(records)
        elapsed = time.perf_counter() - started
    finally:
        await bus.close()
    return events / elapsed, events


async def critical_paths(nats_url: str, site: str, results: list[dict]) -> tuple[dict[str, dict[str, float]], dict]:
    """Each route's critical path (cli/measure/bench/critical_path.py) over the measured turns:
    their stored events, their first token events (TOKENS) and the client's clock; and what
    ANSWER turns waited for the visitor's profile (`critical_path.profile_wait`)."""
    bus = await connect(BusConfig(url=nats_url), name="bench-critical-path")
    turns = []
    try:
        for session in sorted({r["session"] for r in results if r.get("session")}):
            by_turn: dict[int, list] = {}
            for record in await bus.read(subjects.conversation(site, session)):
                by_turn.setdefault(record.event.turn, []).append(record.event)
            first_token: dict[int, float] = {}
            async for _, _, data in bus.read_raw(subjects.session_tokens(site, session),
                                                 stream=subjects.TOKENS_STREAM):
                chunk = ev.decode(data)
                if isinstance(chunk, ev.TokenChunk):
                    first_token[chunk.turn] = min(chunk.ts, first_token.get(chunk.turn, chunk.ts))
            for r in results:
                if r.get("session") == session and r.get("turn") in by_turn:
                    turns.append(critical_path.turn_segments(by_turn[r["turn"]], first_token.get(r["turn"]),
                                                             r["sent_at"], r["first_read_at"]))
    finally:
        await bus.close()
    return critical_path.summarize(turns), critical_path.profile_wait(turns)


def verify(nats_url: str, site: str, env: dict[str, str]) -> dict:
    """`concierge replay verify --site SITE` over the bench's conversations, run as an operator
    runs it: its own process, with the services' LLM settings (`env`; the calls are answered
    from the recording). Its last line, the figures."""
    done = subprocess.run([sys.executable, "-m", "cli", "replay", "verify", "--site", site, "--nats-url", nats_url],
                          cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode not in (0, 1) or not lines:  # 1: something diverged, reported in the figures
        raise RuntimeError(f"replay verify failed ({done.returncode}): {done.stderr[-2000:]}")
    figures = json.loads(lines[-1])
    figures["divergences"] = figures["divergences"][:10]
    return figures


def process_cpu_s(system) -> dict[str, float]:
    """User + system CPU seconds of each process the system started (Linux /proc), to see
    where the measured turns' time went."""
    out = {}
    for name, proc in system.procs.items():
        try:
            out[name] = process_usage.cpu_s(proc.pid)
        except OSError:
            continue
    return out


class NatsProfiler(threading.Thread):
    """nats-server's CPU profile while the measured turns run, from its profiling port (Go's
    pprof): one window of `window_s` seconds a request, fetched one after another until
    `stop`, which reads them together into DIR/nats.txt (cli/measure/bench/pprof_summary.py)."""

    def __init__(self, port: int, directory: Path, window_s: int = 5):
        super().__init__(name="nats-profiler", daemon=True)
        self.url = f"http://127.0.0.1:{port}/debug/pprof/profile?seconds={window_s}"
        self.directory, self.window_s = Path(directory), window_s
        self.windows: list[Path] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            path = self.directory / f"nats-{len(self.windows)}.pprof"
            try:
                with urllib.request.urlopen(self.url, timeout=self.window_s + 30) as answer:
                    path.write_bytes(answer.read())
            except (OSError, http.client.HTTPException) as exc:
                print(f"nats-server profile window not collected: {exc!r}", file=sys.stderr, flush=True)
                return
            self.windows.append(path)

    def stop(self) -> str:
        """After the window under way: the summary of all of them (also in DIR/nats.txt)."""
        self._stopping.set()
        self.join(self.window_s + 35)
        text = pprof_summary.summary(path.read_bytes() for path in self.windows)
        (self.directory / "nats.txt").write_text(text)
        return text


def py_spy() -> str | None:
    """py-spy on PATH or beside this Python (the bench extra's), or None."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def start_profilers(system, directory: str) -> list:
    """py-spy sampling every Python process the system started (collapsed stacks in
    DIR/<service>.txt), and nats-server's own CPU profile when it serves one (DIR/nats.txt)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    spy = py_spy()
    profilers: list = [subprocess.Popen([spy, "record", "--pid", str(proc.pid), "--format", "raw", "--rate", "200",
                                         "--output", str(Path(directory) / f"{name}.txt")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                       for name, proc in system.procs.items() if name not in ("nats", "redis")]
    if system.nats_profile_port:
        profilers.append(NatsProfiler(system.nats_profile_port, Path(directory)))
        profilers[-1].start()
    return profilers


def stop_profilers(profilers: list) -> None:
    spies = [p for p in profilers if isinstance(p, subprocess.Popen)]
    for profiler in spies:
        profiler.send_signal(signal.SIGINT)
    for profiler in spies:
        profiler.wait(30)
    for profiler in profilers:
        if isinstance(profiler, NatsProfiler):
            profiler.stop()


def interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def without_options(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """`argv` without the options `names` and their values (`--name VALUE` or `--name=VALUE`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif not arg.startswith(tuple(f"{name}=" for name in names)):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> int:
    # No abbreviations: --against's runs get the other options as given, and only the full names are taken out.
    parser = argparse.ArgumentParser(prog="concierge bench", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--sessions", type=int, default=None,
                        help="conversations in all (default: --concurrency), --concurrency at a time")
    parser.add_argument("--verify", action="store_true",
                        help="then `concierge replay verify` the bench's conversations (recorded LLM calls)")
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="scripted LLM time to first token")
    parser.add_argument("--inter-token-ms", type=float, default=20.0, help="scripted LLM delay between chunks")
    parser.add_argument("--think-ms", type=float, default=1000.0,
                        help="pause between a session's turns (a visitor reading and typing); 0 = back to back")
    parser.add_argument("--pace-ms", type=float, default=0.0,
                        help="instead of --think-ms: each session sends a turn every PACE ms (open loop: the "
                             "offered load, concurrency / pace turns/s, does not depend on how long answers "
                             "stream; compare backends with it)")
    parser.add_argument("--only", choices=("answer",), default=None,
                        help="answer: every session asks product questions (ANSWER turns only), for the CPU "
                             "figure per ANSWER turn; by default two in three sessions do, the others "
                             "REDIRECT and BOOKING")
    parser.add_argument("--replay-rounds", type=int, default=3)
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="sample every service with py-spy during the measured turns (flame-graph input: "
                             "collapsed stacks per service in DIR/<service>.txt), and nats-server with its own "
                             "CPU profiler (Go pprof windows in DIR/nats-N.pprof, read into DIR/nats.txt)")
    parser.add_argument("--answer-backend", choices=("llm", "extractive"), default="llm",
                        help="extractive: the answer role has no LLM (the other roles keep the scripted one)")
    parser.add_argument("--against", metavar="REV", default=None,
                        help="measure this tree and git revision REV alternately, the same bench with the other "
                             "arguments (cli/measure/bench/alternate.py): the way to compare code on this machine")
    parser.add_argument("--pairs", type=int, default=None,
                        help="with --against: runs of each code, the order switching every pair (default 2; an "
                             "even number favours neither)")
    args = parser.parse_args(argv)
    if args.pairs is not None and not args.against:
        parser.error("--pairs goes with --against")
    if args.pairs is not None and args.pairs < 1:
        parser.error("--pairs: at least 1")
    if args.against and args.profile:
        parser.error("--profile measures one run: not with --against, whose runs would write over each other")
    if args.profile and not py_spy():
        parser.error("--profile samples with py-spy, which is not installed: pip install -e '.[bench]' "
                     "(or make loadtest, which installs it)")
    # SIGTERM stops a run as Ctrl-C does: the system it started is stopped, its data removed
    # (with --against: the run under way, then the worktree).
    signal.signal(signal.SIGTERM, interrupt)
    if args.against:
        from cli.measure.bench import alternate

        return alternate.run(args.against, args.pairs or 2, without_options(
            sys.argv[1:] if argv is None else argv, ("--against", "--pairs")))

    gauge_before = machine.gauge_ms()
    llm_port = free_port()
    llm = subprocess.Popen(
        [sys.executable, "-m", "cli", "scripted-llm", "--port", str(llm_port), "--ttft-ms", str(args.ttft_ms),
         "--inter-token-ms", str(args.inter_token_ms)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    with tempfile.TemporaryDirectory(prefix="concierge-bench-") as data:
        # Only configured sites are served: the bench and warm-up sites are the demo site's config.
        sites = Path(data) / "sites"
        sites.mkdir()
        for name in ("bench", "warmup"):
            shutil.copy(ROOT / "sites" / "demo.toml", sites / f"{name}.toml")
        llm_url = f"http://127.0.0.1:{llm_port}/v1"
        if args.answer_backend == "extractive":
            llm_env = {"LLM_BASE_URL": "", "LLM_ANSWER_BASE_URL": "", "ANSWER_BACKEND": "extractive",
                       **{f"LLM_{role.upper()}_BASE_URL": llm_url for role in LLM_ROLES if role != "answer"}}
        else:
            llm_env = {"LLM_BASE_URL": llm_url, "ANSWER_BACKEND": "llm"}
        system = make_system(Path(data), free_port(), free_port(), {
            "SITES_DIR": str(sites),
            "BRIEFS_BACKEND": "data",  # the turn path is measured; a captured lead's brief makes no model call
            **llm_env,
            # Every simulated visitor comes from 127.0.0.1: the per-IP limit would stop the
            # bench, not measure anything. The per-site limit stays on, above the offered load.
            "RATE_LIMIT_PER_IP_PER_MIN": "0",
            "RATE_LIMIT_PER_SITE_PER_MIN": "100000",
        })
        if args.profile:
            system.nats_profile_port = free_port()
        try:
            wait_http(f"http://127.0.0.1:{llm_port}/v1/models", 30, llm)
            site = "bench"
            # The bench site answers from the demo knowledge base, so ANSWER turns wait for a
            # real retrieval (mix mode) as they do on `make run`.
            system.ingest(site)
            system.start_all()
            print(f"system up; warming up, then {args.turns} turns from {args.concurrency} sessions "
                  f"(scripted TTFT {args.ttft_ms:.0f} ms)", flush=True)
            asyncio.run(drive(system.gateway_url, "warmup", args.concurrency, args.concurrency))
            profilers = start_profilers(system, args.profile) if args.profile else []
            cpu_before = process_cpu_s(system)
            llm_cpu_before = process_usage.cpu_s(llm.pid)
            driver_cpu_before = time.process_time()
            started = time.perf_counter()
            results, sessions = asyncio.run(
                drive(system.gateway_url, site, args.turns, args.concurrency, args.think_ms / 1000, args.sessions,
                      args.pace_ms / 1000, ANSWER_SCRIPTS if args.only == "answer" else SCRIPTS))
            wall = time.perf_counter() - started
            driver_cpu_s = time.process_time() - driver_cpu_before
            stop_profilers(profilers)
            cpu_s = {name: round(after - cpu_before.get(name, 0.0), 2) for name, after in process_cpu_s(system).items()}
            llm_cpu_s = process_usage.cpu_s(llm.pid) - llm_cpu_before
            print("CPU seconds per process during the measured turns: "
                  + ", ".join(f"{name} {seconds}" for name, seconds in cpu_s.items()), flush=True)
            paths, waited = asyncio.run(critical_paths(system.nats_url, site, results))
            rate, replayed = asyncio.run(replay_rate(system.nats_url, site, sessions, args.replay_rounds))
            verified = verify(system.nats_url, site, {**llm_env, "SITES_DIR": str(sites)}) if args.verify else None
        finally:
            system.stop()
            llm.terminate()
            llm.wait(10)
    gauge_after = machine.gauge_ms()

    ok = [r for r in results if r["status"] == 200 and r["final"] == "complete" and r["first_token_s"] is not None]

    def model_ttft(route: str) -> float:  # what the scripted model adds before the first token
        return 0.0 if route == "ANSWER" and args.answer_backend == "extractive" else args.ttft_ms

    overhead = [r["first_token_s"] * 1000 - model_ttft("ANSWER") for r in ok if r["route"] == "ANSWER"]
    by_route = {}
    for route in ("ANSWER", "REDIRECT", "BOOKING"):
        values = [r["first_token_s"] * 1000 - model_ttft(route) for r in ok if r["route"] == route]
        if values:
            by_route[route] = {"turns": len(values), "p50": round(percentile(values, 50), 2),
                               "p99": round(percentile(values, 99), 2)}
    totals = [r["total_s"] * 1000 for r in ok]
    figures = {
        "turns": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "failures": dict(Counter(f"{r['status']}/{r['final']}" for r in results if r not in ok)),
        "concurrency": args.concurrency,
        "answer_backend": args.answer_backend,
        "scripted_ttft_ms": args.ttft_ms,
        "scripted_inter_token_ms": args.inter_token_ms,
        "think_ms": args.think_ms,
        "pace_ms": args.pace_ms,
        "only": args.only,
        "ttft_overhead_ms_p50": round(percentile(overhead, 50), 2),
        "ttft_overhead_ms_p99": round(percentile(overhead, 99), 2),
        "ttft_overhead_ms_mean": round(statistics.fmean(overhead), 2) if overhead else None,
        "ttft_overhead_ms_by_route": by_route,
        "turn_ms_p50": round(percentile(totals, 50), 1),
        "turns_per_s": round(len(ok) / wall, 1),
        "critical_path_ms_p50": paths,
        # ANSWER turns' wait for the visitor's profile past route and retrieval: the budget's cost.
        "profile_wait_ms": waited,
        "cpu_ms_per_turn": {name: round(seconds * 1000 / max(1, len(results)), 1) for name, seconds in cpu_s.items()},
        # On the same cores, outside the figure above: a real provider's is not on ours.
        "scripted_llm_cpu_ms_per_turn": round(llm_cpu_s * 1000 / max(1, len(results)), 1),
        # The load generator (this process: HTTP clients reading SSE), on the same cores too.
        "driver_cpu_ms_per_turn": round(driver_cpu_s * 1000 / max(1, len(results)), 1),
        **({"verify": verified} if verified is not None else {}),
        "replay_events": replayed,
        "replay_events_per_s": round(rate),
        "cpus": os.cpu_count(),
        # This machine's speed before and after (cli/measure/machine.py: ms, higher is slower).
        "machine_gauge_ms": {"before": gauge_before, "after": gauge_after},
    }
    print(f"completed {figures['completed']}/{figures['turns']} turns in {wall:.1f}s "
          f"({figures['turns_per_s']} turns/s)")
    print(f"TTFT overhead (ANSWER) p50 {figures['ttft_overhead_ms_p50']} ms, p99 {figures['ttft_overhead_ms_p99']} ms")
    for route, f in by_route.items():
        print(f"  {route:<8} {f['turns']:>4} turns  TTFT overhead p50 {f['p50']} ms  p99 {f['p99']} ms")
    print("critical path, p50 ms per segment (cli/measure/bench/critical_path.py):")
    for route, segments in paths.items():
        print(f"  {route:<8} " + ", ".join(f"{segment} {ms}" for segment, ms in segments.items()))
    if waited:
        print(f"  the profile's wait (ANSWER, past route and retrieval): p50 {waited['p50']} ms, p90 {waited['p90']} ms, "
              f"p99 {waited['p99']} ms; {waited['waited']} of {waited['turns']} turns waited")
    print("CPU ms per turn: " + ", ".join(f"{name} {ms}" for name, ms in figures["cpu_ms_per_turn"].items())
          + f" (all: {round(sum(figures['cpu_ms_per_turn'].values()), 1)}; on the same cores, the scripted LLM "
          f"{figures['scripted_llm_cpu_ms_per_turn']} and the load generator {figures['driver_cpu_ms_per_turn']})")
    print(f"replay: {replayed} events read and folded at {figures['replay_events_per_s']} events/s")
    if verified is not None:
        print(f"replay verify: {verified['conversations']} conversations, {verified['turns']} turns, "
              f"{verified['diverged']} diverged, {verified['conversations_per_s']} conversations/s, "
              f"{verified['cpu_ms_per_conversation']} ms CPU a conversation")
    print(f"machine gauge: {gauge_before} ms before, {gauge_after} ms after (cli/measure/machine.py; "
          "higher is slower: read the figures against it)")
    print(json.dumps(figures))
    return 0 if figures["failed"] == 0 and not (verified or {}).get("diverged") else 1
