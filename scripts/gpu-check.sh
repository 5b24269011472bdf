#!/usr/bin/env bash
# libshare on a real NVIDIA GPU, and simgpu calibrated against it (issue 33): one prepared check.
#
#   scripts/gpu-check.sh --bundle [DIR]
#       Here, with the Rust toolchain: builds and gathers what a GPU machine needs (release
#       sharectl, the shipped glibc-2.17 shim, the simjob-* jobs, simgpu's libcuda.so, the
#       driver-API programs compiled with gcc, the jobs' PTX, the pinned cudart 12.9/13.5, the
#       PyTorch script, criterion's M1/M2 bench) into DIR (default target/gpu-bundle, git-ignored),
#       stripped, and prints its size. Carry DIR with the working tree to the GPU machine.
#   scripts/gpu-check.sh OUT_DIR [--bundle DIR] [--sim] [--short] [--budget SECS] [--python FILE]
#       On the GPU machine (nothing to build or download; only the driver is needed): runs
#       `sharectl gpu-check` from the bundle and writes OUT_DIR/summary.md, report.json,
#       simgpu-calibrated.toml and logs/. --sim: no GPU, simgpu stands in for the driver (a dry
#       run of the same path; scripts/test.sh runs it through tests/tests/gpu_check.rs). --budget:
#       seconds after which no check starts (default 420, under 8 minutes in all).
#
# SHARE_TESTS_SKIP_BUILD=1: --bundle takes what is built (cargo build --release --workspace and
# scripts/build-shim.sh ran) instead of building. Exit: 0 every check passed or measured, 1 a
# check failed, 2 usage or no bundle.
set -uo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
cache=${LIBSHARE_CACHE:-$HOME/.cache/libshare}
LIMIT_MIB=64  # what the GPU machine takes from the working tree, bundle included

die() { echo "gpu-check: $*" >&2; exit 2; }

make_bundle() {
  local dir=$1
  set -e
  if [ "${SHARE_TESTS_SKIP_BUILD:-}" != 1 ]; then
    cargo build --release -p sharectl -p jobs -p simgpu -p libshare -p instant-driver
    bash scripts/build-shim.sh
    cargo bench --no-run -p libshare-benches --bench shim_overhead
  fi
  local f
  for f in release/sharectl release/simjob-train release/simjob-infer release/simjob-saturate \
           release/libcuda.so dist/libshare.so; do
    [ -f "$target/$f" ] || die "$target/$f is missing: build it (cargo build --release --workspace; scripts/build-shim.sh)"
  done
  local include=$cache/cu13/nvidia/cu13/include cu12=$cache/cu12/nvidia/cuda_runtime cu13=$cache/cu13/nvidia/cu13
  [ -f "$include/cuda.h" ] || die "$include/cuda.h is missing: run scripts/fetch-cuda.sh"
  case "$dir" in "" | / | . | ..) die "refusing to make the bundle in '$dir'" ;; esac
  if [ -e "$dir" ] && [ ! -f "$dir/MANIFEST.json" ] && [ -n "$(ls -A "$dir")" ]; then
    die "$dir exists and is not a bundle: choose another directory"
  fi
  local tmp=$dir.tmp
  rm -rf "$tmp"
  mkdir -p "$tmp"/{release,dist,bin,cudart/cu12,cudart/cu13,kernels,python,bench}

  # Rust binaries and simgpu, stripped (debug info is most of their size).
  for f in sharectl simjob-train simjob-infer simjob-saturate; do
    strip -o "$tmp/release/$f" "$target/release/$f"
  done
  strip --strip-unneeded -o "$tmp/release/libcuda.so" "$target/release/libcuda.so"
  cp "$target/dist/libshare.so" "$tmp/dist/libshare.so"

  # The driver-API programs: cuda.h for the types, linked against simgpu's libcuda.so.1 (the
  # SONAME the driver has too), kernels as PTX the driver compiles.
  local lib=$target/simgpu/lib
  mkdir -p "$lib"
  for f in libcuda.so.1 libcuda.so libnvidia-ml.so.1; do ln -sfn ../../release/libcuda.so "$lib/$f"; done
  local cc=(gcc -std=gnu11 -O1 -Wall -Werror -pthread -I "$include" -I tests/cuda)
  "${cc[@]}" tools/gpu-check/probe.c -o "$tmp/bin/gpu_probe" -L "$lib" -lcuda -ldl
  "${cc[@]}" tests/cuda/shim_driver.c -o "$tmp/bin/shim_driver" -ldl
  "${cc[@]}" -DSHIM_LINKED tests/cuda/shim_driver.c -o "$tmp/bin/shim_driver_linked" -L "$lib" -lcuda -ldl
  "${cc[@]}" tests/cuda/hold_memory.c -o "$tmp/bin/hold_memory" -L "$lib" -lcuda -ldl
  # cudart programs, with the pinned runtimes beside them.
  cp "$cu12/lib/libcudart.so.12" "$tmp/cudart/cu12/"
  cp "$cu13/lib/libcudart.so.13" "$tmp/cudart/cu13/"
  gcc -std=gnu11 -O1 -Wall -I "$cu12/include" -I "$cache/cu12/nvidia/cuda_nvcc/include" tests/cuda/rt_test.c \
    -o "$tmp/bin/rt_test-cu12" -L "$tmp/cudart/cu12" -l:libcudart.so.12 -Wl,-rpath,'$ORIGIN/../cudart/cu12'
  gcc -std=gnu11 -O1 -Wall -I "$include" tests/cuda/rt_test.c \
    -o "$tmp/bin/rt_test-cu13" -L "$tmp/cudart/cu13" -l:libcudart.so.13 -Wl,-rpath,'$ORIGIN/../cudart/cu13'
  strip "$tmp"/bin/*

  cp jobs/src/spin.ptx "$tmp/kernels/spin.ptx"
  cp shim-headers/cuda_driver_api.txt "$tmp/cuda_driver_api.txt"
  cp tests/python/shim_quota.py "$tmp/python/"

  # Criterion's M1/M2 bench (the newest cargo built), with what it loads: the host-built shim and
  # the instant driver; not if older than that shim (built before a change of the state's layout,
  # it would read the shim's state as truncated).
  local bench
  bench=$(ls -t "$target"/release/deps/shim_overhead-* 2>/dev/null | grep -v '\.d$' | head -n 1 || true)
  if [ -n "$bench" ] && [ -x "$bench" ] && [ -f "$target/release/libinstantcuda.so" ] \
     && [ ! "$bench" -ot "$target/release/libshare.so" ]; then
    strip -o "$tmp/bench/shim_overhead" "$bench"
    strip --strip-unneeded -o "$tmp/release/libshare.so" "$target/release/libshare.so"
    strip --strip-unneeded -o "$tmp/release/libinstantcuda.so" "$target/release/libinstantcuda.so"
  else
    echo "gpu-check: no current criterion bench (cargo bench --no-run -p libshare-benches --bench shim_overhead): the bundle goes without it" >&2
  fi

  # What it is, and the newest glibc any of it needs (the shim: 2.17).
  local commit glibc files bytes
  commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
  glibc=$(for f in $(find "$tmp" -type f); do
            objdump -p "$f" 2>/dev/null | awk '$NF ~ /^GLIBC_[0-9.]+$/ {sub(/^GLIBC_/, "", $NF); print $NF}'
          done | sort -u -V | tail -n 1)
  files=$(cd "$tmp" && find . -type f | sort | while read -r f; do
            printf '    "%s": %s,\n' "${f#./}" "$(stat -c %s "$f")"
          done | sed '$ s/,$//')
  bytes=$(du -sb "$tmp" | cut -f1)
  cat > "$tmp/MANIFEST.json" <<EOF
{
  "commit": "$commit",
  "created": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "glibc_needed": "$glibc",
  "bytes": $bytes,
  "files": {
$files
  }
}
EOF
  rm -rf "$dir"
  mv "$tmp" "$dir"
  set +e
  local mib
  mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
  echo "gpu-check: bundle $dir: $(find "$dir" -type f | wc -l) files, $mib MiB (the GPU machine takes $LIMIT_MIB MiB with the working tree), commit $commit, needs glibc >= $glibc"
  if awk -v b="$bytes" -v l="$LIMIT_MIB" 'BEGIN { exit !(b > l * 1048576) }'; then
    die "the bundle is over $LIMIT_MIB MiB"
  fi
}

if [ "${1:-}" = "--bundle" ]; then
  [ $# -le 2 ] || die "usage: scripts/gpu-check.sh --bundle [DIR]"
  make_bundle "${2:-$target/gpu-bundle}"
  exit $?
fi

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || die "usage: scripts/gpu-check.sh OUT_DIR [--bundle DIR] [--sim] [--short] [--budget SECS] [--python FILE] | --bundle [DIR]"
out=$1
shift
bundle=$target/gpu-bundle
budget=420
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=${2:?--bundle needs a directory}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ -x "$bundle/release/sharectl" ] && [ -f "$bundle/MANIFEST.json" ] ||
  die "no bundle in $bundle: make it with scripts/gpu-check.sh --bundle (where the Rust toolchain is) and carry it here"
need=$(sed -n 's/.*"glibc_needed": "\([0-9.]*\)".*/\1/p' "$bundle/MANIFEST.json")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -n 1)" != "$have" ]; then
  die "the bundle needs glibc $need, this machine has $have: make the bundle on a machine with glibc <= $have"
fi
mkdir -p "$out" || die "cannot create $out"

# timeout runs sharectl in a process group of its own and kills all of it at the deadline (the
# budget plus the longest check); sharectl kills its own programs' groups and reaps what escapes.
timeout --kill-after=10 $((budget + 150)) "$bundle/release/sharectl" gpu-check "$out" --bundle "$bundle" "${args[@]}" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' INT TERM HUP
wait $pid
rc=$?
# A signal interrupts the wait: wait again for the check to write its summary and stop.
if kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; fi
trap - INT TERM HUP
if [ ! -s "$out/summary.md" ]; then
  printf '# gpu-check did not start\n\n`sharectl gpu-check` exited with status %s before writing a summary (see its output above).\n' "$rc" > "$out/summary.md"
elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  printf '\n**The run was killed at the wrapper deadline (%s s): the summary above is of what ran.**\n' $((budget + 150)) >> "$out/summary.md"
fi
echo "gpu-check: $out/summary.md (exit $rc)"
exit $rc
