#!/usr/bin/env python3
"""Serving benchmark: `pacer-engine serve` against llama.cpp's C++ `llama-server`, both with
continuous batching, on q4_0 weights (llama.cpp's fastest CPU format: it repacks q4_0 for AVX2),
the same threads and the same load from pacer-bench. Each level gets a fresh server sized for it:
llama-server `--parallel C` (one slot per client), Pacer `--max-batch-size C`. With
`--llama-parallel N`, llama-server also runs with N slots at every level above N (a client
beyond the slots waits in its queue), which is its best throughput when fewer, fuller slots beat
one per client; the tables then show Pacer against both. `--pacer-max-batch N` is the same for
Pacer (`--max-batch-size N` at every level above N).

Settings (each a pair of servers measured side by side):
  cache on:  Pacer with its prefix cache (its default) | llama-server with its prompt cache (its default)
  cache off: Pacer with --prefix-caching false        | llama-server --no-cache-prompt
Workloads (chat requests, --ignore-eos, fixed output length but for varied):
  distinct: every prompt different (only the chat template's system turn repeats)
  shared:   every prompt starts with the same words (a shared system prompt)
  mixed:    prompt lengths uniform in 32..1500 words: long prompts arrive while short streams decode
  varied:   mixed, with answer lengths uniform in 16..128 tokens: no two clients keep step
Each level uses its own seed, so no prompt repeats across levels; both servers get the same
prompts. The server order turns each round.
Reports the median over rounds of output tok/s, goodput at the SLA, P50/P95 TTFT and ITL, and
the ratio Pacer / llama-server. Standard library only.

  scripts/bench-llama-server.sh [--rounds 3] [--concurrency 1,4,8,16,32] [--json-out FILE]
  scripts/bench-llama-server.py --report FILE     # the tables of a saved run
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

WORKLOADS = {
    "distinct": ["--input-len", "136"],
    "shared": ["--input-len", "136", "--shared-prefix", "96"],
    # Long prompts arriving while short streams decode: where the ITL budget matters.
    "mixed": ["--input-len", "uniform:32:1500"],
    # Held out: mixed prompts and mixed answers, so clients finish at different times and their
    # next prompts land among running streams rather than in waves.
    "varied": ["--input-len", "uniform:32:1500", "--output-len", "uniform:16:128"],
}
PATHS = {"pacer", "bench", "llama_bin", "model", "llama_model"}
FIELDS = ["output_throughput", "request_goodput", "p50_ttft_ms", "p95_ttft_ms", "p50_itl_ms", "p95_itl_ms"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def requests_for(c):
    # At concurrency 1 each request takes seconds; fewer of them keep a round under 15 minutes.
    return 12 if c == 1 else 24 if c <= 4 else 48


def start(cmd, url, ready, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(1200):
        if proc.poll() is not None:
            sys.exit(f"{cmd[0]} exited early ({proc.returncode})")
        try:
            with urllib.request.urlopen(url + ready, timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"{cmd[0]} never became ready")


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def fixed_slots(name):
    """The slots of a `llama-server-npN` variant; None for one slot per client."""
    return int(name.rsplit("-np", 1)[1]) if "-np" in name else None


def pacer_hold(name):
    """The `--prefill-hold-ms` of a `pacer-holdN` (or `pacer-holdN-mbB`) variant; 0 otherwise."""
    m = re.search(r"-hold(\d+)", name)
    return int(m.group(1)) if m else 0


def fixed_batch(name):
    """The `--max-batch-size` of a `pacer-…-mbB` variant; None for one row per client."""
    m = re.search(r"-mb(\d+)", name)
    return int(m.group(1)) if m else None


KERNELS = ("vnni", "vnni512", "avx2", "scalar")


def pacer_kernels(name):
    """The `PACER_KERNELS` of a `pacer-K` variant (`pacer-vnni`: the AMX tiles off); None otherwise."""
    k = name.rsplit("-", 1)[1] if name.startswith("pacer-") else None
    return k if k in KERNELS else None


def server_env(name):
    """A `pacer-K` variant runs with `PACER_KERNELS=K`; the rest inherit."""
    k = pacer_kernels(name)
    return dict(os.environ, PACER_KERNELS=k) if k else None


def server_cmd(args, name, cache, workload, port, c):
    if name.startswith("pacer"):
        return [args.pacer, "serve", "--model", args.model, "--tier", "q4_0", "--threads", str(args.threads),
                "--port", str(port), "--served-model-name", "smol",
                "--max-batch-size", str(fixed_batch(name) or c), "--prefix-caching", "true" if cache else "false",
                "--prefill-hold-ms", str(pacer_hold(name))], "/ready"
    # llama-server splits its context evenly over its slots; a mixed-workload prompt needs ~2,100.
    slots = fixed_slots(name) or c
    per_slot = 3072 if workload in ("mixed", "varied") else 1024
    cmd = [os.path.join(args.llama_bin, "llama-server"), "-m", args.llama_model, "-t", str(args.threads),
           "-tb", str(args.threads), "-np", str(slots), "-c", str(per_slot * slots),
           "--host", "127.0.0.1", "--port", str(port), "--no-webui", "-a", "smol"]
    if not cache:
        cmd.append("--no-cache-prompt")
    return cmd, "/health"


def level(args, url, workload, c, seed, out):
    cmd = [args.bench, "run", "--base-url", url, "--model", "smol", "--endpoint", "chat",
           "--num-requests", str(requests_for(c)), "--concurrency", str(c), "--warmup", "1",
           "--ignore-eos", "--seed", str(seed),
           "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
           "--json", out] + WORKLOADS[workload]
    if "--output-len" not in WORKLOADS[workload]:
        cmd += ["--output-len", str(args.max_tokens)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        r = json.load(f)
    return {k: r.get(k) for k in FIELDS + ["completed", "failed"]}


def peers(llama_parallel):
    return ["llama-server"] + ([f"llama-server-np{llama_parallel}"] if llama_parallel else [])


def pacers(hold_ms, kernels=None, max_batch=0):
    batched = [f"pacer{f'-hold{hold_ms}' if hold_ms else ''}-mb{max_batch}"] if max_batch else []
    return ["pacer"] + ([f"pacer-hold{hold_ms}"] if hold_ms else []) + ([f"pacer-{kernels}"] if kernels else []) + batched


def runs_at(name, c):
    """Whether `name` runs at concurrency `c` (a fixed-slot or fixed-batch variant only where it
    differs)."""
    n = fixed_slots(name) or fixed_batch(name)
    return n is None or c > n


def render(med, threads, max_tokens, rounds, slo_ttft_ms, slo_tpot_ms, settings, workloads, levels, llama_parallel=0,
           hold_ms=0, kernels=None, max_batch=0):
    varied = " (varied: 16–128)" if "varied" in workloads else ""
    print(f"threads={threads}, q4_0, chat, {max_tokens} output tokens{varied}, median of {rounds} rounds; "
          f"SLA TTFT ≤ {slo_ttft_ms:.0f} ms and TPOT ≤ {slo_tpot_ms:.0f} ms; Pacer / llama-server\n")
    for cache in settings:
        for workload in workloads:
            for pacer, peer in [(p, q) for p in pacers(hold_ms, kernels, max_batch) for q in peers(llama_parallel)]:
                if not any(runs_at(peer, c) and runs_at(pacer, c) for c in levels):
                    continue
                n = fixed_slots(peer)
                slots = f"--parallel {n}" if n else "one slot per client"
                hold = f", Pacer --prefill-hold-ms {pacer_hold(pacer)}" if pacer_hold(pacer) else ""
                hold += f", Pacer PACER_KERNELS={pacer_kernels(pacer)}" if pacer_kernels(pacer) else ""
                hold += f", Pacer --max-batch-size {fixed_batch(pacer)}" if fixed_batch(pacer) else ""
                print(f"cache {'on' if cache else 'off'}, {workload} prompts, llama-server {slots}{hold}\n")
                print("| concurrency | output tok/s | goodput req/s | P50 TTFT ms | P95 TTFT ms | P50 ITL ms | P95 ITL ms | failed |")
                print("|---:|---|---|---|---|---|---|---|")
                for c in levels:
                    if not (runs_at(peer, c) and runs_at(pacer, c)):
                        continue
                    p = med[f"{'on' if cache else 'off'}|{workload}|{pacer}|{c}"]
                    l = med[f"{'on' if cache else 'off'}|{workload}|{peer}|{c}"]

                    def ratio(f, digits):
                        a, b = p[f], l[f]
                        r = f"**{a / b:.2f}×**" if b else "—"
                        return f"{a:.{digits}f} / {b:.{digits}f} = {r}"

                    cells = [ratio("output_throughput", 0), ratio("request_goodput", 2), ratio("p50_ttft_ms", 0),
                             ratio("p95_ttft_ms", 0), ratio("p50_itl_ms", 1), ratio("p95_itl_ms", 1),
                             f"{p['failed']} / {l['failed']}"]
                    print(f"| {c} | " + " | ".join(cells) + " |")
                print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pacer")
    ap.add_argument("--bench", help="the pacer-bench binary")
    ap.add_argument("--llama-bin", help="folder with llama-server")
    ap.add_argument("--model", help="the shipped GGUF (Pacer loads it at --tier q4_0)")
    ap.add_argument("--llama-model", help="llama.cpp's q4_0 GGUF of the same weights")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--slo-ttft-ms", type=float, default=1000)
    ap.add_argument("--slo-tpot-ms", type=float, default=100)
    ap.add_argument("--settings", default="on,off", help="cache settings to run: on, off or both")
    ap.add_argument("--workloads", default="distinct,shared")
    ap.add_argument("--llama-parallel", type=int, default=0,
                    help="also run llama-server with this many slots at every level above it (0: off)")
    ap.add_argument("--pacer-hold-ms", type=int, default=0,
                    help="also run Pacer with this --prefill-hold-ms (0: off)")
    ap.add_argument("--pacer-kernels", choices=KERNELS,
                    help="also run Pacer with PACER_KERNELS set to this (vnni: the AMX tiles off; avx2: no VNNI)")
    ap.add_argument("--pacer-vnni", action="store_const", const="vnni", dest="pacer_kernels",
                    help="the same as --pacer-kernels vnni")
    ap.add_argument("--pacer-max-batch", type=int, default=0,
                    help="also run Pacer with this --max-batch-size (and --pacer-hold-ms, if set) at every level "
                         "above it, the counterpart of --llama-parallel (0: off)")
    ap.add_argument("--json-out")
    ap.add_argument("--report", help="print the tables of a saved --json-out file and exit")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        a = saved["args"]
        render(saved["medians"], a["threads"], a["max_tokens"], a["rounds"], a["slo_ttft_ms"], a["slo_tpot_ms"],
               [x == "on" for x in a["settings"].split(",")], a["workloads"].split(","), a["levels"],
               a.get("llama_parallel", 0), a.get("pacer_hold_ms", 0),
               a.get("pacer_kernels") or ("vnni" if a.get("pacer_vnni") else None), a.get("pacer_max_batch", 0))
        return
    args.levels = [int(c) for c in args.concurrency.split(",")]
    settings = [s == "on" for s in args.settings.split(",")]
    workloads = args.workloads.split(",")
    runs = {}  # (setting, workload, server, c) -> [reports]
    tmp = tempfile.mkdtemp(prefix="pacer-vs-llama-server-")
    total = args.rounds * len(settings) * len(workloads) * (len(pacers(args.pacer_hold_ms, args.pacer_kernels, args.pacer_max_batch)) + len(peers(args.llama_parallel)))
    done = 0
    for rnd in range(args.rounds):
        for cache in settings:
            for workload in workloads:
                servers = pacers(args.pacer_hold_ms, args.pacer_kernels, args.pacer_max_batch) + peers(args.llama_parallel)
                if rnd % 2:
                    servers.reverse()
                for name in servers:
                    done += 1
                    print(f"[{done}/{total}] round {rnd + 1}, cache {'on' if cache else 'off'}, {workload}: {name}",
                          file=sys.stderr, flush=True)
                    for c in args.levels:
                        if not runs_at(name, c):
                            continue
                        port = free_port()
                        url = f"http://127.0.0.1:{port}"
                        cmd, ready = server_cmd(args, name, cache, workload, port, c)
                        proc = start(cmd, url, ready, server_env(name))
                        try:
                            seed = 1000 * (rnd + 1) + c
                            rep = level(args, url, workload, c, seed, os.path.join(tmp, "level.json"))
                            runs.setdefault(f"{'on' if cache else 'off'}|{workload}|{name}|{c}", []).append(rep)
                        finally:
                            stop(proc)
    med = {k: {f: statistics.median(r[f] for r in v if r.get(f) is not None) if any(r.get(f) is not None for r in v)
               else float("nan") for f in FIELDS} | {"failed": sum(r["failed"] or 0 for r in v)}
           for k, v in runs.items()}
    render(med, args.threads, args.max_tokens, args.rounds, args.slo_ttft_ms, args.slo_tpot_ms,
           settings, workloads, args.levels, args.llama_parallel, args.pacer_hold_ms, args.pacer_kernels,
           args.pacer_max_batch)
    if args.json_out:
        with open(args.json_out, "w") as f:
            # File names only: the report says what ran, not where it lay on this machine.
            saved = {k: os.path.basename(v) if k in PATHS and v else v for k, v in vars(args).items()}
            json.dump({"args": saved, "runs": runs, "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
