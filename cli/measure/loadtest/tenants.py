"""`concierge loadtest tenants --sites N`: many sites on one deployment.

Starts the whole system (or uses `--base-url` with ADMIN_TOKEN), creates `--sites` sites
through the operator API (`PUT /v1/admin/sites/{site}`), each with one text source of
generated knowledge (`POST …/sources`: sections of a fictional product's modules, each
with its own price; sizes mixed, median `--median-chunks` chunks, a few ten times larger)
and waits for every first sync. Then the retriever is restarted, so that no site is open,
and questions are asked as a visitor asks them (`POST /v1/sites/{site}/turns`, the answer
streamed), each about one module of one site, whose price the answer must hold:

1. cold: every site asked once, in a random order: each first answer opens its site;
2. mix: `--questions` questions over the sites by a Zipf law (a few sites asked most, as
   traffic is), with `--concurrency` visitors at a time.

The last line is one JSON object: sites, chunks, the retriever's resident memory (after
the syncs, after the cold pass, after the mix; its budget), cold and mix first-answer
latency (time to the first token, p50/p99, ms), right (answers holding their price) per
pass, and the pool's opens and evictions (the retriever's /metrics). Per pass, `segments`:
where the time to first token of its 25 slowest answers went, beside 25 others drawn at
random (p50 of each: request → TurnRequested, → RouteDecided, → RetrievalCompleted, the later
of those two → first token; from the stored events), and `gc`: each process's collections
of its oldest generation during the pass (count, seconds, those over 0.1 s:
`concierge_gc_pause_seconds`). Exit 1 when an answer is wrong or missing.

`--retrievers 2` asks with two retriever replicas, the questions partitioned by site
(`--partitions`, RETRIEVER_PARTITIONS; each replica answers from a copy of the synced
knowledge: the embedded vector store opens in one process only, a Qdrant server shares one)
and reports per replica: sites opened, resident memory, partitions owned and moved.
`--kill-after K` SIGKILLs the second replica once K of the mix's questions were asked: its
partitions move to the first when its membership expires (PARTITION_MEMBER_TTL_S); every
question must still be answered, and right but for those asked while the partitions moved
(`failover_wrong`: the answer's 2 s retrieval wait passes before a live replica takes them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import shutil
import time
from pathlib import Path
from typing import Callable

import httpx

from cli.measure import machine
from cli.measure.loadtest.retriever import FEATURES, PRODUCTS, REGIONS, TOOLS

SYNC_TIMEOUT_S = 3600


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge loadtest tenants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--median-chunks", type=int, default=20, help="the median site's size, in chunks")
    parser.add_argument("--questions", type=int, default=1000, help="questions of the mixed pass")
    parser.add_argument("--zipf", type=float, default=1.1, help="the mixed pass's Zipf exponent over the sites")
    parser.add_argument("--concurrency", type=int, default=4, help="visitors asking at once")
    parser.add_argument("--budget-mb", type=int, default=1024, help="the retriever's KB_MEMORY_BUDGET_MB")
    parser.add_argument("--open-sites", type=int, default=0, help="the retriever's KB_OPEN_SITES (0: the budget alone)")
    parser.add_argument("--large-sites", type=int, default=0,
                        help="sites of --large-chunks chunks besides, whose cold first answers are reported apart")
    parser.add_argument("--large-chunks", type=int, default=500)
    parser.add_argument("--retrievers", type=int, default=1, help="retriever replicas answering (partitioned)")
    parser.add_argument("--partitions", type=int, default=16, help="RETRIEVER_PARTITIONS with --retrievers above 1")
    parser.add_argument("--kill-after", type=int, default=0,
                        help="SIGKILL the last retriever replica once this many of the mix's questions were asked")
    parser.add_argument("--member-ttl-s", type=float, default=6.0, help="PARTITION_MEMBER_TTL_S")
    parser.add_argument("--sync-timeout-s", type=float, default=SYNC_TIMEOUT_S,
                        help="how long every first sync may take together (5,000 sites: more than an hour here)")
    parser.add_argument("--seed", type=int, default=5)
    return parser


# --- the sites ------------------------------------------------------------------------------

def sizes(count: int, median: int, rng: random.Random) -> list[int]:
    """Chunks per site: log-normal around `median` (a few ten times larger), 2 to 40 × median."""
    return [max(2, min(40 * median, round(rng.lognormvariate(0, 1.0) * median))) for _ in range(count)]


SYLLABLES = ["ka", "lo", "mi", "ra", "te", "vu", "so", "ne", "di", "po", "ze", "an", "or", "il", "us", "em"]


def module_name(i: int, rng: random.Random) -> str:
    """A module's name: a made-up word (its own in the site) and a feature, as products
    name theirs ("Karolo scheduling")."""
    word = "".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()
    return f"{word} {FEATURES[i % len(FEATURES)]}"


def knowledge(site: int, chunks: int, rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """A site's text (one section a chunk) and its questions with the price each answer must hold."""
    product = f"{rng.choice(PRODUCTS)}{site}"
    lines, asked = [], []
    names: set[tuple[str, str]] = set()
    for i in range(chunks):
        module = module_name(i, rng)
        # No two of a site's modules begin alike ("Zelodi audits", "Zedika audits"): the
        # embedding model reads the made-up words by their pieces, and a site of 500 would
        # otherwise ask retrieval to tell near-twins apart, not the pool to hold the site.
        while (module[:4], module.split()[-1]) in names:
            module = module_name(i, rng)
        names.add((module[:4], module.split()[-1]))
        price = rng.randint(5, 900)
        lines += [f"## The {module} module", f"The {module} module of {product} costs ${price} per user per month. "
                  f"It syncs with {rng.choice(TOOLS)} every {rng.randint(1, 60)} minutes and keeps its data in "
                  f"{rng.choice(REGIONS)}.", ""]
        asked.append((f"How much does the {module} module cost?", f"${price}"))
    return "\n".join(lines), asked


# --- asking -----------------------------------------------------------------------------------

async def ask(client: httpx.AsyncClient, base_url: str, site: str, question: str) -> tuple[str, float | None]:
    """The answer's text and its time to the first token (s), as a visitor's widget gets them."""
    text, ttft, _ = await _asked(client, base_url, site, question)
    return text, ttft


async def _asked(client: httpx.AsyncClient, base_url: str, site: str, question: str) -> tuple[str, float | None, dict]:
    """`ask`, and where its turn is (session, the wall clock when it was sent) for `_segments`."""
    from cli.harness.sse import Conversation
    from cli.measure.evals import answer_eval

    sent_at = time.time()
    result = await answer_eval._say(Conversation(client, base_url, site), question)
    final = result.final or {}
    where = {"site": site, "session": result.session_id, "sent_at": sent_at}
    if result.status != 200 or final.get("type") != "complete":
        return f"<{result.status} {final.get('type')}: {final.get('message', '')}>", None, where
    return result.text, result.first_token_s, where


SEGMENT_TURNS = 25  # the slowest first answers of a pass (and as many others) whose time is broken down


async def _segments(client: httpx.AsyncClient, base_url: str, token: str, turn: dict, ttft: float) -> dict[str, float]:
    """Where one answer's time to first token went, from its stored events' timestamps and
    the client's clock (one machine): `gateway_in` (request → TurnRequested), `route`
    (→ RouteDecided), `retrieval` (→ RetrievalCompleted), `reply` (the later of the two →
    the first token read). ms; {} when its log cannot be read."""
    if not turn.get("session"):
        return {}
    shown = await client.get(f"{base_url}/v1/admin/sites/{turn['site']}/conversations/{turn['session']}/events",
                             headers={"Authorization": f"Bearer {token}"})
    if shown.status_code != 200:
        return {}
    at: dict[str, float] = {}
    for e in shown.json()["events"]:
        at.setdefault(e["type"], e["event"]["ts"])
    if not {"turn_requested", "route_decided", "retrieval_completed"} <= at.keys():
        return {}
    start, ready = at["turn_requested"], max(at["route_decided"], at["retrieval_completed"])
    return {"gateway_in": (start - turn["sent_at"]) * 1000, "route": (at["route_decided"] - start) * 1000,
            "retrieval": (at["retrieval_completed"] - start) * 1000,
            "reply": (turn["sent_at"] + ttft - ready) * 1000}


async def _breakdown(client: httpx.AsyncClient, base_url: str, token: str, timed: list[tuple[float, dict]],
                     rng: random.Random) -> dict:
    """Each segment's p50 (ms) over a pass's `SEGMENT_TURNS` slowest answers and as many
    others drawn at random: which part of the path the slow ones spent their time in."""
    ordered = sorted(timed, key=lambda t: t[0], reverse=True)
    slowest, others = ordered[:SEGMENT_TURNS], ordered[SEGMENT_TURNS:]
    out = {}
    for name, group in (("slowest", slowest), ("others", rng.sample(others, min(len(others), SEGMENT_TURNS)))):
        found = [await _segments(client, base_url, token, turn, ttft) for ttft, turn in group]
        found = [f for f in found if f]
        out[name] = {segment: round(sorted(f[segment] for f in found)[len(found) // 2], 1)
                     for segment in ("gateway_in", "route", "retrieval", "reply")} if found else {}
        out[name]["turns"] = len(found)
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def _metric(text: str, name: str, labels: str = "") -> float:
    labelled = re.escape("{" + labels + "}") if labels else ""
    found = re.search(rf"^{name}(?:_total)?{labelled} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _gc_during(before: dict, after: dict) -> dict:
    """What each process's generation-2 collections took between two `gc_figures`."""
    return {name: {"collections": int(c - before.get(name, (0, 0, 0))[0]),
                   "seconds": round(t - before.get(name, (0, 0, 0))[1], 2),
                   "over_100ms": int(o - before.get(name, (0, 0, 0))[2])}
            for name, (c, t, o) in after.items()}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def _pass(client, base_url, plan: list[tuple[str, str, str]], concurrency: int,
                large: frozenset[str] = frozenset(), kill: tuple[int, Callable[[], None], float] | None = None) -> dict:
    """Ask `plan` with `concurrency` visitors; `kill`: (after how many questions asked, what
    kills a replica, the seconds after it in which answers may lack their fact)."""
    gate = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    large_ttfts: list[float] = []
    timed: list[tuple[float, dict]] = []  # (time to first token, where the turn is) for `_breakdown`
    wrong: list[str] = []
    failover_wrong: list[str] = []
    unanswered: list[str] = []
    asked = 0
    killed_at: float | None = None

    async def one(site: str, question: str, fact: str) -> None:
        nonlocal asked, killed_at
        async with gate:
            asked += 1
            if kill is not None and asked == kill[0]:
                await asyncio.to_thread(kill[1])
                killed_at = time.monotonic()
            started = time.monotonic()
            text, ttft, where = await _asked(client, base_url, site, question)
        if ttft is not None:
            (large_ttfts if site in large else ttfts).append(ttft)
            timed.append((ttft, where))
        else:
            unanswered.append(f"{site}: {question} → {text[:160]!r}")
        if fact not in text:
            failing = f"{site}: {question} → {text[:160]!r} (expected {fact})"
            # In flight when the replica died, or asked before its partitions moved.
            in_failover = killed_at is not None and started <= killed_at + kill[2]
            (failover_wrong if in_failover and ttft is not None else wrong).append(failing)

    started = time.monotonic()
    await asyncio.gather(*(one(*p) for p in plan))
    return {"asked": len(plan), "right": len(plan) - len(wrong) - len(failover_wrong),
            "ttft_p50_ms": _pct(ttfts, 0.5), "ttft_p99_ms": _pct(ttfts, 0.99),
            "seconds": round(time.monotonic() - started, 1), "wrong": wrong[:5],
            **({"large_ttft_p50_ms": _pct(large_ttfts, 0.5), "large_ttft_p99_ms": _pct(large_ttfts, 0.99)}
               if large else {}),
            **({"unanswered": len(unanswered), "failover_wrong": len(failover_wrong)} if kill else {}),
            "timed": timed}


async def _create(client, base_url: str, token: str, sites: dict[str, str], concurrency: int,
                  timeout_s: float = SYNC_TIMEOUT_S) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    gate = asyncio.Semaphore(concurrency)

    async def one(site: str, text: str) -> str:
        async with gate:
            api = f"{base_url}/v1/admin/sites/{site}"
            made = await client.put(api, headers=headers, json={"name": f"Tenant {site}", "languages": ["en"],
                                                                  "allowed_origins": [f"https://{site}.example"]})
            if made.status_code not in (200, 201):
                raise RuntimeError(f"PUT {api}: {made.status_code} {made.text[:200]}")
            added = await client.post(f"{api}/sources", headers=headers, json={"title": "Modules", "text": text})
            if added.status_code != 202:
                raise RuntimeError(f"POST {api}/sources: {added.status_code} {added.text[:200]}")
            return added.json()["source"]

    ids = dict(zip(sites, await asyncio.gather(*(one(s, t) for s, t in sites.items()))))
    deadline = time.monotonic() + timeout_s
    pending = dict(ids)
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(2.0)
        # The runs end about in the order they were asked for: the first pending ones are
        # read, not all of them each time (the reads would load the gateway being measured).
        for site, source in list(pending.items())[:50]:
            shown = await client.get(f"{base_url}/v1/admin/sites/{site}/sources/{source}", headers=headers)
            state = shown.json()["source"]["state"] if shown.status_code == 200 else "unknown"
            if state == "failed":
                raise RuntimeError(f"{site}: its sync failed: {shown.text[:300]}")
            if state == "completed":
                del pending[site]
        print(f"  synced {len(ids) - len(pending)} / {len(ids)} sites", flush=True)
    if pending:
        raise TimeoutError(f"{len(pending)} sites not synced within {timeout_s} s")


def run(args: argparse.Namespace) -> dict:
    from cli.harness.supervisor import free_port, make_system

    rng = random.Random(args.seed)
    names = [f"t{n:05d}" for n in range(args.sites)]
    chunk_counts = sizes(args.sites, args.median_chunks, rng)
    names += [f"big{n:03d}" for n in range(args.large_sites)]
    chunk_counts += [args.large_chunks] * args.large_sites
    large = frozenset(names[args.sites:])
    texts, questions = {}, {}
    for n, (site, chunks) in enumerate(zip(names, chunk_counts)):
        texts[site], questions[site] = knowledge(n, chunks, rng)
    cold_plan = [(s, *rng.choice(questions[s])) for s in rng.sample(names, len(names))]
    weights = [1 / (rank + 1) ** args.zipf for rank in range(len(names))]
    popular = rng.sample(names, len(names))  # which site is the most asked: a random one
    mix_plan = [(s, *rng.choice(questions[s])) for s in rng.choices(popular, weights, k=args.questions)]
    result: dict = {"sites": args.sites, "large_sites": args.large_sites, "chunks": sum(chunk_counts),
                    "median_chunks": sorted(chunk_counts)[len(chunk_counts) // 2], "largest_chunks": max(chunk_counts),
                    "budget_mb": args.budget_mb, "open_sites": args.open_sites, "machine_gauge_ms": machine.gauge_ms()}
    partitioned = args.retrievers > 1
    env = {"RATE_LIMIT_PER_IP_PER_MIN": "0", "KB_MEMORY_BUDGET_MB": str(args.budget_mb),
           "KB_OPEN_SITES": str(args.open_sites)}
    if partitioned:
        env.update(RETRIEVER_PARTITIONS=str(args.partitions), PARTITION_MEMBER_TTL_S=str(args.member_ttl_s))
        result.update(retrievers=args.retrievers, partitions=args.partitions)
    replicas = ["retriever"] + [f"retriever-{chr(ord('a') + i)}" for i in range(1, args.retrievers)]
    with tempfile.TemporaryDirectory(prefix="concierge-load-tenants-") as data:
        system = make_system(Path(data), free_port(), free_port(), env)

        def start_retrievers() -> None:
            """Every replica started again with no site open; the others each on a copy of what
            the first synced (the embedded vector store opens in one process only)."""
            system.stop_service("retriever")
            for i, name in enumerate(replicas):
                extra = {"PARTITION_MEMBER": name} if partitioned else {}
                if i:
                    copy = Path(data) / f"kb-{name}"
                    shutil.copytree(system.env["KB_DIR"], copy)
                    extra["KB_DIR"] = str(copy)
                system.start_service("retriever", extra, name=name)
            for name in replicas:
                system.wait_ready(name, 180)

        async def replica_figures(client: httpx.AsyncClient, name: str) -> dict:
            text = (await client.get(f"http://127.0.0.1:{system.ops_ports[name]}/metrics")).text
            figures = {"rss_mb": _rss_mb(system.procs[name].pid),
                       **{key: _metric(text, f"concierge_kb_{key}") for key in ("opens", "evictions", "open_sites")}}
            if partitioned:
                figures.update(partitions=_metric(text, "concierge_partitions_owned", 'node="retrieval"'),
                               moves=_metric(text, "concierge_partition_moves", 'node="retrieval"'))
            return figures

        async def gc_figures(client: httpx.AsyncClient) -> dict[str, tuple[float, float, float]]:
            """Per process of the turn's path: the GC's generation-2 (count, seconds, pauses over 0.1 s)."""
            out = {}
            for name in [*replicas, "responder", "router", "gateway"]:
                if name not in system.ops_ports or name == result.get("killed"):
                    continue
                text = (await client.get(f"http://127.0.0.1:{system.ops_ports[name]}/metrics")).text
                count = _metric(text, "concierge_gc_pause_seconds_count", 'generation="2"')
                under = _metric(text, "concierge_gc_pause_seconds_bucket", 'generation="2",le="0.1"')
                out[name] = (count, _metric(text, "concierge_gc_pause_seconds_sum", 'generation="2"'), count - under)
            return out

        async def settled(client: httpx.AsyncClient, timeout: float = 60) -> None:
            """Until the replicas agree who owns which partition (each has heard the others)."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                owned = [(await replica_figures(client, n))["partitions"] for n in replicas]
                if sum(owned) == args.partitions and all(owned[:args.partitions]):
                    return
                await asyncio.sleep(0.5)
            raise TimeoutError(f"the retrievers did not share out the partitions within {timeout} s")

        try:
            system.start_all()
            token = system.env["ADMIN_TOKEN"]

            async def main() -> None:
                async with httpx.AsyncClient(timeout=120) as client:
                    started = time.monotonic()
                    await _create(client, system.gateway_url, token, texts, args.concurrency, args.sync_timeout_s)
                    result["sync_s"] = round(time.monotonic() - started, 1)
                    result["retriever_rss_mb_synced"] = _rss_mb(system.procs["retriever"].pid)
                    start_retrievers()
                    if partitioned:
                        await settled(client)
                    result["retriever_rss_mb_started"] = _rss_mb(system.procs["retriever"].pid)
                    print(f"  retriever restarted: {result['retriever_rss_mb_started']} MiB; asking each site once",
                          flush=True)
                    gc_before = await gc_figures(client)
                    result["cold"] = await _pass(client, system.gateway_url, cold_plan, args.concurrency, large)
                    result["cold"]["segments"] = await _breakdown(client, system.gateway_url, token,
                                                                  result["cold"].pop("timed"), rng)
                    result["cold"]["gc"] = _gc_during(gc_before, await gc_figures(client))
                    result["retriever_rss_mb_cold"] = _rss_mb(system.procs["retriever"].pid)
                    print(f"  cold pass: {json.dumps(result['cold'])}", flush=True)
                    if partitioned:
                        result["replicas_cold"] = {n: await replica_figures(client, n) for n in replicas}
                        print(f"  replicas after the cold pass: {json.dumps(result['replicas_cold'])}", flush=True)
                    kill = None
                    if partitioned and args.kill_after:
                        victim = replicas[-1]

                        def killed() -> None:
                            system.kill(victim)
                            result["killed"] = victim
                            print(f"  {victim} killed", flush=True)

                        # Its key expires after the TTL, the survivor's next beat (a third of it)
                        # takes the partitions; the answer's retrieval wait (2 s) on top.
                        kill = (args.kill_after, killed, args.member_ttl_s * 4 / 3 + 2.0)
                    gc_before = await gc_figures(client)
                    result["mix"] = await _pass(client, system.gateway_url, mix_plan, args.concurrency, kill=kill)
                    result["mix"]["segments"] = await _breakdown(client, system.gateway_url, token,
                                                                 result["mix"].pop("timed"), rng)
                    result["mix"]["gc"] = _gc_during(gc_before, await gc_figures(client))
                    result["retriever_rss_mb_mix"] = _rss_mb(system.procs["retriever"].pid)
                    metrics = (await client.get(f"http://127.0.0.1:{system.ops_ports['retriever']}/metrics")).text
                    result["pool"] = {name: _metric(metrics, f"concierge_kb_{name}")
                                      for name in ("opens", "evictions", "open_sites", "open_bytes")}
                    if partitioned:
                        result["replicas_mix"] = {n: await replica_figures(client, n) for n in replicas
                                                  if n != result.get("killed")}

            asyncio.run(main())
        finally:
            system.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    result = run(parser().parse_args(argv))
    print(json.dumps(result), flush=True)
    # Killing a replica may leave the questions asked while its partitions moved without
    # their fact (failover_wrong), never without an answer.
    ok = (result["cold"]["right"] == result["cold"]["asked"]
          and result["mix"]["right"] + result["mix"].get("failover_wrong", 0) == result["mix"]["asked"]
          and not result["mix"].get("unanswered"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
