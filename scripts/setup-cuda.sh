#!/usr/bin/env bash
# Installs a CUDA 13.0 build toolkit from NVIDIA's PyPI wheels into the cache (outside the
# repository) and prints its root: enough to *build* `pacer-engine --features cuda` on a machine
# with no GPU and no system CUDA (CI does, on every change). Running it needs a GPU and its
# driver; the CUDA image (`engine/Dockerfile.cuda`) uses NVIDIA's own toolkit instead.
#
#   CUDA_HOME=$(scripts/setup-cuda.sh)
#   PATH="$CUDA_HOME/bin:$PATH" CUDA_COMPUTE_CAP=80 cargo build -p pacer-engine --features cuda
#
# What the wheels hold, unpacked into one tree (they all install under nvidia/cu13/):
#   nvcc, ptxas, fatbinary, cicc            nvidia-cuda-nvcc, nvidia-nvvm
#   headers (cuda_runtime.h, crt/, cub/)    nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl
#   libcudart, libnvrtc, libcublas(Lt),     the runtime wheels candle links against
#   libcurand
# Two things the wheels lack are made here:
#   - the unversioned `libX.so` link names (the wheels ship only `libX.so.13`);
#   - `lib/stubs/libcuda.so` (and `.so.1`), the driver API's link-time stub. The toolkit ships
#     one; PyPI does not, because the real `libcuda.so.1` comes with the GPU driver. The stub
#     has soname `libcuda.so.1` and defines every `cu*` entry point cudarc declares, so the
#     binary links here and loads the driver's library at run time, as with the toolkit's stub.
# Versions are pinned; a finished tree is marked and reused without touching the network.
set -euo pipefail

CUDA_VERSION=13.0
# Bump when the tree this script makes changes, so cached trees are rebuilt.
LAYOUT=2
WHEELS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
)

cache="${PACER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pacer}"
root="$cache/cuda-$CUDA_VERSION"
stamp="$root/.pacer-complete"
log() { printf 'setup-cuda: %s\n' "$*" >&2; }

want=$(printf '%s\n' "layout $LAYOUT" "${WHEELS[@]}")
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$root/bin/nvcc" ]; then
  log "cached: $root"
  echo "$root"
  exit 0
fi

command -v python3 >/dev/null || { log "python3 is required (for pip)"; exit 1; }
command -v cc >/dev/null || { log "a C compiler (cc) is required"; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.cuda.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

log "downloading ${#WHEELS[@]} wheels (CUDA $CUDA_VERSION) from PyPI"
python3 -m pip download --no-deps --disable-pip-version-check --progress-bar on \
  --only-binary=:all: \
  -d "$tmp/wheels" "${WHEELS[@]}" 1>&2

log "unpacking"
python3 - "$tmp/wheels" "$tmp/unpacked" <<'PY'
import os, stat, sys, zipfile, glob
src, out = sys.argv[1:]
for wheel in sorted(glob.glob(f"{src}/*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if not info.filename.startswith("nvidia/cu13/") or info.is_dir():
                continue
            path = z.extract(info, out)
            # Wheels keep Unix modes in the high bits of external_attr.
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)
            elif "/bin/" in info.filename:
                os.chmod(path, 0o755)
PY
tree="$tmp/unpacked/nvidia/cu13"
[ -x "$tree/bin/nvcc" ] || { log "nvcc missing from the nvcc wheel"; exit 1; }

# Link names (`-lcublas` looks for libcublas.so), and lib64 as cudarc's and nvcc's searches expect.
for lib in "$tree"/lib/lib*.so.*; do
  base=$(basename "$lib")
  link="${base%%.so.*}.so"
  [ -e "$tree/lib/$link" ] || ln -s "$base" "$tree/lib/$link"
done
ln -s lib "$tree/lib64"

# The driver stub: one definition per driver entry point cudarc's bindings declare, each
# returning CUDA_ERROR_NO_DEVICE (100). On a GPU machine the dynamic loader resolves
# libcuda.so.1 to the driver's and the stub is never seen; run against the stub
# (LD_LIBRARY_PATH=$CUDA_HOME/lib/stubs), a cuda build behaves as on a machine without a GPU.
# cudarc is an optional dependency, so a build without the `cuda` feature never unpacks its
# sources: `cargo fetch` downloads and unpacks every package the lockfile names.
find_cudarc() {
  ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* 2>/dev/null | sort -V | tail -1 || true
}
cudarc_src=$(find_cudarc)
if [ -z "$cudarc_src" ]; then
  log "cudarc sources not unpacked yet: cargo fetch"
  (cd "$(dirname "$0")/.." && cargo fetch --locked) 1>&2
  cudarc_src=$(find_cudarc)
fi
if [ -z "$cudarc_src" ]; then
  log "cudarc sources not found after 'cargo fetch': is cudarc 0.19 still in Cargo.lock?"
  exit 1
fi
mkdir -p "$tree/lib/stubs"
grep -rhoE '\bfn cu[A-Za-z0-9_]+\(' "$cudarc_src/src/driver/sys" | sed 's/^fn //; s/($//' | sort -u \
  | sed 's/.*/int &(void) { return 100; }/' > "$tmp/cuda_stub.c"
[ -s "$tmp/cuda_stub.c" ] || { log "no driver entry points found in $cudarc_src"; exit 1; }
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tree/lib/stubs/libcuda.so" "$tmp/cuda_stub.c"
ln -s libcuda.so "$tree/lib/stubs/libcuda.so.1"
log "driver stub: $(wc -l < "$tmp/cuda_stub.c") entry points"

"$tree/bin/nvcc" --version | tail -2 >&2
rm -rf "$root"
mv "$tree" "$root"
echo "$want" > "$stamp"
log "installed: $root"
echo "$root"
