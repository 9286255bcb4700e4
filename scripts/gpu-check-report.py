#!/usr/bin/env python3
"""The GPU check's report (scripts/gpu-check.sh --run): results.json and results.md from the
steps' outputs in RESULTS. Exits 1 when a step failed or the f32 greedy answer on the device
differs from the CPU kernels'.

    gpu-check-report.py RESULTS DEVICE TIER...
"""
import csv
import json
import os
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def load_json(path):
    text = read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def main():
    results, device, tiers = sys.argv[1], sys.argv[2], sys.argv[3:]
    steps = [json.loads(line) for line in (read(os.path.join(results, "steps.jsonl")) or "").splitlines() if line]
    report = {"device": device, "steps": steps, "greedy": [], "bench": None, "sweep": [], "gpu": None, "peer": None}
    ok = all(s["rc"] == 0 for s in steps)

    for tier in tiers:
        on_device = read(os.path.join(results, f"greedy-{tier}-{device}.out"))
        on_cpu = read(os.path.join(results, f"greedy-{tier}-cpu.out"))
        equal = bool(on_device and on_device.strip()) and on_device == on_cpu
        report["greedy"].append({"tier": tier, "device": on_device, "cpu": on_cpu, "equal": equal})
        if tier == "f32" and not equal:
            ok = False

    bench = load_json(os.path.join(results, "bench.out"))
    if bench:
        report["bench"] = bench
    sweep = load_json(os.path.join(results, "sweep.json"))
    for level in (sweep or {}).get("levels", []):
        report["sweep"].append({
            "concurrency": level["config"]["arrivals"].get("concurrency"),
            "completed": level.get("completed"),
            "failed": level.get("failed"),
            "output_tok_s": level.get("output_throughput"),
            "p50_ttft_ms": level.get("p50_ttft_ms"),
            "p95_ttft_ms": level.get("p95_ttft_ms"),
            "p50_itl_ms": level.get("p50_itl_ms"),
            "p95_itl_ms": level.get("p95_itl_ms"),
        })
        if level.get("failed"):
            ok = False
    gpu_csv = os.path.join(results, "gpu-under-load.csv")
    if os.path.exists(gpu_csv):
        rows = list(csv.reader(open(gpu_csv, encoding="utf-8", errors="replace")))[1:]
        mem = [float(r[1].split()[0]) for r in rows if len(r) >= 4 and r[1].strip().split()[0].isdigit()]
        util = [float(r[3].split()[0]) for r in rows if len(r) >= 4 and r[3].strip().split()[0].isdigit()]
        if mem:
            report["gpu"] = {"samples": len(mem), "memory_mib_max": max(mem),
                             "utilization_pct_mean": sum(util) / max(len(util), 1)}
    report["peer"] = load_json(os.path.join(results, "transformers.json"))
    report["passed"] = ok
    json.dump(report, open(os.path.join(results, "results.json"), "w"), indent=2)

    md = [f"# GPU check on `{device}`: {'passed' if ok else 'FAILED'}", "",
          "| step | exit | seconds |", "|---|---:|---:|"]
    md += [f"| {s['step']} | {s['rc']}{' (timed out)' if s['timed_out'] else ''} | {s['seconds']:.1f} |" for s in steps]
    md += ["", "| tier | greedy answer on the device equals the CPU kernels' |", "|---|---|"]
    md += [f"| {g['tier']} | {'yes' if g['equal'] else 'no'} |" for g in report["greedy"]]
    if bench:
        md += ["", f"`pacer-engine bench` ({bench.get('tier')}, {bench.get('device')}):", "",
               "| phase | size | tokens/s |", "|---|---:|---:|"]
        md += [f"| {f['phase']} | {f['size']} | {f['tokens_per_second']:.0f} |" for f in bench.get("figures", [])]
    if report["sweep"]:
        md += ["", "`serve` under `pacer-bench sweep`:", "",
               "| concurrency | output tok/s | P50 TTFT ms | P95 TTFT ms | P50 ITL ms | P95 ITL ms | failed |",
               "|---:|---:|---:|---:|---:|---:|---:|"]
        md += [f"| {l['concurrency']} | {l['output_tok_s']:.0f} | {l['p50_ttft_ms']:.0f} | {l['p95_ttft_ms']:.0f} | "
               f"{l['p50_itl_ms']:.1f} | {l['p95_itl_ms']:.1f} | {l['failed']} |" for l in report["sweep"]]
    if report["gpu"]:
        g = report["gpu"]
        md += ["", f"GPU under load: at most {g['memory_mib_max']:.0f} MiB, {g['utilization_pct_mean']:.0f} % busy on "
               f"average ({g['samples']} samples)."]
    if report["peer"]:
        md += ["", "transformers on the same GGUF: " + json.dumps(report["peer"])]
    with open(os.path.join(results, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
