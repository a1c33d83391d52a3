"""What `concierge loadtest all` makes of the services' sweeps: the table written into
docs/benchmarks.md between two marker comments (a rerun replaces it, nothing else in the
file changes) and a PNG chart of latency against offered rate, one panel per service.

The chart needs matplotlib, the `bench` extra (`pip install -e '.[bench]'`, which `make
loadtest` installs); the table does not.
"""

from __future__ import annotations

import re
from pathlib import Path

BEGIN = "<!-- loadtest:begin (written by `make loadtest`; edits between these markers are replaced) -->"
END = "<!-- loadtest:end -->"
SECTION = "## Every service alone (`make loadtest`)"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def capacity(result: dict) -> dict | None:
    """The figures at the service's highest sustained rate, or None when it sustained none."""
    best = result["max_sustainable_rate"]
    return next((p for p in result["rates"] if p["rate"] == best), None)


def table(results: list[dict], command: str) -> str:
    """The summary (capacity and cost per replica) and every rate's figures, in markdown."""
    dates = sorted({r["date"] for r in results})
    lines = [
        f"`{command}`, {' to '.join(dates[:1] + dates[1:][-1:])}, {results[0].get('cpus')} cores. Per replica "
        "(one process of the service); CPU ms per event is the service process's own CPU time over the "
        "rate's window divided by the events it answered; the 1-minute load average is the machine's at "
        "the end of each rate (everything this run started counts in it); the machine gauge is the time of a "
        "fixed piece of Python work when the service's sweep ended, the machine idle (cli/measure/machine.py; "
        "higher is slower); the generator's CPU per event, the same code at every run, shows the machine's "
        "speed during the rates.",
        "",
        "| service | what is timed | p99 objective | max sustainable rate / replica | CPU ms / event there "
        "| cores at that rate | peak RSS | machine gauge ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        best = capacity(result)
        cores = f"{best['rate'] * best['cpu_ms_per_event'] / 1000:.2f}" if best and best["cpu_ms_per_event"] else "–"
        lines.append(
            f"| {_name(result)} | {result['latency']} | {result['objective_p99_ms']:g} ms "
            f"| {_capacity_text(result)} | {_ms(best['cpu_ms_per_event']) if best else '–'} "
            f"| {cores} | {_ms(best['rss_mb']) if best else '–'} MiB | {_ms(result.get('machine_gauge_ms'))} |")
    lines += ["", "| service | offered /s | achieved /s | p50 ms | p95 ms | p99 ms | CPU ms / event | peak RSS MiB "
                  "| sustained | generator CPU ms / event | load 1m |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for p in result["rates"]:
            lines.append(
                f"| {_name(result)} | {p['rate']:g} | {p['achieved']:g} | {_ms(p['p50_ms'])} | {_ms(p['p95_ms'])} "
                f"| {_ms(p['p99_ms'])} | {_ms(p['cpu_ms_per_event'])} | {p['rss_mb']:g} "
                f"| {'yes' if p['sustainable'] else '**no**'} | {_ms(p.get('generator_cpu_ms_per_event'))} "
                f"| {_ms(p.get('load_1m'))} |")
    return "\n".join(lines)


def _capacity_text(result: dict) -> str:
    best = result["max_sustainable_rate"]
    return f"**{best:g}/s**" if best is not None else "**none** (not even the lowest rate tried)"


def _name(result: dict) -> str:
    return f"{result['service']} ({result['scenario']})" if "scenario" in result else result["service"]


def write_docs(path: Path, results: list[dict], command: str, chart: Path | None) -> None:
    """Replace what is between the markers in `path` (the section and markers are appended
    the first time)."""
    body = table(results, command)
    if chart is not None:
        body += f"\n\n![latency against offered rate, per service]({_relative(chart, path)})"
    block = f"{BEGIN}\n{body}\n{END}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    path.write_text(text)


def _relative(target: Path, doc: Path) -> str:
    try:
        return str(target.resolve().relative_to(doc.resolve().parent))
    except ValueError:
        return str(target.resolve())


def chart(results: list[dict], path: Path) -> None:
    """p50, p95 and p99 against the offered rate, a panel per service, with the objective
    and the highest sustained rate marked."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    columns = min(3, len(results))
    rows = -(-len(results) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, result in zip(axes.flat, results):
        points = [p for p in result["rates"] if p["p50_ms"] is not None]
        rates = [p["rate"] for p in points]
        for key, style in (("p50_ms", "o-"), ("p95_ms", "s--"), ("p99_ms", "^-")):
            ax.plot(rates, [max(p[key], 0.1) for p in points], style, label=key.removesuffix("_ms"), markersize=4)
        ax.axhline(result["objective_p99_ms"], color="grey", linestyle=":", label="p99 objective")
        if result["max_sustainable_rate"] is not None:
            ax.axvline(result["max_sustainable_rate"], color="green", linestyle=":", label="max sustained")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 1, 2, 5, 10, 20, 50 … ms
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(_name(result), fontsize=10)
        ax.set_xlabel("offered events/s")
        ax.set_ylabel("latency ms")
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
