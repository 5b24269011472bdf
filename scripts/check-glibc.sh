#!/usr/bin/env bash
# Prints the highest GLIBC_ symbol version an ELF file needs, and fails if it is newer than MAX.
#   scripts/check-glibc.sh FILE [MAX]      MAX defaults to 2.17 (the shim's baseline, design §3.2)
# Reads the version *requirements* (.gnu.version_r, "Version References" in `objdump -p`): what the
# dynamic loader checks at load time, and what makes a shim fail in a container with an older glibc
# ("version `GLIBC_2.34' not found"). Exit: 0 ok, 1 too new, 2 usage or unreadable file.
set -euo pipefail
file=${1:?usage: check-glibc.sh FILE [MAX=2.17]}
max=${2:-2.17}
[ -r "$file" ] || { echo "check-glibc: cannot read $file" >&2; exit 2; }
command -v objdump >/dev/null || { echo "check-glibc: objdump not found (apt-get install binutils)" >&2; exit 2; }

# The "Version References" block of `objdump -p`: "  required from libc.so.6:" then one
# "    0x09691a75 0x00 02 GLIBC_2.2.5" line per version needed.
headers=$(objdump -p "$file") || { echo "check-glibc: $file is not an ELF file objdump can read" >&2; exit 2; }
versions=$(awk '/^Version References:/ {in_r = 1; next}
                in_r && /^[^ \t]/ {in_r = 0}
                in_r && $NF ~ /^GLIBC_[0-9.]+$/ {sub(/^GLIBC_/, "", $NF); print $NF}' <<<"$headers" |
           sort -u -V)
if [ -z "$versions" ]; then
  echo "$file: needs no GLIBC_ symbol version (max allowed $max): ok"
  exit 0
fi
highest=$(tail -n 1 <<<"$versions")
echo "$file: highest GLIBC version needed: GLIBC_$highest (max allowed GLIBC_$max)"

newest=$(printf '%s\n%s\n' "$max" "$highest" | sort -V | tail -n 1)
if [ "$highest" != "$max" ] && [ "$newest" = "$highest" ]; then
  # Name the symbols that need a version newer than MAX, so the fix is obvious.
  too_new=$(awk -v max="$max" '$0 ~ /GLIBC_[0-9]/ {
              for (i = 1; i <= NF; i++) if ($i ~ /^\(?GLIBC_[0-9.]+\)?$/) {
                v = $i; gsub(/[()]|GLIBC_/, "", v); print v " " $NF }
            }' < <(objdump -T "$file") |
            while read -r v sym; do
              if [ "$v" != "$max" ] && [ "$(printf '%s\n%s\n' "$max" "$v" | sort -V | tail -n 1)" = "$v" ]; then
                echo "$sym@GLIBC_$v"
              fi
            done | sort -u | tr '\n' ' ')
  echo "check-glibc: FAIL: $file needs GLIBC_$highest > GLIBC_$max (${too_new% }); build it with scripts/build-shim.sh" >&2
  exit 1
fi
echo "check-glibc: ok: $file needs nothing newer than GLIBC_$max"
