#!/usr/bin/env python3
"""Serving benchmark: `pacer-engine serve` against llama.cpp's server (llama-cpp-python[server])
on the same q4_0 weights and thread count, one server at a time on loopback.

For each concurrency C it sends 2·C streaming completion requests (at least 8), C at a time,
each a distinct counting prompt that both engines continue to `max_tokens`, greedy. Client-side,
in the project's latency vocabulary: TTFT = first content event − request sent; ITL = gaps between content
events; output tokens/s = content events / wall time of the level. Prints a Markdown table
(Pacer / llama.cpp) and writes JSON.

  scripts/bench-serve.sh [--concurrency 1,4,8,16] [--max-tokens 64]
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


async def one(client, url, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    events = []
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                events.append(time.perf_counter())
    ttft = events[0] - t0 if events else float("nan")
    itl = [b - a for a, b in zip(events, events[1:])]
    return ttft, itl, len(events)


async def level(url, model, concurrency, max_tokens, offset):
    n = max(8, 2 * concurrency)
    prompts = [f"Counting from {offset + i * 100}: {offset + i * 100 + 1}, {offset + i * 100 + 2}," for i in range(n)]
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def run(p):
            async with sem:
                return await one(client, url, model, p, max_tokens)

        t = time.perf_counter()
        results = await asyncio.gather(*(run(p) for p in prompts))
        wall = time.perf_counter() - t
    ttfts = [r[0] for r in results]
    itls = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return {
        "concurrency": concurrency,
        "requests": n,
        "output_tokens": tokens,
        "output_tokens_per_second": tokens / wall,
        "p50_ttft_ms": pct(ttfts, 0.5) * 1e3,
        "p95_ttft_ms": pct(ttfts, 0.95) * 1e3,
        "p50_itl_ms": pct(itls, 0.5) * 1e3,
        "p95_itl_ms": pct(itls, 0.95) * 1e3,
    }


def wait_ready(url, proc, path):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"server exited early ({proc.returncode})")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    sys.exit("server never became ready")


def bench(name, cmd, url, ready_path, model, levels, max_tokens):
    print(f"{name}: starting", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc, ready_path)
        asyncio.run(level(url, model, 1, 8, 0))  # warm-up
        out = []
        for c in levels:
            print(f"{name}: concurrency {c}", file=sys.stderr, flush=True)
            out.append(asyncio.run(level(url, model, c, max_tokens, 1000 * c)))
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pacer", required=True)
    ap.add_argument("--model", required=True, help="the shipped GGUF (Pacer loads it at --tier q4_0)")
    ap.add_argument("--llama-model", required=True, help="llama.cpp's q4_0 GGUF of the same weights")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pacer = bench(
        "pacer",
        [args.pacer, "serve", "--model", args.model, "--tier", "q4_0", "--threads", str(args.threads),
         "--port", str(port), "--served-model-name", "smol", "--max-batch-size", "16"],
        url, "/ready", "smol", levels, args.max_tokens,
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    llama = bench(
        "llama.cpp",
        [sys.executable, "-m", "llama_cpp.server", "--model", args.llama_model, "--model_alias", "smol",
         "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "4096",
         "--host", "127.0.0.1", "--port", str(port)],
        url, "/v1/models", "smol", levels, args.max_tokens,
    )
    print(f"threads={args.threads}, q4_0, max_tokens={args.max_tokens}, greedy; Pacer / llama.cpp\n")
    print("| concurrency | output tok/s | P50 TTFT ms | P95 TTFT ms | P50 ITL ms | P95 ITL ms |")
    print("|---|---|---|---|---|---|")
    for p, l in zip(pacer, llama):
        cells = [
            f"{p['output_tokens_per_second']:.0f} / {l['output_tokens_per_second']:.0f} = **{p['output_tokens_per_second'] / l['output_tokens_per_second']:.2f}×**",
            f"{p['p50_ttft_ms']:.0f} / {l['p50_ttft_ms']:.0f}",
            f"{p['p95_ttft_ms']:.0f} / {l['p95_ttft_ms']:.0f}",
            f"{p['p50_itl_ms']:.1f} / {l['p50_itl_ms']:.1f}",
            f"{p['p95_itl_ms']:.1f} / {l['p95_itl_ms']:.1f}",
        ]
        print(f"| {p['concurrency']} | " + " | ".join(cells) + " |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"threads": args.threads, "pacer": pacer, "llama_cpp": llama}, f, indent=1)


if __name__ == "__main__":
    main()
