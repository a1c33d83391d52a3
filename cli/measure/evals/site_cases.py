"""`concierge eval site --site S`: run a site's own test cases (shared/eval_cases.py) against
the running system, as `POST /v1/admin/sites/{site}/evals/runs` does, and print each case's
result as it is judged (shared/eval_runs.py: a gateway's eval_runner asks them through the
real nodes). Needs the system's bus (NATS_URL, or --nats-url) and a gateway running.

The last line is the run as JSON (cases, passed, failed, newly_failing, pass_rate, seconds,
`cases_per_s`). Exit 0 when every case passed, 1 when one failed, 2 when the site has no
case, 3 when the run did not end within `--timeout`.

`--metrics URL` (repeatable, each process's /metrics, as `make run` prints them): the
processes' CPU seconds a case took (`cpu_s_per_case`, their `process_cpu_seconds_total`).

`--import FILE`: the file's rows (JSONL in the shipped answers eval's format: `id`, `lang`,
`messages`, `facts`, `forbidden`, and `intent`, `route`, `pages`, `decline`) saved as the
site's cases, a row whose case says the same already left alone; nothing is run. Exit 2
for a wrong row (named).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from shared import eval_cases, eval_runs
from shared.bus import Bus, connect
from shared.config import BusConfig


async def run(config: BusConfig, site: str, timeout: float, out=sys.stdout, metrics: list[str] = ()) -> int:
    bus = await connect(config, name="eval-site-cli")
    try:
        return await _run(bus, site, timeout, out, list(metrics))
    finally:
        await bus.close()


async def cpu_seconds(urls: list[str]) -> float:
    """The processes' CPU seconds so far (`process_cpu_seconds_total` of each /metrics)."""
    import httpx

    total = 0.0
    async with httpx.AsyncClient(timeout=10) as client:
        for url in urls:
            text = (await client.get(url)).text
            total += sum(float(line.split()[-1]) for line in text.splitlines()
                         if line.startswith("process_cpu_seconds_total"))
    return total


async def _run(bus: Bus, site: str, timeout: float, out, metrics: list[str]) -> int:
    cases = [c for c, retired in (await eval_cases.current(bus, site)).values() if not retired]
    if not cases:
        print(f"site {site} has no test case: save one from the console or POST …/evals/cases", file=sys.stderr)
        return 2
    cpu_before = await cpu_seconds(metrics) if metrics else None
    started = time.monotonic()
    requested = await eval_runs.request(bus, site, "operator", "cli")
    run_id = eval_runs.run_of(requested.session_id)
    print(f"run {run_id}: {len(cases)} cases of site {site}", file=out, flush=True)
    shown: set[str] = set()
    while True:
        detail = await eval_runs.run_detail(bus, site, run_id)
        for result in detail["results"]:
            if result["case_id"] not in shown:
                shown.add(result["case_id"])
                verdict = "pass" if result["passed"] else "FAIL"
                print(f"{verdict}  {result['case_id']}  {result['message'][:70]!r}  {'; '.join(result['failures'])}",
                      file=out, flush=True)
        if detail["state"] != "running":
            break
        if time.monotonic() - started > timeout:
            print(f"run {run_id} not ended within {timeout:.0f} s", file=sys.stderr)
            return 3
        await asyncio.sleep(0.3)
    figures = {k: detail.get(k) for k in ("run", "state", "cases", "passed", "failed", "newly_failing", "pass_rate",
                                          "seconds", "error")}
    figures["cases_per_s"] = round(detail["cases"] / detail["seconds"], 2) if detail.get("seconds") else None
    if cpu_before is not None and detail.get("cases"):  # every process the URLs name, the run's cost
        figures["cpu_s_per_case"] = round((await cpu_seconds(metrics) - cpu_before) / detail["cases"], 3)
    print(json.dumps(figures), file=out, flush=True)
    if detail["state"] == "failed":
        return 1
    return 0 if not detail["failed"] else 1


async def import_file(config: BusConfig, site: str, path: Path, out=sys.stdout) -> int:
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    bus = await connect(config, name="eval-site-cli")
    try:
        counts = await eval_cases.import_rows(bus, site, rows, "cli")
    except eval_cases.CaseError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    finally:
        await bus.close()
    print(f"site {site}: {counts['saved']} cases saved, {counts['unchanged']} unchanged ({path})", file=out)
    return 0
