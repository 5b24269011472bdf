#!/usr/bin/env bash
# Builds the shipped shim against the glibc 2.17 baseline (design §3.2) and checks it.
#   scripts/build-shim.sh        -> target/<triple>/release/libshare.so, copied to target/dist/libshare.so
#                                   (debug info split off into target/dist/libshare.so.debug)
# libshare.so is preloaded into every process of a container, so it must not need a newer glibc than the
# oldest container it meets: it is linked by `cargo zigbuild --target <triple>.2.17`, i.e. against zig's
# glibc 2.17 stubs instead of the host's glibc (the host's `cargo build` output needs GLIBC_2.34).
# Installs what is missing, idempotently, pinned: zig from PyPI into a venv under $LIBSHARE_CACHE
# (default ~/.cache/libshare), cargo-zigbuild from crates.io into ~/.cargo/bin. Works without stdin
# (CI=true). Exits non-zero if the build fails or the result needs a GLIBC_ version newer than the
# baseline (scripts/check-glibc.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

ZIG_VERSION=0.15.2          # PyPI `ziglang` (the zig download site is not reachable here)
ZIGBUILD_VERSION=0.24.1     # crates.io `cargo-zigbuild`
GLIBC_BASELINE=2.17

case "$(uname -m)" in
  x86_64) triple=x86_64-unknown-linux-gnu ;;
  aarch64 | arm64) triple=aarch64-unknown-linux-gnu ;;
  *) echo "build-shim: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
# The .2.17 suffix is only zigbuild's glibc selector: the Rust target is the host's own, so no
# extra rustup target (nor its download) is needed.
host=$(rustc -vV | sed -n 's/^host: //p')
if [ "$host" != "$triple" ]; then
  echo "build-shim: rustc's host is $host, expected $triple; add it with: rustup target add $triple" >&2
  exit 1
fi

cache=${LIBSHARE_CACHE:-$HOME/.cache/libshare}
venv=$cache/ziglang-$ZIG_VERSION

# 1. zig, from PyPI, in its own venv (complete only once the stamp is written).
if [ ! -e "$venv/.complete" ] || [ "$("$venv/bin/python3" -m ziglang version 2>/dev/null)" != "$ZIG_VERSION" ]; then
  echo "build-shim: installing zig $ZIG_VERSION (PyPI ziglang) into $venv"
  rm -rf "$venv"
  mkdir -p "$cache"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian's python3 needs python3-venv for ensurepip.
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-input "ziglang==$ZIG_VERSION"
  [ "$("$venv/bin/python3" -m ziglang version)" = "$ZIG_VERSION" ]
  touch "$venv/.complete"
fi
# cargo-zigbuild runs `$CARGO_ZIGBUILD_PYTHON_PATH -m ziglang`: this pins it to our venv, whatever
# `zig` or `ziglang` the machine has elsewhere.
export CARGO_ZIGBUILD_PYTHON_PATH=$venv/bin/python3

# 2. cargo-zigbuild, from crates.io.
export PATH=$HOME/.cargo/bin:$PATH
if [ "$(cargo-zigbuild --version 2>/dev/null)" != "cargo-zigbuild $ZIGBUILD_VERSION" ]; then
  echo "build-shim: installing cargo-zigbuild $ZIGBUILD_VERSION"
  cargo install cargo-zigbuild --locked --version "$ZIGBUILD_VERSION"
fi

# 3. Build. Its own target subdirectory, so it never invalidates the host build in target/release.
target_dir=${CARGO_TARGET_DIR:-target}
cargo zigbuild --release -p libshare --target "$triple.$GLIBC_BASELINE"
out=$target_dir/$triple/release/libshare.so
[ -f "$out" ] || { echo "build-shim: $out was not produced" >&2; exit 1; }

# 4. Check, then publish the artifact that packaging ships (atomically: never a half-copied file).
bash scripts/check-glibc.sh "$out" "$GLIBC_BASELINE"
mkdir -p "$target_dir/dist"
cp "$out" "$target_dir/dist/.libshare.so.tmp"
# The shim is mapped into every process of a container: ship it without debug info (7 MB -> under
# 1 MB) and keep that in libshare.so.debug beside it, linked by .gnu_debuglink for gdb/perf.
if command -v objcopy >/dev/null; then
  objcopy --only-keep-debug "$out" "$target_dir/dist/libshare.so.debug"
  objcopy --strip-debug --add-gnu-debuglink="$target_dir/dist/libshare.so.debug" "$target_dir/dist/.libshare.so.tmp"
else
  echo "build-shim: objcopy not found (binutils); shipping libshare.so with its debug info" >&2
fi
mv -f "$target_dir/dist/.libshare.so.tmp" "$target_dir/dist/libshare.so"
echo "build-shim: $target_dir/dist/libshare.so (zig $ZIG_VERSION, cargo-zigbuild $ZIGBUILD_VERSION, glibc baseline $GLIBC_BASELINE)"
