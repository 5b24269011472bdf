#!/usr/bin/env bash
# THE test command: installs what is missing, builds, checks formatting and lints, runs every test.
#   scripts/test.sh                 everything (what CI runs, via .ci/run)
#   scripts/test.sh <nextest args>  extra arguments go to the test runner, e.g. a filter: torch
# Works on a clean clone, without a GPU and without stdin (CI=true). Steps that fail do not stop
# the later ones; the script exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
failed=()
step() { echo; echo "==> $*"; }
run() { # name, command...
  local name=$1; shift
  step "$name: $*"
  local t0=$SECONDS
  if "$@" </dev/null; then
    echo "--- $name: ok ($((SECONDS - t0)) s)"
  else
    echo "--- $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}

# 1. The NVIDIA user-space pieces the tests run on simgpu (pinned pip wheels; idempotent).
if ! command -v python3 >/dev/null; then
  step "installing python3"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pip python3-venv
fi
if ! command -v gcc >/dev/null || ! command -v g++ >/dev/null; then
  step "installing gcc/g++"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential
fi
if ! command -v strace >/dev/null; then
  step "installing strace (the shim's no-side-effects test traces system calls)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace
fi
if ! command -v promtool >/dev/null; then
  step "installing promtool (Debian's prometheus package: daemon_metrics checks /metrics with it)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
    || echo "cannot install promtool: daemon_metrics will print SKIP for its promtool checks" >&2
fi
if ! command -v tmux >/dev/null; then
  step "installing tmux (daemon_metrics drives sharectl top in it)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; } \
    || echo "cannot install tmux: daemon_metrics will print SKIP for sharectl top" >&2
fi
missing=()
for p in runc:runc podman:podman dockerd:docker.io debootstrap:debootstrap busybox:busybox-static musl-gcc:musl-tools systemd-analyze:systemd; do
  command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
done
if [ "${#missing[@]}" -ne 0 ]; then
  step "installing ${missing[*]} (tests/tests/containers_*.rs run real containers)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    || echo "cannot install ${missing[*]}: the container tests will print SKIP" >&2
fi
# Another fetch-cuda.sh (e.g. a background torch install) must finish first: never run two.
while pgrep -f "scripts/fetch-cuda.sh" >/dev/null 2>&1; do
  echo "waiting for a running scripts/fetch-cuda.sh to finish..."; sleep 10
done
run fetch-cuda bash scripts/fetch-cuda.sh
if [ "${#failed[@]}" -ne 0 ]; then
  echo "cannot install the CUDA wheels; the CUDA tests would all fail" >&2
fi

# 2. Build everything (simgpu's libcuda.so, the shim, sharectl, jobs).
run build cargo build --release --workspace
# The shipped shim, linked against the glibc 2.17 baseline (cargo zigbuild) and checked.
run shim-glibc bash scripts/build-shim.sh

# 3. Format and lints.
run fmt cargo fmt --all -- --check
run clippy cargo clippy --workspace --all-targets --release -- -D warnings
# The Kubernetes manifests: schema (kubernetes-validate, pinned) and policy (issue 22).
run k8s-manifests bash packaging/kubernetes/check.sh

# 4. Tests. The harness builds simgpu itself when run alone; here it was just built.
export SHARE_TESTS_SKIP_BUILD=1
if cargo nextest --version >/dev/null 2>&1; then
  if [ $# -eq 0 ]; then
    # Every test binary that preloads the shim (its source calls the harness's `with_shim()` or
    # `shim_lib()`) runs against the shim that ships (glibc-2.17 baseline, target/dist), the
    # others once; both shims are built from the same source, and running the shim's tests a
    # second time against the host build cost CI about 11 minutes. With arguments (a filter,
    # a developer's loop), everything runs against the host build.
    shim_tests=$(grep -lE 'with_shim\(|shim_lib\(' tests/tests/*.rs \
      | sed -E 's#.*/(.*)\.rs$#binary(=\1)#' | paste -sd '|')
    run tests cargo nextest run --workspace --release --no-fail-fast -E "not ($shim_tests)"
    SHARE_TESTS_SHIM=dist run tests-shipped-shim cargo nextest run -p libshare-tests --release \
      --no-fail-fast -E "$shim_tests"
  else
    run tests cargo nextest run --workspace --release --no-fail-fast "$@"
  fi
else
  echo "cargo-nextest not found: falling back to cargo test"
  run tests cargo test --workspace --release --no-fail-fast "$@"
fi

echo
if [ "${#failed[@]}" -ne 0 ]; then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
echo "all steps passed"
