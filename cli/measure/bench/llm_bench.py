"""`concierge llm-bench`: time to first token and tokens per second of an LLM endpoint.

Without `--base-url` it starts the embedded local model (cli/harness/local_llm.py) the way
`make run` does and measures that. Each request is a grounded question about the demo
company with a few numbered sources in the system prompt, as the answer writer sends
them; the answer streams (one chunk per token on llama.cpp). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cli.measure.stats import percentile

QUESTIONS = ["What integrations do you offer?", "How much does the Growth plan cost?",
             "Does the mobile app work offline?", "Are you SOC 2 compliant?", "Is there a free trial?"]
SYSTEM = """You are the assistant of Tidewise, a field-service software company. Answer briefly from these sources and cite them as [n]:
[1] Integrations: QuickBooks Online and Xero sync invoices every 10 minutes. Salesforce and HubSpot create jobs from won deals.
[2] Pricing: Starter $29 per technician per month, Growth $59, Enterprise on quote. 14-day free trial, no credit card.
[3] Tidewise Mobile: works offline, syncs photos and signatures when back online.
[4] Security: SOC 2 Type II, ISO 27001, GDPR, data in Frankfurt or Virginia."""


def measure(base_url: str, model: str, rounds: int, max_tokens: int) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=120)
    ttfts, rates, tokens_all = [], [], []
    for i in range(rounds):
        question = QUESTIONS[i % len(QUESTIONS)]
        started = time.perf_counter()
        first = None
        tokens = 0
        stream = client.chat.completions.create(model=model, stream=True, max_tokens=max_tokens, temperature=0.3,
                                                messages=[{"role": "system", "content": SYSTEM},
                                                          {"role": "user", "content": question}])
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                tokens += 1
                if first is None:
                    first = time.perf_counter()
        done = time.perf_counter()
        if first is None:
            continue
        ttfts.append((first - started) * 1000)
        if tokens > 1 and done > first:
            rates.append((tokens - 1) / (done - first))
        tokens_all.append(tokens)
        print(f"  {question!r}: TTFT {ttfts[-1]:.0f} ms, {tokens} tokens", flush=True)
    return {"requests": rounds, "answered": len(ttfts),
            "ttft_ms_p50": round(percentile(ttfts, 50), 1) if ttfts else None,
            "ttft_ms_max": round(max(ttfts), 1) if ttfts else None,
            "tokens_per_s_mean": round(statistics.fmean(rates), 1) if rates else None,
            "tokens_per_answer_mean": round(statistics.fmean(tokens_all), 1) if tokens_all else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="concierge llm-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="", help="an OpenAI-compatible endpoint (default: the embedded model)")
    parser.add_argument("--model", default="")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=120)
    args = parser.parse_args(argv)
    if args.base_url:
        result = measure(args.base_url, args.model or "default", args.rounds, args.max_tokens)
        result["endpoint"] = args.base_url
    else:
        from cli.harness import local_llm
        from cli.harness.supervisor import free_port, make_system, wait_http

        local_llm.ensure_server()
        model = local_llm.ensure_model()
        with tempfile.TemporaryDirectory(prefix="concierge-llm-bench-") as data:
            system = make_system(Path(data), free_port(), free_port(), {})
            port = free_port()
            try:
                started = time.monotonic()
                proc = system.spawn("llm", local_llm.server_argv(model, port))
                wait_http(f"http://127.0.0.1:{port}/v1/models", 120, proc)
                print(f"local model ready in {time.monotonic() - started:.1f} s", flush=True)
                result = measure(f"http://127.0.0.1:{port}/v1", local_llm.MODEL_NAME, args.rounds, args.max_tokens)
            finally:
                system.stop()
        result["endpoint"] = f"embedded {local_llm.MODEL_NAME} (llama-cpp-python {local_llm.LLAMA_CPP_VERSION})"
    print(json.dumps(result))
    return 0 if result["answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
