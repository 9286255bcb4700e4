#!/usr/bin/env bash
# The GPU check in two halves, for a GPU that may be lent for minutes on a machine with the
# NVIDIA driver but no Rust toolchain and no network.
#
#   scripts/gpu-check.sh --build [--out DIR]       # here, no GPU needed (CUDA from PyPI)
#   scripts/gpu-check.sh --run DIR [--model FILE] [--device cuda] [--smoke] [--results DIR]
#
# --build compiles the `cuda` engine for CUDA_COMPUTE_CAP (default 90: H100/H200), pacer-bench,
#   and the candle backend's test binaries (its unit tests, engine/tests/candle.rs and
#   reference.rs) in a target directory of their own, strips them, compresses them with xz into
#   DIR (default gpu-check/) and writes DIR/manifest.json (commit, compute capability, files,
#   sha256). --no-cuda builds the same set without the feature (CI runs the --run half on it).
# --run unpacks DIR's binaries and runs, each step under its own timeout and writing as it goes
#   into the results folder (default DIR/results): nvidia-smi; greedy answers at every tier on
#   the device against the CPU kernels; the candle tests on the device; `pacer-engine bench` on
#   the device (prefill 128/512/2048, decode batch 1-128); `serve` on the device under
#   `pacer-bench sweep` at concurrency 1/16/64/128 with GPU memory and utilisation sampled; and
#   Hugging Face transformers on the same GGUF when PyTorch is there. Then results.json and
#   results.md. Its time on a GPU is not measured yet (each step has its own timeout); --smoke
#   shrinks every step (CI, on candle-cpu).
# Exit status: 0 when every step passed, 1 when one failed (the results say which), 2 on usage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf 'gpu-check: %s\n' "$*" >&2; }
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

mode="" dir="" model="${PACER_MODEL:-}" device="cuda" smoke=0 results="" cuda=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) mode=build ;;
    --run) mode=run; dir="${2:?--run needs a folder}"; shift ;;
    --out) dir="${2:?}"; shift ;;
    --model) model="${2:?}"; shift ;;
    --device) device="${2:?}"; shift ;;
    --results) results="${2:?}"; shift ;;
    --smoke) smoke=1 ;;
    --no-cuda) cuda=0 ;;
    -h|--help) usage ;;
    *) log "unknown argument $1"; usage ;;
  esac
  shift
done
[ -n "$mode" ] || usage

build() {
  local out="${dir:-gpu-check}" cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
  local cap="${CUDA_COMPUTE_CAP:-90}" build_sel test_sel
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  cd "$root"
  if [ "$cuda" = 1 ]; then
    CUDA_HOME=$(scripts/setup-cuda.sh)
    export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" CUDA_COMPUTE_CAP="$cap"
    # A target directory of its own: the kernels for this compute capability stay cached
    # without replacing CI's (sm_80) or the CPU release build.
    export CARGO_TARGET_DIR="$cache/target-gpu-check-sm$cap"
    build_sel=(-p pacer-engine -p pacer-bench --features pacer-engine/cuda)
    test_sel=(-p pacer-engine --features cuda --lib --test candle --test reference)
  else
    # The whole workspace's tests, as scripts/test.sh builds them: `cargo test --no-run` also
    # builds the binaries the tests run, with the features the tests unify, so nothing is
    # rebuilt after scripts/test.sh. (A `cargo build` would resolve features without the
    # dev-dependencies and rebuild most of the workspace.)
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
    build_sel=()
    test_sel=(--workspace)
  fi
  if [ "${#build_sel[@]}" -gt 0 ]; then
    log "building the engine and pacer-bench (${build_sel[*]})"
    cargo build --release --locked "${build_sel[@]}"
  fi
  log "building the test binaries (and the engine and pacer-bench they run)"
  local tests
  tests=$(cargo test --release --locked "${test_sel[@]}" --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    if "pacer-engine" not in m["package_id"] or m["target"]["name"] not in ("pacer_engine", "candle", "reference"):
        continue
    print(("unit" if m["target"]["kind"] == ["lib"] else m["target"]["name"]) + "=" + m["executable"])')
  local files=()
  pack() { # name source
    strip -o "$out/$1" "$2"
    xz -f -T0 "${XZ_LEVEL:--6}" "$out/$1"
    files+=("$1.xz")
  }
  pack pacer-engine "$CARGO_TARGET_DIR/release/pacer-engine"
  pack pacer-bench "$CARGO_TARGET_DIR/release/pacer-bench"
  while IFS='=' read -r name path; do pack "test-$name" "$path"; done <<<"$tests"
  python3 - "$out" "$cap" "$cuda" "$(git rev-parse HEAD)" "${files[@]}" <<'PY'
import hashlib, json, os, sys
out, cap, cuda, commit, *files = sys.argv[1:]
entries = [{"file": f, "bytes": os.path.getsize(os.path.join(out, f)),
            "sha256": hashlib.sha256(open(os.path.join(out, f), "rb").read()).hexdigest()} for f in files]
json.dump({"commit": commit, "cuda": cuda == "1", "compute_cap": int(cap) if cuda == "1" else None,
           "files": entries}, open(os.path.join(out, "manifest.json"), "w"), indent=2)
PY
  log "wrote $out ($(du -sh "$out" | cut -f1)); run it with: scripts/gpu-check.sh --run $out --model FILE"
}

run() {
  [ -f "$dir/manifest.json" ] || { log "$dir has no manifest.json (make it with --build)"; exit 2; }
  [ -n "$model" ] && [ -f "$model" ] || { log "--model FILE (or PACER_MODEL) must name the GGUF model"; exit 2; }
  dir=$(cd "$dir" && pwd)
  results="${results:-$dir/results}"
  mkdir -p "$results" "$dir/bin"
  : >"$results/steps.jsonl"
  for f in "$dir"/*.xz; do
    local b="$dir/bin/$(basename "$f" .xz)"
    [ -x "$b" ] || { xz -dc "$f" >"$b" && chmod +x "$b"; }
  done
  local bin="$dir/bin" failed=0
  # A cuda build links cuBLAS, cuRAND, NVRTC and the CUDA runtime; on a machine whose CUDA
  # libraries come only with a Python environment's NVIDIA wheels, find them there.
  if ldd "$bin/pacer-engine" 2>/dev/null | grep -q "not found"; then
    local libs
    libs=$(python3 -c '
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
found = {os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(found)))' 2>/dev/null || true)
    [ -n "$libs" ] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "CUDA libraries from the Python environment: ${libs:-none found}"
  fi
  ldd "$bin/pacer-engine" >"$results/libraries.txt" 2>&1 || true
  if grep -q "not found" "$results/libraries.txt"; then
    log "the engine cannot load: $(grep 'not found' "$results/libraries.txt" | tr -s ' \t' ' ' | tr '\n' ';')"
    exit 1
  fi
  [ -d "$root/engine/tests/data" ] && export PACER_TEST_DATA="$root/engine/tests/data"
  export PACER_MODEL="$model" RUST_BACKTRACE=0 NO_COLOR=1
  # step NAME SECONDS CMD...: runs CMD under a timeout, its output in NAME.out and NAME.log, its verdict in
  # steps.jsonl as it ends.
  step() {
    local name="$1" limit="$2" start rc
    shift 2
    log "$name (at most ${limit}s)"
    start=$(date +%s%N)
    set +e
    timeout -k 5 "$limit" "$@" >"$results/$name.out" 2>"$results/$name.log"
    rc=$?
    set -e
    printf '{"step":"%s","rc":%d,"seconds":%d.%03d,"timed_out":%s}\n' "$name" "$rc" \
      $(( ($(date +%s%N) - start) / 1000000000 )) $(( ($(date +%s%N) - start) / 1000000 % 1000 )) \
      "$([ $rc -eq 124 ] && echo true || echo false)" >>"$results/steps.jsonl"
    [ $rc -eq 0 ] || { failed=1; log "$name failed (exit $rc): $results/$name.log"; }
  }
  local tiers=(f32 q8_0 q4_0 native) prefill=128,512,2048 batch=1,4,16,64,128 steps=32 conc=1,16,64,128 n=256
  local out_len=128 in_len=256
  # One test at a time on a GPU (each holds the device); a smoke run on the CPU takes every core.
  local threads=(--test-threads 1)
  if [ "$smoke" = 1 ]; then
    tiers=(f32 native) prefill=32 batch=1,2 steps=4 conc=1,2 n=4 out_len=8 in_len=16 threads=()
  fi

  if command -v nvidia-smi >/dev/null; then step nvidia-smi 30 nvidia-smi; fi
  for t in "${tiers[@]}"; do
    step "greedy-$t-$device" 120 "$bin/pacer-engine" generate --model "$model" --device "$device" --tier "$t" \
      --chat --max-tokens 24 --prompt "What is the capital of France?"
    step "greedy-$t-cpu" 120 "$bin/pacer-engine" generate --model "$model" --device cpu --tier "$t" \
      --chat --max-tokens 24 --prompt "What is the capital of France?"
  done
  for t in "$bin"/test-*; do
    local filter=()
    case "$(basename "$t")" in
      test-unit) filter=(candle_backend) ;;
      test-reference) filter=(candle_) ;;
    esac
    step "$(basename "$t")" 240 env PACER_TEST_DEVICE="$device" "$t" "${threads[@]}" "${filter[@]}"
  done
  step bench 180 "$bin/pacer-engine" bench --model "$model" --device "$device" --prefill "$prefill" \
    --batch "$batch" --decode-steps "$steps" --repeats 2 --json

  local port=18471 sampler=""
  "$bin/pacer-engine" serve --model "$model" --device "$device" --port $port --probe-port $((port + 1)) \
    --served-model-name pacer --max-batch-size 128 >"$results/serve.log" 2>&1 &
  local server=$!
  for _ in $(seq 120); do
    kill -0 "$server" 2>/dev/null || { log "serve exited: $results/serve.log"; break; }
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$((port + 1))/ready', timeout=1)" \
      2>/dev/null && break
    sleep 1
  done
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv -l 1 \
      >"$results/gpu-under-load.csv" 2>&1 &
    sampler=$!
  fi
  step sweep 240 "$bin/pacer-bench" sweep --model pacer --base-url "http://127.0.0.1:$port" \
    --concurrencies "$conc" --num-requests "$n" --input-len "$in_len" --output-len "$out_len" --ignore-eos \
    --json "$results/sweep.json"
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true

  if [ "$device" != candle-cpu ] && python3 -c "import torch, transformers" 2>/dev/null; then
    step transformers 180 python3 "$root/scripts/gpu-check-peer.py" --model "$model" --batch "$batch" \
      --tokens "$steps" --json "$results/transformers.json"
  fi
  python3 "$root/scripts/gpu-check-report.py" "$results" "$device" "${tiers[@]}" || failed=1
  log "results: $results/results.md"
  return $failed
}

if [ "$mode" = build ]; then build; else run; fi
