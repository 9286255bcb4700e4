#!/usr/bin/env bash
# Runs Pacer's main job on this machine: fetches the default model, builds the engine and the
# operator, and runs local mode with the step load: engine replicas as local processes behind a
# router on 127.0.0.1:8000, the SLA planner scaling them through light → heavy → light traffic
# (about 5 minutes on 2 cores), then the verdict and where the report and its picture are.
# Extra arguments go to `pacer-operator local` (the step load and the default model's profile
# stay unless `--load` or `--profile` is given), e.g.
#   scripts/run.sh --load none --port 8080     # serve and hold the SLA for your own clients
#   scripts/run.sh --config my-service.yaml --out /tmp/pacer-run
#
# Builds into the same cargo target directory as scripts/test.sh (under the cache), so the two
# share one build; set CARGO_TARGET_DIR to override.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
PACER_MODEL=$(scripts/fetch-model.sh)
export PACER_MODEL
echo "building pacer-engine and pacer-operator (release; the first build takes several minutes)" >&2
cargo build --release --locked -q -p pacer-engine -p pacer-operator
# Defaults for what the caller did not say: the step load, and the engine profile of the
# default model on one thread seeding the planner's capacity model (measured on a 2-core machine;
# `pacer-engine profile` measures your own). The config defaults to config/local.yaml.
defaults=()
case " $* " in *" --load "* | *" --load="*) ;; *) defaults+=(--load step) ;; esac
case " $* " in
  *" --profile "* | *" --profile="*) ;;
  *) defaults+=(--profile config/profiles/smollm2-135m-native-t1.json) ;;
esac
exec "$CARGO_TARGET_DIR/release/pacer-operator" local \
  --engine "$CARGO_TARGET_DIR/release/pacer-engine" "${defaults[@]}" "$@"
