"""The rate sweep every load test runs: one service process under rising fixed rates, the
figures of each rate, and the highest rate it sustains.

A rate is **sustainable** when the service answered every arrival, at ≥ 95 % of the rate
(`MIN_ACHIEVED`), with the p99 latency within the service's objective (`--objective-ms`). The sweep climbs the
rates in order and stops at the first one that is not sustainable (higher ones would only
queue); `--refine N` then tries N rates halfway between the last sustained and the first
failed. Per rate: the achieved rate, p50/p95/p99 of the service's latency, CPU
milliseconds per answered event (the service process's own CPU time over the window,
backlog included: stable on a shared machine) and its peak RSS during that rate; beside
them the load generator's own CPU ms per event and the machine's 1-minute load average
at the end of the rate, to judge what else was competing for the cores.

Each load test's last line is `report(...)` as one JSON object:

    {"service": ..., "objective_p99_ms": ..., "latency": what is timed, "seconds": ...,
     "rates": [{"rate", "achieved", "sent", "answered", "p50_ms", "p95_ms", "p99_ms",
                "cpu_ms_per_event", "rss_mb", "sustainable", "generator_cpu_ms_per_event",
                "load_1m", ...}, ...],
     "max_sustainable_rate": highest sustained rate or null, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

from cli.measure import machine, process_usage
from cli.measure.loadtest import driver
from cli.measure.stats import percentile

MIN_ACHIEVED = 0.95
QUIET_WAIT_S = 30.0  # before each rate: how long the service may take to work off the last one's backlog


def add_arguments(parser: argparse.ArgumentParser, rates: str | None, objective_ms: float | None,
                  seconds: float = 10.0, by: str = "") -> None:
    """The sweep's options. A `None` default is chosen later, `by` what (e.g. the scenario)."""
    parser.add_argument("--rates", default=rates, help="events per second offered, in order (default "
                        + (rates if rates is not None else f"by {by}") + ")")
    parser.add_argument("--seconds", type=float, default=seconds, help="how long each rate is offered")
    parser.add_argument("--objective-ms", type=float, default=objective_ms,
                        help="p99 latency a sustainable rate keeps within (default "
                        + (f"{objective_ms:g} ms" if objective_ms is not None else f"by {by}") + ")")
    parser.add_argument("--refine", type=int, default=1,
                        help="rates tried between the last sustained and the first failed (bisection)")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="seconds at the first rate before measuring")


def rates_of(text: str) -> list[float]:
    return sorted(float(r) for r in text.split(",") if r.strip())


def point(run: driver.Run, cpu_s: float, rss_mb: float, objective_ms: float, primary: str = driver.COMPLETION,
          offset_ms: float = 0.0) -> dict:
    """One rate's figures. `primary` is the mark the percentiles and the objective are of;
    `offset_ms` is subtracted from its latencies (a scripted model's fixed delay); every
    other mark gets its p50 and p99 under its own name."""
    values = [v - offset_ms for v in run.latencies_ms.get(primary, [])]

    def ms(values: list[float], p: float) -> float | None:
        return round(percentile(values, p), 2) if values else None

    figures = {
        "rate": run.offered_per_s, "achieved": run.achieved_per_s, "sent": run.sent, "answered": run.answered,
        "p50_ms": ms(values, 50), "p95_ms": ms(values, 95), "p99_ms": ms(values, 99),
        "cpu_ms_per_event": round(cpu_s * 1000 / run.answered, 2) if run.answered else None,
        "rss_mb": round(rss_mb, 1),
    }
    for mark, other in run.latencies_ms.items():
        if mark != primary:
            figures[f"{mark}_p50_ms"], figures[f"{mark}_p99_ms"] = ms(other, 50), ms(other, 99)
    figures["sustainable"] = (len(values) == run.sent and run.achieved_per_s >= MIN_ACHIEVED * run.offered_per_s
                              and figures["p99_ms"] is not None and figures["p99_ms"] <= objective_ms)
    if run.labels:
        figures["labels"] = run.labels
    return figures


def measured(pid: int, rate: float, run: Callable[[float], driver.Run], objective_ms: float, **point_args) -> dict:
    """`run(rate)` against the service process `pid`, with its CPU time and peak RSS over it.
    Waits first for the process to work off what an earlier rate left queued."""
    if not process_usage.wait_quiet(pid, QUIET_WAIT_S):
        print(f"  (pid {pid} still busy after {QUIET_WAIT_S:g} s; measuring anyway)", flush=True)
    process_usage.reset_peak_rss(pid)
    before, generator_before = process_usage.cpu_s(pid), process_usage.cpu_s(os.getpid())
    result = run(rate)
    figures = point(result, process_usage.cpu_s(pid) - before, process_usage.peak_rss_mb(pid), objective_ms,
                    **point_args)
    # The load generator shares the machine: when it costs more per event than the service,
    # a rate it could not sustain may be the generator's limit, not the service's.
    generator_s = process_usage.cpu_s(os.getpid()) - generator_before
    figures["generator_cpu_ms_per_event"] = round(generator_s * 1000 / result.answered, 2) if result.answered else None
    figures["load_1m"] = round(os.getloadavg()[0], 2)
    print(f"  {rate:g}/s: achieved {figures['achieved']}/s, p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, "
          f"p99 {figures['p99_ms']} ms, {figures['cpu_ms_per_event']} CPU ms/event, {figures['rss_mb']} MiB"
          f"{'' if figures['sustainable'] else '  (not sustained)'}", flush=True)
    return figures


def sweep(pid: int, args: argparse.Namespace, run_at: Callable[[float], driver.Run], **point_args) -> list[dict]:
    """`run_at(rate)` against service process `pid`, measured (`measured`), up `args.rates`
    until one is not sustained within `args.objective_ms`, then `args.refine` bisection steps."""

    def measure(rate: float) -> dict:
        return measured(pid, rate, run_at, args.objective_ms, **point_args)

    print(f"sweeping {args.rates} per s, {args.seconds:g} s each, objective p99 ≤ {args.objective_ms:g} ms",
          flush=True)
    points: list[dict] = []
    for rate in rates_of(args.rates):
        points.append(measure(rate))
        if not points[-1]["sustainable"]:
            break
    for _ in range(args.refine):
        good = max((p["rate"] for p in points if p["sustainable"]), default=0.0)
        bad = min((p["rate"] for p in points if not p["sustainable"] and p["rate"] > good), default=None)
        if bad is None or bad - good < max(1.0, 0.05 * bad):
            break
        points.append(measure(round((good + bad) / 2, 1)))
    return sorted(points, key=lambda p: p["rate"])


def max_sustainable(points: list[dict]) -> float | None:
    """The highest rate sustained, below every rate that was not (a lucky rate above a failed
    one does not count)."""
    best = None
    for p in sorted(points, key=lambda p: p["rate"]):
        if not p["sustainable"]:
            break
        best = p["rate"]
    return best


def report(service: str, args: argparse.Namespace, latency: str, points: list[dict], **extra) -> dict:
    return {"service": service, "objective_p99_ms": args.objective_ms, "latency": latency, "seconds": args.seconds,
            "rates": points, "max_sustainable_rate": max_sustainable(points), **extra,
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
            # This machine's speed when the sweep ended (cli/measure/machine.py: ms, higher is slower).
            "machine_gauge_ms": machine.gauge_ms()}


def print_report(result: dict) -> int:
    """The result as the last line; exit 1 when a rate got no answer at all (the harness, not
    the service, is at fault: nothing was measured)."""
    print(f"{result['service']}: max sustainable {result['max_sustainable_rate']}/s per replica "
          f"(p99 ≤ {result['objective_p99_ms']:g} ms, achieved ≥ {MIN_ACHIEVED:.0%} of offered)", flush=True)
    print(json.dumps(result), flush=True)
    return 0 if all(p["answered"] for p in result["rates"]) else 1
