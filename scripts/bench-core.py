#!/usr/bin/env python3
"""Model-core benchmark, Pacer against llama.cpp side by side in one run, same thread count,
same token ids, same GGUF weights at each tier.

Per tier it measures prefill tok/s (128- and 512-token prompts by default, `--prefill` for
others; one sequence, llama.cpp in micro-batches of 512 as llama-bench does), and decode
tok/s at batch sizes 1, 4, 8, 16 (aggregate over the batch; each sequence has a 32-token
context), alternating engines per tier so machine noise hits both alike. Prints a Markdown
table with Pacer/llama.cpp ratios and writes the raw figures as JSON.

  scripts/bench-core.sh                      # builds, fetches, runs with 2 threads
  scripts/bench-core.sh --tiers q4_0 --threads 1
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time

import llama_cpp as L

MASK = (1 << 64) - 1


def synthetic_tokens(n: int, seed: int, vocab: int) -> list[int]:
    """Same ids as pacer_engine::bench::synthetic_tokens."""
    state = (seed * 2_654_435_761 + 12_345) & MASK
    out = []
    for _ in range(n):
        state = (state * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407) & MASK
        out.append(100 + (state >> 33) % (vocab - 100))
    return out


class LlamaCpp:
    def __init__(self, path: str, threads: int, n_ctx: int, n_seq: int):
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, n_seq
        cp.n_threads = cp.n_threads_batch = threads
        # One KV pool shared by all sequences, like Pacer's paged cache (the default splits
        # n_ctx evenly per sequence, which cannot hold a 512-token prompt next to 15 others).
        cp.kv_unified = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(512, 0, n_seq)

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def decode(self, entries):
        """entries: (token, pos, seq, want_logits)."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            sys.exit(f"llama_decode failed: {rc}")

    def prefill(self, tokens):
        self.clear()
        t = time.perf_counter()
        entries = [(tok, i, 0, i == len(tokens) - 1) for i, tok in enumerate(tokens)]
        # In micro-batches of 512, as llama-bench -p does with its default n_ubatch.
        for i in range(0, len(entries), 512):
            self.decode(entries[i : i + 512])
        return len(tokens) / (time.perf_counter() - t)

    def batched_decode(self, b, context, steps):
        self.clear()
        entries = []
        for s in range(b):
            for i, tok in enumerate(synthetic_tokens(context, 1000 + s, self.vocab)):
                entries.append((tok, i, s, i == context - 1))
        for i in range(0, len(entries), 512):
            self.decode(entries[i : i + 512])
        nxt = [synthetic_tokens(steps, 7 + s, self.vocab) for s in range(b)]
        t = time.perf_counter()
        for step in range(steps):
            self.decode([(nxt[s][step], context + step, s, True) for s in range(b)])
        return b * steps / (time.perf_counter() - t)


@L.llama_log_callback
def _quiet(level, text, user_data):
    pass


def bench_llama(path, threads, prefill, batches, context, steps, repeats):
    L.llama_log_set(_quiet, ctypes.c_void_p(0))
    n_ctx = max(2048, max(prefill) + 1, max(batches) * (context + steps + 1))
    eng = LlamaCpp(path, threads, n_ctx=n_ctx, n_seq=max(batches))
    eng.prefill(synthetic_tokens(16, 99, eng.vocab))  # warm-up
    figs = []
    for n in prefill:
        toks = synthetic_tokens(n, n, eng.vocab)
        figs.append({"phase": "prefill", "size": n, "tokens_per_second": statistics.median(eng.prefill(toks) for _ in range(repeats))})
    for b in batches:
        figs.append({"phase": "decode", "size": b, "tokens_per_second": statistics.median(eng.batched_decode(b, context, steps) for _ in range(repeats))})
    return figs


def bench_pacer(binary, model, tier, threads, prefill, batches, steps, repeats):
    cmd = [binary, "bench", "--json", "--model", model, "--tier", tier, "--threads", str(threads),
           "--prefill", ",".join(map(str, prefill)), "--batch", ",".join(map(str, batches)),
           "--decode-steps", str(steps), "--repeats", str(repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pacer", required=True, help="pacer-engine binary")
    ap.add_argument("--model", required=True, help="the shipped GGUF (Pacer converts it per tier)")
    ap.add_argument("--ref-dir", required=True, help="directory with the f32/q8_0/q4_0 GGUFs for llama.cpp")
    ap.add_argument("--tiers", default="q4_0,q8_0,f32,native")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", default="128,512", help="prompt lengths, e.g. 2048,4096,8000")
    ap.add_argument("--batches", default="1,4,8,16", help="decode batch sizes")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    prefill = [int(n) for n in args.prefill.split(",")]
    batches, context = [int(b) for b in args.batches.split(",")], 32
    results = []
    tiers = args.tiers.split(",")
    for i, tier in enumerate(tiers):
        print(f"[{i + 1}/{len(tiers)}] {tier}: pacer", file=sys.stderr, flush=True)
        p = bench_pacer(args.pacer, args.model, tier, args.threads, prefill, batches, args.steps, args.repeats)
        # llama.cpp runs the shipped file for `native`, else its own quantization of the f32 GGUF.
        path = args.model if tier == "native" else f"{args.ref_dir}/SmolLM2-135M-Instruct.{tier}.gguf"
        print(f"[{i + 1}/{len(tiers)}] {tier}: llama.cpp", file=sys.stderr, flush=True)
        llama = bench_llama(path, args.threads, prefill, batches, context, args.steps, args.repeats)
        results.append({"tier": tier, "pacer": p, "llama_cpp": llama})

    cols = [f"prefill@{n}" for n in prefill] + [f"decode B={b}" for b in batches]
    print(f"threads={args.threads}, llama-cpp-python {L.__version__}; tok/s (Pacer / llama.cpp = ratio)\n")
    print("| tier | weights MiB | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for r in results:
        cells = []
        for pf, lf in zip(r["pacer"]["figures"], r["llama_cpp"]):
            a, b = pf["tokens_per_second"], lf["tokens_per_second"]
            cells.append(f"{a:.0f} / {b:.0f} = **{a / b:.2f}×**")
        mib = r["pacer"]["weight_bytes"] / 2**20
        print(f"| {r['tier']} | {mib:.0f} | " + " | ".join(cells) + " |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"threads": args.threads, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
