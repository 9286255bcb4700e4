#!/usr/bin/env bash
# Long prompts against running streams: 4 streams decode (chat, 800 tokens each) while one
# request with a long prompt (about N tokens of text, 1 output token) prefills. Prints, per run,
# how long the long prompt's prefill took (its TTFT) and the streams' inter-token gaps while it
# prefilled (P50, P99, max) next to their gaps without it, so the ratio says how much a long
# prompt stalls everyone else.
#   scripts/bench-long-prompt.sh [ENGINE] [N ...]     # N defaults to 2000 4000 7000
# PACER_ENGINE_ARGS adds engine flags, e.g. "--max-num-batched-tokens 128".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
engine="${1:-${CARGO_TARGET_DIR:-$cache/target}/release/pacer-engine}"
shift || true
sizes=("${@:-2000 4000 7000}")
model=$("$root/scripts/fetch-model.sh")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
# shellcheck disable=SC2086
"$engine" serve --model "$model" --port "$port" --served-model-name smol ${PACER_ENGINE_ARGS:-} >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/ready', timeout=1)" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
PORT=$port python3 - ${sizes[*]} <<'PY'
import http.client, json, os, sys, threading, time

port = int(os.environ["PORT"])

def chat(content, max_tokens, times, stream=True):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "smol", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, "ignore_eos": True}
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if not stream:
        r.read()
        times.append(time.monotonic() - t0)
        return
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if b'"content":"' in event and b'"role"' not in event:
                times.append(time.monotonic())

def gaps(streams, lo, hi):
    out = []
    for ts in streams:
        out += [b - a for a, b in zip(ts, ts[1:]) if b > lo and a < hi]
    return sorted(out)

def pct(v, q):
    return v[min(len(v) - 1, int(q / 100 * len(v)))] * 1000 if v else float("nan")

print("| prompt tokens | its TTFT (s) | streams' gaps without it: P50 / P99 / max (ms) | while it prefills: P50 / P99 / max (ms) | P99 ratio |")
print("|---:|---:|---|---|---:|")
for n in map(int, sys.argv[1:]):
    streams = [[] for _ in range(4)]
    threads = [threading.Thread(target=chat, args=(f"Story {i}: tell me a long story.", 800, streams[i])) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    ttft = []
    start = time.monotonic()
    long_req = threading.Thread(target=chat, args=("word " * (n - 20), 1, ttft, False))
    long_req.start()
    long_req.join()
    end = time.monotonic()
    for t in threads:
        t.join()
    during = gaps(streams, start, end)
    before = gaps(streams, start - 2.5, start)
    ratio = pct(during, 99) / pct(before, 99)
    print(f"| {n} | {ttft[0]:.2f} | {pct(before, 50):.0f} / {pct(before, 99):.0f} / {before[-1]*1000:.0f} | "
          f"{pct(during, 50):.0f} / {pct(during, 99):.0f} / {during[-1]*1000:.0f} | {ratio:.1f}× |")
PY
