#!/usr/bin/env python3
"""pacer-bench against an independent tool (NVIDIA AIPerf) and against the server's own
histograms, on one `pacer-engine serve`, the same load (closed loop, 128-token prompts,
64 output tokens, ignore_eos), one tool at a time.

For each tool it reports the client-side mean TTFT and TPOT, and the server's mean TTFT and
TPOT over exactly that tool's requests (deltas of the `_sum` / `_count` series). On a small
machine the client's own CPU use slows the server, so the tools are compared through the
server: each must agree with what the server measured during its own run.

  scripts/bench-acceptance.sh [--concurrency 4] [--requests 40]
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request


def server_sums(url):
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        for name in ("vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds"):
            for suffix in ("_sum", "_count"):
                if line.startswith(name + suffix + "{"):
                    out[name + suffix] = float(line.rsplit(" ", 1)[1])
    return out


def server_means(before, after, exclude=0, exclude_ttft=0.0, exclude_tpot=0.0):
    def mean(name, excl):
        n = after[name + "_count"] - before[name + "_count"] - exclude
        return (after[name + "_sum"] - before[name + "_sum"] - excl) / n * 1e3
    return (mean("vllm:time_to_first_token_seconds", exclude_ttft), mean("vllm:request_time_per_output_token_seconds", exclude_tpot))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--aiperf", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--port", type=int, default=8131)
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([args.engine, "serve", "--model", args.model, "--tier", "q4_0", "--port", str(args.port),
                               "--served-model-name", "smol"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                if urllib.request.urlopen(f"{url}/ready").status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        rows = []
        # AIPerf, niced like pacer-bench so the server keeps priority.
        before = server_sums(url)
        out_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"aiperf-{os.getpid()}")
        subprocess.run(["nice", "-n", "19", args.aiperf, "profile", "-m", "smol", "--url", url, "--endpoint-type", "chat",
                        "--streaming", "--tokenizer", args.tokenizer_dir, "--concurrency", str(args.concurrency),
                        "--request-count", str(args.requests), "--prompt-input-tokens-mean", "128",
                        "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", "64",
                        "--prompt-output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
                        "--use-server-token-count", "--output-artifact-dir", out_dir, "--no-auto-plot",
                        "--workers-max", "1", "--record-processor-service-count", "1", "--ui-type", "none"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after = server_sums(url)
        d = json.load(open(os.path.join(out_dir, "profile_export_aiperf.json")))
        # AIPerf's warm-up probe is one extra request on the server; it is short, so the
        # per-request means below include it only through the count.
        extra = int(after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"]) - args.requests
        rows.append(("aiperf 0.13.0", d["time_to_first_token"]["avg"], d["inter_token_latency"]["avg"],
                     *server_means(before, after, exclude=0), extra))
        # pacer-bench (no warm-up, so the server sees exactly its requests).
        before = server_sums(url)
        report = os.path.join(out_dir, "pacer-bench.json")
        subprocess.run(["nice", "-n", "19", args.bench, "run", "--base-url", url, "--model", "smol", "--concurrency",
                        str(args.concurrency), "--num-requests", str(args.requests), "--input-len", "128",
                        "--output-len", "64", "--ignore-eos", "--warmup", "0", "--json", report],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after = server_sums(url)
        r = json.load(open(report))
        rows.append(("pacer-bench", r["mean_ttft_ms"], r["mean_tpot_ms"], *server_means(before, after), 0))
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"concurrency {args.concurrency}, {args.requests} requests, 128 in / 64 out; means in ms\n")
    print("| tool | client TTFT | server TTFT | Δ | client TPOT | server TPOT | Δ |")
    print("|---|---|---|---|---|---|---|")
    for name, ct, cp, st, sp, extra in rows:
        print(f"| {name} | {ct:.1f} | {st:.1f} | {100 * (ct - st) / st:+.1f}% | {cp:.2f} | {sp:.2f} | {100 * (cp - sp) / sp:+.1f}% |"
              + (f" (+{extra} probe requests on the server)" if extra else ""))


if __name__ == "__main__":
    main()
