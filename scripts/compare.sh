#!/usr/bin/env bash
# Before/after in the same hour: the shim's cost (M1/M2) and sharing scenarios of another commit
# against this tree, run alternately so the VM's drift between hours falls on both sides.
#   scripts/compare.sh BASE                   M1/M2, 3 rounds (~2 min after the builds)
#   scripts/compare.sh BASE --rounds 5
#   scripts/compare.sh BASE --bench S1,S3     also `sharectl bench` of those scenarios, both trees
#   scripts/compare.sh BASE --bench all -- --policy exclusive,libshare   (after --: bench options)
#   scripts/compare.sh BASE --build-only      build both sides now, measure later (when idle)
# BASE is any commit (e.g. the one before an issue's first merge). Its tree is checked out with
# `git worktree` under target/compare/<sha> and built there, in a target directory of its own
# (a cold build: ~10 min on 2 cores). Results are printed, one JSON line per run and side, then a
# summary of the medians; run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "compare.sh: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: scripts/compare.sh BASE [--rounds N] [--bench S1,S2,...]"
base=$(git rev-parse --verify --quiet "$1^{commit}") || die "$1 is not a commit here"
shift
rounds=3 scenarios="" build_only="" bench_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; bench_args=("$@"); break ;;
    --build-only) build_only=1; shift ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --bench) scenarios=${2:?--bench needs scenarios, e.g. S1,S3}; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
head_dir=$PWD
head_target=${CARGO_TARGET_DIR:-$head_dir/target}
short=${base:0:12}
base_dir=$head_target/compare/$short
base_target=$head_target/compare/$short-target
if [ ! -d "$base_dir" ]; then
  git worktree add --detach "$base_dir" "$base" >/dev/null
fi

# Builds one side and prints the path of its M1/M2 bench binary.
build() { # dir target
  local dir=$1 target=$2
  (cd "$dir" && CARGO_TARGET_DIR=$target cargo build --release --quiet >&2 &&
    CARGO_TARGET_DIR=$target cargo build --release --quiet -p libshare -p instant-driver >&2 &&
    CARGO_TARGET_DIR=$target cargo bench -p libshare-benches --bench shim_overhead --no-run \
      --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "shim_overhead" and m.get("executable"):
        print(m["executable"])')
}
echo "building $short (base) and this tree (head)" >&2
base_bench=$(build "$base_dir" "$base_target")
head_bench=$(build "$head_dir" "$head_target")
[ -x "$base_bench" ] && [ -x "$head_bench" ] || die "could not build the M1/M2 bench on both sides"
[ -z "$build_only" ] || { echo "built: $base_dir and this tree" >&2; exit 0; }

out=$(mktemp)
m1() { # side dir target bench
  (cd "$2" && CARGO_TARGET_DIR=$3 SHARE_TESTS_SKIP_BUILD=1 "$4" --bench --warm-up-time 1 \
    --measurement-time 3 2>/dev/null | grep -E '^\{' | tail -1 | sed "s/^/$1 /") | tee -a "$out"
}
for _ in $(seq "$rounds"); do
  m1 base "$base_dir" "$base_target" "$base_bench"
  m1 head "$head_dir" "$head_target" "$head_bench"
done
python3 - "$out" "$short" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, js = line.split(" ", 1)
    r = json.loads(js)
    runs.setdefault(side, []).append((r["launch"]["added_ns"], r["alloc_free"]["added_ns"]))
print(f"\n| median of {len(runs.get('head', []))} runs | base {sys.argv[2]} | head |")
print("|---|---|---|")
for i, name in enumerate(["M1 added ns per launch", "M2 added ns per alloc+free pair"]):
    cells = [f"{statistics.median(v[i] for v in runs[s]):.1f}" for s in ("base", "head")]
    print(f"| {name} | {cells[0]} | {cells[1]} |")
EOF
rm -f "$out"

if [ -n "$scenarios" ]; then
  for s in ${scenarios//,/ }; do
    for side in base head; do
      if [ $side = base ]; then t=$base_target; else t=$head_target; fi
      echo; echo "== $s, $side"
      "$t/release/sharectl" bench "$s" --markdown "${bench_args[@]}"
    done
  done
fi
